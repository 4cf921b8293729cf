"""Quantization: NanoQuant (``zoo.quant.nanoquant``) and binary baselines (``zoo.quant.baselines``)."""
