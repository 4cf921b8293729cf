"""The synthetic jailbreak task: determinism, exact labels, and the designed structure (early
crystallisation, recoveries after the prefix, benign prompts never unsafe)."""

from __future__ import annotations

import random

import pytest

from zoo.data.jailbreak import (
    DEFAULT_PREFIX,
    HARMFUL_ANSWER,
    JailbreakTask,
    SafetyPrefixSource,
    is_harmful,
    labelled_prefixes,
    oracle_safety_score,
    step_is_unsafe,
    trace_is_unsafe,
)
from zoo.data.tasks import split_steps


@pytest.fixture(scope="module")
def examples():
    return JailbreakTask().examples(3000, seed=0)


def test_deterministic_and_answers_verify(examples):
    again = JailbreakTask().examples(3000, seed=0)
    assert [e.completion for e in again] == [e.completion for e in examples]
    task = JailbreakTask()
    for e in examples[:200]:
        ops = [int(c) for c in e.prompt.split("add ")[1] if c.isdigit()]
        assert e.answer == str(sum(ops) % 10)
        assert task.verify(e.completion, e.answer) == (not e.meta["harmful"])


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
    assert rate[1] > 0.85
    assert rate[1] > rate.get(2, 0.0)


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
    with pytest.raises(ValueError, match="operands"):
        JailbreakTask(min_operands=1)


def test_task_config_composes():
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate

    with initialize_config_module("zoo.conf", version_base="1.3"):
        cfg = compose("train", overrides=["task=jailbreak"])
    task = instantiate(cfg.task)
    assert isinstance(task, JailbreakTask)
    assert task.prefix == DEFAULT_PREFIX
    assert task.sample(random.Random(0)).prompt.endswith("=")
