"""ADMM initialization of the low-rank binary factors (NanoQuant Sec. 3, "ADMM initialization"; ``admm_nq.py``).

Problem: ``min_{A, B} ||W~ - A B||_F^2`` s.t. ``A``, ``B`` in the SVID set (sign pattern times a rank-1 magnitude,
from OneBit), with the preconditioned target ``W~ = D_out W D_in``. Per outer iteration ``t`` with
``rho = sched(t / K)``:

1. ``A``-update: ``X = Z_B^T`` with each rank component normalized; solve
   ``(X^T X + (rho mean diag(X^T X) + reg) I) A^T = X^T W~^T + rho (Z_A - L_A)^T`` (Cholesky, ``solve`` fallback);
   the ``B``-update is symmetric with ``X = Z_A`` (columns normalized).
2. ``Z``-update: ``Z = SVID(factor + L)`` (sign times the rank-1 approximation of ``|.|``, power iterations).
3. Dual update: ``L += factor - Z``.

Export: ``U = sign(Z_A)``, ``V = sign(Z_B)``; scales are the code's mean-magnitude values, optionally refined by
exact alternating least squares on the weighted objective (``refit_scale_iters``, an addition, see
:func:`fit_scales`); the preconditioning is undone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zoo.quant.nanoquant.calibration import preconditioned_target
from zoo.quant.nanoquant.linear import hard_sign

RHO_SCHEDULES: dict[str, Callable[[float], float]] = {
    "linear": lambda x: x,
    "cubic": lambda x: min(1.0, x) ** 3,
    "logistic": lambda x: 1.0 / (1.0 + math.exp(-5.0 * (x - 0.5))),
    "exp_decay": lambda x: (1.0 - math.exp(-5.0 * x)) / (1.0 - math.exp(-5.0)),
    "exp_growth": lambda x: (math.exp(5.0 * x) - 1.0) / (math.exp(5.0) - 1.0),
}


@dataclass
class BinaryFactorization:
    """Result of a low-rank binary factorization ``W ~ diag(s_post) U diag(s_mid) V diag(s_pre)`` (Sec. 3).

    ``U [d_out, r]`` and ``V [r, d_in]`` are exactly ``+-1``; ``u_latent``/``v_latent`` are real latents whose signs
    equal ``U``/``V`` (mean magnitude 1), the starting point of STE tuning; ``s_mid`` is ``None`` without the middle
    scale; ``weighted_error`` is the relative preconditioned error (fp32 scales).
    """

    U: torch.Tensor
    V: torch.Tensor
    s_pre: torch.Tensor
    s_post: torch.Tensor
    s_mid: torch.Tensor | None
    u_latent: torch.Tensor
    v_latent: torch.Tensor
    weighted_error: float

    def dense(self) -> torch.Tensor:
        """The dense estimate ``diag(s_post) U diag(s_mid) V diag(s_pre)``."""
        left = self.U * self.s_post[:, None]
        if self.s_mid is not None:
            left = left * self.s_mid[None, :]
        return left @ (self.V * self.s_pre[None, :])


def svid(M: torch.Tensor, power_iters: int = 5) -> torch.Tensor:
    """Projection onto the SVID set (OneBit): ``sign(M) * (u v^T)`` with ``u v^T`` the rank-1 approximation of
    ``|M|`` by ``power_iters`` power iterations started from a positive vector (so ``u, v >= 0``)."""
    absM = M.abs()
    v = torch.ones(M.shape[1], dtype=M.dtype, device=M.device) / math.sqrt(M.shape[1])
    u = absM @ v
    for _ in range(max(1, power_iters)):
        u = absM @ v
        u = u / u.norm().clamp_min(1e-30)
        v = absM.T @ u
        v = v / v.norm().clamp_min(1e-30)
    u = absM @ v
    return hard_sign(M) * torch.outer(u, v)


def _solve(X: torch.Tensor, Y: torch.Tensor, Z: torch.Tensor, L: torch.Tensor, rho: float, reg: float) -> torch.Tensor:
    """Solve ``(X^T X + (rho mean diag(X^T X) + reg) I) F = X^T Y + rho (Z - L)`` for ``F`` (ADMM primal step)."""
    G = X.T @ X
    G = 0.5 * (G + G.T)
    stab = max(rho * float(G.diagonal().mean().abs()) + reg, 1e-12)
    G.diagonal().add_(stab)
    rhs = X.T @ Y + rho * (Z - L)
    C, info = torch.linalg.cholesky_ex(G)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, C)
    return torch.linalg.solve(G, rhs)


def fit_scales(
    W: torch.Tensor,
    U: torch.Tensor,
    V: torch.Tensor,
    d_out: torch.Tensor,
    d_in: torch.Tensor,
    s_pre: torch.Tensor,
    s_post: torch.Tensor,
    s_mid: torch.Tensor | None = None,
    iters: int = 10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Exact alternating least squares for the scales of ``diag(p) U diag(m) V diag(q)`` on the weighted objective
    ``sum_ij o_i c_j (W_ij - p_i M_ij q_j)^2`` with ``o = D_out^2``, ``c = D_in^2`` (Sec. 3 objective).

    Each step is the exact minimizer of one scale vector given the others, so the objective never increases.
    Not in the official code (which keeps the mean-magnitude scales and relies on STE tuning); ``iters=0`` returns
    the inputs unchanged. Returns ``(s_pre, s_post, s_mid)`` in fp32.
    """
    W, U, V = W.float(), U.float(), V.float()
    o, c = d_out.float().square(), d_in.float().square()
    p, q = s_post.float().clone(), s_pre.float().clone()
    m = None if s_mid is None else s_mid.float().clone()
    eps = 1e-12
    for _ in range(iters):
        Um = U if m is None else U * m[None, :]
        M = Um @ V  # [d_out, d_in]
        # p given q, m
        Mq = M * q[None, :]
        p = (W * Mq * c[None, :]).sum(1) / ((Mq.square() * c[None, :]).sum(1) + eps)
        # q given p, m
        Mp = M * p[:, None]
        q = (W * Mp * o[:, None]).sum(0) / ((Mp.square() * o[:, None]).sum(0) + eps)
        if m is not None:
            # m given p, q: G = (U^T diag(o p^2) U) * (V diag(c q^2) V^T), rhs_k = u_k^T diag(o p) W diag(c q) v_k
            G = (U.T @ (U * (o * p.square())[:, None])) * ((V * (c * q.square())[None, :]) @ V.T)
            rhs = ((U * (o * p)[:, None]).T @ (W * (c * q)[None, :]) * V).sum(1)
            G.diagonal().add_(eps * float(G.diagonal().mean().clamp_min(1.0)))
            m = torch.linalg.solve(G, rhs)
    return q, p, m


