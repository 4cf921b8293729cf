"""Where auxiliary models live: next to the policy (DESIGN "Scale": scorers, teachers, references and reward models
run on the policy's device, in its compute dtype, unless told otherwise).

An auxiliary model is not a child of the LightningModule (it is never saved nor optimized), so the strategy does not
move it: a callback or module calls :func:`place_auxiliary` once it knows where the policy is (the first batch of a
stage), and the call is a no-op while both stay put.

``device`` / ``dtype`` options (e.g. ``SafeThinkMonitor(scorer_device=..., scorer_dtype=...)``):

* ``None`` (default) -- the policy's: its parameters' device, and the dtype of its floating-point weights (its
  ``dtype`` attribute for a Hugging Face model; a 4-bit policy's compute dtype is that of its unquantized weights);
* ``"keep"`` -- where and how the model was loaded;
* anything else -- a device (``"cpu"``, ``"cuda:1"``) or a floating dtype name (``"bfloat16"``).

bitsandbytes-quantized auxiliaries are never cast (transformers refuses ``.to(dtype)`` on them) and are moved only by
their ``device_map`` at load time.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.errors import ConfigError

KEEP = "keep"


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter or buffer (CPU for a model without any)."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def model_dtype(model: nn.Module) -> torch.dtype | None:
    """The compute dtype of ``model``: a Hugging Face model's ``dtype``, else its first floating parameter's."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return None


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` was quantized at load time (bitsandbytes through transformers)."""
    return bool(getattr(model, "is_quantized", False) or getattr(model, "hf_quantizer", None) is not None)


def resolve_dtype_option(value: str | torch.dtype | None, option: str) -> torch.dtype | str | None:
    """``None`` / ``"keep"`` as they are, else a floating torch dtype (a :class:`ConfigError` naming ``option``)."""
    if value is None or value == KEEP or isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConfigError(f"{option}={value!r}: use null (the policy's), 'keep', or float32 / bfloat16 / float16")
    return dtype


def place_auxiliary(
    model: nn.Module,
    policy: nn.Module | None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    option: str = "device/dtype",
) -> nn.Module:
    """Move ``model`` (an auxiliary: scorer, teacher, reference, reward model) to ``device`` and cast it to ``dtype``,
    each ``None`` = the policy's (see the module docstring); returns ``model`` (moved in place)."""
    dtype = resolve_dtype_option(dtype, f"{option} dtype")
    if device is None and policy is not None:
        device = model_device(policy)
    if dtype is None and policy is not None:
        dtype = model_dtype(policy)
    if is_quantized(model):
        return model
    kwargs = {}
    if device not in (None, KEEP) and model_device(model) != torch.device(device):
        kwargs["device"] = device
    if dtype not in (None, KEEP) and model_dtype(model) not in (None, dtype):
        kwargs["dtype"] = dtype
    return model.to(**kwargs) if kwargs else model


__all__ = ["KEEP", "is_quantized", "model_device", "model_dtype", "place_auxiliary", "resolve_dtype_option"]
