"""LoRA through ``peft`` for any family module: inject adapters (the only trainable weights) and merge them back.

Used by the backbones (``backbone.lora``: adapters on any family module's model, e.g. QLoRA with ``quant=bnb_nf4``,
``+preset=qlora``), the Cuttlefish LLM-adaptation stage and the LoRA baseline of the vocabulary extension.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

DEFAULT_LORA: dict[str, Any] = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def inject_lora(model: nn.Module, settings: Mapping[str, Any], seed: int = 0) -> nn.Module:
    """Add LoRA adapters in place and make them the only parameters with ``requires_grad``.

    Args:
        model: any torch module (a Hugging Face model).
        settings: ``r``, ``alpha``, ``dropout``, ``target_modules`` (missing keys: :data:`DEFAULT_LORA`).
        seed: seed of the adapters' initialisation (the global RNG is left untouched).
    """
    from peft import LoraConfig, inject_adapter_in_model

    lora = {**DEFAULT_LORA, **dict(settings)}
    config = LoraConfig(
        r=int(lora["r"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` holds ``peft`` LoRA layers (added by :func:`inject_lora`)."""
    return any("lora_" in name for name, _ in model.named_parameters())


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its LoRA adapters merged and the ``peft`` layers replaced by plain base layers
    (so ``save_pretrained`` writes ordinary weights); ``model`` itself is unchanged."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, BaseTunerLayer):
                setattr(module, child_name, child.get_base_layer())
    return model


def lora_layers(model: nn.Module) -> list[nn.Module]:
    """The ``peft`` tuner layers of ``model`` (``BaseTunerLayer``: the layers :func:`inject_lora` wrapped)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def lora_is_identity(model: nn.Module) -> bool:
    """Whether every LoRA update ``B A`` of ``model`` is zero (``lora_B = 0``, peft's default initialisation), i.e.
    the model with its adapters disabled computes what it computes with them."""
    return all(not bool(p.detach().any()) for name, p in model.named_parameters() if "lora_B" in name)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model`` without its LoRA updates inside the block (peft's ``disable_adapter()``, layer by layer:
    ``BaseTunerLayer.enable_adapters(False)``), then restore the adapters and every parameter's ``requires_grad``."""
    layers = lora_layers(model)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_enabled = [not layer.disable_adapters for layer in layers]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer, enabled in zip(layers, was_enabled):
            layer.enable_adapters(enabled)
        for param, flag in flags:
            param.requires_grad_(flag)


class AdapterFreeReference(nn.Module):
    """The frozen reference of a LoRA policy as the policy itself with its adapters disabled: no second model.

    QLoRA (Dettmers et al. 2023) freezes the 4-bit base and trains only the adapters, so the initial policy (LoRA
    ``B = 0``) *is* the base with the adapters off; KL-regularised RL and DPO read their reference that way (TRL's
    ``GRPOTrainer``/``DPOTrainer`` with a peft model and no ``ref_model`` use ``disable_adapter()`` the same way).
    A call runs the policy in eval mode (no dropout) under :func:`adapters_disabled` and restores its mode.

    The policy is held outside this module's children, so ``.eval()``, ``.to()`` and ``requires_grad_`` on the
    reference never touch the policy, and the reference is never saved nor optimized.
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)

        # keep the policy's forward signature (logits_to_keep, the cache argument's name) visible to callers
        @functools.wraps(policy.forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._forward(*args, **kwargs)

        object.__setattr__(self, "forward", forward)

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        was_training = self.policy.training
        self.policy.eval()
        try:
            with adapters_disabled(self.policy):
                return self.policy(*args, **kwargs)
        finally:
            self.policy.train(was_training)

    def get_base_model(self) -> nn.Module:
        """The policy (for callers that inspect the model's ``forward``)."""
        return self.policy

    def get_input_embeddings(self) -> nn.Module:
        return self.policy.get_input_embeddings()

    @property
    def config(self) -> Any:
        return self.policy.config

    @property
    def device(self) -> torch.device:
        return next(self.policy.parameters()).device


__all__ = [
    "DEFAULT_LORA",
    "AdapterFreeReference",
    "adapters_disabled",
    "has_lora",
    "inject_lora",
    "lora_is_identity",
    "lora_layers",
    "merged_copy",
]
