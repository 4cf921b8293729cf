"""Advantage estimators: GRPO / Dr.GRPO / RLOO invariants (research/rl.md §1(e))."""

from __future__ import annotations

import doctest

import pytest
import torch

import zoo.rl.advantages as adv_mod
from zoo.errors import ConfigError
from zoo.rl import (
    DrGRPOAdvantage,
    GRPOAdvantage,
    RLOOAdvantage,
    grpo_advantages,
    reward_group_stats,
    rloo_advantages,
    to_groups,
)


def test_doctests_pass():
    assert doctest.testmod(adv_mod).failed == 0


def test_group_advantages_have_mean_zero_and_unit_std():
    torch.manual_seed(0)
    rewards = torch.rand(16, 8) * 3.0
    adv = grpo_advantages(rewards)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(16), atol=1e-6)
    assert torch.all((adv.std(dim=1) - 1.0).abs() < 1e-3)


def test_hand_computed_grpo_uses_bessel_std_and_eps():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=1e-4)
    std = (1.0 / 3.0) ** 0.5  # Bessel: sum of squares 4 * 0.25 / (4 - 1)
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5]]) / (std + 1e-4)
    assert torch.allclose(adv, expected, atol=1e-6)


@pytest.mark.parametrize(
    "estimator", [GRPOAdvantage(), GRPOAdvantage(scale="batch"), GRPOAdvantage(scale="none"), RLOOAdvantage()]
)
def test_constant_groups_give_exact_zero_and_no_nan(estimator):
    # 0.1 * 3 has a rounding residue in the mean: the zero must be exact, not 1e-17.
    rewards = torch.tensor([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.5]], dtype=torch.float64)
    adv = estimator(rewards)
    assert not torch.isnan(adv).any()
    assert torch.equal(adv[:3], torch.zeros(3, 3, dtype=torch.float64))
    assert adv[3].abs().sum() > 0


def test_scale_none_is_drgrpo_mean_centering():
    rewards = torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
    expected = rewards - rewards.mean(dim=1, keepdim=True)
    assert torch.allclose(grpo_advantages(rewards, scale="none"), expected)
    assert torch.allclose(DrGRPOAdvantage()(rewards), expected)


def test_batch_scale_uses_group_mean_and_batch_std():
    rewards = torch.tensor([[1.0, 0.0], [4.0, 2.0]])
    expected = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std() + 1e-4)
    assert torch.allclose(grpo_advantages(rewards, scale="batch"), expected)


def test_rloo_equals_hand_computed_leave_one_out():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    # A_i = r_i - mean of the other three
    expected = torch.tensor([[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]])
    assert torch.allclose(rloo_advantages(rewards), expected)
    assert torch.allclose(RLOOAdvantage()(rewards), expected)


@pytest.mark.parametrize("estimator", [GRPOAdvantage(), DrGRPOAdvantage(), RLOOAdvantage()])
def test_advantage_preserves_reward_order_within_group(estimator):
    torch.manual_seed(1)
    rewards = torch.randn(10, 6)
    adv = estimator(rewards)
    assert torch.equal(rewards.argsort(dim=1), adv.argsort(dim=1))


@pytest.mark.parametrize(
    "estimator", [GRPOAdvantage(), GRPOAdvantage(scale="none"), DrGRPOAdvantage(), RLOOAdvantage()]
)
def test_group_size_one_is_a_config_error(estimator):
    with pytest.raises(ValueError, match="group size 1"):
        estimator(torch.tensor([[1.0], [0.0]]))


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="num_groups"):
        grpo_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="NaN"):
        grpo_advantages(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ConfigError, match="scale"):
        GRPOAdvantage(scale="batchy")


def test_to_groups_uses_contiguous_blocks():
    flat = torch.tensor([0.0, 1.0, 2.0, 10.0, 11.0, 12.0])
    groups = to_groups(flat, 3)
    assert groups.tolist() == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
    with pytest.raises(ConfigError, match="groups of 4"):
        to_groups(flat, 4)


def test_reward_group_stats_counts_zero_std_groups():
    stats = reward_group_stats(torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [2.0, 2.0]]))
    assert stats["frac_reward_zero_std"].item() == pytest.approx(0.75)
