"""``NanoQuantLinear``: the low-rank binary factorized linear layer of NanoQuant (Sec. 3).

``W_hat = diag(s_post) U diag(s_mid) V diag(s_pre)`` with ``U in {+-1}^{d_out x r}``, ``V in {+-1}^{r x d_in}``.
The forward never forms the ``d_out x d_in`` matrix: ``y = s_post * (((x * s_pre) V^T) * s_mid) U^T + bias``,
``O(r (d_in + d_out))`` per token. Two run-time modes (:data:`FORWARD_MODES`, ``NanoQuantLinear.forward_mode``):

* ``"cached"`` -- unpack both factors once into ``+-1`` fp32 matrices and keep them (fastest in plain torch, but
  ``4 r (d_in + d_out)`` bytes per layer: at ~1 bpw as large as the dense fp32 weight, so the memory win is lost);
* ``"chunked"`` -- unpack ``chunk_size`` rows of a factor at a time into a bounded workspace and discard it: the
  layer's resident memory stays the packed bits + scales, the workspace is ``chunk_size x max(d_in, r)`` floats.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from zoo.quant.nanoquant.packing import bit_shifts, pack_signs, packed_width, unpack_signs


class _SignSTE(torch.autograd.Function):
    """``sign`` with ``sign(0) = +1`` in the forward and the identity straight-through gradient (Sec. 3)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def ste_sign(x: torch.Tensor) -> torch.Tensor:
    """Binarize with the identity straight-through estimator (Sec. 3): value ``sign(x)`` (``0 -> +1``),
    gradient ``d/dx = 1`` (not clipped, as in the official code)."""
    return _SignSTE.apply(x)


def hard_sign(x: torch.Tensor) -> torch.Tensor:
    """``sign`` with ``sign(0) = +1`` (no gradient)."""
    return torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))


FORWARD_MODES = ("cached", "chunked")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp16 binary forwards overflow (notes 1(f)); compute them in fp32.
    return torch.float32 if dtype in (torch.float16,) or not dtype.is_floating_point else dtype


