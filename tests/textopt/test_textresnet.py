"""TextResNet (arXiv 2602.08306) invariants: identity highway, lossless disjoint projection, routing locality,
top-k density scheduling, the projector's bad replies, and the simulator regression (a single fault is edited first)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from zoo.agents import ScriptedBackend
from zoo.errors import ConfigError
from zoo.textopt import (
    CallLog,
    DeepChainSim,
    DensityScheduler,
    LLMProjector,
    RuleProjector,
    TextGrad,
    TextResNet,
    append_delta,
    is_prefix_chain,
    make_optimizer,
    parse_deltas,
    parse_projection,
    replace_forward,
    residual_forward,
    visible_deltas,
)
from zoo.textopt.deepchain import OPERATIONS, operation_of

IDS = ["c1", "c2", "c3"]


def test_identity_highway_all_empty_deltas_return_the_input():
    states = residual_forward("the question", [(cid, lambda s: "") for cid in IDS])
    assert states == ["the question"] * 4 and is_prefix_chain(states)


def test_every_state_is_a_prefix_of_the_next_and_each_span_has_its_author():
    components = [(cid, lambda s, cid=cid: f"{cid} saw {len(s)} chars") for cid in IDS]
    states = residual_forward("x0", components)
    assert is_prefix_chain(states) and states[0] == "x0"
    assert [cid for cid, _ in parse_deltas(states[-1])] == IDS
    assert parse_deltas(states[-1])[1][1] == f"c2 saw {len(states[1])} chars"


def test_a_replace_style_forward_fails_the_identity_highway():
    empty = replace_forward("the question", [lambda s: ""] * 3)
    assert empty[-1] != "the question" and not is_prefix_chain(empty)
    rewriting = replace_forward("x0", [lambda s: s.upper() + "!"] * 2)
    assert not is_prefix_chain(rewriting)


def test_the_simulated_residual_chain_keeps_the_prefix_property():
    sim = DeepChainSim(depth=6, seed=3)
    method = make_optimizer("textresnet", sim)
    example = sim.train_examples([0])[0]
    states = residual_forward(example.input, [(c, method.component(c)) for c in sim.component_ids])
    assert is_prefix_chain(states) and len(parse_deltas(states[-1])) == 6
    assert sim.answer(states[-1], residual=True) == method.problem.values(states[-1], True)[-1]


def test_delta_cap_bounds_every_delta_and_the_state():
    states = residual_forward("x", [(cid, lambda s: "y" * 1000) for cid in IDS], max_delta_chars=10)
    deltas = parse_deltas(states[-1])
    assert all(len(text) == 10 and text.endswith("…") for _, text in deltas)
    tag = len('\n<delta id="c1"></delta>')
    assert len(states[-1]) <= 1 + 3 * (10 + tag) and is_prefix_chain(states)
    assert append_delta("x", "c1", "short", max_chars=10).endswith(">short</delta>")


def test_a_retraction_hides_the_upstream_delta_without_editing_it():
    replies = {"c1": "wrong", "c2": "RETRACT c1", "c3": "right"}
    states = residual_forward("x", [(cid, lambda s, cid=cid: replies[cid]) for cid in IDS])
    assert is_prefix_chain(states) and "wrong" in states[-1]
    assert visible_deltas(states[-1]) == [("c3", "right")]
    assert [cid for cid, _ in parse_deltas(states[-1])] == ["c1", "c3"]


def test_rule_projection_is_lossless_and_disjoint():
    feedback = [
        "span c2: given 'ab' expected 'ba' got 'ab'",
        "global: the final answer is wrong",
        "span c9: an id that does not exist",
        "span c1: given 'x' expected 'y' got 'z'",
        "span c2: second item for c2",
        "free text with no span",
    ]
    projection = RuleProjector().project(feedback, [], IDS)
    assert Counter(projection.items()) == Counter(feedback)  # union == g, each item exactly once
    assert projection.components == {"c1": [feedback[3]], "c2": [feedback[0], feedback[4]], "c3": []}
    assert projection.global_items == [feedback[1], feedback[2], feedback[5]] and projection.invented == ["c9"]


def test_projector_json_parses_with_fallback_then_counts_failures():
    feedback = ["span c1: bad", "global: wrong"]
    clean = parse_projection('{"c1": ["bad"], "global": ["wrong"]}', IDS, feedback)
    assert clean.components["c1"] == ["bad"] and clean.global_items == ["wrong"] and not clean.failed
    fenced = parse_projection('Here you go:\n```json\n{"c2": "one", "c3": ["two"]}\n```\nDone.', IDS, feedback)
    assert fenced.components == {"c1": [], "c2": ["one"], "c3": ["two"]} and not fenced.failed
    broken = parse_projection("c1 is wrong, I think {not json", IDS, feedback)
    assert broken.failed and broken.global_items == feedback and broken.components == {}
    invented = parse_projection('{"c7": ["made up"], "c1": ["real"]}', IDS, feedback)
    assert (
        invented.invented == ["c7"] and invented.global_items == ["made up"] and invented.components["c1"] == ["real"]
    )


def test_llm_projector_counts_an_invalid_reply_and_the_step_goes_on():
    # a scripted reply stands in for a model that answers the projector prompt with prose (control flow only)
    log, seen = CallLog(), []
    replies = iter(["I would blame the second component.", '{"c2": ["fix it"], "c8": ["?"]}'])
    backend = ScriptedBackend(policy=lambda messages, tools: seen.append(messages) or next(replies))
    projector = LLMProjector(backend, log)
    first = projector.project(["global: wrong"], [("c1", "a")], IDS)
    second = projector.project(["global: wrong"], [("c1", "a")], IDS)
    assert first.failed and first.global_items == ["global: wrong"]
    assert second.components["c2"] == ["fix it"] and second.invented == ["c8"]
    assert projector.failures == 1 and projector.invented == 1 and log.calls["projector"] == 2
    user = seen[0][-1]["content"]
    assert '<delta id="c1">a</delta>' in user and "global: wrong" in user and "c1, c2, c3" in user


def test_scheduler_updates_exactly_the_top_k_densities_with_a_deterministic_tie_break():
    scheduler = DensityScheduler(["c1", "c2", "c3", "c4"], budget=2, decay=0.5)
    scheduler.observe({"c1": 0.2, "c2": 0.4, "c3": 0.4})
    assert scheduler.density == pytest.approx({"c1": 0.1, "c2": 0.2, "c3": 0.2, "c4": 0.0})
    assert scheduler.select(["c4", "c3", "c2", "c1"]) == ["c2", "c3"]  # tie c2/c3: the earlier component first
    assert scheduler.select(["c1", "c3"]) == ["c3", "c1"]  # only eligible components
    scheduler.observe({})
    assert scheduler.density == pytest.approx({"c1": 0.05, "c2": 0.1, "c3": 0.1, "c4": 0.0})  # decays, stays >= 0
    with pytest.raises(ValueError, match="negative"):
        scheduler.observe({"c1": -1})
    with pytest.raises(ConfigError, match="budget"):
        DensityScheduler(IDS, budget=0)


def test_density_observes_each_steps_routed_shares_not_counts():
    """s_i = share of the step's routed critiques that went to i, so densities do not grow with the minibatch: the
    EMA is checked by hand from the routed gradients of two steps, and 2 or 4 examples with the same routing give
    the same densities."""
    sim = DeepChainSim(depth=6, faulty=(2, 2), noise=0.0, seed=3)
    method = make_optimizer("textresnet", sim, budget=1, decay=0.5)
    expected = dict.fromkeys(sim.component_ids, 0.0)
    for batch in ([0, 1, 2, 3], [4, 5, 6]):
        report = method.step(sim.train_examples(batch))
        counts = {cid: len(items) for cid, items in report.gradients.items()}
        total = sum(counts.values())
        assert total > 1  # several critiques routed: shares and counts differ
        expected = {cid: 0.5 * expected[cid] + 0.5 * counts[cid] / total for cid in expected}
        assert report.extra["density"] == pytest.approx(expected)

    def first_density(batch: list[int]) -> dict[str, float]:
        fresh = DeepChainSim(depth=6, faulty=(2, 2), noise=0.0, seed=3)
        return (
            make_optimizer("textresnet", fresh, budget=1, decay=0.5).step(fresh.train_examples(batch)).extra["density"]
        )

    assert first_density([0, 1]) == pytest.approx(first_density([0, 1, 2, 3]))


def test_a_component_with_no_routed_critique_keeps_its_instruction_byte_identical():
    sim = DeepChainSim(depth=8, faulty=(1, 1), noise=0.0, seed=1)
    method = make_optimizer("textresnet", sim, budget=3)
    before = method.instructions()
    report = method.step(sim.train_examples([0, 1, 2]))
    (fault,) = sim.initially_faulty
    assert report.updated == [fault]
    for cid in sim.component_ids:
        if not report.gradients[cid]:
            assert method.instructions()[cid] == before[cid]
    assert all(not report.gradients[c] for c in sim.component_ids if c != fault)
    assert sim.faulty(method.instructions()) == set()
    # the broadcast baseline sends components that received only the global critique to the optimizer
    baseline = make_optimizer("textgrad", DeepChainSim(depth=8, faulty=(1, 1), noise=0.0, seed=1))
    assert len(baseline.step(sim.train_examples([0, 1, 2])).updated) > 1


@pytest.mark.parametrize("depth", [2, 5, 10, 20])
def test_a_single_fault_is_edited_first_at_every_depth(depth):
    for seed in range(3):
        sim = DeepChainSim(depth=depth, faulty=(1, 1), noise=0.0, seed=seed)
        method = make_optimizer("textresnet", sim, budget=1, seed=seed)
        report = method.step(sim.train_examples([0, 1]))
        assert report.updated == sim.initially_faulty


def test_textgrad_attribution_falls_with_depth_when_the_backward_is_lossy():
    from zoo.textopt import optimize

    def attribution(depth: int) -> float:
        runs = [optimize(DeepChainSim(depth=depth, noise=0.15, seed=s), "textgrad", steps=4, seed=s) for s in range(4)]
        return sum(r["attribution_accuracy"] for r in runs) / len(runs)

    assert attribution(20) < attribution(2)


def test_textresnet_needs_fewer_proxy_calls_than_textgrad_on_a_deep_chain():
    from zoo.textopt import optimize

    sim = DeepChainSim(depth=10, noise=0.0, seed=2)
    resnet = optimize(sim, "textresnet", steps=4, seed=2)
    # TextGrad with the record sees every step as TextResNet does: with lossless calls both repair the chain
    grad = optimize(DeepChainSim(depth=10, noise=0.0, seed=2, record=True), "textgrad", steps=4, seed=2)
    assert resnet["test_accuracy"] == grad["test_accuracy"] == 1.0
    assert resnet["calls/backward"] == 0 and grad["calls/projector"] == 0
    assert resnet["token_proxy_calls"] < grad["token_proxy_calls"]


def test_same_seed_same_prompts(tmp_path):
    def prompts(seed: int, name: str) -> list[str]:
        sim = DeepChainSim(depth=5, noise=0.2, seed=seed)
        path = tmp_path / f"{name}.jsonl"
        backend = ScriptedBackend(policy=sim.policy, cache={"path": str(path), "mode": "record"})
        method = TextResNet(sim, backend, seed=seed)
        for step in range(3):
            method.step(sim.train_examples([2 * step, 2 * step + 1]))
        return [json.dumps(json.loads(line)["request"]["messages"]) for line in path.read_text().splitlines()]

    first, again, other = prompts(4, "a"), prompts(4, "b"), prompts(5, "c")
    assert first == again and len(first) > 10
    assert first != other


def test_textresnet_settings_are_checked():
    sim = DeepChainSim(depth=3)
    with pytest.raises(ConfigError, match="projector"):
        TextResNet(sim, sim.default_backend(), projector="oracle")
    with pytest.raises(ConfigError, match="max_delta_chars"):
        TextResNet(sim, sim.default_backend(), max_delta_chars=0)
    with pytest.raises(ConfigError, match="decay"):
        TextResNet(sim, sim.default_backend(), decay=1.0)
    with pytest.raises(ConfigError, match="group"):
        RuleProjector(r"^span (\S+):")
    assert isinstance(make_optimizer("textgrad", sim), TextGrad)


def test_the_simulator_components_apply_the_named_operation():
    sim = DeepChainSim(depth=4, faulty=(2, 2), seed=0)
    assert len(sim.initially_faulty) == 2 and sim.faulty(
        dict(zip(sim.component_ids, sim.initial_instructions()))
    ) == set(sim.initially_faulty)
    example = sim.train_examples([0])[0]
    value = example.input
    for cid in sim.component_ids:
        value = OPERATIONS[sim.correct[cid]](value)
    assert value == example.target
    assert operation_of("Apply the operation 'reverse' to the latest value.") == "reverse"
    assert operation_of("do something else") is None
    with pytest.raises(ConfigError, match="noise"):
        DeepChainSim(noise=0.7)
    with pytest.raises(ConfigError, match="faulty"):
        DeepChainSim(faulty=(3, 1))


def test_tracker_counts_attribution_and_convergence_by_hand():
    from zoo.textopt import optimize

    # one faulty component of four, lossless calls: TextResNet rewrites only it; TextGrad's global critique reaches
    # all four nodes, so four optimizer calls of which one hits the fault (1/4), and both converge at step 1
    resnet = optimize(DeepChainSim(depth=4, faulty=(1, 1), noise=0.0, seed=0), "textresnet", steps=3, budget=1)
    grad = optimize(DeepChainSim(depth=4, faulty=(1, 1), noise=0.0, seed=0), "textgrad", steps=3)
    assert resnet["attribution_accuracy"] == 1.0 and resnet["updates"] == 1 and resnet["converged_at"] == 1
    assert grad["attribution_accuracy"] == 0.25 and grad["updates"] == 4 and grad["converged_at"] == 1
    assert [r["faulty"] for r in grad["history"]] == [0, 0, 0] and grad["test_accuracy"] == 1.0
    assert resnet["calls/optimizer"] == 1 and resnet["calls/projector"] == 4  # one per critiqued example


def test_retraction_option_tells_components_how_to_retract():
    from zoo.textopt.textresnet import RETRACTION_NOTE

    sim = DeepChainSim(depth=2)
    assert RETRACTION_NOTE in TextResNet(sim, sim.default_backend(), retraction=True).system_prompt("c1")
    assert RETRACTION_NOTE not in TextResNet(sim, sim.default_backend()).system_prompt("c1")
