"""Calibration statistics and the diagonal preconditioner of NanoQuant (Sec. 3; ``importance.py``).

* input second moments ``i_norm_j = E[x_j^2]`` over calibration tokens (diagonal of ``E[x x^T]``);
* output-gradient Fisher diagonal ``o_norm_i = E[g_i^2]``, ``g = dL/dy`` of the next-token loss;
* robust clipping of per-token norms at the running 99.9th percentile ("online" strategy of the code);
* shrinkage ``H <- (1 - gamma) H + gamma mean(H)``;
* preconditioned target ``W~ = D_out W D_in`` with ``D = diag(sqrt(H / mean H))``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class LinearStats:
    """Diagonal curvature statistics of one linear layer: ``i_norm [d_in]`` and ``o_norm [d_out]``."""

    i_norm: torch.Tensor
    o_norm: torch.Tensor

    def to(self, device: torch.device | str) -> LinearStats:
        """Move both vectors to ``device``."""
        return LinearStats(self.i_norm.to(device), self.o_norm.to(device))


def default_layer_filter(name: str, module: nn.Module) -> bool:
    """Default choice of quantized layers: every ``nn.Linear`` inside a decoder layer (``...layers.<i>....``);
    embeddings and ``lm_head`` stay in full precision (as in the paper)."""
    return isinstance(module, nn.Linear) and ".layers." in f".{name}" and "lm_head" not in name


def _robust_tau(norms: torch.Tensor, percentile: float) -> torch.Tensor:
    k = max(1, int(norms.numel() * (1.0 - percentile)))
    return torch.topk(norms.reshape(-1), k).values[-1]


class _OnlineClippedMoment:
    """Running mean of clipped squared entries (code's "online" strategy): per batch ``tau`` = ``percentile``
    of token norms, a running maximum of ``tau`` clips token norms; when the maximum grows, the earlier sum is
    rescaled by ``(tau_new / tau_old)^2``."""

    def __init__(self, dim: int, percentile: float, clip: bool) -> None:
        self.sum = torch.zeros(dim, dtype=torch.float64)
        self.batches = 0
        self.gmax: torch.Tensor | None = None
        self.percentile = percentile
        self.clip = clip

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).double()
        if self.clip and self.percentile < 1.0:
            norms = x.norm(dim=1, keepdim=True)
            tau = _robust_tau(norms, self.percentile)
            if self.gmax is None:
                self.gmax = tau
            elif tau > self.gmax:
                self.sum.mul_((tau / self.gmax.clamp_min(1e-30)).square().cpu())
                self.gmax = tau
            x = x * torch.clamp(self.gmax / (norms + 1e-30), max=1.0)
        self.sum.add_(x.square().mean(dim=0).cpu())
        self.batches += 1

    def value(self) -> torch.Tensor:
        return (self.sum / max(self.batches, 1)).float()


def collect_linear_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    *,
    layer_filter: Callable[[str, nn.Module], bool] = default_layer_filter,
    batch_size: int = 1,
    percentile: float = 0.999,
    clip: bool = True,
    loss_scale: float = 1.0,
    token_mask: torch.Tensor | None = None,
) -> dict[str, LinearStats]:
    """Collect ``i_norm = E[x^2]`` and ``o_norm = E[(dL/dy)^2]`` for every selected linear (Sec. 3).

    ``model`` is a causal LM called as ``model(input_ids=..., labels=...)`` returning ``.loss`` (next-token
    cross-entropy, as in the code); ``input_ids`` is ``[N, T]``. Parameters are frozen during collection (the
    gradient reaches the linears through the input embeddings) and restored afterwards; ``loss_scale`` multiplies
    the loss before ``backward`` to avoid fp16 underflow (the code's ``GRAD_SCALE_FACTOR = 1e6`` only rescales
    the captured gradients; it is irrelevant here because the preconditioner is normalized to mean 1).
    Robust clipping: see :class:`_OnlineClippedMoment` (``clip=False`` gives the plain "dbf" moments).
    ``token_mask [N, T]`` (bool) marks real tokens of right-padded rows: only they enter the moments and the loss
    (padding gets label -100). Returns ``{name: LinearStats}`` on CPU (fp32).
    """
    layers = {n: m for n, m in model.named_modules() if layer_filter(n, m)}
    if not layers:
        raise ValueError("layer_filter selected no layers")
    acc_in = {n: _OnlineClippedMoment(m.in_features, percentile, clip) for n, m in layers.items()}
    acc_out = {n: _OnlineClippedMoment(m.out_features, percentile, clip) for n, m in layers.items()}
    handles = []
    if token_mask is not None and token_mask.shape != input_ids.shape:
        raise ValueError(
            f"token_mask {tuple(token_mask.shape)} must have the shape of input_ids {tuple(input_ids.shape)}"
        )
    batch_mask: dict[str, torch.Tensor | None] = {"keep": None}

    def real(t: torch.Tensor) -> torch.Tensor:
        keep = batch_mask["keep"]
        return t if keep is None else t[keep.to(t.device)]

    def make_hook(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            acc_in[name].update(real(args[0]))
            if output.requires_grad:
                output.register_hook(lambda g: acc_out[name].update(real(g) / loss_scale))

        return hook

    for n, m in layers.items():
        handles.append(m.register_forward_hook(make_hook(n)))
    emb = model.get_input_embeddings()
    handles.append(emb.register_forward_hook(lambda m, a, o: o.detach().requires_grad_(True)))
    flags = {p: p.requires_grad for p in model.parameters()}
    was_training = model.training
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        with torch.enable_grad():
            for start in range(0, input_ids.shape[0], batch_size):
                ids = input_ids[start : start + batch_size]
                labels = ids
                if token_mask is not None:
                    batch_mask["keep"] = token_mask[start : start + batch_size].to(torch.bool)
                    labels = ids.masked_fill(~batch_mask["keep"].to(ids.device), -100)
                loss = model(input_ids=ids, labels=labels, use_cache=False).loss
                (loss * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
        for p, f in flags.items():
            p.requires_grad_(f)
        model.train(was_training)
    return {n: LinearStats(acc_in[n].value(), acc_out[n].value()) for n in layers}


def shrink(h: torch.Tensor, gamma: float) -> torch.Tensor:
    """Shrinkage toward the mean, ``H <- (1 - gamma) H + gamma mean(H)``.

    Paper: ``gamma = 0.2`` (Llama/Qwen), ``0.6`` (Gemma/Rnj); official code default ``calib_shrinkage = 0.4``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"shrinkage gamma must be in [0, 1], got {gamma}")
    return (1.0 - gamma) * h + gamma * h.mean()


