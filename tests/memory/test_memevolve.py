"""MemEvolve's outer loop (``+method=memevolve``, zoo.memory.memevolve): selection and Pareto ranks, diagnose and
design, the tournament invariants, isolation of candidates, failing/hanging/generated candidates, the app run."""

from __future__ import annotations

import json
import random
import sys
import time

import pytest

from zoo.agents.backends import ScriptedBackend
from zoo.cli.train import run
from zoo.errors import ConfigError
from zoo.memory import Genotype
from zoo.memory.memevolve import (
    Candidate,
    LLMDesigner,
    MemEvolve,
    compare_systems,
    diagnose,
    dominates,
    evaluate_candidate,
    mutations,
    pareto_ranks,
    rule_based_design,
    run_isolated,
    run_stream,
    selection_order,
    tie_break_scores,
)
from zoo.memory.system import ModularMemory

ENV = {"name": "procworld", "family_ids": [0, 1, 2, 3]}
VALID_CODE = """
from zoo.memory import Genotype, ModularMemory


class Provider(ModularMemory):
    def __init__(self, store_dir):
        super().__init__(Genotype("skill", "list", "bm25", "dedup"), store_dir)
"""
HANGING_CODE = """
from zoo.memory import MemoryProvider


class Provider(MemoryProvider):
    def __init__(self, store_dir):
        pass

    def initialize(self):
        return True

    def provide_memory(self, request):
        while True:
            pass

    def take_in_memory(self, trajectory):
        return True, ""
"""


def small(tmp_path, **kw) -> MemEvolve:
    options = {
        "rounds": 2,
        "candidates": 2,
        "tasks": 8,
        "finalists": 2,
        "reused": 2,
        "smoke_tasks": 2,
        "isolation": "inline",
        "seed": 5,
    }
    options.update(kw)
    return MemEvolve(Genotype("raw", "list", "recency", "none", name="start"), tmp_path / "evo", ENV, **options)


# -- selection ------------------------------------------------------------------------------------------------------
def test_pareto_ranks_hold_no_dominated_pair_and_each_rank_is_dominated_by_the_previous():
    rng = random.Random(0)
    points = [(rng.choice([0.2, 0.5, 0.8]), rng.choice([10.0, 20.0, 30.0]), rng.choice([1.0, 2.0])) for _ in range(40)]
    ranks = pareto_ranks(points)
    assert min(ranks) == 0 and max(ranks) >= 2
    for i, j in ((i, j) for i in range(40) for j in range(40) if i != j and ranks[i] == ranks[j]):
        assert not dominates(points[i], points[j])
    for i in range(40):
        if ranks[i] > 0:
            assert any(ranks[j] == ranks[i] - 1 and dominates(points[j], points[i]) for j in range(40))


def test_dominance_needs_no_worse_everywhere_and_better_somewhere():
    assert dominates((0.8, 10, 1), (0.8, 12, 1)) and not dominates((0.8, 10, 1), (0.8, 10, 1))
    assert not dominates((0.9, 30, 1), (0.8, 10, 1))


def test_lexicographic_selection_is_accuracy_then_tokens_and_skips_failures():
    results = [
        {"ok": True, "success": 0.5, "tokens": 10, "time": 1},
        {"ok": True, "success": 0.8, "tokens": 50, "time": 9},
        {"ok": False, "success": 0.0, "tokens": 0, "time": 0},
        {"ok": True, "success": 0.8, "tokens": 40, "time": 9},
        {"ok": True, "success": 0.5, "tokens": 10, "time": 0},
    ]
    assert selection_order(results) == [3, 1, 0, 4]  # the tie 0/4 goes to the earlier entrant
    pareto = selection_order(results, "pareto")
    assert 2 not in pareto and set(pareto) == {0, 1, 3, 4}
    # 4 dominates 0 (same accuracy and tokens, less time); 3 dominates 1: ranks [3, 4] then [0, 1]
    assert set(pareto[:2]) == {3, 4}
    with pytest.raises(ConfigError, match="selection"):
        selection_order(results, "best")


