"""N-MARS reward (zoo.rl.nmars): the orderings the method needs, hand-computed values, and its TRL signature."""

from __future__ import annotations

import math

import pytest

from zoo.backbones import build_char_tokenizer
from zoo.errors import ConfigError
from zoo.generation.undo import UNDO_TOKEN, trace_undo
from zoo.rl import RewardFunctionError, reward_matrix
from zoo.rl.nmars import BacktrackWeights, NMarsReward, backtrack_term, outcome_term, token_accuracy
from zoo.vocab import register_new_tokens

REFERENCE = "<think>1+2=3</think>3"


@pytest.fixture(scope="module")
def tok():
    tokenizer = build_char_tokenizer()
    register_new_tokens(tokenizer, [UNDO_TOKEN], first_id=len(tokenizer))
    return tokenizer


def enc(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def score(tok, completion_ids: list[list[int]], **kwargs) -> list[float]:
    reward = NMarsReward(tokenizer=tok, **kwargs)
    return reward(
        ["1+2="] * len(completion_ids),
        [""] * len(completion_ids),
        completion_ids=completion_ids,
        reference=[REFERENCE] * len(completion_ids),
    )


def test_token_accuracy_and_outcome():
    assert token_accuracy([1, 2, 3], [1, 2, 3]) == 1.0
    assert token_accuracy([1, 9, 3, 4], [1, 2, 3]) == pytest.approx(2 / 3)
    assert token_accuracy([], [1, 2]) == 0.0
    assert outcome_term([1, 2], [1, 2]) == 1.0
    assert outcome_term([1, 9], [1, 2]) == pytest.approx(0.25)


def test_orderings(tok):
    u, eos = tok.convert_tokens_to_ids(UNDO_TOKEN), tok.eos_token_id
    ref = enc(tok, REFERENCE)  # 8 tokens: <think> 1 + 2 = 3 </think> 3
    wrong = enc(tok, "4")[0]
    correct = ref + [eos]
    unnecessary_mid = ref[:5] + [u] + ref[4:] + [eos]  # retracts the correct '=' and writes it again
    unnecessary_end = ref + [u] + ref[-1:] + [eos]  # retracts the final answer and writes it again
    corrected = ref[:5] + [wrong, u] + ref[5:] + [eos]  # '4' -> UNDO -> '3'
    uncorrected = ref[:5] + [wrong] + ref[6:] + [eos]
    failed = ref[:5] + [wrong, u, enc(tok, "5")[0]] + ref[6:] + [eos]
    r = dict(
        zip(
            ["correct", "mid", "end", "corrected", "uncorrected", "failed"],
            score(tok, [correct, unnecessary_mid, unnecessary_end, corrected, uncorrected, failed]),
        )
    )
    assert r["correct"] > r["mid"] and r["correct"] > r["end"]  # correct without undo > with an unnecessary one
    assert r["corrected"] > r["uncorrected"] and r["corrected"] > r["failed"]  # wrong -> right beats wrong
    assert r["uncorrected"] > r["failed"]  # a failed correction costs more than leaving the error (-0.3 vs -0.1)
    # hand-computed: 1 + 0.3 format; corrected: first attempt 5/8 right -> bonus 0.4 * 3/8 + 0.25 / sqrt(1)
    assert r["correct"] == pytest.approx(1.0 + 0.3)
    assert r["corrected"] == pytest.approx(1.0 + 0.6 * (0.4 * 3 / 8 + 0.25) + 0.3)
    assert r["mid"] == pytest.approx(1.0 - 0.6 * 0.2 + 0.3)
    assert r["uncorrected"] == pytest.approx(0.5 * 7 / 8 - 0.6 * 0.1 + 0.3)
    # the WIP code's check pays the bonus for the mid-sequence unnecessary undo (the loophole the default closes)
    wip = dict(
        zip(
            ["correct", "mid", "end"],
            score(tok, [correct, unnecessary_mid, unnecessary_end], first_attempt_check="exact"),
        )
    )
    assert wip["mid"] > wip["correct"] > wip["end"]


def test_backtrack_term_edge_cases():
    ref = [1, 2, 3, 4]
    u = 9
    assert backtrack_term(trace_undo([1, 2, 3, 4], u), ref) == 0.0
    assert backtrack_term(trace_undo([1, 2, 5, 4], u), ref) == pytest.approx(-0.1)
    excessive = [1] + [5, u] * 21 + [2, 3, 4]
    assert backtrack_term(trace_undo(excessive, u), ref) == -1.0
    # a correction after a short first attempt is stuttering: -0.2 per UNDO
    assert backtrack_term(trace_undo([7, u, 1, 2, 3, 4], u), ref) == pytest.approx(-0.2)
    # the efficiency bonus falls with the number of UNDOs
    two = backtrack_term(trace_undo([1, 2, 3, 7, 7, u, u, 4], u), ref)
    assert two == pytest.approx(0.4 * (1 - 3 / 4) + 0.25 / math.sqrt(2))
    with pytest.raises(ConfigError, match="first_attempt_check"):
        BacktrackWeights(first_attempt_check="maybe")


def test_the_reward_has_trl_signature_and_clear_errors(tok):
    u = tok.convert_tokens_to_ids(UNDO_TOKEN)
    ids = enc(tok, REFERENCE)
    reward = NMarsReward(tokenizer=tok)
    # through the zoo's reward caller, by name, with columns
    matrix = reward_matrix({"nmars": reward}, ["p"], ["ignored"], {"completion_ids": [ids], "reference": [REFERENCE]})
    assert matrix.shape == (1, 1) and float(matrix[0, 0]) == pytest.approx(1.3)
    with pytest.raises(RewardFunctionError, match="needs completion_ids"):
        reward(["p"], ["c"], reference=[REFERENCE])
    with pytest.raises(RewardFunctionError, match="column 'reference'"):
        reward(["p"], ["c"], completion_ids=[ids])
    with pytest.raises(ConfigError, match="no tokenizer"):
        NMarsReward()(["p"], ["c"], completion_ids=[ids + [u]], reference=[REFERENCE])
    # bound later by the GRPO module
    late = NMarsReward()
    late.bind_tokenizer(tok)
    assert late(["p"], ["c"], completion_ids=[ids], reference=[REFERENCE]) == reward(
        ["p"], ["c"], completion_ids=[ids], reference=[REFERENCE]
    )
    with pytest.raises(ConfigError, match="has no '<UNDO>' token"):
        NMarsReward(tokenizer=build_char_tokenizer())(["p"], ["c"], completion_ids=[ids], reference=[REFERENCE])
