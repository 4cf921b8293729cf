"""Synthetic tasks: determinism, exact verifiers, answer extraction, redundancy labels, held-out splits."""

import random

import pytest

from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition, MultiSum, Reverse, extract_answer, split_steps


@pytest.mark.parametrize("task", [Addition(3), MultiSum(redundant_prob=0.5), Reverse()])
def test_deterministic_and_verifiable(task):
    a = task.examples(50, seed=7)
    assert a == task.examples(50, seed=7)
    assert a != task.examples(50, seed=8)
    for ex in a:
        assert task.verify(ex.completion + "<eos>", ex.answer)
        assert not task.verify(ex.completion.rsplit("</think>", 1)[0] + "</think>" + ex.answer + "0", ex.answer)
        assert not task.verify(ex.completion.split("</think>")[0], ex.answer)  # no closed reasoning block


def test_addition_steps_carry_and_sum():
    for ex in Addition(4).examples(200, seed=0):
        a, b = map(int, ex.prompt[:-1].split("+"))
        assert ex.answer == str(a + b)
        assert len(split_steps(ex.completion)) == max(len(str(a)), len(str(b)))


def test_multisum_redundancy_labels_match_the_steps():
    task = MultiSum(min_operands=4, max_operands=6, redundant_prob=0.5)
    total_redundant = 0
    for ex in task.examples(200, seed=1):
        steps = split_steps(ex.completion)
        assert len(steps) == len(ex.meta["step_redundant"])
        for step, redundant in zip(steps, ex.meta["step_redundant"]):
            assert step.startswith("check ") == redundant
        assert ex.answer == str(sum(map(int, ex.prompt[:-1].split("+"))))
        total_redundant += ex.meta["num_redundant"]
    assert total_redundant > 0
    assert all(ex.meta["num_redundant"] == 0 for ex in MultiSum(redundant_prob=0.0).examples(50, seed=1))


def test_reverse_answer():
    ex = Reverse().sample(random.Random(0))
    assert ex.answer == ex.prompt[4:-1][::-1]


def test_extract_answer():
    assert extract_answer("<think>x</think> 42 <eos><pad>") == "42"
    assert extract_answer("no think") is None


def test_task_source_held_out_prompts_never_in_train():
    source = TaskSource(Addition(2), num_train=3000, num_val=300, num_test=300, seed=0)
    train = {r["prompt"] for r in source.rows("train")}
    held = {r["prompt"] for r in source.rows("val")} | {r["prompt"] for r in source.rows("test")}
    assert len(train) > 1000
    assert not train & held
