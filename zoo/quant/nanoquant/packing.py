"""Bit packing of {+1, -1} matrices into ``uint8`` bit-planes (NanoQuant storage format, Sec. 3 / App. F).

Convention (format version 1): the last dimension is packed LSB-first, 8 entries per byte; bit ``k`` of byte
``j`` holds entry ``8 j + k``; a set bit means ``+1``, a clear bit ``-1``; ``sign(0)`` is mapped to ``+1``.
Padding bits of the last byte are written as zero and ignored on unpacking.
"""

from __future__ import annotations

import torch

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_SHIFTS = torch.arange(8, dtype=torch.uint8)


def packed_width(n: int) -> int:
    """Number of bytes that hold ``n`` packed signs: ``ceil(n / 8)``."""
    return (int(n) + 7) // 8


def pack_signs(signs: torch.Tensor) -> torch.Tensor:
    """Pack a sign tensor ``[..., n]`` into ``uint8`` bits ``[..., ceil(n/8)]`` (entries ``>= 0`` -> bit 1).

    Any real tensor is accepted; only the sign is kept (``0`` counts as ``+1``, as in the STE of Sec. 3).
    """
    if signs.dim() == 0:
        raise ValueError("pack_signs needs at least one dimension")
    n = signs.shape[-1]
    bits = (signs >= 0).to(torch.uint8)
    pad = packed_width(n) * 8 - n
    if pad:
        bits = torch.nn.functional.pad(bits, (0, pad))
    bits = bits.reshape(*signs.shape[:-1], packed_width(n), 8)
    return (bits * _BIT_WEIGHTS.to(bits.device)).sum(dim=-1, dtype=torch.uint8)


def bit_shifts(device: torch.device | str | None = None) -> torch.Tensor:
    """The shifts ``0..7`` (``uint8``) that :func:`unpack_signs` reads each bit with, on ``device``: a layer keeps them
    as a (non-persistent) buffer, so they move with it once instead of being copied to the device at every unpack."""
    return _SHIFTS.to(device) if device is not None else _SHIFTS.clone()


def unpack_signs(
    packed: torch.Tensor, n: int, dtype: torch.dtype = torch.float32, shifts: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse of :func:`pack_signs`: ``uint8 [..., ceil(n/8)]`` -> ``{+1, -1}`` tensor ``[..., n]`` of ``dtype``.

    ``shifts``: :func:`bit_shifts` already on ``packed``'s device (a layer's buffer); ``None`` copies the host
    constant to that device (one small host-to-device copy per call on an accelerator)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed bits must be uint8, got {packed.dtype}")
    if packed.shape[-1] != packed_width(n):
        raise ValueError(f"packed width {packed.shape[-1]} does not match n={n} (expected {packed_width(n)} bytes)")
    if shifts is None or shifts.device != packed.device:
        shifts = _SHIFTS.to(packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    bits = bits.reshape(*packed.shape[:-1], packed.shape[-1] * 8)[..., :n]
    return bits.to(dtype).mul_(2).sub_(1)  # in place: one float buffer (the chunked forward's workspace)
