"""Learning-rate schedules taking the total number of optimizer steps (filled in by the module).

Where transformers has the same schedule, it is used (:func:`constant` is ``get_constant_schedule``). The warm-up
schedules differ from transformers' ``get_constant_schedule_with_warmup`` / ``get_cosine_with_min_lr_schedule_with_
warmup`` in two ways, on purpose: the warm-up factor at optimizer step ``s`` is ``(s + 1) / warmup`` (transformers':
``s / warmup``, so its first step has learning rate 0 and a one-step run -- a smoke run, a ``fast_dev_run`` -- moves no
weight), and the cosine is held at its floor after ``total_steps`` (transformers' keeps turning when a run is
resumed for more steps than planned). :func:`one_cycle` is torch's ``OneCycleLR`` with its phases kept non-empty.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR
from transformers import get_constant_schedule


def one_cycle(optimizer: torch.optim.Optimizer, total_steps: int, pct_start: float = 0.1) -> LRScheduler:
    """One-cycle schedule peaking at the optimizer's learning rate."""
    max_lr = [group["lr"] for group in optimizer.param_groups]
    total = max(int(total_steps), 4)
    # OneCycleLR divides by the length of each phase: keep the warm-up at least 2 steps and the decay non-empty
    pct_start = min(max(pct_start, 2.0 / total), 1.0 - 2.0 / total)
    return OneCycleLR(optimizer, max_lr=max_lr, total_steps=total, pct_start=pct_start)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float = 0.05, min_ratio: float = 0.1
) -> LRScheduler:
    """Linear warm-up then cosine decay to ``min_ratio`` of the peak."""
    total = max(int(total_steps), 1)
    warmup = max(int(warmup_ratio * total), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def constant(optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
    """Constant learning rate (transformers' ``get_constant_schedule``)."""
    return get_constant_schedule(optimizer)


def constant_with_warmup(optimizer: torch.optim.Optimizer, total_steps: int, pct_start: float = 0.1) -> LRScheduler:
    """Linear warm-up over the first ``pct_start`` of the steps (at least one), then constant (transformers'
    ``constant_with_warmup``; ``pct_start`` as in :func:`one_cycle`)."""
    warmup = max(int(pct_start * max(int(total_steps), 1)), 1)
    return LambdaLR(optimizer, lambda step: min((step + 1) / warmup, 1.0))


def linear_warmup(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 150) -> LRScheduler:
    """Linear warm-up from 0 to the optimizer's learning rate over ``warmup_steps``, then constant (DPO, App. B)."""
    warmup = max(int(warmup_steps), 1)
    return LambdaLR(optimizer, lambda step: min((step + 1) / warmup, 1.0))
