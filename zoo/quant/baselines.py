"""Binary baselines for NanoQuant's comparison (notes 1(c)/(d)): sign binarization with a per-row scale and
OneBit's sign-value-independent decomposition (SVID, Xu et al., arXiv 2402.11295).

* :class:`SignBinaryLinear`: ``W ~ diag(alpha) sign(W)``, ``alpha_i = sum_j c_j |W_ij| / sum_j c_j`` (weighted
  L2-optimal; ``c = 1`` without stats -> the row mean of ``|W|``); ``1 + 16 / d_in`` bpw.
* :class:`OneBitLinear`: ``W ~ diag(a) sign(W) diag(b)`` with ``a b^T`` the rank-1 SVD of ``|W|`` (OneBit SVID),
  ``1 + 16 (d_out + d_in) / (d_out d_in)`` bpw; forward ``y = a * ((x * b) S^T)``.

Both store the packed sign matrix (uint8, :mod:`zoo.quant.nanoquant.packing`) and fp16 scales, report
``stored_bits()``/``bits_per_weight()`` like :class:`~zoo.quant.nanoquant.linear.NanoQuantLinear`, and have a
``quantize_*(linear, bits=None, stats=None, **kw)`` builder with the shape of
:func:`~zoo.quant.nanoquant.reconstruct.quantize_linear`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from zoo.quant.nanoquant.calibration import LinearStats, preconditioner
from zoo.quant.nanoquant.packing import bit_shifts, pack_signs, packed_width, unpack_signs


class _PackedSignLinear(nn.Module, ABC):
    """Shared storage: ``sign_packed uint8 [d_out, ceil(d_in/8)]``, optional fp ``bias`` (not counted in bpw), and the
    unpacking's bit shifts as a non-persistent buffer (:func:`~zoo.quant.nanoquant.packing.bit_shifts`), moved with
    the layer instead of copied from the host at every unpack."""

    def __init__(self, in_features: int, out_features: int, bias: bool, scale_dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scale_dtype = int(in_features), int(out_features), scale_dtype
        self.register_buffer("sign_packed", torch.zeros(out_features, packed_width(in_features), dtype=torch.uint8))
        # the unpacking shifts travel with the layer (``.to``/``.cuda`` move them once); not part of the state dict
        self.register_buffer("bit_shifts", bit_shifts(), persistent=False)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def signs(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The ``+-1`` matrix ``[d_out, d_in]`` (cached)."""
        key = (self.sign_packed.data_ptr(), self.sign_packed._version, dtype)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, unpack_signs(self.sign_packed, self.in_features, dtype, self.bit_shifts))
        return self._cache[1]

    @abstractmethod
    def _scale_params(self) -> list[nn.Parameter]:
        """The scale parameters counted in the bit budget."""

    def stored_bits(self) -> int:
        """Packed sign bits (padding included) + scales at their stored width; bias not counted."""
        bits = self.sign_packed.numel() * 8
        return int(bits + sum(p.numel() * torch.finfo(p.dtype).bits for p in self._scale_params()))

    def bits_per_weight(self) -> float:
        """Measured bpw ``stored_bits() / (d_out d_in)``."""
        return self.stored_bits() / (self.out_features * self.in_features)

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype)


