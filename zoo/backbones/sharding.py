"""FSDP sharding of a Hugging Face backbone: the policy model is the FSDP root, and the auto-wrap policy comes from
the model's decoder-layer class.

**The root.** Lightning's ``FSDPStrategy`` wraps the LightningModule unless ``configure_model`` already wrapped
something (Lightning's "manual wrapping"). With the LightningModule as the root unit, the module's own code calls the
policy (rollouts, log-prob and loss forwards) but never the root's forward: the root unit stays in its forward state
and the first ``manual_backward`` fails (``Expects BACKWARD_PRE or BACKWARD_POST state but got FORWARD``); Lightning's
FSDP precision plugin also refuses ``gradient_clip_algorithm="norm"`` (``torch.nn.utils.clip_grad_norm_`` on shards
is wrong; the root's ``clip_grad_norm_`` is right, per torch's FSDP documentation). :func:`shard` makes the policy
the root inside ``configure_model`` (torch's ``wrap``: a no-op outside the strategy's wrapping context, so one process
and DDP keep the plain model), and :func:`sharded_root` finds it for clipping. A module calls it once its policy is
final (the GRPO family; a module that still changes the model after building it, e.g. resizing its embeddings, is
wrapped whole by Lightning as before).

**The wrap policy.** ``conf/trainer/fsdp.yaml`` passes :class:`DecoderLayerWrapPolicy` to Lightning's
``FSDPStrategy(auto_wrap_policy=)``. transformers names, on every model class, the blocks that must stay whole on one
device (``_no_split_modules``: ``["LlamaDecoderLayer"]``, ``["Qwen2DecoderLayer"]``, ...; the classes ``accelerate``'s
``device_map`` and TRL's FSDP setup wrap). The policy reads that attribute from the model it is wrapping, so a Qwen2,
Mistral or Gemma backbone is sharded per decoder layer like a Llama one; a hard-wired ``LlamaDecoderLayer`` left every
other model unwrapped (one root unit, no per-layer sharding).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import wrap

# Lightning warns that the strategy's auto-wrap policy "will be ignored" when ``configure_model`` wrapped the model;
# :func:`shard` wrapped it with that very policy (the strategy's wrapping context passes it to ``wrap``)
warnings.filterwarnings("ignore", message="A FSDP `auto_wrap_policy` is set, but the model is already wrapped")


def shard(model: nn.Module) -> nn.Module:
    """``model`` as an FSDP root unit when called inside the wrapping context of Lightning's ``FSDPStrategy``
    (``configure_model``; the strategy's sharding strategy, mixed precision, device and auto-wrap policy, e.g.
    :class:`DecoderLayerWrapPolicy` per decoder layer); ``model`` itself otherwise (one process, DDP, a test)."""
    if isinstance(model, FullyShardedDataParallel):
        return model
    return wrap(model)


def sharded_root(model: nn.Module | None) -> FullyShardedDataParallel | None:
    """``model`` when it is an FSDP root unit (:func:`shard`), else ``None``."""
    return model if isinstance(model, FullyShardedDataParallel) else None


class DecoderLayerWrapPolicy:
    """FSDP auto-wrap policy (the callable form ``policy(module, recurse, nonwrapped_numel) -> bool`` that
    ``torch.distributed.fsdp.FullyShardedDataParallel(auto_wrap_policy=)`` accepts): wrap every module whose class name
    is one of the model's ``_no_split_modules``.

    FSDP asks the policy top-down (``recurse=True`` on a parent before its children are decided), so the names are
    collected from every module that declares ``_no_split_modules`` (the ``PreTrainedModel``, also inside a PEFT
    wrapper) before its layers are reached.

    Args:
        layers: class names to wrap instead (``fsdp_wrap_layer=...``); ``None`` = the model's ``_no_split_modules``.
    """

    def __init__(self, layers: str | Sequence[str] | None = None) -> None:
        self.layers: frozenset[str] | None = (
            None if layers is None else frozenset([layers] if isinstance(layers, str) else layers)
        )
        self.found: set[str] = set()

    def layer_names(self) -> frozenset[str]:
        """The class names wrapped: the given ``layers``, else those found so far."""
        return self.layers if self.layers is not None else frozenset(self.found)

    def __call__(self, module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        if recurse:
            names = getattr(module, "_no_split_modules", None)
            if self.layers is None and names:
                self.found.update(str(n) for n in names)
            return True
        return type(module).__name__ in self.layer_names()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layers={sorted(self.layers) if self.layers is not None else 'from the model'})"
