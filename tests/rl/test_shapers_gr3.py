"""GR3 rescaling, alpha calibration and the other reward shapers (research/rl.md §2(e), §1(e))."""

from __future__ import annotations

import doctest

import pytest
import torch

import zoo.rl.gr3 as gr3_mod
from zoo.rl import (
    AdditiveLengthPenalty,
    DAPOOverlongPenalty,
    GR3Shaper,
    NoShaping,
    calibrate_alpha,
    gr3_rescale,
    grpo_advantages,
    rlhf_sigmoid,
    satisfaction_rate,
    satisfied_groups,
    soft_overlong_punishment,
)


def test_doctests_pass():
    assert doctest.testmod(gr3_mod).failed == 0


def test_hand_computed_rescale():
    r = torch.tensor([[1.0, 0.5, 1.0, 0.0]])
    lengths = torch.tensor([[10.0, 20.0, 30.0, 20.0]])  # mean 20
    expected = torch.tensor([[1.0 / 1.25, 0.5 / 1.5, 1.0 / 1.75, 0.0]])
    assert torch.allclose(gr3_rescale(r, lengths, alpha=0.5), expected)


def test_alpha_zero_gives_plain_grpo_advantages():
    torch.manual_seed(0)
    rewards = torch.rand(6, 8)
    lengths = torch.randint(1, 50, (6, 8))
    shaped = GR3Shaper(alpha=0.0)(rewards, lengths)
    assert torch.equal(shaped, rewards)
    assert torch.equal(grpo_advantages(shaped), grpo_advantages(rewards))


def test_zero_reward_stays_zero():
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.7]])
    lengths = torch.tensor([[5, 40, 90, 3]])
    out = gr3_rescale(rewards, lengths, alpha=2.0)
    assert out[0, 0] == 0.0
    assert out[0, 2] == 0.0


def test_scaling_lengths_by_a_constant_leaves_rescaled_rewards_unchanged():
    torch.manual_seed(2)
    rewards = torch.rand(4, 6)
    lengths = torch.randint(1, 100, (4, 6)).float()
    c = torch.tensor([[0.5], [3.0], [7.0], [11.0]])  # a different constant per group
    assert torch.allclose(gr3_rescale(rewards, lengths, 0.4), gr3_rescale(rewards, lengths * c, 0.4), atol=1e-6)


def test_equal_positive_rewards_favour_the_shorter_response():
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.3]])
    lengths = torch.tensor([[10.0, 30.0, 20.0, 20.0]])
    shaped = gr3_rescale(rewards, lengths, alpha=0.3)
    adv = grpo_advantages(shaped)
    assert shaped[0, 0] > shaped[0, 1]
    assert adv[0, 0] > adv[0, 1]


def test_binary_rewards_every_correct_beats_every_incorrect():
    torch.manual_seed(3)
    rewards = (torch.rand(200, 8) > 0.5).float()
    lengths = torch.randint(1, 200, (200, 8))
    adv = grpo_advantages(GR3Shaper(alpha=1.0)(rewards, lengths))
    for r, a in zip(rewards, adv):
        if 0 < r.sum() < len(r):
            assert a[r == 1].min() > a[r == 0].max()


def test_negative_rewards_raise():
    with pytest.raises(ValueError, match="non-negative"):
        gr3_rescale(torch.tensor([[1.0, -0.5]]), torch.tensor([[3, 4]]), 0.3)
    with pytest.raises(ValueError, match="rlhf_sigmoid"):
        GR3Shaper(alpha=0.3)(torch.tensor([[1.0, -0.5]]), torch.tensor([[3, 4]]))


def test_rlhf_sigmoid_mode_accepts_raw_reward_model_scores():
    raw = torch.tensor([[-3.0, -1.0, 2.0], [5.0, 5.0, 9.0]])
    squashed = rlhf_sigmoid(raw, temperature=2.0)
    assert torch.all((squashed > 0) & (squashed < 1))
    assert torch.allclose(squashed[:, 1], torch.full((2,), 0.5))  # the group median maps to 0.5
    assert torch.allclose(squashed[0, 2], torch.sigmoid(torch.tensor(1.5)))
    lengths = torch.tensor([[10, 20, 30], [10, 20, 30]])
    shaped = GR3Shaper(alpha=0.5, rlhf_sigmoid=True)(raw, lengths)
    assert torch.allclose(shaped, gr3_rescale(squashed, lengths, 0.5))


