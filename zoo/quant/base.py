"""The quantizer seam: ``quant=<name>`` is orthogonal to ``+method=...``.

A quantizer contributes in up to two places of the one model-building path of every backbone:

* :meth:`Quantizer.from_pretrained_kwargs` -- extra keyword arguments for ``from_pretrained`` (load-time
  quantization such as bitsandbytes' ``BitsAndBytesConfig``);
* :meth:`Quantizer.apply` -- a post-hoc transform of a built model (e.g. the zoo's own binary quantizers).
"""

from __future__ import annotations

from typing import Any

from torch import nn


class Quantizer:
    """Identity quantizer (``quant=none``); subclasses override one or both hooks."""

    name: str = "none"

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments for ``AutoModel*.from_pretrained``."""
        return {}

    def apply(self, model: nn.Module) -> nn.Module:
        """Transform a built model in place or return a new one."""
        return model

    @property
    def needs_pretrained_load(self) -> bool:
        """Whether the quantizer only works through ``from_pretrained`` (load-time quantization)."""
        return bool(self.from_pretrained_kwargs())


class NoQuantizer(Quantizer):
    """``quant=none``: full precision."""
