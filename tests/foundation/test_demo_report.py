"""zoo.report's demo helpers: sweeps -> arms and seeds, statistics over seeds, curves, page generation."""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from zoo.report import (
    Run,
    Sweep,
    artifact_runs,
    artifact_users,
    artifact_val_loss_curves,
    artifact_val_losses,
    base_policy_val_losses,
    best_mean,
    best_on_other_seeds,
    build_demo_page,
    build_run,
    build_seconds,
    choose_per_seed,
    contrast,
    curve,
    decaying_schedule_caveat,
    doubling_checks,
    group_runs,
    last_change,
    latest_sweep,
    legend,
    loss_settled,
    lr_order,
    paired_contrast,
    provenance,
    pyplot,
    quarter_change,
    split_by_length,
    val_loss_plateau,
)
from zoo.report.__main__ import main
from zoo.stats import (
    compare,
    fmt_stat,
    stat,
    t_critical,
)

from conftest import REPO_ROOT


def write_run(
    root: Path,
    subdir: str,
    overrides: list[str],
    rows: list[dict[str, float]] | None = None,
    *,
    num: int = 0,
    info: dict | None = None,
    files: dict[str, object] | None = None,
) -> Path:
    """A run directory as Hydra + train.py write it: overrides, hydra.yaml job number, CSV log, run_info.json."""
    run = root / subdir
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    seed = next((int(o.split("=")[1]) for o in overrides if o.startswith("seed=")), 0)
    (run / "resolved_config.yaml").write_text(yaml.safe_dump({"seed": seed, "demo": {"labels": {"a": "Arm A"}}}))
    if rows:
        (run / "csv").mkdir()
        names = sorted({k for r in rows for k in r})
        with (run / "csv" / "metrics.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=names)
            writer.writeheader()
            writer.writerows(rows)
    if info is not None:
        (run / "run_info.json").write_text(json.dumps(info))
    for name, content in (files or {}).items():
        (run / name).write_text(json.dumps(content))
    return run


def write_multirun(root: Path, params: dict[str, str], task: list[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text(
        yaml.safe_dump({"hydra": {"sweeper": {"params": params}, "overrides": {"task": task}}})
    )


def info(start: str, end: str, wall: float) -> dict:
    return {
        "argv": ["/repo/train.py", "-m", "+demo=toy", "seed=0,1"],
        "started_at": start,
        "finished_at": end,
        "wall_seconds": wall,
        "machine": {
            "processor": "Toy CPU",
            "cpu_count": 2,
            "torch_threads": 1,
            "omp_num_threads": "1",
            "accelerator": None,
            "load_average": 3.5,
        },  # fmt: skip
        "commit": "0123456789abcdef",
        "dirty": False,
        "versions": {"torch": "2.x", "transformers": "5.x"},
    }


# -- statistics -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423), (1e6, 1.9600)]
)
def test_t_critical_matches_the_students_t_table(df, expected):
    assert t_critical(df) == pytest.approx(expected, abs=1e-3)


def test_t_critical_other_levels_and_bad_input():
    assert t_critical(5, 0.99) == pytest.approx(4.0321, abs=1e-3)
    assert t_critical(5, 0.90) == pytest.approx(2.0150, abs=1e-3)
    with pytest.raises(ValueError, match="df"):
        t_critical(0)


def test_stat_mean_sd_and_confidence_interval():
    s = stat([1.0, 2.0, 3.0, float("nan"), None])
    assert (s.mean, s.sd, s.n) == (2.0, 1.0, 3)
    half = 4.3027 / math.sqrt(3)
    assert s.lo == pytest.approx(2.0 - half, abs=1e-3)
    assert s.hi == pytest.approx(2.0 + half, abs=1e-3)
    assert fmt_stat(s, digits=2) == f"2.00 ± 1.00 [{2 - half:.2f}, {2 + half:.2f}]"
    one = stat([0.5])
    assert one.n == 1 and math.isnan(one.lo) and fmt_stat(one) == "0.500"
    assert stat([]).n == 0 and fmt_stat(stat([])) == "n/a"


def test_compare_is_welchs_interval():
    a, b = [1.0, 2.0, 3.0], [10.0, 12.0, 14.0, 16.0]
    d = compare(a, b)
    va, vb = 1.0 / 3, (20.0 / 3) / 4  # sample variances / n
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    assert d.df == pytest.approx(df)
    half = t_critical(df) * math.sqrt(va + vb)
    assert (d.delta, d.lo, d.hi) == pytest.approx((-11.0, -11.0 - half, -11.0 + half))
    assert d.shown
    assert not compare([1.0, 2.0, 3.0], [1.5, 2.5, 2.0]).shown
    assert not compare([1.0], [5.0, 6.0]).shown  # one value on a side: no interval


def test_contrast_says_not_shown_within_noise():
    resolved = contrast("SafeThink", [0.1, 0.12, 0.11], "base", [0.5, 0.45, 0.48], "ASR")
    assert resolved.startswith("ASR is lower with SafeThink than with base (0.110 vs 0.477;")
    noisy = contrast("GR3", [0.9, 0.8, 0.85], "additive", [0.86, 0.84, 0.88], "accuracy")
    assert "not shown" in noisy and "contains 0" in noisy
    assert "fewer than two seeds" in contrast("a", [1.0], "b", [2.0], "x")


# -- sweeps -----------------------------------------------------------------------------------------------------


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """Two arms x two seeds from hydra.sweeper.params, plus a command-line sweep axis (lr) with one value."""
    root = tmp_path / "logs" / "demos" / "toy" / "2026-01-01_00-00-00"
    write_multirun(root, {"demo/toy/arm": "a,b", "seed": "0,1"}, ["+demo=toy", "module.lr=0.1,0.2", "x=1"])
    num = 0
    for lr in ("0.1", "0.2"):
        for arm in ("a", "b"):
            for seed in (0, 1):
                base = {"a": 1.0, "b": 2.0}[arm] + float(lr) + seed
                write_run(
                    root,
                    f"{arm}/{lr}/seed{seed}",
                    [f"demo/toy/arm={arm}", f"seed={seed}", "+demo=toy", f"module.lr={lr}", "x=1"],
                    [{"step": 0, "m": base}, {"step": 5, "m": base + 1}, {"step": 9 + seed, "m": base + 2}],
                    num=num,
                    info=info(f"2026-01-01T00:0{num}:00+00:00", f"2026-01-01T00:0{num}:30+00:00", 30.0 + num),
                    files={"records.json": {"arm": arm, "seed": seed}},
                )
                num += 1
    return root


def test_paired_contrast_uses_per_seed_differences():
    # a seed effect that Welch's interval cannot separate; the per-seed differences are all +0.01
    a, b = {0: 0.31, 1: 0.51, 2: 0.71}, {0: 0.30, 1: 0.50, 2: 0.70}
    assert not compare(list(a.values()), list(b.values())).shown
    resolved = paired_contrast("WET", a, "none", b, "WMR")
    assert resolved.startswith("WMR is higher with WET than with none, paired by seed") and "+0.010" in resolved
    noisy = paired_contrast("WET", {0: 0.3, 1: 0.5, 2: 0.7}, "none", {0: 0.31, 1: 0.49, 2: 0.7}, "WMR")
    assert "not shown" in noisy and "n=3" in noisy
    # only seeds present on both sides are paired
    assert "fewer than two paired seeds" in paired_contrast("a", {0: 1.0, 1: 2.0}, "b", {1: 1.0, 5: 0.0}, "x")


def test_a_seeds_setting_is_chosen_without_its_own_scores():
    scores = {"low": {0: 0.1, 1: 0.8, 2: 0.7}, "high": {0: 0.9, 1: 0.5, 2: 0.6}}
    assert best_on_other_seeds(scores, 0) == "low"  # seed 0's own 0.9 would pick "high"
    assert best_on_other_seeds(scores, 1) == "high"  # (0.1 + 0.7) / 2 < (0.9 + 0.6) / 2
    assert best_on_other_seeds(scores, 1, higher=False) == "low"  # a loss: lower is better
    assert best_mean(scores) == "high"  # every seed: 0.533 < 0.667
    # ties go to the first point; NaN scores and a point without another seed are left out
    assert best_on_other_seeds({"a": {0: 9.0, 1: 0.5}, "b": {1: 0.5}}, 0) == "a"
    assert best_on_other_seeds({"a": {0: 0.1, 1: math.nan}, "b": {0: 0.0, 1: 0.2}}, 0) == "b"
    assert best_on_other_seeds({"a": {0: 0.9}}, 0) is None  # one seed: nothing to choose on without it


@dataclass
class SeedRun:
    """A run as choosing reads it: its seed and one score."""

    seed: int | None
    score: float


def test_each_seed_of_an_arm_is_reported_at_the_point_chosen_on_the_other_seeds():
    scores = {"low": {0: 0.1, 1: 0.8, 2: 0.7}, "high": {0: 0.9, 1: 0.5, 2: 0.6}}
    runs = {p: {s: SeedRun(s, v) for s, v in by_seed.items()} for p, by_seed in scores.items()}
    choice = choose_per_seed(runs, lambda r: r.score)
    assert choice.chosen == {0: "low", 1: "high", 2: "high"} and choice.held_out
    assert choice.reported[0].score == 0.1  # the chosen point's run, not the seed's best
    assert choice.other_seed_means(0) == pytest.approx({"low": 0.75, "high": 0.55})
    assert choose_per_seed(runs, lambda r: r.score, higher=False).chosen == {0: "high", 1: "low", 2: "low"}
    # the grid order is the tie-break; an untrained arm reports each seed's first point, nothing chosen
    tie = {"a": {0: SeedRun(0, 0.5), 1: SeedRun(1, 0.5)}, "b": {0: SeedRun(0, 0.5), 1: SeedRun(1, 0.5)}}
    assert choose_per_seed(tie, lambda r: r.score, order=["b", "a"]).chosen == {0: "b", 1: "b"}
    assert choose_per_seed(runs, lambda r: r.score, order=["high"], tuned=False).chosen == dict.fromkeys(
        range(3), "high"
    )
    # one seed: nothing to choose on without it -- the first point, flagged
    alone = choose_per_seed({"low": {0: SeedRun(0, 0.1)}, "high": {0: SeedRun(0, 0.9)}}, lambda r: r.score)
    assert alone.chosen == {0: "low"} and not alone.held_out
    # a seed that did not run at its chosen point is left out, not reported at another point
    del runs["low"][0]
    # (seed 0's choice is low, on 0.75 against 0.55; seed 2's now low, on seed 1's 0.8 against 0.7)
    assert choose_per_seed(runs, lambda r: r.score).chosen == {1: "high", 2: "low"}


@dataclass
class LrRun:
    """A run as ordering reads it: its seed and its resolved config's learning rate."""

    seed: int | None
    lr: float | None

    def get(self, dotted: str, default: object = None) -> object:
        return self.lr if dotted == "module.optimizer.lr" and self.lr is not None else default


def test_grid_points_are_ordered_by_the_learning_rate_their_runs_trained_with():
    # names say nothing of the order ("xlow" < "vlow" < "low" < "high" by rate, not alphabetically)
    grid = {n: {0: LrRun(0, lr), 1: LrRun(1, lr)} for n, lr in [("low", 1e-4), ("xlow", 3e-5), ("high", 1e-3)]}
    grid["vlow"] = {0: LrRun(0, 5e-5)}
    assert lr_order(grid) == ["xlow", "vlow", "low", "high"]
    grid["unknown"] = {0: LrRun(0, None)}  # no rate named: last
    assert lr_order(grid)[-1] == "unknown"
    # the order is the chooser's tie-break and its edges
    tie = {p: {s: SeedRun(s, 0.5) for s in (0, 1)} for p in ("high", "low")}
    assert choose_per_seed(
        tie, lambda r: r.score, order=lr_order({"high": {0: LrRun(0, 1e-3)}, "low": {0: LrRun(0, 1e-5)}})
    ).chosen == {0: "low", 1: "low"}


def test_choices_on_an_edge_of_a_grid_of_three_or_more_points_are_named():
    scores = {"low": {0: 0.1, 1: 0.9, 2: 0.9}, "mid": {0: 0.6, 1: 0.5, 2: 0.6}, "high": {0: 0.9, 1: 0.1, 2: 0.0}}
    runs = {p: {s: SeedRun(s, v) for s, v in by_seed.items()} for p, by_seed in scores.items()}
    choice = choose_per_seed(runs, lambda r: r.score, order=["low", "mid", "high"])
    assert choice.chosen == {0: "low", 1: "mid", 2: "mid"}
    assert choice.on_edge() == {0: "low"}  # mid is inside the grid
    # the edges follow the grid order, not the mapping's
    assert choose_per_seed(runs, lambda r: r.score, order=["mid", "low", "high"]).on_edge() == {1: "mid", 2: "mid"}
    # two points: every choice is an edge, nothing is said
    two = {p: runs[p] for p in ("low", "high")}
    assert choose_per_seed(two, lambda r: r.score).on_edge() == {}


@dataclass
class LongRun:
    """A run as retraining reads it: its seed, grid point, training steps and one score."""

    seed: int | None
    point: str
    steps: int | None
    score: float


def test_longer_runs_of_the_chosen_points_are_reported_only_when_they_cover_every_seed():
    grid = [LongRun(s, p, 100, v) for s, (p, v) in enumerate([("a", 0.9), ("a", 0.8), ("a", 0.7)])]
    grid += [LongRun(s, "b", 100, 0.1) for s in range(3)]
    longer = [LongRun(s, "a", 400, 0.95) for s in range(3)]  # every seed's chosen point, at 400
    longer += [LongRun(s, "a", 800, 0.99) for s in (0, 1)]  # 800 misses seed 2
    longer += [LongRun(s, "b", 1600, 0.5) for s in range(3)]  # the point no seed chose
    shortest, rest, n = split_by_length([*longer, *grid], lambda r: r.steps)
    assert n == 100 and shortest == grid and rest == longer
    assert split_by_length([LongRun(0, "a", None, 0.0)], lambda r: r.steps)[2] is None  # no length: the grid
    cells = {p: {r.seed: r for r in grid if r.point == p} for p in ("a", "b")}
    choice = choose_per_seed(cells, lambda r: r.score)
    assert choice.chosen == dict.fromkeys(range(3), "a")
    kw = {"point_of": lambda r: r.point, "length_of": lambda r: r.steps}
    assert list(choice.retrain_lengths(longer, **kw)) == [400]  # 800 misses a seed, 1600 retrains another point
    longest = choice.retrain(longer, **kw)
    assert longest.retrained_length == 400 and [r.score for r in longest.reported.values()] == [0.95] * 3
    assert longest.chosen == choice.chosen and longest.scores == choice.scores  # the choice is the grid's
    assert choice.retrain(longer, length=800, **kw) is choice  # an incomplete length: the grid's runs
    assert [r.steps for r in choice.reported.values()] == [100] * 3


def test_runs_are_grouped_by_arm_grid_point_and_seed():
    runs = [SeedRun(0, 0.1), SeedRun(1, 0.2), SeedRun(0, 0.3)]
    grouped = group_runs(runs, arm_of=lambda r: "a" if r.score < 0.25 else "b", point_of=lambda r: f"p{r.seed}")
    assert grouped == {"a": {"p0": {0: runs[0]}, "p1": {1: runs[1]}}, "b": {"p0": {0: runs[2]}}}


def test_sweep_groups_runs_into_arms_and_seeds(sweep_dir):
    sweep = Sweep.load(sweep_dir)
    assert sweep.swept == ["demo/toy/arm", "module.lr"]
    assert sweep.seeds == [0, 1]
    arms = sweep.arms()
    assert list(arms) == ["a/0.1", "b/0.1", "a/0.2", "b/0.2"]
    runs = arms["b/0.2"]
    assert [r.seed for r in runs] == [0, 1]
    assert runs[0].label == "demo/toy/arm=b module.lr=0.2"
    assert runs[0].choice("x") == "1"
    assert runs[1].last("m") == pytest.approx(5.2)
    assert runs[1].last("missing") != runs[1].last("missing")  # nan
    assert runs[1].read_json("records.json") == {"arm": "b", "seed": 1}
    assert runs[0].get("demo.labels.a") == "Arm A" and runs[0].get("demo.nope", 7) == 7
    assert sweep.command == "python train.py -m +demo=toy seed=0,1"


def test_sweep_without_multirun_yaml_uses_what_varies(tmp_path):
    for i, (shaper, seed) in enumerate([("gr3", 0), ("none", 0), ("gr3", 1)]):
        write_run(tmp_path, str(i), [f"module/shaper={shaper}", f"seed={seed}", "trainer.max_steps=5"], num=i)
    sweep = Sweep.load(tmp_path)
    assert sweep.swept == ["module/shaper"]
    assert {k: [r.seed for r in v] for k, v in sweep.arms().items()} == {"gr3": [0, 1], "none": [0]}


def test_sweep_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no sweep directory"):
        Sweep.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no run directories"):
        Sweep.load(tmp_path)


def test_curve_averages_steps_every_run_logged(sweep_dir):
    runs = Sweep.load(sweep_dir).arm("a/0.1")
    c = curve(runs, "m")
    assert c.steps == [0, 5] and c.n == 2  # step 9 / 10 are logged by one seed each
    assert c.mean == pytest.approx([1.6, 2.6])
    half = t_critical(1) * math.sqrt(0.5) / math.sqrt(2)
    assert c.lo[0] == pytest.approx(1.6 - half) and c.hi[1] == pytest.approx(2.6 + half)
    assert curve(runs, "missing").steps == []


def test_provenance_reads_command_dates_machine_and_commit(sweep_dir):
    text = provenance(Sweep.load(sweep_dir), "toy")
    assert "`python train.py -m +demo=toy seed=0,1`" in text
    assert "8 runs (4 arms × 2 seeds: 0, 1)" in text
    assert "2026-01-01 00:00 to 2026-01-01 00:07" in text
    assert "7.5 min wall" in text and "30-37 s each" in text
    assert "Toy CPU, 2 cores, torch threads 1, OMP_NUM_THREADS=1, no accelerator" in text
    assert "commit 0123456789" in text


# -- pages ------------------------------------------------------------------------------------------------------

BUILDER = """
from zoo.report import Sweep, table, provenance, write_page
from zoo.stats import fmt_stat, stat

def build(sweep: Sweep, out):
    rows = [[name, fmt_stat(stat(r.last("m") for r in runs))] for name, runs in sweep.arms().items()]
    return [write_page(out, "toy", [provenance(sweep, "toy"), "", table(["arm", "m"], rows)])]
"""


def test_demo_page_is_built_by_the_papers_builder_from_the_newest_sweep(sweep_dir, tmp_path, capsys):
    demos = tmp_path / "demos"
    demos.mkdir()
    (demos / "toy.py").write_text(BUILDER)
    older = sweep_dir.parent / "2025-12-31_00-00-00"
    write_multirun(older, {"seed": "0"}, [])
    write_run(older, "x", ["seed=0"], [{"step": 0, "m": 99.0}])
    past = time.time() - 3600
    os.utime(older / "multirun.yaml", (past, past))
    assert latest_sweep("toy", tmp_path / "logs") == sweep_dir
    paths = build_demo_page("toy", out=tmp_path / "out", demos_dir=demos, log_dir=tmp_path / "logs")
    page = (tmp_path / "out" / "toy.md").read_text()
    assert paths == [tmp_path / "out" / "toy.md"]
    assert f"| a/0.1 | {fmt_stat(stat([3.1, 4.1]))} |" in page
    assert "99" not in page
    assert page.endswith("`python -m zoo.report demo toy`.\n")  # the footer of write_page
    main(["demo", "toy", "--sweep", str(older), "--out", str(tmp_path / "old"), "--demos", str(demos)])
    assert "| all | 99.000 |" in (tmp_path / "old" / "toy.md").read_text()
    assert "wrote" in capsys.readouterr().out


def test_demo_page_errors_are_one_line(tmp_path, capsys):
    """A missing sweep, a missing builder and data a builder rejects (ValueError): one line on stderr, status 2."""

    def said(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1
        return err

    demos = tmp_path / "demos"
    demos.mkdir()
    (demos / "toy.py").write_text("def build(sweep, out):\n    return []\n")
    assert "no sweep of the 'toy' demo" in said(["demo", "toy", "--log-dir", str(tmp_path), "--demos", str(demos)])
    write_run(tmp_path / "s", "r", ["seed=0"])
    page = ["demo", "toy", "--sweep", str(tmp_path / "s"), "--demos", str(demos)]
    (demos / "toy.py").write_text("def build(sweep, out):\n    raise ValueError('r/records.jsonl: bad row')\n")
    assert "r/records.jsonl: bad row" in said(page)
    (demos / "toy.py").unlink()
    assert "no page builder" in said(page)


def test_provenance_names_every_launch_of_a_merged_sweep(tmp_path):
    """Runs of a second launch (e.g. some arms run in parallel) copied into a sweep folder: the page names both
    commands and both commits instead of passing the runs off as one launch."""
    import json

    from zoo.report import Run, Sweep, provenance

    runs = []
    for i, (argv, commit, start) in enumerate(
        [
            (["train.py", "-m", "+demo=toy"], "a" * 40, "2026-01-01T10:00:00"),
            (["train.py", "-m", "+demo=toy", "arm=b"], "b" * 40, "2026-01-01T10:05:00"),
            (["train.py", "-m", "+demo=toy"], "a" * 40, "2026-01-01T10:01:00"),
        ]
    ):
        path = tmp_path / str(i)
        path.mkdir()
        (path / "run_info.json").write_text(json.dumps({"argv": argv, "commit": commit, "started_at": start}))
        runs.append(Run(path=path, overrides=[], number=i))
    sweep = Sweep(path=tmp_path, runs=runs, swept=[], multirun={})
    assert sweep.commands == ["python train.py -m +demo=toy", "python train.py -m +demo=toy arm=b"]
    text = provenance(sweep, "toy")
    assert "2 launches (`python train.py -m +demo=toy`; `python train.py -m +demo=toy arm=b`)" in text
    assert "commits aaaaaaaaaa, bbbbbbbbbb" in text
    single = Sweep(path=tmp_path, runs=[runs[0], runs[2]], swept=[], multirun={})
    assert "of `python train.py -m +demo=toy` by" in provenance(single, "toy")
    assert json.dumps(single.commands) == '["python train.py -m +demo=toy"]'


def agent_pages():
    """The agent demos' shared page sections (``demos/_agent_pages.py``), imported as a page builder imports them."""
    sys.path.insert(0, str(REPO_ROOT / "demos"))
    try:
        return importlib.import_module("_agent_pages")
    finally:
        sys.path.remove(str(REPO_ROOT / "demos"))


def test_llm_arm_sentence_counts_steps_calls_and_commits(tmp_path):
    from zoo.report import Run

    llm_arm_measured = agent_pages().llm_arm_measured

    run = Run.load(write_run(tmp_path, "llm/seed0", ["seed=0"], [{"step": 0, "test/tokens": 120.0}]))
    episodes = [
        {"committed": True, "steps": [{"tool": "move", "ok": True}, {"tool": None, "ok": False}]},
        {"committed": False, "steps": [{"tool": "move", "ok": False}]},
    ]
    text = llm_arm_measured([run], episodes, "score 0.5")
    assert text.startswith("Measured over 1 runs (2 episodes, 3 steps): score 0.5;")
    assert "parsed tool call 2 of 3, steps that succeeded 1; committed 1 of 2 episodes; 120 tokens" in text


def test_endpoint_section_names_the_arm_and_the_caps():
    lines = agent_pages().endpoint_section("toy", "llm_endpoint", "demo.llm.max_tokens=1024", ", on-demand scheme")
    assert lines[0] == "## Any OpenAI-compatible endpoint"
    assert "the arm `llm_endpoint`, on-demand scheme;" in lines[2]
    assert "OMP_NUM_THREADS=1 python train.py -m +demo=toy demo/toy/arm=llm_endpoint \\" in lines
    assert "    demo.llm.max_tokens=1024" in lines and "python -m zoo.report demo toy" in lines


def test_a_single_run_directory_loads_with_hydras_missing_job_number(tmp_path):
    # a run of `python train.py` (no -m) has hydra.job.num = "???"
    run_dir = write_run(tmp_path, "run", ["seed=3"], [{"step": 0, "m": 1.0}], num="???")
    run = Run.load(run_dir)
    assert (run.number, run.seed, run.last("m")) == (0, 3, 1.0)


def test_legend_only_where_a_panel_has_labelled_artists(recwarn):
    """A panel with labelled lines gets a legend; an empty panel (a curve a quick run does not produce) says "no
    data" and gets none, with no matplotlib warning."""
    plt = pyplot()
    fig, (drawn, empty) = plt.subplots(1, 2)
    drawn.plot([0, 1], [0, 1], label="arm")
    legend(drawn, fontsize=7)
    legend(empty, fontsize=7)
    assert [t.get_text() for t in drawn.get_legend().get_texts()] == ["arm"]
    assert empty.get_legend() is None
    assert [t.get_text() for t in empty.texts] == ["no data"]
    assert not [w for w in recwarn if "legend" in str(w.message)]
    plt.close(fig)


def test_provenance_of_a_partial_grid_does_not_multiply_arms_by_seeds(tmp_path):
    """Settings run at some seeds only (e.g. a tuning run at seed 0): the count is not written as arms × seeds."""
    for i, (shaper, seed) in enumerate([("gr3", 0), ("none", 0), ("gr3", 1)]):
        write_run(tmp_path, str(i), [f"module/shaper={shaper}", f"seed={seed}", "trainer.max_steps=5"], num=i)
    text = provenance(Sweep.load(tmp_path), "toy")
    assert "3 runs (2 settings, each at some of 2 seeds: 0, 1)" in text and "×" not in text.split("runs (")[1][:40]


# -- plateau readings ---------------------------------------------------------------------------------------------
def test_last_change_is_the_relative_change_over_the_value_before():
    assert last_change([2.0, 1.0, 0.9]) == pytest.approx(-0.1)  # falling: negative, over the value before (1.0)
    assert last_change((1.0, 1.1)) == pytest.approx(0.1)
    assert all(math.isnan(last_change(v)) for v in ([], [5.0], [1.0, 0.0, 2.0]))


def test_quarter_change_compares_the_third_and_the_last_quarter():
    # 10 points: quarters of 2 (10 // 4), third quarter [4, 6] (mean 5), last quarter [3, 3] (mean 3)
    falling = [100.0, 100.0, 9.0, 9.0, 8.0, 8.0, 4.0, 6.0, 3.0, 3.0]
    assert quarter_change(falling) == pytest.approx(-2.0)
    assert quarter_change(falling, relative=True) == pytest.approx(-0.4)
    rising = [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert (quarter_change(rising), quarter_change(rising, relative=True)) == pytest.approx((1.0, 0.5))
    assert math.isnan(quarter_change(rising[:7])) and math.isnan(quarter_change(rising[:7], relative=True))
    flat_at_zero = [0.0] * 6 + [1.0, 1.0]
    assert quarter_change(flat_at_zero) == 1.0 and math.isnan(quarter_change(flat_at_zero, relative=True))


def test_prerequisite_validation_loss_curves_and_their_plateau(tmp_path):
    """Curves of the prerequisites the runs used (run_info.json -> artifacts): per run, per distinct prerequisite, and
    the last loss and last change over the distinct curves of two or more validations."""
    a_rows = [{"step": 0, "val/loss": 2.0}, {"step": 1, "train/loss": 3.0}, {"step": 2, "val/loss": 1.0}]
    a = write_run(tmp_path, "a", [], [*a_rows, {"step": 3, "val/loss": 0.95}])  # step 1: no validation
    b = write_run(tmp_path, "b", [], [{"step": 0, "val/loss": 1.0}, {"step": 1, "val/loss": 1.1}])
    d = write_run(tmp_path, "d", [], [{"step": 0, "val/loss": 0.5}])
    gone = tmp_path / "gone"

    def used(*arts: tuple[str, Path]) -> dict:
        return {"artifacts": [{"kind": kind, "path": str(path)} for kind, path in arts]}

    runs = [
        Run.load(write_run(tmp_path, f"r{i}", [f"seed={i}"], info=info))
        for i, info in enumerate(
            [
                used(("base_policy", a)),
                used(("base_policy", a)),
                used(("base_policy", gone), ("base_policy", b), ("demo_policy", d)),
                {},
            ]
        )
    ]
    assert artifact_val_losses(runs[0]) == base_policy_val_losses(runs[0]) == [2.0, 1.0, 0.95]
    assert artifact_val_losses(runs[2]) == [1.0, 1.1]  # the first of the kind whose log is there
    assert artifact_val_losses(runs[2], "demo_policy") == [0.5] and artifact_val_losses(runs[3]) == []
    curves = artifact_val_loss_curves(runs, "base_policy")
    assert curves == {str(a): [2.0, 1.0, 0.95], str(gone): [], str(b): [1.0, 1.1]}
    users = artifact_users(runs, "base_policy")
    assert {p: [r.seed for r in rs] for p, rs in users.items()} == {str(a): [0, 1], str(gone): [2], str(b): [2]}
    last, change = val_loss_plateau(runs)
    assert (last.n, change.n) == (2, 2)  # a and b once each
    assert last.mean == pytest.approx((0.95 + 1.1) / 2) and change.mean == pytest.approx((-0.05 + 0.1) / 2)
    assert val_loss_plateau(runs, absolute=True)[1].mean == pytest.approx((-0.05 + 0.1) / 2)  # 0.95 - 1.0, 1.1 - 1.0
    assert val_loss_plateau(runs, "demo_policy")[1].n == 0  # a single validation: no change


def test_run_artifacts_by_kind_and_name_their_logs_and_build_seconds(tmp_path):
    """The prerequisites a run used, filtered by kind and name; a log's validation losses with their steps; a build's
    seconds from its artifact.json (nan when the record is gone)."""
    model = write_run(tmp_path, "model", [], [{"step": 49, "train/loss": 3.0}, {"step": 50, "val/loss": 1.5}])
    (model / "artifact.json").write_text(json.dumps({"build_seconds": 12.5}))
    arts = [
        {"kind": "topic_lm", "name": "generator", "path": str(model), "built_now": True},
        {"kind": "topic_lm", "name": "paraphraser", "path": str(tmp_path / "gone")},
        {"kind": "base_policy", "path": str(model)},
    ]
    run = Run.load(write_run(tmp_path, "r", ["seed=0"], info={"artifacts": arts}))
    assert run.artifacts() == arts
    assert run.artifacts("topic_lm") == arts[:2] and run.artifacts("topic_lm", "paraphraser") == arts[1:2]
    assert run.artifacts("demo_policy") == [] and Run.load(write_run(tmp_path, "bare", [])).artifacts() == []
    assert list(artifact_users([run], "topic_lm", "generator")) == [str(model)]
    assert artifact_val_losses(run, "topic_lm") == [1.5] and artifact_val_losses(run, "demo_policy") == []
    # plateau: a small relative change, or a few ten-thousandths of a nat at the loss floor; neither: not settled
    assert loss_settled(-0.04, -0.1, 0.05) and loss_settled(-0.64, -0.0009, 0.05)
    assert not loss_settled(-0.5, -0.005, 0.05) and not loss_settled(0.06, 0.002, 0.05)
    assert build_seconds(arts[0]) == 12.5 and math.isnan(build_seconds(arts[1]))
    # a prerequisite's build run reads as a run: its resolved config and log; a gone one has neither
    (model / "resolved_config.yaml").write_text(yaml.safe_dump({"datamodule": {"overflow": "keep_recent"}}))
    assert build_run(arts[0]).get("datamodule.overflow") == "keep_recent"
    assert build_run(arts[0]).series("val/loss") == [(50, 1.5)]
    assert build_run(arts[1]).config == {} and build_run(arts[1]).series("val/loss") == []
    assert [b.path for b in artifact_runs([run, run], "topic_lm")] == [model, tmp_path / "gone"]  # distinct, in order
    assert [b.path for b in artifact_runs([run], "topic_lm", "paraphraser")] == [tmp_path / "gone"]


def test_a_doubling_check_is_a_build_of_the_same_spec_trained_twice_as_long_in_the_same_cache(tmp_path):
    """Builds written through the artifact cache itself (:func:`zoo.artifacts.ensure`): the base a run used (3 epochs)
    pairs with the build whose spec differs only in twice its epochs -- not with a build at 4 epochs, nor with 6 epochs
    of another seed; the caveat of a one-cycle schedule then reads the pair against the plateau threshold."""
    from zoo.artifacts import ensure

    cache = tmp_path / "cache"

    def build(losses: list[float], schedule: str = "zoo.optim.one_cycle"):
        def write(directory: Path) -> dict:
            write_run(directory.parent, directory.name, [], [{"step": i, "val/loss": v} for i, v in enumerate(losses)])
            config = {"module": {"scheduler": {"_target_": schedule}}}
            (directory / "resolved_config.yaml").write_text(yaml.safe_dump(config))
            return {"metrics": {"val/loss": losses[-1]}}

        return write

    def spec(epochs: int, seed: int = 0) -> dict:
        return {"seed": seed, "trainer": {"max_epochs": epochs, "max_steps": -1}, "module": {"lr": 0.003}}

    used = ensure("base_policy", spec(3), build([2.0, 1.0, 0.990]), cache, name="task")
    ensure("base_policy", spec(4), build([0.5]), cache, name="task")  # not twice as long
    ensure("base_policy", spec(6, seed=1), build([0.4]), cache, name="task")  # another seed
    arts = [{"kind": "base_policy", "path": str(used)}]
    run = Run.load(write_run(tmp_path, "r", ["seed=0"], info={"artifacts": arts}))
    assert doubling_checks([run], "base_policy") == []
    caveat = decaying_schedule_caveat([run], "base_policy", "epoch", relative=0.02, whose="The base's")
    assert caveat.startswith(" The base's learning rate follows a one-cycle") and "doubling" not in caveat

    ensure("base_policy", spec(6), build([2.0, 0.5, 0.3, 0.2, 0.1, 0.891]), cache, name="task")
    (check,) = doubling_checks([run], "base_policy")
    assert (check.key, check.unit, check.length) == ("trainer.max_epochs", "epochs", 3)
    assert (check.loss, check.doubled_loss) == (0.990, 0.891) and check.change == pytest.approx(-0.1)
    caveat = decaying_schedule_caveat([run], "base_policy", "epoch", relative=0.02)
    assert "a doubling check of the model" in caveat
    assert (
        "0.99 after 3 epochs and 0.891 after 6 (-10.0%, -0.099 nats: not at its plateau: more training lowers" in caveat
    )
    assert "at a plateau more training lowers it by less than 2% or 0.001 nats" in caveat
    assert caveat.endswith("By the doubling check the plateau is **not met**, whatever the last epoch shows.")
    settled = decaying_schedule_caveat([run], "base_policy", "epoch", relative=0.2)
    assert "(-10.0%, -0.099 nats: at its plateau" in settled and "**not met**" not in settled
    # a longer build that ends higher: training longer does not help (a plateau, said as such)
    worse = ensure("base_policy", spec(6), build([2.0, 1.2]), tmp_path / "other", name="task")
    base = ensure("base_policy", spec(3), build([2.0, 1.0]), tmp_path / "other", name="task")
    assert worse != base
    higher = Run.load(
        write_run(tmp_path, "h", ["seed=0"], info={"artifacts": [{"kind": "base_policy", "path": str(base)}]})
    )
    caveat = decaying_schedule_caveat([higher], "base_policy", "epoch", relative=0.02)
    assert "(+20.0%, +0.2 nats: more training raises it: at its plateau, training longer does not help" in caveat
    assert "**not met**" not in caveat
    assert doubling_checks([run], "demo_policy") == []  # another kind: nothing found
    # a build under a constant rate needs no caveat, doubling check or not
    other = ensure("base_policy", spec(3, seed=2), build([1.0, 0.99], "torch.optim.lr_scheduler.ConstantLR"), cache)
    flat = Run.load(
        write_run(tmp_path, "c", ["seed=2"], info={"artifacts": [{"kind": "base_policy", "path": str(other)}]})
    )
    assert decaying_schedule_caveat([flat], "base_policy", "epoch", relative=0.02) == ""


def test_the_schedule_caveat_names_each_decaying_schedule_and_reads_the_runs_own_configs(tmp_path):
    """A cosine schedule (``zoo.optim.warmup_cosine``) decays too, to its ``min_ratio`` of the peak; with ``kind=None``
    the caveat reads the runs' own schedules (the runs trained themselves: no artifact, no doubling check)."""

    def run_with(name: str, scheduler: dict | None) -> Run:
        path = write_run(tmp_path, name, ["seed=0"], info={})
        config = {"seed": 0, **({"module": {"scheduler": scheduler}} if scheduler else {})}
        (path / "resolved_config.yaml").write_text(yaml.safe_dump(config))
        return Run.load(path)

    from zoo.optim import warmup_cosine
    from zoo.report.runs import COSINE_MIN_RATIO

    assert inspect.signature(warmup_cosine).parameters["min_ratio"].default == COSINE_MIN_RATIO == 0.1
    cosine = run_with("cos", {"_target_": "zoo.optim.warmup_cosine", "warmup_ratio": 0.05})
    caveat = decaying_schedule_caveat([cosine], None, "validation interval", relative=0.05, whose="Their")
    assert caveat == (
        " Their learning rate follows a cosine schedule that decays to 0.1 of its peak by the end of training, so a "
        "flat last validation interval does not show that more training would not lower the loss."
    )
    low = run_with("low", {"_target_": "zoo.optim.warmup_cosine", "min_ratio": 0.25})
    assert "decays to 0.25 of its peak" in decaying_schedule_caveat([low], None, "epoch", relative=0.05)
    one_cycle = run_with("oc", {"_target_": "zoo.optim.one_cycle"})
    assert "a one-cycle schedule that decays towards 0 by the end" in decaying_schedule_caveat(
        [one_cycle], None, "epoch", relative=0.05
    )
    constant = run_with("const", {"_target_": "zoo.optim.constant"})
    assert decaying_schedule_caveat([constant, run_with("none", None)], None, "epoch", relative=0.05) == ""
    # the runs' own schedule is not read when the caveat is about their prerequisites (here: none)
    assert decaying_schedule_caveat([cosine], "base_policy", "epoch", relative=0.05) == ""
