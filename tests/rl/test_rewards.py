"""Reward functions (TRL signature) and their validation."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from zoo.answers import extract_answer
from zoo.rl import (
    ExactMatchReward,
    FormatReward,
    LengthBiasedProxyReward,
    RewardFunctionError,
    WeightedSumReward,
    reward_matrix,
    score_rewards,
)

PROMPTS = ["1+2=", "3+4=", "5+5="]
COMPLETIONS = ["<think>1+2=3</think>3", "<think>3+4</think> 8 ", "no tags 10"]
ANSWERS = ["3", "7", "10"]


def test_extract_answer_default_extractor():
    assert extract_answer("<think>a</think>  42 \n") == "42"
    assert extract_answer("<think>a</think>1</think>2") == "2"
    assert extract_answer("42") is None


def test_exact_match_reward():
    fn = ExactMatchReward()
    assert fn(PROMPTS, COMPLETIONS, answer=ANSWERS) == [1.0, 0.0, 0.0]
    assert fn(["p"], ["<think></think> 7"], answer=[7]) == [1.0]  # non-string answers are compared as text
    last_token = ExactMatchReward(extractor=lambda c: c.split()[-1])
    assert last_token(PROMPTS, COMPLETIONS, answer=ANSWERS) == [0.0, 0.0, 1.0]
    dotted = ExactMatchReward(extractor="zoo.answers.extract_answer", correct_reward=2.0)
    assert dotted(PROMPTS, COMPLETIONS, answer=ANSWERS) == [2.0, 0.0, 0.0]
    with pytest.raises(RewardFunctionError, match="'exact_match'.*'answer'"):
        fn(PROMPTS, COMPLETIONS, solution=ANSWERS)


@pytest.mark.parametrize(
    ("completion", "ok"),
    [
        ("<think>step</think>42", True),
        ("  <think>\nstep\n</think>\n 42\n", True),
        ("<think></think>42", True),
        ("<think>step</think>   ", False),
        ("<think>step 42", False),
        ("step</think>42", False),
        ("42", False),
        ("<think>a</think>4<think>b</think>2", False),
    ],
)
def test_format_reward(completion, ok):
    assert FormatReward()(["p"], [completion]) == [1.0 if ok else 0.0]


def test_format_reward_can_require_a_nonempty_think():
    assert FormatReward(require_nonempty_think=True)(["p", "p"], ["<think> </think>1", "<think>x</think>1"]) == [0, 1]


def test_length_biased_proxy_grows_with_length_regardless_of_correctness_and_is_bounded():
    rm = LengthBiasedProxyReward(max_length=40, kappa=1.5)
    pads = [0, 5, 10, 20, 30, 60]
    correct = [f"<think>{'.' * k}</think>3" for k in pads]
    wrong = [f"<think>{'.' * k}</think>4" for k in pads]
    r_correct = rm(["p"] * len(pads), correct, answer=["3"] * len(pads))
    r_wrong = rm(["p"] * len(pads), wrong, answer=["3"] * len(pads))
    for scores in (r_correct, r_wrong):
        assert all(0.0 < s < 1.0 for s in scores)
        assert all(a < b for a, b in zip(scores[:4], scores[1:5]))  # strictly increasing below L_max
        assert scores[-1] == scores[-2]  # saturated beyond L_max (both lengths > 40)
    assert all(c > w for c, w in zip(r_correct, r_wrong))
    # the notes' formula: sigmoid(2 * correct - 1 + kappa * l / L_max)
    length = len(correct[1])
    assert r_correct[1] == pytest.approx(1 / (1 + math.exp(-(1.0 + 1.5 * length / 40))))
    # with a stronger bias a long wrong answer outscores a short correct one
    strong = LengthBiasedProxyReward(max_length=100, kappa=3.0)
    short_correct, long_wrong = "<think></think>3", "<think>" + "." * 90 + "</think>4"
    wrong_score, correct_score = strong(["p", "p"], [long_wrong, short_correct], answer=["3", "3"])
    assert wrong_score > correct_score


def test_length_biased_proxy_logit_mode_and_pure_length_mode():
    rm = LengthBiasedProxyReward(max_length=100, output="logit")
    assert rm(["p"], ["<think></think>9"], answer=["3"])[0] < 0
    pure = LengthBiasedProxyReward(max_length=10, correctness_weight=0.0)
    short, long = pure(["p", "p"], ["ab", "abcd"])  # no answer column needed
    assert short < long


def test_weighted_sum_reward():
    combo = WeightedSumReward([ExactMatchReward(), FormatReward()], weights=[1.0, 0.5])
    assert combo(PROMPTS, COMPLETIONS, answer=ANSWERS) == [1.5, 0.5, 0.0]
    by_name = WeightedSumReward({"acc": ExactMatchReward(), "fmt": FormatReward()}, weights={"fmt": 0.25})
    assert by_name(PROMPTS, COMPLETIONS, answer=ANSWERS) == [1.25, 0.25, 0.0]
    assert by_name.__name__ == "weighted_sum"


def _nan_reward(prompts, completions, **columns):
    return [1.0, float("nan"), 0.0]


def _short_reward(prompts, completions, **columns):
    return [1.0]


def test_score_rewards_sums_with_weights():
    out = score_rewards([ExactMatchReward(), FormatReward()], [2.0, 1.0], PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert torch.equal(out, torch.tensor([3.0, 1.0, 0.0]))
    matrix = reward_matrix([ExactMatchReward(), FormatReward()], PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert matrix.shape == (3, 2)


@pytest.mark.parametrize(
    ("fn", "pattern"),
    [
        (_nan_reward, r"'_nan_reward'.*NaN.*1: nan"),
        (_short_reward, r"'_short_reward' returned 1 rewards for 3 completions"),
        (functools.partial(_short_reward), r"'_short_reward'"),
    ],
)
def test_bad_reward_output_raises_naming_the_function(fn, pattern):
    with pytest.raises(ValueError, match=pattern):
        score_rewards([FormatReward(), fn], None, PROMPTS, COMPLETIONS, {})


def test_weight_count_mismatch_raises():
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        score_rewards([FormatReward()], [1.0, 2.0], PROMPTS, COMPLETIONS, {})
