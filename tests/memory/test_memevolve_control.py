"""MemEvolve's reading aids (zoo.memory.memevolve): the "tune top_k only" control (``design_modules=[top_k]``: the
same loop and candidate budget, only ``top_k`` varied), each round's logged change, and the base run on the finals
stream as the paired reference of what the change contributed."""

from __future__ import annotations

import random

import pytest

from zoo.errors import ConfigError
from zoo.memory import Genotype
from zoo.memory.memevolve import DESIGN_MODULES, MemEvolve, rule_based_design

ENV = {"name": "procworld", "family_ids": [0, 1, 2, 3]}
ALL_ORDER = {"order": ["retrieve", "store", "manage", "encode", "top_k"], "scores": {}}


def small(tmp_path, **kw) -> MemEvolve:
    options = {
        "rounds": 3,
        "candidates": 3,
        "tasks": 6,
        "finalists": 2,
        "reused": 2,
        "smoke_tasks": 1,
        "isolation": "inline",
        "seed": 5,
    }
    options.update(kw)
    base = Genotype("insight", "list", "hybrid", "dedup", top_k=3, phases=("begin",), name="start")
    return MemEvolve(base, tmp_path / "evo", ENV, **options)


def changed_fields(a: Genotype | dict, b: Genotype | dict) -> list[str]:
    a = a.to_dict() if isinstance(a, Genotype) else a
    b = b.to_dict() if isinstance(b, Genotype) else b
    return [k for k in a if k != "name" and a[k] != b[k]]


def test_a_top_k_only_designer_changes_top_k_alone_and_keeps_the_candidate_budget():
    base = Genotype("insight", "list", "bm25", "dedup", top_k=6)
    seen = {base.describe(), base.mutate(top_k=5).describe()}  # one of the three top_k moves (8, 12, 5) was tried
    designed = rule_based_design(base, ALL_ORDER, 3, random.Random(0), seen, modules=("top_k",))
    assert [module for _, module in designed] == ["top_k"] * 3  # the diagnosis blames retrieve; top_k is all it may do
    assert all(changed_fields(base, g) == ["top_k"] for g, _ in designed)
    assert sorted(g.top_k for g, _ in designed) == [7, 8, 12]  # 5 was tried: the nearest untried value fills in
    # every module allowed: the same call follows the diagnosis
    assert {m for _, m in rule_based_design(base, ALL_ORDER, 3, random.Random(0), {base.describe()})} == {"retrieve"}


def test_the_top_k_only_control_runs_the_same_loop_with_the_same_number_of_candidates(tmp_path):
    control = small(tmp_path / "control", design_modules=["top_k"]).run()
    full = small(tmp_path / "full").run()
    assert [len(r["candidates"]) for r in control] == [len(r["candidates"]) for r in full] == [3, 3, 3]
    for record in control:
        base = record["base"]["genotype"]
        assert all(changed_fields(base, c["genotype"]) == ["top_k"] for c in record["candidates"])
        assert all(c["origin"] == "rule:top_k" for c in record["candidates"])
        assert record["change"]["modules"] in ([], ["top_k"])
    assert any(changed_fields(r["base"]["genotype"], c["genotype"]) != ["top_k"] for r in full for c in r["candidates"])


def test_each_round_logs_its_change_and_the_base_on_the_same_finals_stream(tmp_path):
    history = small(tmp_path).run()
    for record in history:
        change, winner, base = record["change"], record["winner"], record["base"]
        assert change["modules"] == changed_fields(base["genotype"], winner["genotype"])
        assert (change["from"], change["to"]) == (base["system"], winner["system"])
        assert change["origin"] == ("kept" if winner["name"] == "base" else winner["origin"])
        reference = record["base_finals"]
        assert reference["ok"] and reference["system"] == base["system"]
        finals = {f["name"]: f for f in record["finals"]}
        if "base" in finals:  # a finalist: its finals run is the reference, not a second run
            assert reference == finals["base"]
        else:
            assert reference["store_dir"] not in {f["store_dir"] for f in record["finals"]}
        for entry in [reference, *record["finals"], *record["tournament"]]:
            assert entry["success"] == pytest.approx(sum(entry["scores"]) / len(entry["scores"]))
        assert all(len(x["scores"]) == len(record["tasks"]["finals"]) for x in [reference, *record["finals"]])
    assert [r["change"]["modules"] != [] for r in history] == [r["winner"]["name"] != "base" for r in history]


def test_the_reference_is_off_on_request_and_a_bad_module_list_is_refused(tmp_path):
    record = small(tmp_path / "a", rounds=1, reference_base=False).run()[0]
    names = {f["name"] for f in record["finals"]}
    assert (record["base_finals"] is None) == ("base" not in names)
    for bad in (["topk"], []):
        with pytest.raises(ConfigError, match=r"design_modules=.*non-empty subset of .*top_k"):
            small(tmp_path / "b", design_modules=bad)
    assert set(DESIGN_MODULES) == set(ALL_ORDER["order"])


def test_train_py_refuses_a_bad_module_list_with_one_message(zoo_main, tmp_path):
    from conftest import REPO_ROOT

    args = ["+method=memevolve", "module.design_modules=[topk]", f"paths.log_dir={tmp_path / 'logs'}"]
    code, _, err = zoo_main([*args, f"hydra.run.dir={tmp_path / 'run'}"], REPO_ROOT)
    assert code == 2
    last = err.strip().splitlines()[-1]  # the run ends on the one actionable line
    assert last.startswith("error: module.design_modules=['topk']; use a non-empty subset of") and "top_k" in last
    assert err.count("error: ") == 1