def test_empty_group_is_not_rescaled_and_bad_inputs_raise():
    assert torch.equal(gr3_rescale(torch.tensor([[1.0, 0.0]]), torch.tensor([[0, 0]]), 0.5), torch.tensor([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="alpha"):
        gr3_rescale(torch.tensor([[1.0, 0.0]]), torch.tensor([[1, 2]]), -0.1)
    with pytest.raises(ValueError, match="lengths"):
        gr3_rescale(torch.tensor([[1.0, 0.0]]), torch.tensor([[1, -2]]), 0.1)


def test_alpha_zero_satisfies_every_group_and_all_correct_unequal_lengths_violate():
    torch.manual_seed(4)
    rewards = torch.rand(50, 8)
    lengths = torch.randint(1, 100, (50, 8))
    assert satisfaction_rate(rewards, lengths, 0.0) == 1.0
    all_correct = torch.ones(3, 4)
    unequal = torch.tensor([[10, 20, 30, 40], [1, 1, 1, 5], [7, 8, 9, 10]])
    for alpha in (0.01, 0.3, 1.0):
        assert not satisfied_groups(all_correct, unequal, alpha).any()
    # equal lengths: equality r_max / (1 + alpha) == mean, kept by the tolerance
    assert satisfied_groups(all_correct, torch.full((3, 4), 7), 0.3).all()


def test_calibration_picks_the_largest_satisfying_alpha_on_a_hand_built_example():
    # Constraint per group: r_max / (1 + a) >= mean_g r_i / (1 + a * l_i / l_bar).
    #   group A, r=[1, 0],    l=[1, 3]: 1/(1+a) >= 0.5/(1+0.5a) <=> 1 + 0.5a >= 0.5 + 0.5a: holds for every a.
    #   group B, r=[1, 1],    l=[1, 3]: all correct, unequal lengths: fails for every a > 0 (Jensen).
    #   group C, r=[1, 0.95], l=[3, 1]: 1/(1+a) >= (1/(1+1.5a) + 0.95/(1+0.5a)) / 2:
    #            margin +0.0219 at a=0.1, +0.0010 at a=0.5, -0.0167 at a=1, -0.0292 at a=2.
    rewards = torch.tensor([[1.0, 0.0]] * 6 + [[1.0, 1.0]] + [[1.0, 0.95]] * 3)
    lengths = torch.tensor([[1, 3]] * 6 + [[1, 3]] + [[3, 1]] * 3)
    grid = [0.5, 0.0, 2.0, 0.1, 1.0]  # unsorted on purpose
    result = calibrate_alpha(rewards, lengths, grid, target_fraction=0.9)
    assert result.alphas == (0.0, 0.1, 0.5, 1.0, 2.0)
    # a=0: all 10 groups; 0 < a <= 0.5: B fails -> 9/10; a >= 1: B and C fail -> 6/10
    assert result.rates == pytest.approx((1.0, 0.9, 0.9, 0.6, 0.6))
    assert result.alpha == 0.5
    assert result.satisfied
    assert calibrate_alpha(rewards, lengths, grid, target_fraction=0.6).alpha == 2.0
    assert calibrate_alpha(rewards, lengths, grid, target_fraction=1.0).alpha == 0.0
    # constant-reward groups excluded -> B no longer counts: 9/9 up to a = 0.5
    assert calibrate_alpha(rewards, lengths, grid, target_fraction=1.0, exclude_constant_groups=True).alpha == 0.5
    assert GR3Shaper(alpha=0.5).satisfaction_rate(rewards, lengths) == pytest.approx(0.9)


def test_calibration_without_a_passing_grid_value_falls_back_to_zero():
    result = calibrate_alpha(torch.ones(2, 2), torch.tensor([[1, 3], [2, 5]]), [0.2, 0.4], target_fraction=0.5)
    assert result.alpha == 0.0
    assert not result.satisfied
    assert result.as_dict() == {0.2: 0.0, 0.4: 0.0}


def test_no_shaping_is_identity():
    r = torch.tensor([[1.0, -2.0]])
    assert torch.equal(NoShaping()(r, torch.tensor([[3, 4]])), r)


def test_additive_length_penalty():
    r = torch.tensor([[1.0, 0.0]])
    lengths = torch.tensor([[50, 100]])
    expected = torch.tensor([[1.0 - 0.2 * 0.5, -0.2]])
    assert torch.allclose(AdditiveLengthPenalty(lam=0.2, max_length=100)(r, lengths), expected)
    assert torch.allclose(AdditiveLengthPenalty(lam=0.2)(r, lengths, max_length=100), expected)
    with pytest.raises(ValueError, match="max_length"):
        AdditiveLengthPenalty(lam=0.2)(r, lengths)


def test_dapo_overlong_three_regimes():
    lengths = torch.tensor([[50, 80, 90, 100, 120]])
    expected = torch.tensor([[0.0, 0.0, -0.5, -1.0, -1.0]])
    assert torch.allclose(soft_overlong_punishment(lengths, max_length=100, buffer=20), expected)
    shaped = DAPOOverlongPenalty(max_length=100, buffer=20)(torch.ones(1, 5), lengths)
    assert torch.allclose(shaped, 1.0 + expected)
    shaped_call = DAPOOverlongPenalty(buffer=20, penalty_factor=0.5)(torch.ones(1, 5), lengths, max_length=100)
    assert torch.allclose(shaped_call, 1.0 + 0.5 * expected)
