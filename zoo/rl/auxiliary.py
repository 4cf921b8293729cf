"""The auxiliary-loss seam of the GRPO family (seam (iv) of notes ``rl.md`` §0): extra training items built from a
rollout step, and their loss added to the policy loss inside the same optimizer update.

One rollout step with an auxiliary loss ``A`` of weight ``w`` (:class:`zoo.modules.GRPOModule`):

1. ``A.prepare(module, rollout)`` (no gradient; before any update, so it sees the rollout-time policy) builds the
   step's items, e.g. ThoughtFold's span-masked DPO pairs (:class:`zoo.modules.thoughtfold.ThoughtFoldLoss`);
2. in every update the policy loss is accumulated over its micro-batches, then ``w * A.loss(module, items, rows)``
   over the items' micro-batches; ``A.loss`` divides by a normalizer fixed for the whole step (e.g. the number of
   pairs), so the summed micro-batch gradients equal the full batch's whatever ``micro_batch_size`` is.

The items are not policy-loss rows: they carry advantage 0 for the policy loss (the released ThoughtFold trainer
packs its DPO items with advantage 0) and do not enter the policy loss's token normalizer, so ``w = 0`` gives
exactly the plain GRPO gradient ([assumed]: packing them into the normalizer would rescale the GRPO gradient).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from zoo.errors import ConfigError


class AuxiliaryItems(Protocol):
    """What :meth:`AuxiliaryLoss.prepare` returns: anything with ``size`` (the number of items, split into
    micro-batches by row slices) and ``normalizer``, the divisor of the step's loss: ``None`` = ``size``; under data
    parallelism the module sets it to the all-reduced item count over the number of ranks
    (:meth:`zoo.modules.GRPOModule.share_aux_normalizer`)."""

    size: int
    normalizer: float | None


class AuxiliaryLoss(ABC):
    """Base of auxiliary losses (``module/grpo/aux=<name>``; ``none`` = no auxiliary loss).

    Args:
        weight: the loss's weight against the policy loss (0 = computed and logged, no gradient).
    """

    def __init__(self, weight: float = 1.0) -> None:
        if weight < 0:
            raise ConfigError(f"module.aux.weight must be >= 0, got {weight}")
        self.weight = float(weight)

    def setup(self, module: Any) -> None:  # noqa: B027 - an optional hook, empty by default
        """Called once the module's model exists (check the backbone, build a reference, ...)."""

    @abstractmethod
    def prepare(self, module: Any, rollout: dict[str, Any]) -> AuxiliaryItems | None:
        """The step's items (``None``: no auxiliary loss this step). Runs without gradient."""

    @abstractmethod
    def loss(self, module: Any, items: AuxiliaryItems, rows: slice) -> torch.Tensor:
        """The differentiable loss of the items ``rows``, divided by the step's normalizer (``items.normalizer``, else
        ``items.size``; not by the slice's size): summed over the slices of ``range(items.size)`` it is the full step's
        loss."""

    def metrics(self) -> dict[str, float]:
        """Diagnostics of the last :meth:`prepare` (logged under ``train/``)."""
        return {}


__all__ = ["AuxiliaryItems", "AuxiliaryLoss"]