def admm_factorize(
    W: torch.Tensor,
    rank: int,
    *,
    d_out: torch.Tensor | None = None,
    d_in: torch.Tensor | None = None,
    outer_iters: int = 400,
    inner_iters: int = 5,
    reg: float = 3e-2,
    rho_schedule: str = "linear",
    mid_scale: bool = False,
    refit_scale_iters: int = 10,
    seed: int = 0,
) -> BinaryFactorization:
    """ADMM low-rank binary factorization of ``W [d_out, d_in]`` at ``rank`` (Sec. 3, "ADMM initialization").

    Defaults follow the paper/code: ``outer_iters=400``, ``inner_iters=5`` (power iterations inside SVID, the
    code's ``inner_iters``), ``reg=3e-2``, random Gaussian init (the code removed SVD init), ``rho_schedule``:
    ``"linear"`` is the CLI default of the code, ``"cubic"`` its function default (others: ``logistic``,
    ``exp_decay``, ``exp_growth``). ``d_out``/``d_in`` are the diagonal preconditioners of
    :func:`zoo.quant.nanoquant.calibration.preconditioner` (``None`` -> identity, plain Frobenius objective).
    ``mid_scale=True`` adds ``s_mid`` (the "DBF"-style third scale). ``refit_scale_iters`` runs
    :func:`fit_scales` after export (0 reproduces the code's mean-magnitude scales).
    """
    if rho_schedule not in RHO_SCHEDULES:
        raise ValueError(f"unknown rho_schedule {rho_schedule!r}; choose from {sorted(RHO_SCHEDULES)}")
    W = W.detach().float()
    a, b = W.shape
    r = int(rank)
    dev = W.device
    d_out = torch.ones(a, device=dev) if d_out is None else d_out.float().to(dev)
    d_in = torch.ones(b, device=dev) if d_in is None else d_in.float().to(dev)
    Wn = preconditioned_target(W, d_out, d_in)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    A = torch.randn(a, r, generator=gen).to(dev)
    B = torch.randn(r, b, generator=gen).to(dev)
    ZA, ZB = svid(A, inner_iters), svid(B, inner_iters)
    LA, LB = A - ZA, B - ZB
    sched = RHO_SCHEDULES[rho_schedule]
    for t in range(outer_iters):
        rho = float(sched(t / outer_iters))
        XA = ZB.T / ZB.norm(dim=1).clamp_min(1e-12)  # [b, r]
        A = _solve(XA, Wn.T, ZA.T, LA.T, rho, reg).T
        XB = ZA / ZA.norm(dim=0).clamp_min(1e-12)  # [a, r]
        B = _solve(XB, Wn, ZB, LB, rho, reg)
        TA, TB = A + LA, B + LB
        ZA, ZB = svid(TA, inner_iters), svid(TB, inner_iters)
        LA = TA - ZA
        LB = TB - ZB
    TA, TB = ZA + LA, ZB + LB  # pre-projection targets; sign(T) == sign(Z)
    U, V = hard_sign(TA), hard_sign(TB)
    # Export as in the code: undo the preconditioning, balance, mean-magnitude scales.
    A_u, B_u = ZA / d_out[:, None], ZB / d_in[None, :]
    A_u = A_u / ZB.norm(dim=1).clamp_min(1e-12)[None, :]
    bal = (B_u.norm() / A_u.norm().clamp_min(1e-12)).sqrt()
    A_u, B_u = A_u * bal, B_u / bal
    s_post = A_u.abs().mean(dim=1)
    s_pre = B_u.abs().mean(dim=0)
    s_mid = torch.ones(r, device=dev) if mid_scale else None
    if refit_scale_iters > 0:
        s_pre, s_post, s_mid = fit_scales(W, U, V, d_out, d_in, s_pre, s_post, s_mid, iters=refit_scale_iters)
    fac = BinaryFactorization(
        U=U,
        V=V,
        s_pre=s_pre,
        s_post=s_post,
        s_mid=s_mid,
        # Latents in the code's units (magnitude of the balanced exported factors), so its learning rates carry over.
        u_latent=TA / TA.abs().mean().clamp_min(1e-12) * A_u.abs().mean(),
        v_latent=TB / TB.abs().mean().clamp_min(1e-12) * B_u.abs().mean(),
        weighted_error=0.0,
    )
    fac.weighted_error = _rel_err(W, fac.dense(), d_out, d_in)
    return fac


