"""Scaling-Aware Patching (Cuttlefish, arXiv 2602.02780; notes 4(a), equations numbered (P1)-(P5) here).

- (P1) instruction vector ``z = Linear(LayerNorm(mean_t e_t))``          -> :class:`InstructionProjector`
- (P2) anchor logits ``l_i = MLP([x_i; z])``, ``p = softmax_i(l)`` per graph -> :class:`AnchorGate`
- (P3) ``k_g = min{k : sum_{j<=k} p_(j) >= rho}`` clipped to ``[1, k_max]``  -> :func:`num_patches`,
  :func:`num_patches_batched`
- (P4) ``W_ia = softmax_a((-beta ||P_i - P_a||^2 + l_a) / tau)`` over the k_g anchors
  -> :meth:`ScalingAwarePatching.forward`
- (P5) ``t_a = sum_i W_ia x_i / sum_i W_ia`` (optional per-patch top-r truncation)
  -> :meth:`ScalingAwarePatching.forward`
- diagnostics and controls (not in the paper): normalized gate entropy ``H(p) / log n`` -> :func:`gate_entropy`;
  ``k_g`` against ``n`` -> :func:`patch_count_stats`; uniform gate (``gate="uniform"``: ``l = 0``, so
  ``k_g = ceil(rho n)``, anchors evenly spaced in atom order) -> :meth:`ScalingAwarePatching.forward`

All inputs are padded per structure: ``x [B, N, D]``, ``pos [B, N, 3]``, ``atom_mask [B, N]`` (True = real atom).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zoo.errors import ConfigError

GATES = ("learned", "uniform")
# Cumulative mass within this of rho counts as reaching it: a float32 softmax of n equal logits must give
# exactly ceil(rho * n) patches even when rho * n is an integer.
MASS_TOLERANCE = 1e-6


def _check_rho_kmax(rho: float, k_max: int) -> None:
    if not 0.0 < rho <= 1.0:
        raise ConfigError(f"rho must lie in (0, 1], got {rho}")
    if k_max < 1:
        raise ConfigError(f"k_max must be >= 1, got {k_max}")


def num_patches_batched(anchor_probs: Tensor, atom_mask: Tensor, rho: float, k_max: int) -> Tensor:
    """Eq. (P3) per structure: ``anchor_probs [B, N]`` (zero at padding), ``atom_mask [B, N]`` -> ``k_g [B]`` long.

    ``k_g`` is the smallest k whose k largest probabilities sum to at least ``rho`` (up to :data:`MASS_TOLERANCE`),
    clipped to ``[1, min(k_max, n_atoms)]``.
    """
    _check_rho_kmax(rho, k_max)
    probs = torch.where(atom_mask, anchor_probs.detach().double(), torch.zeros((), dtype=torch.float64))
    mass = torch.sort(probs, dim=-1, descending=True).values.cumsum(-1)
    k = (mass < rho - MASS_TOLERANCE).sum(-1) + 1
    upper = atom_mask.sum(-1).clamp(max=k_max)
    return torch.minimum(k.clamp(min=1), upper)


def num_patches(anchor_probs: Tensor, rho: float, k_max: int) -> int:
    """Eq. (P3) for one structure: ``anchor_probs [n]`` (its atoms' probabilities) -> ``k_g`` in ``[1, k_max]``.

    >>> num_patches(torch.full((10,), 0.1), rho=0.25, k_max=256)
    3
    """
    if anchor_probs.ndim != 1 or anchor_probs.numel() == 0:
        raise ValueError(f"anchor_probs must be a non-empty 1-D tensor, got shape {tuple(anchor_probs.shape)}")
    mask = torch.ones(1, anchor_probs.numel(), dtype=torch.bool, device=anchor_probs.device)
    return int(num_patches_batched(anchor_probs[None], mask, rho, k_max)[0])


def gate_entropy(anchor_probs: Tensor, atom_mask: Tensor) -> Tensor:
    """Normalized entropy ``H(p) / log n`` of each structure's anchor distribution: ``[B, N]`` -> ``[B]`` in
    ``[0, 1]`` (1 = uniform over its ``n`` atoms, 0 = one atom; ``n = 1`` gives 1). Differentiable."""
    p = anchor_probs.masked_fill(~atom_mask, 0.0)
    h = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    n = atom_mask.sum(-1).to(p.dtype)
    return torch.where(n > 1, h / torch.log(n.clamp_min(2.0)), torch.ones_like(h))


def patch_count_stats(num_patches: Tensor, num_atoms: Tensor, rho: float) -> dict[str, float]:
    """How ``k_g`` scales with structure size ``n`` in a batch (``[B]`` each): mean ``k``, mean ``k / n``, the
    least-squares slope of ``k`` on ``n``, and the mean of ``k / ceil(rho n)`` (1 = what a uniform gate gives, the
    upper end of (P3); near 0 = collapsed to a few patches whatever the size)."""
    k, n = num_patches.double(), num_atoms.double()
    uniform = torch.ceil(rho * n).clamp(min=1)
    dn = n - n.mean()
    var = float((dn * dn).sum())
    slope = float((dn * (k - k.mean())).sum()) / var if var > 0 else float("nan")
    return {
        "k_mean": float(k.mean()),
        "k_per_atom": float((k / n).mean()),
        "k_slope": slope,
        "k_vs_uniform": float((k / uniform).mean()),
    }


def masked_softmax(logits: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Softmax over entries where ``mask`` is True; exactly zero elsewhere (rows need one True entry)."""
    out = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=dim)
    return out.masked_fill(~mask, 0.0)