class NanoQuantLinear(nn.Module):
    """Low-rank binary factorized linear layer (NanoQuant Sec. 3).

    Stored tensors (``state_dict``): ``u_packed`` (``uint8 [d_out, ceil(r/8)]``), ``v_packed``
    (``uint8 [r, ceil(d_in/8)]``), ``s_pre [d_in]``, ``s_post [d_out]``, optional ``s_mid [r]`` (all in
    ``scale_dtype``, fp16 by default) and an optional full-precision ``bias``. Bits are LSB-first, ``1 = +1``
    (see :mod:`zoo.quant.nanoquant.packing`).

    A freshly built layer is *latent* when it carries real-valued latent factors ``u_latent``/``v_latent``
    (parameters, fp32) for straight-through tuning (Sec. 3); :meth:`finalize` hardens them into the packed
    buffers and deletes them. In latent mode the forward uses ``ste_sign(latent)``; otherwise it unpacks the
    bits into ``+-1`` factors: all at once and cached (``forward_mode="cached"``, ``O(r (d_in + d_out))`` memory,
    invalidated when the buffers change) or ``chunk_size`` rows at a time (``forward_mode="chunked"``, bounded
    workspace, nothing kept); both give the same outputs up to float summation order.

    Shapes: input ``[..., d_in]`` -> output ``[..., d_out]``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        *,
        bias: bool = False,
        mid_scale: bool = False,
        scale_dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"rank must be positive, got {rank}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.rank = int(rank)
        self.mid_scale = bool(mid_scale)
        self.scale_dtype = scale_dtype
        kw = {"device": device}
        self.register_buffer("u_packed", torch.zeros(out_features, packed_width(rank), dtype=torch.uint8, **kw))
        self.register_buffer("v_packed", torch.zeros(rank, packed_width(in_features), dtype=torch.uint8, **kw))
        # the unpacking shifts travel with the layer (``.to``/``.cuda`` move them once); not part of the state dict
        self.register_buffer("bit_shifts", bit_shifts(device), persistent=False)
        self.s_pre = nn.Parameter(torch.ones(in_features, dtype=scale_dtype, **kw))
        self.s_post = nn.Parameter(torch.ones(out_features, dtype=scale_dtype, **kw))
        self.s_mid = nn.Parameter(torch.ones(rank, dtype=scale_dtype, **kw)) if mid_scale else None
        self.bias = nn.Parameter(torch.zeros(out_features, **kw)) if bias else None
        self.register_parameter("u_latent", None)
        self.register_parameter("v_latent", None)
        self._cache: tuple[tuple, torch.Tensor, torch.Tensor] | None = None
        self.forward_mode = "cached"
        self.chunk_size = 256

    def set_forward(self, mode: str, chunk_size: int | None = None) -> None:
        """Select the run-time forward (:data:`FORWARD_MODES`); ``"chunked"`` drops any cached factors."""
        if mode not in FORWARD_MODES:
            raise ValueError(f"forward mode {mode!r}; use one of {FORWARD_MODES}")
        if chunk_size is not None:
            if int(chunk_size) < 1:
                raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
            self.chunk_size = int(chunk_size)
        self.forward_mode = mode
        if mode == "chunked":
            self._cache = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_factors(
        cls,
        U: torch.Tensor,
        V: torch.Tensor,
        s_pre: torch.Tensor,
        s_post: torch.Tensor,
        s_mid: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        *,
        u_latent: torch.Tensor | None = None,
        v_latent: torch.Tensor | None = None,
        scale_dtype: torch.dtype = torch.float16,
    ) -> NanoQuantLinear:
        """Build from sign factors ``U [d_out, r]``, ``V [r, d_in]`` (only their signs are kept) and scales.

        With ``u_latent``/``v_latent`` the layer is returned in latent mode (STE tuning, Sec. 3).
        """
        d_out, r = U.shape
        r2, d_in = V.shape
        if r2 != r:
            raise ValueError(f"rank mismatch: U {tuple(U.shape)} vs V {tuple(V.shape)}")
        layer = cls(
            d_in, d_out, r, bias=bias is not None, mid_scale=s_mid is not None, scale_dtype=scale_dtype, device=U.device
        )
        with torch.no_grad():
            layer.u_packed.copy_(pack_signs(U))
            layer.v_packed.copy_(pack_signs(V))
            layer.s_pre.copy_(s_pre.reshape(-1))
            layer.s_post.copy_(s_post.reshape(-1))
            if s_mid is not None:
                layer.s_mid.copy_(s_mid.reshape(-1))
            if bias is not None:
                layer.bias.data = bias.detach().clone()
        if u_latent is not None or v_latent is not None:
            if u_latent is None or v_latent is None:
                raise ValueError("give both u_latent and v_latent or neither")
            layer.u_latent = nn.Parameter(u_latent.detach().clone().float())
            layer.v_latent = nn.Parameter(v_latent.detach().clone().float())
        return layer

    # ------------------------------------------------------------------ state
    @property
    def is_latent(self) -> bool:
        """True while the layer holds real-valued latent factors (before :meth:`finalize`)."""
        return self.u_latent is not None

    def scales(self) -> Iterator[nn.Parameter]:
        """The scale parameters ``s_pre``, ``s_post`` and (if present) ``s_mid``."""
        yield self.s_pre
        yield self.s_post
        if self.s_mid is not None:
            yield self.s_mid

    @torch.no_grad()
    def finalize(self) -> None:
        """Harden the latents: ``U = sign(u_latent)``, ``V = sign(v_latent)`` into the packed buffers (Sec. 3),
        drop the latents and cast the scales back to ``scale_dtype``. No-op on a finalized layer's bits."""
        if self.is_latent:
            self.u_packed.copy_(pack_signs(self.u_latent))
            self.v_packed.copy_(pack_signs(self.v_latent))
            self.u_latent = None
            self.v_latent = None
        for p in self.scales():
            p.data = p.data.to(self.scale_dtype)
        self._cache = None

    def binary_factors(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``+-1`` factors ``(U [d_out, r], V [r, d_in])`` as ``dtype`` (STE signs in latent mode)."""
        if self.is_latent:
            return ste_sign(self.u_latent).to(dtype), ste_sign(self.v_latent).to(dtype)
        key = (
            self.u_packed.data_ptr(),
            self.u_packed._version,
            self.v_packed.data_ptr(),
            self.v_packed._version,
            dtype,
            self.u_packed.device,
        )
        if self._cache is None or self._cache[0] != key:
            U = unpack_signs(self.u_packed, self.rank, dtype, self.bit_shifts)
            V = unpack_signs(self.v_packed, self.in_features, dtype, self.bit_shifts)
            self._cache = (key, U, V)
        return self._cache[1], self._cache[2]

    # ------------------------------------------------------------------ compute
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = s_post * ((((x * s_pre) V^T) * s_mid) U^T) + bias``, never forming ``W_hat``."""
        dt = _compute_dtype(x.dtype)
        h = x.to(dt) * self.s_pre.to(dt)
        chunked = self.forward_mode == "chunked" and not self.is_latent
        if chunked:
            h = self._chunked_matmul(h, self.v_packed, self.in_features)
        else:
            U, V = self.binary_factors(dt)
            h = h @ V.T
        if self.s_mid is not None:
            h = h * self.s_mid.to(dt)
        y = self._chunked_matmul(h, self.u_packed, self.rank) if chunked else h @ U.T
        y = y * self.s_post.to(dt)
        if self.bias is not None:
            y = y + self.bias.to(dt)
        return y.to(x.dtype)

    def _chunked_matmul(self, h: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
        """``h @ S^T`` for the packed sign matrix ``S [m, n]`` (``packed`` ``uint8 [m, ceil(n/8)]``), unpacking
        ``chunk_size`` rows of ``S`` at a time; ``h [..., n]`` -> ``[..., m]``."""
        m = packed.shape[0]
        out = h.new_empty(*h.shape[:-1], m)
        for start in range(0, m, self.chunk_size):
            block = unpack_signs(packed[start : start + self.chunk_size], n, h.dtype, self.bit_shifts)
            out[..., start : start + block.shape[0]] = h @ block.T
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dense estimate ``W_hat = diag(s_post) U diag(s_mid) V diag(s_pre)``, ``[d_out, d_in]``."""
        U, V = self.binary_factors(dtype)
        left = U * self.s_post.to(dtype)[:, None]
        if self.s_mid is not None:
            left = left * self.s_mid.to(dtype)[None, :]
        return left @ (V * self.s_pre.to(dtype)[None, :])

    # ------------------------------------------------------------------ accounting
    def stored_bits(self) -> int:
        """Bits of the stored quantized representation: ``u_packed`` + ``v_packed`` (8 bits per byte, packing
        padding included) + ``s_pre``, ``s_post``, ``s_mid`` at their stored dtype's width. Latents (training
        only) and the bias (full precision, absent in Llama) are not counted."""
        bits = (self.u_packed.numel() + self.v_packed.numel()) * 8
        bits += sum(p.numel() * torch.finfo(self.scale_dtype).bits for p in self.scales())
        return int(bits)

    def bits_per_weight(self) -> float:
        """Measured bits per weight ``stored_bits() / (d_out d_in)``; equals App. F Eq. 60 when ``r`` and ``d_in``
        are multiples of 8 and scales are 16-bit."""
        return self.stored_bits() / (self.out_features * self.in_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
            f"mid_scale={self.mid_scale}, bias={self.bias is not None}, latent={self.is_latent}, "
            f"bpw={self.bits_per_weight():.4f}"
        )


def set_forward_mode(model: nn.Module, mode: str, chunk_size: int | None = None) -> int:
    """Set :meth:`NanoQuantLinear.set_forward` on every NanoQuant layer of ``model``; returns how many."""
    layers = [m for m in model.modules() if isinstance(m, NanoQuantLinear)]
    for layer in layers:
        layer.set_forward(mode, chunk_size)
    return len(layers)


def quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    """All modules of ``model`` that report ``stored_bits()`` (NanoQuant layers and the baselines), by name."""
    return {n: m for n, m in model.named_modules() if callable(getattr(m, "stored_bits", None))}


def model_bits_per_weight(model: nn.Module) -> float:
    """Measured bpw over the quantized layers only: ``sum stored_bits / sum d_out d_in`` (App. F convention;
    embeddings, norms and ``lm_head`` stay in full precision and are excluded)."""
    layers = quantized_layers(model)
    if not layers:
        raise ValueError("model has no quantized layers")
    bits = sum(m.stored_bits() for m in layers.values())
    numel = sum(m.out_features * m.in_features for m in layers.values())
    return bits / numel
