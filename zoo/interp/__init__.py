"""Interpretability toolkit: activation caching, probes, residual steering, head scaling (cores, no Lightning).

The hooks are context managers over any registered causal LM (:mod:`zoo.interp.architectures`); WET
(:mod:`zoo.interp.wet`) and the performative-misalignment harness (:mod:`zoo.interp.performative`) are built on
them.
"""

from zoo.interp.architectures import (
    ArchitectureSpec,
    ModelLayout,
    model_layout,
    register_architecture,
    supported_architectures,
)
from zoo.interp.hooks import (
    ActivationCache,
    HeadPatcher,
    HeadScaler,
    ModelHook,
    ResidualSteerer,
    activations_at,
    collect_activations,
)
from zoo.interp.probes import LinearProbe, auroc, cosine, diff_of_means, load_vector, save_vectors

__all__ = [
    "ActivationCache",
    "ArchitectureSpec",
    "HeadPatcher",
    "HeadScaler",
    "LinearProbe",
    "ModelHook",
    "ModelLayout",
    "ResidualSteerer",
    "activations_at",
    "auroc",
    "collect_activations",
    "cosine",
    "diff_of_means",
    "load_vector",
    "model_layout",
    "register_architecture",
    "save_vectors",
    "supported_architectures",
]
