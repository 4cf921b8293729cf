"""Quantization: the quantizer seam (``zoo.quant.base``), bitsandbytes (``zoo.quant.bnb``), NanoQuant
(``zoo.quant.nanoquant``) and binary baselines (``zoo.quant.baselines``).

Importing the package imports :mod:`zoo.quant.bnb`, so that :func:`zoo.quant.base.measured_bits_per_weight` recognises
bitsandbytes' layers whoever built them (the formats register as subclasses of
:class:`~zoo.quant.base.Quantizer`; NanoQuant's layers report their own bits).
"""

from zoo.quant.bnb import BnbQuantizer

__all__ = ["BnbQuantizer"]