class SignBinaryLinear(_PackedSignLinear):
    """``W ~ diag(alpha) sign(W)`` (sign binarization with a per-row scale; the RTN-style 1-bit baseline)."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool = False, scale_dtype: torch.dtype = torch.float16
    ) -> None:
        super().__init__(in_features, out_features, bias, scale_dtype)
        self.alpha = nn.Parameter(torch.ones(out_features, dtype=scale_dtype))

    def _scale_params(self) -> list[nn.Parameter]:
        return [self.alpha]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = alpha * (x S^T) + bias``."""
        dt = torch.float32 if x.dtype == torch.float16 else x.dtype
        y = (x.to(dt) @ self.signs(dt).T) * self.alpha.to(dt)
        return self._finish(y, x)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense ``diag(alpha) S``."""
        return self.signs(dtype) * self.alpha.to(dtype)[:, None]


class OneBitLinear(_PackedSignLinear):
    """OneBit SVID layer ``W ~ diag(a) sign(W) diag(b)`` (OneBit, arXiv 2402.11295, SVID initialization)."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool = False, scale_dtype: torch.dtype = torch.float16
    ) -> None:
        super().__init__(in_features, out_features, bias, scale_dtype)
        self.a = nn.Parameter(torch.ones(out_features, dtype=scale_dtype))
        self.b = nn.Parameter(torch.ones(in_features, dtype=scale_dtype))

    def _scale_params(self) -> list[nn.Parameter]:
        return [self.a, self.b]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = a * ((x * b) S^T) + bias``."""
        dt = torch.float32 if x.dtype == torch.float16 else x.dtype
        y = ((x.to(dt) * self.b.to(dt)) @ self.signs(dt).T) * self.a.to(dt)
        return self._finish(y, x)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense ``diag(a) S diag(b)``."""
        return self.signs(dtype) * self.a.to(dtype)[:, None] * self.b.to(dtype)[None, :]


def quantize_sign(
    linear: nn.Linear,
    bits: float | None = None,
    stats: LinearStats | None = None,
    *,
    scale_dtype: torch.dtype = torch.float16,
) -> SignBinaryLinear:
    """Sign binarization with the weighted L2-optimal row scale ``alpha_i = sum_j c_j |W_ij| / sum_j c_j``,
    ``c = D_in^2`` from ``stats`` (row scaling makes ``D_out`` irrelevant). ``bits`` is accepted for interface
    symmetry and must be ``None`` or at least the layer's fixed cost ``1 + 16 / d_in``."""
    W = linear.weight.detach().float()
    d_out, d_in = W.shape
    _check_bits(bits, 1 + 16 / d_in, "sign")
    _, c = preconditioner(stats, d_out, d_in)
    c = c.square().to(W.device)
    alpha = (W.abs() * c[None, :]).sum(1) / c.sum()
    layer = SignBinaryLinear(d_in, d_out, bias=linear.bias is not None, scale_dtype=scale_dtype).to(W.device)
    with torch.no_grad():
        layer.sign_packed.copy_(pack_signs(W))
        layer.alpha.copy_(alpha)
        if linear.bias is not None:
            layer.bias.data = linear.bias.detach().clone()
    return layer


def quantize_onebit(
    linear: nn.Linear,
    bits: float | None = None,
    stats: LinearStats | None = None,
    *,
    scale_dtype: torch.dtype = torch.float16,
) -> OneBitLinear:
    """OneBit SVID initialization: rank-1 SVD of ``|W~|`` (``W~ = D_out W D_in``; identity without ``stats``),
    ``a = u sqrt(s) / D_out``, ``b = v sqrt(s) / D_in``, ``S = sign(W)``. ``bits`` as in :func:`quantize_sign`."""
    W = linear.weight.detach().float()
    d_out, d_in = W.shape
    _check_bits(bits, 1 + 16 * (d_out + d_in) / (d_out * d_in), "onebit")
    do, di = (t.to(W.device) for t in preconditioner(stats, d_out, d_in))
    P, S, Qh = torch.linalg.svd((do[:, None] * W * di[None, :]).abs(), full_matrices=False)
    u, v = P[:, 0], Qh[0]
    if u.sum() < 0:  # singular vectors of a nonnegative matrix: pick the nonnegative orientation
        u, v = -u, -v
    a = u * S[0].sqrt() / do
    b = v * S[0].sqrt() / di
    layer = OneBitLinear(d_in, d_out, bias=linear.bias is not None, scale_dtype=scale_dtype).to(W.device)
    with torch.no_grad():
        layer.sign_packed.copy_(pack_signs(W))
        layer.a.copy_(a)
        layer.b.copy_(b)
        if linear.bias is not None:
            layer.bias.data = linear.bias.detach().clone()
    return layer


def _check_bits(bits: float | None, cost: float, name: str) -> None:
    if bits is not None and bits < cost - 1e-9:
        raise ValueError(f"{name} binarization costs {cost:.4f} bpw for this layer; target {bits:g} is below it")