def shrink_stats(stats: dict[str, LinearStats], gamma: float = 0.2) -> dict[str, LinearStats]:
    """Apply :func:`shrink` to both vectors of every layer; returns new objects (inputs untouched)."""
    return {n: LinearStats(shrink(s.i_norm, gamma), shrink(s.o_norm, gamma)) for n, s in stats.items()}


def preconditioner(stats: LinearStats | None, d_out: int, d_in: int, eps: float = 1e-8) -> tuple[torch.Tensor, ...]:
    """Diagonal preconditioner ``(D_out [d_out], D_in [d_in])`` with ``D = sqrt(H / mean H)``.

    Normalizing to mean 1 (pitfall in the notes: raw gradient RMS ~1e-4 lets the ridge ``reg`` dominate) does not
    change the weighted objective's minimizer beyond the ridge term. ``stats=None`` gives identity.
    """
    if stats is None:
        return torch.ones(d_out), torch.ones(d_in)
    if stats.o_norm.numel() != d_out or stats.i_norm.numel() != d_in:
        raise ValueError(
            f"stats shapes (o_norm {stats.o_norm.numel()}, i_norm {stats.i_norm.numel()}) do not match the layer "
            f"({d_out}, {d_in})"
        )

    def norm(h: torch.Tensor) -> torch.Tensor:
        h = h.float().clamp_min(0)
        mean = h.mean()
        if not torch.isfinite(mean) or mean <= 0:
            return torch.ones_like(h)
        return (h / mean).clamp_min(eps).sqrt()

    return norm(stats.o_norm), norm(stats.i_norm)


def preconditioned_target(W: torch.Tensor, d_out: torch.Tensor, d_in: torch.Tensor) -> torch.Tensor:
    """``W~ = diag(D_out) W diag(D_in)``, fp32 ``[d_out, d_in]``."""
    return d_out.float()[:, None] * W.float() * d_in.float()[None, :]


def weighted_error(W: torch.Tensor, W_hat: torch.Tensor, d_out: torch.Tensor, d_in: torch.Tensor) -> float:
    """Relative weighted error ``||D_out (W - W_hat) D_in||_F^2 / ||D_out W D_in||_F^2`` (ADMM objective, Sec. 3)."""
    num = preconditioned_target(W.float() - W_hat.float(), d_out, d_in).square().sum()
    den = preconditioned_target(W, d_out, d_in).square().sum().clamp_min(1e-30)
    return float(num / den)