def test_the_released_tie_break_formula():
    points = [(0.5, 100.0, 4.0), (0.7, 300.0, 2.0), (0.6, 200.0, 3.0)]
    expected = [
        0.6 * 0.5 + 0.25 * 1.0 + 0.15 * 0.0,
        0.6 * 0.7 + 0.25 * 0.0 + 0.15 * 1.0,
        0.6 * 0.6 + 0.25 * 0.5 + 0.15 * 0.5,
    ]
    assert tie_break_scores(points) == pytest.approx(expected)
    assert tie_break_scores([(0.5, 7.0, 1.0), (0.5, 7.0, 1.0)]) == pytest.approx([0.6 * 0.5 + 0.4] * 2)


# -- diagnose and design ----------------------------------------------------------------------------------------
def test_diagnosis_blames_recency_retrieval_across_families_and_design_mutates_it(tmp_path):
    base = Genotype("insight", "list", "recency", "dedup", top_k=3)
    result = run_stream(ModularMemory(base, tmp_path / "s"), ENV, list(range(20)), seed=1)
    diagnosis = diagnose(result)
    assert diagnosis["worst"] == "retrieve" and diagnosis["scores"]["retrieve"] > 0.5
    designed = rule_based_design(base, diagnosis, 3, random.Random(0), {base.describe()})
    assert len(designed) == 3 and all(module == "retrieve" for _, module in designed)
    for genotype, _ in designed:
        assert genotype.retrieve != "recency"
        assert (genotype.encode, genotype.store, genotype.manage, genotype.top_k) == ("insight", "list", "dedup", 3)


def test_diagnosis_blames_verbose_encoding_for_raw_trajectories(tmp_path):
    base = Genotype("raw", "list", "bm25", "dedup")
    diagnosis = diagnose(run_stream(ModularMemory(base, tmp_path / "s"), ENV, list(range(12)), seed=1))
    assert diagnosis["worst"] == "encode"


def test_design_skips_seen_genotypes_and_moves_to_the_next_module():
    base = Genotype("insight", "list", "bm25", "dedup")
    diagnosis = {"order": ["manage", "retrieve"], "scores": {}}
    seen = {base.describe()} | {g.describe() for g in mutations(base, "manage")[:2]}
    designed = rule_based_design(base, diagnosis, 3, random.Random(0), seen)
    assert [module for _, module in designed] == ["manage", "retrieve", "retrieve"]
    assert len({g.describe() for g, _ in designed} | seen) == len(seen)  # all added to seen, none repeated


# -- the loop -----------------------------------------------------------------------------------------------------
def test_the_base_always_joins_so_the_winner_is_never_worse_than_the_base(tmp_path):
    evolver = small(tmp_path)
    history = evolver.run()
    lines = (tmp_path / "evo" / "rounds.jsonl").read_text().splitlines()
    assert len(lines) == 2 and [json.loads(line)["round"] for line in lines] == [0, 1]
    for record in history:
        tournament = {t["name"]: t for t in record["tournament"]}
        assert record["tournament"][0]["name"] == "base" and tournament["base"]["ok"]
        winner = record["winner"]["name"]
        if winner != "base":
            base, best = tournament["base"], tournament[winner]
            assert (best["success"], -best["tokens"]) >= (base["success"], -base["tokens"])
        assert len(record["candidates"]) == 2 and all(c["validation"]["ok"] for c in record["candidates"])
        # every candidate evaluated in its own store directory
        dirs = [t["store_dir"] for t in record["tournament"]] + [f["store_dir"] for f in record["finals"]]
        assert len(set(dirs)) == len(dirs)
    assert evolver.current.genotype.describe() == history[-1]["winner"]["system"]


