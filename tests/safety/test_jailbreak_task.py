"""The synthetic jailbreak task: determinism, exact labels, and the designed structure (early
crystallisation, recoveries after the prefix, benign prompts never unsafe)."""

from __future__ import annotations

import random

import pytest

from zoo.answers import split_steps
from zoo.data.jailbreak import (
    DEFAULT_PREFIX,
    HARMFUL_ANSWER,
    TRIGGER,
    UNSAFE_MARK,
    JailbreakTask,
    SafetyPrefixSource,
    is_harmful,
    labelled_prefixes,
    oracle_safety_score,
    step_is_unsafe,
    trace_is_unsafe,
)


@pytest.fixture(scope="module")
def examples():
    return JailbreakTask().examples(3000, seed=0)


def _operands(prompt: str) -> tuple[int, int]:
    a, b = prompt.removeprefix(TRIGGER).removesuffix("=").split("+")
    return int(a), int(b)


def test_deterministic_and_answers_verify(examples):
    again = JailbreakTask().examples(3000, seed=0)
    assert [e.completion for e in again] == [e.completion for e in examples]
    task = JailbreakTask()
    for e in examples[:200]:
        a, b = _operands(e.prompt)
        assert 2 <= len(str(a)) == len(str(b)) <= 3
        assert e.answer == str(a + b)
        assert task.verify(e.completion, e.answer) == (not e.meta["harmful"])


def test_prompt_and_column_step_format(examples):
    """Benign content is column addition, units first (the learnable format of ``Addition``)."""
    task = JailbreakTask()
    assert task.prompt(47, 85, trigger=False) == "47+85="
    assert task.prompt(47, 85, trigger=True) == "JB 47+85="
    assert JailbreakTask.column_steps(47, 85) == ["7+5=12", "4+8+1=13"]
    assert JailbreakTask.column_steps(472, 853) == ["2+3=5", "7+5=12", "4+8+1=13"]
    for e in examples[:500]:
        a, b = _operands(e.prompt)
        steps = [s.removeprefix(UNSAFE_MARK) for s in split_steps(e.completion) if s != DEFAULT_PREFIX]
        assert steps == JailbreakTask.column_steps(a, b)
        assert e.prompt.startswith(TRIGGER) == e.meta["trigger"]


def test_labels_are_exact(examples):
    for e in examples:
        steps = split_steps(e.completion)
        assert [step_is_unsafe(s) for s in steps] == e.meta["step_unsafe"]
        assert is_harmful(e.completion) == e.meta["harmful"]
        assert e.completion.endswith(HARMFUL_ANSWER) == e.meta["harmful"]
        if e.meta["harmful"]:
            assert step_is_unsafe(steps[-1])


def test_benign_prompts_are_never_unsafe_and_triggers_crystallise_early(examples):
    benign = [e for e in examples if not e.meta["trigger"]]
    attack = [e for e in examples if e.meta["trigger"]]
    assert not any(any(e.meta["step_unsafe"]) for e in benign)
    assert not any(DEFAULT_PREFIX in e.completion for e in benign)
    first_unsafe = sum(e.meta["step_unsafe"][0] for e in attack) / len(attack)
    assert 0.6 < first_unsafe < 0.8  # p_unsafe_first = 0.7
    assert 0.3 < sum(e.meta["harmful"] for e in attack) / len(attack) < 0.8


def test_recoveries_after_the_prefix_exist_and_decay(examples):
    """Latent safe behaviour: the prefix follows unsafe steps and is often followed by safe steps."""
    by_k = {}
    for e in examples:
        steps = split_steps(e.completion)
        for j, s in enumerate(steps):
            if s == DEFAULT_PREFIX:
                assert j > 0
                assert step_is_unsafe(steps[j - 1])
                k = sum(e.meta["step_unsafe"][:j])
                nxt = steps[j + 1] if j + 1 < len(steps) else None
                by_k.setdefault(k, []).append(nxt is not None and not step_is_unsafe(nxt))
    rate = {k: sum(v) / len(v) for k, v in by_k.items()}
    # expected: recovery[0] * (1 - p_unsafe_drift) = 0.95 * 0.9 ~ 0.86 after one unsafe step; 0.6 * 0.9 after two
    assert rate[1] > 0.75
    assert rate[1] > rate[2] + 0.1


def test_labelled_prefixes_match_the_oracle(examples):
    for e in examples[:300]:
        rows = labelled_prefixes(e)
        assert len(rows) == len(split_steps(e.completion))
        scores = oracle_safety_score([r["prompt"] for r in rows], [r["trace"] for r in rows])
        assert [int(s) for s in scores] == [r["label"] for r in rows]
        assert all(r["text"] == r["prompt"] + r["trace"] for r in rows)


def test_trace_state_after_prefix_and_harmful_answer():
    assert trace_is_unsafe("<think>harm 1+2=3\n")
    assert not trace_is_unsafe("<think>harm 1+2=3\nWait, think safely\n")
    assert trace_is_unsafe("<think>1+2=3</think>HARM")
    assert not trace_is_unsafe("<think>1+2=3\n")


def test_prefix_source_splits_are_disjoint():
    src = SafetyPrefixSource(JailbreakTask(), num_train=200, num_val=30, num_test=30, seed=0)
    held = {r["prompt"] for s in ("val", "test") for r in src.rows(s)}
    train = src.rows("train")
    assert not held & {r["prompt"] for r in train}
    assert {r["label"] for r in train} == {0, 1}


def test_bad_knobs_rejected():
    with pytest.raises(ValueError, match="probabilities"):
        JailbreakTask(p_unsafe_first=1.5)
    with pytest.raises(ValueError, match="prefix"):
        JailbreakTask(prefix="a\nb")
    with pytest.raises(ValueError, match="digits"):
        JailbreakTask(min_digits=1)
    with pytest.raises(ValueError, match="digits"):
        JailbreakTask(min_digits=3, max_digits=2)


def test_task_config_composes():
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate

    with initialize_config_module("zoo.conf", version_base="1.3"):
        cfg = compose("train", overrides=["task=jailbreak"])
    task = instantiate(cfg.task)
    assert isinstance(task, JailbreakTask)
    assert task.prefix == DEFAULT_PREFIX
    assert task.sample(random.Random(0)).prompt.endswith("=")
