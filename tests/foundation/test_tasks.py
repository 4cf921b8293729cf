"""Synthetic tasks: determinism, exact verifiers, answer extraction, redundancy labels, held-out splits."""

import hashlib
import json
import random

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.answers import extract_answer, split_steps
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition, MultiSum, Reverse
from zoo.errors import ConfigError

from conftest import REPO_ROOT


@pytest.mark.parametrize(
    "task",
    [
        Addition(3),
        MultiSum(redundant_prob=0.5),
        MultiSum(redundant_prob=0.5, min_operands=4, max_operands=6, partials="pairs"),
        MultiSum(redundant_prob=0.5, min_operands=4, max_operands=6, min_value=2, max_value=4, partials="products"),
        Reverse(),
    ],
)
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


def rows_digest(task: MultiSum, n: int = 200, seed: int = 0) -> str:
    rows = [e.as_row() for e in task.examples(n, seed=seed)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize(
    ("kwargs", "digest"),
    [  # digests of the rows drawn before the ``partials`` option existed: the default layout must not change
        ({}, "48a6b3dcbec57c7625b35e69201369ddb3bd778cb8ec7e4dd3998cd8e264c740"),
        ({"redundant_prob": 0.3}, "860d10a706851e675090728066fddce4b19f78774a98f5671fe5fe94fe945595"),
        (
            {"min_operands": 4, "max_operands": 6, "redundant_prob": 0.5},
            "522cb9538ff913727254c571f9cbc6c894ce1e84e89961d1878345b2a88b58f9",
        ),
    ],
)
def test_multisum_chain_rows_are_unchanged(kwargs, digest):
    assert rows_digest(MultiSum(**kwargs)) == digest
    assert rows_digest(MultiSum(**kwargs, partials="chain")) == digest


def test_multisum_chain_seeded_example_text():
    ex = MultiSum(redundant_prob=0.3).examples(2, seed=0)[1]
    assert ex.prompt == "5+9+3+8="
    assert ex.completion == "<think>5+9=14\ncheck 14\n14+3=17\ncheck 17\n17+8=25\ncheck 25</think>25"


def test_multisum_pairs_seeded_example_text():
    ex = MultiSum(min_operands=4, max_operands=6, redundant_prob=0.5, partials="pairs").examples(3, seed=0)[1]
    assert ex.prompt == "9+3+8+2+4+2="
    assert ex.completion == "<think>9+3=12\n8+2=10\n4+2=6\ncheck 6</think>28"
    assert ex.answer == "28"
    assert ex.meta == {"num_steps": 4, "step_redundant": [False, False, False, True], "num_redundant": 1}


def test_multisum_pairs_lines_labels_and_answer():
    task = MultiSum(min_operands=4, max_operands=6, redundant_prob=0.5, partials="pairs")
    pair_counts, redundant, lines = set(), 0, 0
    for ex in task.examples(300, seed=2):
        ops = list(map(int, ex.prompt[:-1].split("+")))
        assert len(ops) in (4, 6)
        pair_counts.add(len(ops) // 2)
        steps = split_steps(ex.completion)
        assert len(steps) == len(ex.meta["step_redundant"]) == ex.meta["num_steps"]
        essential = [s for s, r in zip(steps, ex.meta["step_redundant"]) if not r]
        # one essential line per disjoint pair, in order, holding that pair's sum
        assert essential == [f"{a}+{b}={a + b}" for a, b in zip(ops[0::2], ops[1::2])]
        for i, (step, is_redundant) in enumerate(zip(steps, ex.meta["step_redundant"])):
            assert step.startswith("check ") == is_redundant
            if is_redundant:  # a check repeats the sum of the pair line just before it
                assert i > 0 and not ex.meta["step_redundant"][i - 1]
                assert step == "check " + steps[i - 1].split("=")[1]
        assert ex.answer == str(sum(ops))
        assert ex.completion.endswith(f"</think>{ex.answer}")
        assert ex.meta["num_redundant"] == sum(ex.meta["step_redundant"])
        redundant += ex.meta["num_redundant"]
        lines += len(essential)
    assert pair_counts == {2, 3}
    assert 0.4 < redundant / lines < 0.6  # one check per pair line with probability 0.5
    assert all(
        ex.meta["num_redundant"] == 0
        for ex in MultiSum(min_operands=4, max_operands=6, partials="pairs").examples(50, seed=1)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_operands": 3, "max_operands": 6, "partials": "pairs"}, "must be even and at least 4"),
        ({"min_operands": 4, "max_operands": 5, "partials": "pairs"}, "must be even and at least 4"),
        ({"min_operands": 2, "max_operands": 4, "partials": "pairs"}, "must be even and at least 4"),
        ({"partials": "tree"}, "task.partials must be one of"),
        ({"min_operands": 5, "max_operands": 4}, "min_operands <= max_operands"),
        ({"min_value": 5, "max_value": 4}, "task.min_value <= task.max_value"),
        ({"min_value": -1}, "task.min_value <= task.max_value"),
    ],
)
def test_multisum_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MultiSum(**kwargs)


def test_multisum_pairs_redundant_config():
    conf = REPO_ROOT / "conf" / "task"
    cfg = OmegaConf.merge(
        OmegaConf.load(conf / "multisum.yaml"), OmegaConf.load(conf / "multisum_pairs_redundant.yaml")
    )
    cfg.pop("defaults")
    task = instantiate(cfg)
    assert isinstance(task, MultiSum) and task.partials == "pairs" and task.redundant_prob == 0.5
    examples = task.examples(100, seed=0)
    assert {len(ex.prompt[:-1].split("+")) for ex in examples} == {4, 6}
    # no operand 0: no pair sum repeats an operand of the prompt
    assert {int(x) for ex in examples for x in ex.prompt[:-1].split("+")} == set(range(1, task.max_value + 1))


def test_multisum_products_lines_labels_answer_and_distinct_pairs():
    task = MultiSum(min_operands=4, max_operands=6, min_value=2, max_value=4, redundant_prob=0.5, partials="products")
    assert task.examples(2, seed=0)[1].prompt == "2*4+3*4+4*4="
    assert task.examples(2, seed=0)[1].completion == "<think>2*4=8\n3*4=12\ncheck 12\n4*4=16</think>36"
    pair_counts, redundant, lines = set(), 0, 0
    for ex in task.examples(300, seed=2):
        pairs = [tuple(map(int, term.split("*"))) for term in ex.prompt[:-1].split("+")]
        assert all(2 <= x <= 4 for pair in pairs for x in pair)
        assert len(set(pairs)) == len(pairs)  # distinct pairs: no essential line repeats another
        pair_counts.add(len(pairs))
        steps = split_steps(ex.completion)
        assert len(steps) == len(ex.meta["step_redundant"]) == ex.meta["num_steps"]
        essential = [s for s, r in zip(steps, ex.meta["step_redundant"]) if not r]
        assert essential == [f"{a}*{b}={a * b}" for a, b in pairs]
        for i, (step, is_redundant) in enumerate(zip(steps, ex.meta["step_redundant"])):
            assert step.startswith("check ") == is_redundant
            if is_redundant:
                assert step == "check " + steps[i - 1].split("=")[1]
        assert ex.answer == str(sum(a * b for a, b in pairs))
        assert ex.completion.endswith(f"</think>{ex.answer}")
        redundant += ex.meta["num_redundant"]
        lines += len(essential)
    assert pair_counts == {2, 3}
    assert 0.4 < redundant / lines < 0.6
    with pytest.raises(ConfigError, match="partials=products combines the operands in disjoint pairs"):
        MultiSum(min_operands=4, max_operands=5, partials="products")


def test_multisum_products_redundant_config():
    conf = REPO_ROOT / "conf" / "task"
    cfg = OmegaConf.merge(
        OmegaConf.load(conf / "multisum.yaml"), OmegaConf.load(conf / "multisum_products_redundant.yaml")
    )
    cfg.pop("defaults")
    task = instantiate(cfg)
    assert isinstance(task, MultiSum) and task.partials == "products" and task.redundant_prob == 0.5
    examples = task.examples(300, seed=0)
    # two pairs; no operand 1: no product line repeats an operand of the prompt
    assert {len(ex.prompt[:-1].split("+")) for ex in examples} == {2}
    operands = {int(x) for ex in examples for term in ex.prompt[:-1].split("+") for x in term.split("*")}
    assert operands == set(range(2, 10))
    # a check line carries no value: each product appears on its essential line only
    checks = {s for ex in examples for s, r in zip(split_steps(ex.completion), ex.meta["step_redundant"]) if r}
    assert checks == {"check ok"}


def test_multisum_check_lines_state_the_value_or_not():
    def task(states: bool) -> MultiSum:
        return MultiSum(4, 4, 9, redundant_prob=1.0, partials="products", min_value=2, check_states_value=states)

    stating, bare = task(True).examples(20, seed=3), task(False).examples(20, seed=3)
    for a, b in zip(stating, bare):
        assert a.prompt == b.prompt and a.answer == b.answer and a.meta == b.meta
        steps_a, steps_b = split_steps(a.completion), split_steps(b.completion)
        assert steps_a[0::2] == steps_b[0::2]  # the same product lines
        assert steps_a[1::2] == [f"check {line.split('=')[1]}" for line in steps_a[0::2]]
        assert steps_b[1::2] == ["check ok"] * len(steps_b[1::2])


def test_multisum_min_value_bounds_the_operands():
    for partials, low in (("chain", 0), ("chain", 2), ("pairs", 1)):
        task = MultiSum(min_operands=4, max_operands=6, max_value=5, min_value=low, partials=partials)
        operands = {int(x) for ex in task.examples(200, seed=0) for x in ex.prompt[:-1].split("+")}
        assert operands == set(range(low, 6))


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