def test_the_finals_rerun_y_of_the_tournament_tasks_plus_x_new_ones(tmp_path):
    """Released MemEvolve: the finals stream is ``random.sample`` of y tournament tasks followed by x new tasks, the
    same stream for every finalist. The tasks each evaluation actually ran are read from its per-task rows."""
    evolver = small(tmp_path, tasks=6, reused=3)
    ran: list[tuple[int, str, str, list[int]]] = []
    evaluate = evolver.evaluate

    def spy(candidate, phase, episodes, timeout):
        result = evaluate(candidate, phase, episodes, timeout)
        ran.append((len(evolver.history), phase, candidate.name, [row["episode"] for row in result["episodes"]]))
        return result

    evolver.evaluate = spy
    history = evolver.run()
    for record in history:
        r = record["round"]
        tournament = [eps for rr, phase, _, eps in ran if rr == r and phase == "tournament"]
        finals = [eps for rr, phase, _, eps in ran if rr == r and phase == "finals"]
        assert tournament and all(eps == tournament[0] for eps in tournament) and len(tournament[0]) == 6
        assert finals and all(eps == finals[0] for eps in finals)  # one stream for every finalist
        reused, new = finals[0][:3], finals[0][3:]
        assert set(reused) <= set(tournament[0]) and len(set(reused)) == 3
        assert len(new) == 6 and not set(new) & set(tournament[0])
        assert finals[0] == record["tasks"]["finals"]
    # the reused subset is a seeded random sample, not a fixed slice of the batch
    offsets = [[t - 100_000 * (rec["round"] + 1) for t in rec["tasks"]["finals"][:3]] for rec in history]
    assert offsets != [[0, 1, 2]] * len(history)


def test_base_in_finals_makes_the_winner_at_least_the_base_on_the_finals(tmp_path):
    for record in small(tmp_path, base_in_finals=True, rounds=1).run():
        finals = {f["name"]: f for f in record["finals"]}
        assert "base" in finals
        win, base = finals[record["finals_order"][0]], finals["base"]
        assert (win["success"], -win["tokens"]) >= (base["success"], -base["tokens"])


def test_a_fixed_seed_gives_the_same_evolution(tmp_path):
    first = [r["winner"]["system"] for r in small(tmp_path / "a").run()]
    second = small(tmp_path / "b").run()
    assert [r["winner"]["system"] for r in second] == first
    first_round = json.loads((tmp_path / "a" / "evo" / "rounds.jsonl").read_text().splitlines()[0])
    assert [c["system"] for c in second[0]["candidates"]] == [c["system"] for c in first_round["candidates"]]


def test_a_failing_candidate_is_recorded_and_the_tournament_goes_on(tmp_path):
    """Generated code importing a missing package fails validation in its sandboxed child; the round finishes."""
    evolver = small(
        tmp_path,
        rounds=1,
        candidates=1,
        isolation="process",
        extra_candidates={0: [Candidate("missing", code="import package_that_is_not_installed\n", origin="test")]},
    )
    [record] = evolver.run()
    validation = {c["name"]: c["validation"] for c in record["candidates"]}
    assert validation["missing"]["ok"] is False
    assert "'package_that_is_not_installed', which is not installed" in validation["missing"]["error"]
    assert [t["name"] for t in record["tournament"]] == ["base", "r0c0"] and all(t["ok"] for t in record["tournament"])
    assert (tmp_path / "evo" / "round0" / "tournament" / "base" / "items.jsonl").read_text().strip()