class InstructionProjector(nn.Module):
    """Eq. (P1): ``LayerNorm -> Linear`` from the LLM embedding width to the encoder width."""

    def __init__(self, instr_dim: int, node_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(instr_dim)
        self.proj = nn.Linear(instr_dim, node_dim)

    def forward(self, instruction: Tensor) -> Tensor:
        return self.proj(self.norm(instruction))


class AnchorGate(nn.Module):
    """Eq. (P2): anchor logits ``l_i = MLP([x_i; z])``: ``x [B, N, D]``, ``z [B, D]`` -> ``[B, N]``."""

    def __init__(self, node_dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or node_dim
        self.mlp = nn.Sequential(nn.Linear(2 * node_dim, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        return self.mlp(torch.cat([x, z[:, None, :].expand_as(x)], dim=-1)).squeeze(-1)


@dataclass
class PatchOutput:
    """Result of :class:`ScalingAwarePatching`.

    Attributes:
        tokens: ``[B, K, D]`` patch tokens (zero at padded patches), ``K = max_b k_g``.
        patch_mask: ``[B, K]`` True for the first ``k_g`` patches of each structure.
        num_patches: ``[B]`` long ``k_g``.
        anchor_index: ``[B, K]`` atom index of each anchor (sorted by probability, descending).
        anchor_logits, anchor_probs: ``[B, N]`` gate logits and per-structure softmax (zero at padding).
        assignment: ``[B, N, K]`` soft assignment ``W`` (rows of real atoms sum to 1 over real patches).
        entropy: ``[B]`` normalized gate entropy :func:`gate_entropy` (differentiable; a regularizer's input).
    """

    tokens: Tensor
    patch_mask: Tensor
    num_patches: Tensor
    anchor_index: Tensor
    anchor_logits: Tensor
    anchor_probs: Tensor
    assignment: Tensor
    entropy: Tensor


class ScalingAwarePatching(nn.Module):
    """Instruction-conditioned, size-adaptive pooling of atom embeddings into ``k_g`` patch tokens (eqs. P1-P5).

    Args:
        node_dim: encoder width ``D``.
        instr_dim: width of the instruction vector (the LLM embedding width); ``None`` disables conditioning
            (``z = 0``).
        rho: anchor mass (code ``dynamic_k_mass`` = 0.1; the notes record no separate paper value).
        k_max: maximum patches per structure (code 256).
        beta: distance scale in (P4). The paper's formula has no beta (= 1); code default 1.
        tau: temperature in (P4). The paper's formula has no temperature (tau = 1, the default here); the official
            code uses tau = 0.1, which with Å-scale distances makes the assignment nearly hard (Voronoi cells).
        r_max: optional per-patch top-r truncation of the assignment (code ``r_max``; ``None`` in the 8B configs).
            With truncation the rows of ``W`` no longer sum to 1.
        use_anchor_bias: add ``l_a`` in (P4) (paper and code). Top-k anchor selection is discrete, so this bias is
            the gate's only gradient path in the paper.
        prob_straight_through: multiply each token by ``p_a / stopgrad(p_a)`` (value 1, so the forward pass is the
            paper's) to give the gate a gradient also when ``k_g = 1`` (the bias then cancels in the softmax) or
            when the assignment is nearly hard. Not in the paper; set False for the paper's gradient.
        gate: ``"learned"`` (eq. P2) or ``"uniform"`` -- a control: ``l = 0`` for every atom, so ``k_g = ceil(rho
            n)`` (clipped) and the anchors are evenly spaced in atom order; the gate MLP is unused.
    """

    def __init__(
        self,
        node_dim: int,
        instr_dim: int | None = None,
        *,
        rho: float = 0.1,
        k_max: int = 256,
        beta: float = 1.0,
        tau: float = 1.0,
        r_max: int | None = None,
        use_anchor_bias: bool = True,
        prob_straight_through: bool = True,
        gate_hidden: int | None = None,
        gate: str = "learned",
    ) -> None:
        super().__init__()
        _check_rho_kmax(rho, k_max)
        if gate not in GATES:
            raise ConfigError(f"gate must be one of {GATES}, got {gate!r}")
        self.gate_mode = gate
        if beta < 0 or tau <= 0:
            raise ConfigError(f"need beta >= 0 and tau > 0, got beta={beta}, tau={tau}")
        if r_max is not None and r_max < 1:
            raise ConfigError(f"r_max must be None or >= 1, got {r_max}")
        self.node_dim = node_dim
        self.rho, self.k_max, self.beta, self.tau, self.r_max = rho, k_max, beta, tau, r_max
        self.use_anchor_bias = use_anchor_bias
        self.prob_straight_through = prob_straight_through
        self.instruction = InstructionProjector(instr_dim, node_dim) if instr_dim else None
        self.gate = AnchorGate(node_dim, gate_hidden)

    def forward(self, x: Tensor, pos: Tensor, atom_mask: Tensor, instruction: Tensor | None = None) -> PatchOutput:
        """Eqs. (P1)-(P5): ``x [B, N, D]``, ``pos [B, N, 3]``, ``atom_mask [B, N]``, ``instruction [B, instr_dim]``.

        Returns a :class:`PatchOutput`.
        """
        if not atom_mask.any(-1).all():
            raise ValueError("every structure needs at least one atom (atom_mask has an all-False row)")
        bsz = x.shape[0]
        if self.instruction is not None and instruction is not None:
            z = self.instruction(instruction.to(x.dtype))
        else:
            z = x.new_zeros(bsz, self.node_dim)
        logits = self.gate(x, z) if self.gate_mode == "learned" else x.new_zeros(x.shape[:2])  # (P2)
        probs = masked_softmax(logits, atom_mask)
        k = num_patches_batched(probs, atom_mask, self.rho, self.k_max)  # (P3)
        kk = int(k.max())
        if self.gate_mode == "uniform":  # anchors j * n / k_g, evenly spaced along the atom order
            j = torch.arange(kk, device=x.device)[None, :]
            n = atom_mask.sum(-1, keepdim=True)
            anchor_index = torch.where(j < k[:, None], (j * n) // k[:, None], 0)
        else:
            order = torch.sort(
                logits.detach().masked_fill(~atom_mask, float("-inf")), dim=-1, descending=True, stable=True
            )
            anchor_index = order.indices[:, :kk]
        patch_mask = torch.arange(kk, device=x.device)[None, :] < k[:, None]
        anchor_pos = torch.gather(pos, 1, anchor_index[..., None].expand(-1, -1, 3))
        sq_dist = (pos[:, :, None, :] - anchor_pos[:, None, :, :]).pow(2).sum(-1)  # [B, N, K]
        score = -self.beta * sq_dist
        anchor_logits = torch.gather(logits, 1, anchor_index)
        if self.use_anchor_bias:
            score = score + anchor_logits[:, None, :]
        valid = atom_mask[:, :, None] & patch_mask[:, None, :]
        log_w = torch.log_softmax((score / self.tau).masked_fill(~patch_mask[:, None, :], float("-inf")), dim=-1)
        log_w = log_w.masked_fill(~valid, float("-inf"))  # (P4), log domain
        if self.r_max is not None and self.r_max < log_w.shape[1]:
            top = torch.topk(log_w, self.r_max, dim=1).indices
            keep = torch.zeros_like(valid).scatter_(1, top, True)
            log_w = log_w.masked_fill(~keep, float("-inf"))
        # (P5) column normalisation in the log domain: each token is a convex combination of atom embeddings
        # (padded patches get a finite dummy column, zeroed below, so no NaN reaches the backward pass)
        col = torch.softmax(torch.where(patch_mask[:, None, :], log_w, 0.0), dim=1)
        tokens = torch.einsum("bnk,bnd->bkd", col, x)
        if self.prob_straight_through and self.gate_mode == "learned":
            p_a = torch.gather(probs, 1, anchor_index)
            p_det = p_a.detach()
            ratio = torch.where(p_det > 0, p_a / p_det.clamp_min(torch.finfo(p_a.dtype).tiny), 1.0)
            tokens = tokens * ratio[..., None]
        tokens = tokens * patch_mask[..., None]
        assignment = log_w.exp()
        return PatchOutput(
            tokens, patch_mask, k, anchor_index, logits, probs, assignment, gate_entropy(probs, atom_mask)
        )
