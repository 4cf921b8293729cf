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


def measured_bits_per_weight(model: nn.Module) -> float:
    """Bits per weight of a model's linear layers as stored, whatever quantized it.

    * bitsandbytes layers (``quant=bnb_nf4|bnb_int8``): :func:`zoo.quant.bnb.bnb_bits_per_weight` (codes + scales);
    * layers that report ``stored_bits()`` (NanoQuant, sign, OneBit): packed bits + scales over those layers
      (:func:`zoo.quant.nanoquant.model_bits_per_weight`);
    * otherwise (full precision): the storage bits of every ``nn.Linear`` weight except the output head.

    Embeddings, norms and the output head are never counted (they stay in full precision in every arm).
    """
    from zoo.quant.nanoquant import model_bits_per_weight, quantized_layers

    try:
        from zoo.quant.bnb import bnb_bits_per_weight, is_bnb_quantized

        if is_bnb_quantized(model):
            return bnb_bits_per_weight(model)
    except ImportError:  # bitsandbytes not installed: no bnb layers either
        pass
    if quantized_layers(model):
        return model_bits_per_weight(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
    numel = sum(m.weight.numel() for m in linears)
    if not numel:
        raise ValueError(f"{type(model).__name__} has no linear layers to measure")
    return sum(m.weight.numel() * m.weight.element_size() * 8 for m in linears) / numel