def naive_sign_svd_factorize(
    W: torch.Tensor,
    rank: int,
    *,
    d_out: torch.Tensor | None = None,
    d_in: torch.Tensor | None = None,
    mid_scale: bool = False,
    refit_scale_iters: int = 10,
) -> BinaryFactorization:
    """Naive baseline: truncated SVD ``W~ ~ P S Q^T``, ``U = sign(P sqrt(S))``, ``V = sign(sqrt(S) Q^T)`` with the
    same scale export as :func:`admm_factorize` (the "LRBF naive sign-of-SVD" arm of the notes)."""
    W = W.detach().float()
    a, b = W.shape
    d_out = torch.ones(a) if d_out is None else d_out.float()
    d_in = torch.ones(b) if d_in is None else d_in.float()
    P, S, Qh = torch.linalg.svd(preconditioned_target(W, d_out, d_in), full_matrices=False)
    A = P[:, :rank] * S[:rank].sqrt()
    B = S[:rank].sqrt()[:, None] * Qh[:rank]
    U, V = hard_sign(A), hard_sign(B)
    s_post = (A / d_out[:, None]).abs().mean(1)
    s_pre = (B / d_in[None, :]).abs().mean(0)
    s_mid = torch.ones(rank) if mid_scale else None
    if refit_scale_iters > 0:
        s_pre, s_post, s_mid = fit_scales(W, U, V, d_out, d_in, s_pre, s_post, s_mid, iters=refit_scale_iters)
    fac = BinaryFactorization(U, V, s_pre, s_post, s_mid, A / A.abs().mean(), B / B.abs().mean(), 0.0)
    fac.weighted_error = _rel_err(W, fac.dense(), d_out, d_in)
    return fac


def _rel_err(W: torch.Tensor, W_hat: torch.Tensor, d_out: torch.Tensor, d_in: torch.Tensor) -> float:
    num = preconditioned_target(W - W_hat, d_out, d_in).square().sum()
    den = preconditioned_target(W, d_out, d_in).square().sum().clamp_min(1e-30)
    return float(num / den)
