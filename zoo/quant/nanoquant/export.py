"""Packed export of a NanoQuant model (format of the official ``binary_packer``, adapted: uint8 LSB-first planes).

``save_quantized(model, dir)`` writes
* ``nanoquant.safetensors``: for every :class:`NanoQuantLinear` ``<name>``: ``<name>.u_packed``, ``<name>.v_packed``
  (uint8 bit-planes), ``<name>.s_pre``, ``<name>.s_post``, optional ``<name>.s_mid`` (stored scale dtype) and
  ``<name>.bias``; plus every other entry of ``model.state_dict()`` (embeddings, norms, ``lm_head``, unquantized
  linears) under its own key;
* ``nanoquant_config.json``: format name/version, bit order, per-layer shapes/ranks/flags and the quantization
  config.

``load_quantized(dir, base)`` rebuilds the layers into ``base`` (a module, or a zero-argument builder) and loads
every tensor strictly: a missing, unexpected, or mismatched tensor raises an error naming it. There is no fallback
to full-precision weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from zoo.quant.nanoquant.linear import NanoQuantLinear

FORMAT = "nanoquant-packed"
FORMAT_VERSION = 1
TENSORS_FILE = "nanoquant.safetensors"
CONFIG_FILE = "nanoquant_config.json"


def save_quantized(model: nn.Module, directory: str | Path, config: dict[str, Any] | None = None) -> Path:
    """Write the packed model (App. F storage: bit-planes + scales) to ``directory``; returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, NanoQuantLinear)}
    if not layers:
        raise ValueError("save_quantized: the model has no NanoQuantLinear layers")
    latent = [n for n, m in layers.items() if m.is_latent]
    if latent:
        raise ValueError(f"save_quantized: layers still hold latents (call finalize()): {latent}")
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "bit_order": "lsb-first, bit 1 = +1, last dim packed, 8 per uint8",
        "layers": {
            n: {
                "in_features": m.in_features,
                "out_features": m.out_features,
                "rank": m.rank,
                "mid_scale": m.mid_scale,
                "bias": m.bias is not None,
                "scale_dtype": str(m.scale_dtype).replace("torch.", ""),
            }
            for n, m in layers.items()
        },
        "config": dict(config or {}),
    }
    save_file(tensors, str(out / TENSORS_FILE), metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)})
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def load_quantized(directory: str | Path, base: nn.Module | Callable[[], nn.Module]) -> nn.Module:
    """Rebuild a model saved by :func:`save_quantized` (App. F storage) and return it.

    ``base`` is the full-precision architecture (its weights are all overwritten) or a zero-argument builder of it.
    Each recorded layer must exist in ``base`` as an ``nn.Linear`` (or ``NanoQuantLinear``) of the recorded shape;
    it is replaced by a :class:`NanoQuantLinear`, and then every tensor is loaded strictly. Raises ``KeyError`` for a
    missing or unexpected tensor and ``ValueError`` for a shape/dtype mismatch, naming the tensor.
    """
    path = Path(directory)
    meta = json.loads((path / CONFIG_FILE).read_text())
    if meta.get("format") != FORMAT or int(meta.get("format_version", -1)) != FORMAT_VERSION:
        raise ValueError(
            f"{path / CONFIG_FILE}: unsupported format {meta.get('format')!r} v{meta.get('format_version')}"
        )
    model = base if isinstance(base, nn.Module) else base()
    for name, spec in meta["layers"].items():
        try:
            old = model.get_submodule(name)
        except AttributeError as e:
            raise KeyError(f"layer {name!r} recorded in {CONFIG_FILE} does not exist in the model") from e
        if not isinstance(old, nn.Linear | NanoQuantLinear) or (old.out_features, old.in_features) != (
            spec["out_features"],
            spec["in_features"],
        ):
            raise ValueError(
                f"layer {name!r}: expected a linear of shape ({spec['out_features']}, {spec['in_features']}), "
                f"found {type(old).__name__}"
            )
        new = NanoQuantLinear(
            spec["in_features"],
            spec["out_features"],
            spec["rank"],
            bias=spec["bias"],
            mid_scale=spec["mid_scale"],
            scale_dtype=getattr(torch, spec["scale_dtype"]),
        )
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    tensors = load_file(str(path / TENSORS_FILE))
    expected = model.state_dict()
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise KeyError(f"tensor {missing[0]!r} is missing from {path / TENSORS_FILE} ({len(missing)} missing in all)")
    unexpected = [k for k in tensors if k not in expected]
    if unexpected:
        raise KeyError(f"unexpected tensor {unexpected[0]!r} in {path / TENSORS_FILE}")
    for k, ref in expected.items():
        t = tensors[k]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            raise ValueError(
                f"tensor {k!r}: stored {tuple(t.shape)} {t.dtype} does not match the model's {tuple(ref.shape)} "
                f"{ref.dtype}"
            )
    model.load_state_dict(tensors, strict=True)
    return model
