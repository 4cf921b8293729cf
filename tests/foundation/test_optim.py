"""The learning-rate schedules against transformers' (zoo/optim.py says where they agree and how they differ)."""

from __future__ import annotations

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from zoo.optim import constant, constant_with_warmup, linear_warmup, warmup_cosine


def factors(make, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make(optimizer)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_warmup_cosine_is_transformers_cosine_with_a_floor_but_starts_at_one_step_of_warmup():
    total, warmup, floor = 40, 4, 0.1
    ours = factors(lambda o: warmup_cosine(o, total, warmup_ratio=warmup / total, min_ratio=floor), total + 10)
    theirs = factors(lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, warmup, total, min_lr_rate=floor), total)
    assert ours[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert theirs[0] == 0.0  # transformers' first step has learning rate 0
    assert ours[warmup:total] == pytest.approx(theirs[warmup:total])
    assert ours[total:] == pytest.approx([floor] * 10)  # held at the floor after the planned steps


@pytest.mark.parametrize(
    "make", [lambda o: constant_with_warmup(o, 40, pct_start=0.1), lambda o: linear_warmup(o, 40, warmup_steps=4)]
)
def test_warmup_schedules_are_transformers_shifted_by_one_step(make):
    ours = factors(make, 12)
    theirs = factors(lambda o: get_constant_schedule_with_warmup(o, 4), 13)
    assert ours == pytest.approx(theirs[1:])


def test_constant_is_constant():
    assert factors(lambda o: constant(o, 10), 10) == [1.0] * 10
