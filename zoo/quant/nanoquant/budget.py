"""Bit budget of a low-rank binary factorization (NanoQuant App. F, Eq. 60; official ``calculate_ranks``).

For a linear layer ``W`` of shape ``(a, b) = (d_out, d_in)`` factorized as
``diag(s_post) U diag(s_mid?) V diag(s_pre)`` with ``U in {+-1}^{a x r}``, ``V in {+-1}^{r x b}``:

* stored bits (two scales): ``r (a + b) + 16 (a + b)``  ->  ``bpw(r) = (r + 16)(a + b) / (a b)``;
* with the optional middle scale: ``r (a + b) + 16 (a + b) + 16 r``.

Solving ``bpw(r) = bits`` gives ``r = bits a b / (a + b) - 16`` (two scales) or
``r = (bits a b - 16 (a + b)) / (a + b + 16)`` (three scales); the rank is floored to a multiple of
``rank_multiple`` and clamped to ``[rank_multiple, min(a, b)]``. Example: 4096 x 4096 at 1 bit -> r = 2016
(0.992 bpw).
"""

from __future__ import annotations

import math
import warnings


def bits_for_rank(d_out: int, d_in: int, rank: int, *, mid_scale: bool = False, scale_bits: int = 16) -> float:
    """Bits per weight of a rank-``rank`` binary factorization (App. F, Eq. 60), packing padding excluded.

    Counts the two binary factors (1 bit per entry) and the scale vectors (``scale_bits`` each); the bias (if
    any) is not counted, as in the paper.
    """
    a, b = int(d_out), int(d_in)
    total = rank * (a + b) + scale_bits * (a + b) + (scale_bits * rank if mid_scale else 0)
    return total / (a * b)


def scale_floor_bits(d_out: int, d_in: int, *, scale_bits: int = 16) -> float:
    """The scale-only floor ``16 (a + b) / (a b)``: the bpw of the scales alone (rank 0)."""
    return scale_bits * (d_out + d_in) / (d_out * d_in)


def rank_for_bits(
    d_out: int,
    d_in: int,
    bits: float,
    rank_multiple: int = 32,
    *,
    mid_scale: bool = False,
    scale_bits: int = 16,
    layer_name: str | None = None,
) -> int:
    """Largest rank whose factorization fits ``bits`` per weight (App. F, Eq. 60).

    ``r = floor((bits a b / (a + b) - 16) / m) m`` (two scales) or
    ``r = floor(((bits a b - 16 (a + b)) / (a + b + 16)) / m) m`` (with ``s_mid``), clamped to
    ``[m, min(a, b)]`` where ``m = rank_multiple``. The official code uses ``m = 32`` (GPU kernels); the CPU
    demos use 8 or 1, because a small layer cannot reach low budgets with 32 (a 128 x 128 layer has a floor of
    0.75 bpw at r = 32).

    If ``bits`` is at or below the scale-only floor ``16 (a + b) / (a b)`` no rank fits and a ``ValueError``
    names the layer, its shape and the minimum achievable bpw. If the budget is above the floor but below
    ``bpw(m)``, the rank is raised to ``m`` (as the official code does) and a ``UserWarning`` gives the bpw
    actually used.
    """
    a, b, m = int(d_out), int(d_in), int(rank_multiple)
    if a <= 0 or b <= 0 or m <= 0:
        raise ValueError(f"invalid shape/rank_multiple: d_out={a}, d_in={b}, rank_multiple={m}")
    if mid_scale:
        r_cont = (bits * a * b - scale_bits * (a + b)) / (a + b + scale_bits)
    else:
        r_cont = bits * a * b / (a + b) - scale_bits
    name = f"layer '{layer_name}' " if layer_name else "layer "
    min_rank = min(m, a, b)
    min_bits = bits_for_rank(a, b, min_rank, mid_scale=mid_scale, scale_bits=scale_bits)
    if r_cont <= 0:
        floor = scale_floor_bits(a, b, scale_bits=scale_bits)
        raise ValueError(
            f"{name}of shape (d_out={a}, d_in={b}) cannot be stored in {bits:g} bits per weight: the scale vectors "
            f"alone take {floor:.4f} bpw; the minimum achievable is {min_bits:.4f} bpw (rank {min_rank}, "
            f"rank_multiple={m})"
        )
    rank = int(math.floor(r_cont / m)) * m
    if rank < min_rank:
        warnings.warn(
            f"{name}of shape ({a}, {b}): {bits:g} bpw gives rank {r_cont:.1f} < rank_multiple={m}; using rank "
            f"{min_rank} ({min_bits:.4f} bpw). Lower rank_multiple to meet the budget.",
            stacklevel=2,
        )
        rank = min_rank
    return min(rank, a, b)
