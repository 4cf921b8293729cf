"""Sequence Exploration invariants (research notes, UltraHorizon section 5(e))."""

from __future__ import annotations

import json

import pytest

from zoo.agents import SequenceExploration
from zoo.agents.envs.ultrahorizon.sequence import SEQ_RULES, STAGE_RULES, is_prime


def stages(out: dict) -> list[str]:
    return [t["sequence"] for t in out["transformations"][1:]]


@pytest.mark.parametrize(
    ("main", "vice", "problem"),
    [
        ("ABCD", "ABCDE", "exactly 5"),
        ("ABCDEA", "ABCDE", "exactly 5"),
        ("ABCDF", "ABCDE", "Invalid character 'F'"),
        ("abcde", "ABCDE", "Invalid character 'a'"),
        ("AAAAA", "ABCDE", "at least 2 different"),
        ("ABCDE", "CCCCC", "at least 2 different"),
    ],
)
def test_validation_rejects_bad_sequences_without_spending_a_step(main, vice, problem):
    env = SequenceExploration(seed=0)
    out = env.input_sequences(main, vice)
    assert "error" in out and problem in out["error"]
    assert env.total_steps == 0 and env.history == []


def test_hard_output_length_is_20_plus_a():
    env = SequenceExploration(seed=0, required_steps=25)
    for n in range(1, 24):
        out = env.input_sequences("ABCDE", "EDCBA")
        a = n % 10 or 10
        assert len(out["final_output"]) == 20 + a, n
        assert len(stages(out)[0]) == 10 and len(stages(out)[1]) == 20


def test_rule_1_order_flips_with_the_parity_of_the_step():
    env = SequenceExploration(seed=0)
    odd = stages(env.input_sequences("AABBC", "DDEEA"))[0]
    even = stages(env.input_sequences("AABBC", "DDEEA"))[0]
    assert odd == "ADADBEBECA" and even == "DADAEBEBAC"


def test_rule_4_is_the_identity_at_the_first_step_and_adds_the_previous_main_after():
    env = SequenceExploration(seed=0)
    first = stages(env.input_sequences("ABCDE", "EDCBA"))
    assert first[3] == first[2]
    second = stages(env.input_sequences("BBBBA", "EDCBA"))
    expected = "".join(chr((ord(c) - 65 + ord(m) - 65) % 26 + 65) for c, m in zip(second[2][:5], "ABCDE"))
    assert second[3] == expected + second[2][5:]


def test_rule_5_fires_only_on_prime_steps():
    env = SequenceExploration(seed=0, required_steps=30)
    for n in range(1, 30):
        out = stages(env.input_sequences("AABCD", "ABCDE"))
        assert (out[4] != out[3]) == is_prime(n), n


def test_rule_5_breaks_ties_by_first_occurrence():
    env = SequenceExploration(seed=0)
    env.input_sequences("ABCDE", "EDCBA")  # n = 1
    out = stages(env.input_sequences("ABCDE", "EDCBA"))  # n = 2 (prime)
    before, after = out[3], out[4]
    counts = {c: before.count(c) for c in before}
    top = max(counts.values())
    first = next(c for c in before if counts[c] == top)
    assert after == before.replace(first, chr((ord(first) - 65 + 1) % 26 + 65))


def test_easy_chain():
    env = SequenceExploration(seed=0, difficulty="easy")
    out = stages(env.input_sequences("ABCDE", "EDCBA"))
    assert out == ["AEBDCCDBEA", "EEEEE", "EDCDE", "EDCDE", "AABBCCDDEE"]


def test_medium_uses_the_hard_rules_and_history_tools_are_off_by_default():
    assert SequenceExploration(seed=0, difficulty="medium").rules == STAGE_RULES["hard"]
    assert SequenceExploration(seed=0).tools().names == ["input_sequences", "commit_final_result"]
    names = SequenceExploration(seed=0, history_tools=True).tools().names
    assert {"get_game_info", "get_history"} <= set(names)


#: the HARD chain as an agent would write it (not the library's wording)
HARD_ANSWER = {
    "rule_1": "''.join(p + q for p, q in zip(*((main, vice) if len(history) % 2 == 0 else (vice, main))))",
    "rule_2": "''.join(chr((ord(c) - 65 + len(history) + 1) % 26 + 65) for c in cur[::-1] + cur)",
    "rule_3": "cur + cur[(len(history) % 10 + 1) - 1] * (len(history) % 10 + 1)",
    "rule_4": "''.join(chr((ord(a) + ord(b) - 130) % 26 + 65) for a, b in zip(cur, history[-1][0])) + cur[5:] "
    "if history else cur",
    "rule_5": "cur.replace(max(cur, key=cur.count), chr((ord(max(cur, key=cur.count)) - 64) % 26 + 65)) if "
    "len(history) + 1 in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37) else cur",
}


def test_commit_rule_and_rubric_with_the_rule_1_split():
    env = SequenceExploration(seed=0, required_steps=2)
    assert not env.commit_final_result(json.dumps(HARD_ANSWER))["success"]
    env.input_sequences("ABCDE", "EDCBA")
    env.input_sequences("ABCDE", "EDCBA")
    assert "error" in env.input_sequences("ABCDE", "EDCBA")  # budget spent
    main_first = "''.join(a + b for a, b in zip(main, vice))"
    guess = {**HARD_ANSWER, "rule_1": main_first}
    assert env.commit_final_result(json.dumps(guess))["success"]
    assert env.report.total == 85  # rule_1: 5 (interleaving) + 0 (parity lead)
    exact = SequenceExploration(seed=0, free=True)
    exact.commit_final_result(json.dumps(HARD_ANSWER))
    assert exact.report.total == 100
    strict = SequenceExploration(seed=0, free=True, rule1_split=False)
    strict.commit_final_result(json.dumps(guess))
    assert strict.report.total == 80
    not_interleaved = SequenceExploration(seed=0, free=True)
    not_interleaved.commit_final_result(json.dumps({**HARD_ANSWER, "rule_1": "main + vice"}))
    assert not_interleaved.report.total == 80
    bad = SequenceExploration(seed=0, free=True).commit_final_result(json.dumps({**HARD_ANSWER, "rule_3": "magic"}))
    assert not bad["success"] and "rule_3: unknown name 'magic'" in bad["message"]


def test_choice_variant_and_no_candidate_rule_in_the_default_commit():
    description = SequenceExploration(seed=0).tools()["commit_final_result"].description
    assert not any(rule.description in description or rule.id in description for rule in SEQ_RULES.values())
    env = SequenceExploration(seed=0, free=True, commit_format="choice")
    truth = dict(zip([f"rule_{i}" for i in range(1, 6)], STAGE_RULES["hard"]))
    env.commit_final_result(json.dumps({**truth, "rule_1": "interleave_main_first"}))
    assert env.report.total == 85
    bad = SequenceExploration(seed=0, free=True, commit_format="choice")
    assert "rule_3: unknown rule id" in bad.commit_final_result(json.dumps({**truth, "rule_3": "magic"}))["message"]


def test_step_0_transformation_carries_the_official_sequence_text():
    step0 = SequenceExploration(seed=0).input_sequences("ABCDE", "EDCBA")["transformations"][0]
    assert step0 == {
        "step": 0,
        "rule": "input",
        "sequence": "main: ABCDE, vice: EDCBA",
        "main": "ABCDE",
        "vice": "EDCBA",
    }