@pytest.mark.slow
def test_failing_hanging_and_generated_candidates_are_recorded_and_the_tournament_goes_on(tmp_path):
    """A provider that hangs, code importing a missing package, and a valid generated provider (from a scripted
    backend standing in for the LLM designer) join round 0; the round finishes and the other stores are intact."""
    backend = ScriptedBackend(["no code here", f"```python\n{VALID_CODE}```"])
    evolver = small(
        tmp_path,
        rounds=1,
        candidates=1,
        isolation="process",
        timeout=60,
        smoke_timeout=6,
        designer=LLMDesigner(backend),
        llm_candidates=2,
        extra_candidates={
            0: [
                Candidate("hangs", code=HANGING_CODE, origin="test"),
                Candidate("missing", code="import package_that_is_not_installed\n", origin="test"),
            ]
        },
    )
    [record] = evolver.run()
    validation = {c["name"]: c["validation"] for c in record["candidates"]}
    assert validation["hangs"]["ok"] is False and "timed out after 6 s" in validation["hangs"]["error"]
    assert "'package_that_is_not_installed', which is not installed" in validation["missing"]["error"]
    assert validation["r0llm0"]["ok"] is False and "no class Provider" in validation["r0llm0"]["error"]
    assert validation["r0llm1"]["ok"] is True and validation["r0c0"]["ok"] is True
    entrants = [t["name"] for t in record["tournament"]]
    assert entrants == ["base", "r0c0", "r0llm1"]
    for entry in record["tournament"]:
        assert entry["ok"], entry
    base_store = tmp_path / "evo" / "round0" / "tournament" / "base" / "items.jsonl"
    assert base_store.read_text().strip()
    # the generated code was written next to its store and never imported here
    assert (tmp_path / "evo" / "round0" / "smoke" / "r0llm1_provider.py").read_text().strip() == VALID_CODE.strip()
    assert "generated_provider" not in sys.modules
    # a generated winner is compared as its code (not as "no memory")
    compared = compare_systems({"generated": Candidate("x", code=VALID_CODE)}, ENV, [0, 1, 2], 0, tmp_path / "cmp")
    assert compared["generated"]["ok"] and (tmp_path / "cmp" / "generated" / "items.jsonl").is_file()


def test_run_isolated_stops_a_hang_and_reports_an_exception():
    start = time.perf_counter()
    hung = run_isolated(lambda: time.sleep(60) or {}, timeout=1.0)
    assert hung == {"ok": False, "error": "timed out after 1 s (stopped)"} and time.perf_counter() - start < 30

    def boom():
        raise RuntimeError("store exploded")

    assert run_isolated(boom, timeout=10.0)["error"] == "RuntimeError: store exploded"
    assert run_isolated(lambda: {"x": 1}, timeout=10.0) == {"ok": True, "x": 1}


def test_an_evaluation_never_reuses_a_store_and_a_work_dir_must_be_new(tmp_path):
    store = tmp_path / "s"
    store.mkdir()
    (store / "items.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="not empty"):
        evaluate_candidate(Candidate("c", Genotype()), store, ENV, [0], 0)
    assert (store / "items.jsonl").read_text() == "{}\n"
    (tmp_path / "evo").mkdir()
    (tmp_path / "evo" / "old").write_text("x")
    with pytest.raises(ConfigError, match="work_dir"):
        small(tmp_path)


def test_memevolve_runs_on_the_app(train_cfg, tmp_path):
    smoke = ["module.rounds=1", "module.candidates=1", "module.tasks=4", "module.reused=1", "module.smoke_tasks=2"]
    cfg = train_cfg(["+method=memevolve", *smoke, "module.eval_tasks=4", "module.isolation=inline"])
    metrics = run(cfg)
    assert metrics["test/rounds"] == 1.0
    for name in ("no_memory", "expel", "voyager", "agent_kb", "initial", "evolved"):
        assert 0.0 <= metrics[f"test/success/{name}"] <= 1.0
        assert f"test/transfer_success/{name}" in metrics
    assert metrics["test/tokens/no_memory"] == 0.0
    comparison = json.loads((tmp_path / "run" / "comparison.json").read_text())
    assert comparison["initial"]["name"] == "agent_kb"
    assert len((tmp_path / "run" / "evolution" / "rounds.jsonl").read_text().splitlines()) == 1
