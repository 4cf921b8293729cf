"""DeepChainSim: what each optimizer does with the feedback decides the depth effect, not a per-call loss.

A replace-style (TextGrad) output shows only its answer; TextGrad's backward pulls the target back through each
node's own operation, so a fault sends a wrong target upstream and the nodes after it get examples their correct
operation cannot meet; with lossless calls TextGrad can fail where TextResNet and the record ablation repair the
chain; the call budget skips the steps after it is spent."""

from __future__ import annotations

import pytest

from zoo.errors import ConfigError
from zoo.textopt import DeepChainSim, make_optimizer, optimize
from zoo.textopt.deepchain import INVERSES, OPERATIONS, instruction, pull_back
from zoo.textopt.textgrad import feedback_loss


def test_every_operation_is_undone_by_its_inverse():
    for name, operation in OPERATIONS.items():
        for word in ("abcdef", "abcdefg", "zz"):
            assert INVERSES[name](operation(word)) == word and pull_back(name, operation(word)) == word
    assert pull_back(None, "abc") == "abc"


def test_a_replace_style_output_shows_only_its_answer_and_the_critic_judges_only_that():
    sim = DeepChainSim(depth=4, faulty=(1, 1), noise=0.0, seed=0)
    example = sim.train_examples([0])[0]
    output = make_optimizer("textgrad", sim).output(example)
    assert len(output.split()) == 1  # no record of the earlier values
    assert sim.critique(output, example, residual=False) == [f"output: expected '{example.target}' got '{output}'"]
    # the record ablation restates every value, so the critic judges every step (one span item for the fault)
    record = DeepChainSim(depth=4, faulty=(1, 1), noise=0.0, seed=0, record=True)
    shown = make_optimizer("textgrad", record).output(example)
    assert len(shown.split()) == 5
    (fault,) = record.initially_faulty
    assert [i.split(":")[0] for i in record.critique(shown, example, residual=False)] == [f"span {fault}", "global"]


def test_textgrad_backward_pulls_the_target_back_through_each_nodes_own_operation():
    """Fault at the last node: its instruction gets the exact example, but the target it sends upstream is pulled
    back through its wrong operation, so the correct nodes above it are told to produce a wrong value."""
    sim = DeepChainSim(depth=3, faulty=(0, 0), noise=0.0, seed=1)
    method = make_optimizer("textgrad", sim)
    wrong = next(name for name in sorted(OPERATIONS) if name != sim.correct["c3"])
    method.parameters["c3"].value = instruction(wrong)
    example = sim.train_examples([0])[0]
    v1 = OPERATIONS[sim.correct["c1"]](example.input)
    v2 = OPERATIONS[sim.correct["c2"]](v1)
    y = method.forward(example)
    feedback_loss(y, sim.critique(y.value, example, residual=False)).backward()
    got = OPERATIONS[wrong](v2)
    assert method.parameters["c3"].gradients == [f"span c3: given '{v2}' expected '{example.target}' got '{got}'"]
    told = INVERSES[wrong](example.target)  # what c3 asks of its input, trusting its own (faulty) operation
    assert told != v2  # a wrong target: the correct c2 already produced the right value
    assert method.parameters["c2"].gradients == [f"span c2: given '{v1}' expected '{told}' got '{v2}'"]
    assert method.parameters["c1"].gradients == [
        f"span c1: given '{example.input}' expected '{INVERSES[sim.correct['c2']](told)}' got '{v1}'"
    ]
    assert method.log.calls["backward"] == 3 + 2  # one call per instruction, one per non-leaf input


def test_with_lossless_calls_textgrad_fails_by_what_it_does_with_the_feedback():
    """q = 0: the single fault at c1 gets its exact example, but c3 receives an example its correct operation cannot
    meet and another operation can (it absorbs the upstream error); every node is rewritten in the same step, so
    the two rewrites undo each other step after step. TextResNet's state shows every step and the critic flags c1
    alone; TextGrad with the record sees the same steps and repairs the chain too."""
    sim = DeepChainSim(depth=3, faulty=(1, 1), noise=0.0, seed=2)
    assert sim.initially_faulty == ["c1"]
    plain = optimize(sim, "textgrad", steps=6, seed=2)
    assert plain["converged_at"] is None and [r["faulty"] for r in plain["history"]] == [1] * 6
    assert {"c1", "c3"} <= set(plain["history"][0]["updated"])
    record = optimize(DeepChainSim(depth=3, faulty=(1, 1), noise=0.0, seed=2, record=True), "textgrad", steps=6)
    resnet = optimize(DeepChainSim(depth=3, faulty=(1, 1), noise=0.0, seed=2), "textresnet", steps=6)
    assert record["converged_at"] == resnet["converged_at"] == 1
    assert record["test_accuracy"] == resnet["test_accuracy"] == 1.0 > plain["test_accuracy"]


def test_a_call_budget_skips_the_steps_after_it_is_spent():
    sim = DeepChainSim(depth=10, noise=0.0, seed=2)
    run = optimize(sim, "textgrad", steps=5, seed=2, call_budget=100)
    history = run["history"]
    ran = [r for r in history if not r.get("skipped")]
    assert 2 <= len(ran) < 5 and run["steps_run"] == len(ran) and run["call_budget"] == 100
    spent = [r["calls/backward"] + r["calls/projector"] + r["calls/optimizer"] for r in ran]
    assert all(s < 100 for s in spent[:-1]) and spent[-1] >= 100  # each step started under the budget
    assert run["token_proxy_calls"] == spent[-1]  # no call after the budget was reached
    assert all(r["skipped"] and r["updates"] == 0 for r in history[len(ran) :])
    free = optimize(DeepChainSim(depth=10, noise=0.0, seed=2), "textgrad", steps=5, seed=2)
    assert free["steps_run"] == 5 and free["call_budget"] is None
    with pytest.raises(ConfigError, match="call_budget"):
        make_optimizer("textresnet", sim, call_budget=0)


def test_bad_operation_vocabulary_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown"):
        DeepChainSim(operations=["reverse", "shuffle"])
    with pytest.raises(ConfigError, match="at least two"):
        DeepChainSim(operations=["reverse"])
    sim = DeepChainSim(depth=6, operations=["reverse", "rotate_left"], seed=0)
    assert set(sim.correct.values()) | set(sim.initial.values()) <= {"reverse", "rotate_left"}
