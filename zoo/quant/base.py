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

    @classmethod
    def layer_bits(cls, layer: nn.Module) -> tuple[int, int] | None:
        """``(stored bits, weights)`` of ``layer`` when it is a layer of this quantizer's format, else ``None``.

        Formats whose layers cannot report their own ``stored_bits()`` (third-party layers) override it; the base
        recognises none."""
        return None

    @property
    def needs_pretrained_load(self) -> bool:
        """Whether the quantizer only works through ``from_pretrained`` (load-time quantization)."""
        return bool(self.from_pretrained_kwargs())


class NoQuantizer(Quantizer):
    """``quant=none``: full precision."""


def quantizer_classes() -> list[type[Quantizer]]:
    """Every imported subclass of :class:`Quantizer` (the formats :func:`layer_stored_bits` can recognise)."""
    found: list[type[Quantizer]] = []
    todo = list(Quantizer.__subclasses__())
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def layer_stored_bits(layer: nn.Module) -> tuple[int, int] | None:
    """``(stored bits, weights)`` of a quantized layer, ``None`` for any other module.

    A layer that reports ``stored_bits()`` itself (NanoQuant, sign, OneBit: packed bits + scales over
    ``out_features * in_features`` weights), or one whose format a quantizer class recognises
    (:meth:`Quantizer.layer_bits`, e.g. bitsandbytes' layers in :class:`zoo.quant.bnb.BnbQuantizer`).
    """
    own = getattr(layer, "stored_bits", None)
    if callable(own):
        return int(own()), int(layer.out_features * layer.in_features)
    for quantizer in quantizer_classes():
        found = quantizer.layer_bits(layer)
        if found is not None:
            return found
    return None


def measured_bits_per_weight(model: nn.Module) -> float:
    """Bits per weight of a model's linear layers as stored, whatever quantized it.

    * quantized layers (:func:`layer_stored_bits`: each layer or its quantizer reports its stored bits):
      ``sum stored bits / sum weights`` over those layers (NanoQuant App. F convention; bitsandbytes: codes + scales);
    * otherwise (full precision): the storage bits of every ``nn.Linear`` weight except the output head.

    Embeddings, norms and the output head are never counted (they stay in full precision in every arm).
    """
    stored = [bits for m in model.modules() if (bits := layer_stored_bits(m)) is not None]
    if stored:
        return sum(b for b, _ in stored) / sum(n for _, n in stored)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
    numel = sum(m.weight.numel() for m in linears)
    if not numel:
        raise ValueError(f"{type(model).__name__} has no linear layers to measure")
    return sum(m.weight.numel() * m.weight.element_size() * 8 for m in linears) / numel
