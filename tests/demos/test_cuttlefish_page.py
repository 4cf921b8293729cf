"""The Cuttlefish page (demos/cuttlefish.py) on a 4-arm x 3-seed sweep whose outcomes the test chooses: it opens
with the generated Verdict (Cuttlefish vs the fixed-length query connector in distribution and beyond, vs mean
pooling beyond, the token count growing with size, the adapter vs patching alone), each effect paired by seed, and
has a generated Fair-test section that says from the numbers whether the fixed budget fails on large structures,
whether the learned gate gives them more tokens, and whether every arm's training loss reached a plateau."""

from __future__ import annotations

import pytest
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

ARMS = ("mean_pool", "query", "patching", "cuttlefish")
SEEDS = (0, 1, 2)
# right answers out of 10 per seed: (in distribution, extrapolation)
CORRECT = {
    "mean_pool": ((7, 4), (7, 4), (7, 4)),
    "query": ((6, 3), (6, 3), (6, 3)),
    "patching": ((9, 8), (8, 8), (8, 8)),
    "cuttlefish": ((8, 7), (9, 7), (8, 7)),
}
CONFIG = {
    "trainer": {"max_steps": 500},
    "datamodule": {"batch_size": 16, "source": {"num_train": 64, "num_val": 20, "task": {"max_atoms": 100}}},
    "module": {
        "optimizer": {"lr": 0.001},
        "scheduler": {"_target_": "zoo.optim.warmup_cosine", "warmup_ratio": 0.05},  # as the demo's runs
        "stage": "full_finetune",
        "encoder": {"hidden": 64},
    },
    "demo": {"train_max_atoms": 100, "labels": {"query": "query (8)", "cuttlefish": "Cuttlefish", "patching": "SAP"}},
}


def tokens(arm: str, atoms: int, collapsed: bool) -> int:
    if arm == "mean_pool":
        return 1
    if arm == "query":
        return 8
    return 1 if collapsed else (2 if atoms <= 100 else 5)


GRID = {"low": 3e-4, "high": 1e-3}


def correct(arm: str, point: str, seed: int) -> tuple[int, int]:
    """Right answers at a grid point: ``low`` is CORRECT; ``high`` is worse on every seed but the query connector's
    seed 0 (10 + 10 right against 6 + 3; seeds 1, 2: 4 + 2). Leave one seed out, the query connector's seed 0 gets
    ``low`` (seeds 1, 2 score 0.30 at ``high``, 0.45 at ``low``) and seeds 1 and 2 get ``high`` ((1.00 + 0.30) / 2 >
    0.45); choosing on a seed's own score would swap them, on every seed at once would give ``high`` everywhere."""
    if point == "low":
        return CORRECT[arm][seed]
    if point == "vlow":
        return tuple(max(r - 1, 0) for r in CORRECT[arm][seed])
    if arm == "query":
        return (10, 10) if seed == 0 else (4, 2)
    return tuple(max(r - 2, 0) for r in CORRECT[arm][seed])


@pytest.fixture
def make_sweep(tmp_path):
    def make(
        collapsed: bool = False,
        loss_drop: float = 0.0,
        grid: bool = False,
        vlow: bool = False,
        retrain: tuple = (),
        heldout: dict | None = None,
    ) -> Sweep:
        """``vlow``: a later launch adds the grid point 1e-4 (its runs' configs hold the three-point grid).
        ``retrain``: arms whose chosen point (see :func:`correct`) a later launch retrains for 1000 steps at every
        seed: one more right answer per region, a flat training loss. ``heldout``: ``{arm: change}``, the retrained
        runs of these arms validate every 200 steps and their held-out loss changes by ``change`` from step 799 to
        999."""
        params = {"demo/cuttlefish/arm": ",".join(ARMS), "seed": "0,1,2"} | ({"demo.lr": "low,high"} if grid else {})
        root = write_sweep(tmp_path / f"sweep{collapsed}{loss_drop}{grid}{vlow}{retrain}{heldout}", params)
        launched = (*GRID, "vlow") if vlow else GRID
        cells = [(a, s, p, False) for a in ARMS for s in SEEDS for p in (launched if grid else ("-",))]
        cells += [(a, s, "high" if a == "query" and s > 0 else "low", True) for a in retrain for s in SEEDS]
        for number, (arm, seed, point, long) in enumerate(cells):
            gated = arm in ("patching", "cuttlefish")
            config = CONFIG | {"module": {**CONFIG["module"], "connector": {"rho": 0.1, "k_max": 64, "tau": 1.0}}}
            config = config if gated else CONFIG
            if grid:
                lr_grid = GRID | {"vlow": 1e-4} if point == "vlow" else GRID
                module = {**config["module"], "optimizer": {"lr": lr_grid[point]}}
                config = config | {"module": module, "demo": {**CONFIG["demo"], "lr": point, "lr_grid": lr_grid}}
            rights = correct(arm, point, seed) if grid else CORRECT[arm][seed]
            if long:
                every = 200 if arm in (heldout or {}) else 1000
                config = config | {"trainer": {"max_steps": 1000, "val_check_interval": every}}
                rights = tuple(min(r + 1, 10) for r in rights)
            records = []
            for atoms, right in zip((60, 250), rights):
                records += [
                    {
                        "step": 499,
                        "correct": i < right,
                        "num_atoms": atoms,
                        "size_bins": "51-100" if atoms <= 100 else ">200",
                        "kinds": "ring_count",
                        "answer": "2",
                        "completion": "2" if i < right else "1",
                        "num_tokens": tokens(arm, atoms, collapsed),
                    }
                    for i in range(10)
                ]
            run = write_run(
                root,
                ("long/" if long else "") + (f"{arm}/lr_{point}/seed{seed}" if grid else f"{arm}/seed{seed}"),
                {"demo/cuttlefish/arm": arm, "seed": seed} | ({"demo.lr": point} if grid else {}),
                {**config, "seed": seed},
                number,
                info={"wall_seconds": 10.0},
                files={"eval_records.jsonl": records},
            )
            curve = [{"step": 10 * s, "train/loss": 1.0 - (0.0 if long else loss_drop) * s} for s in range(10)]
            if long and arm in (heldout or {}):
                losses = [1.0, 0.9, 0.8, 0.7, 0.7 * (1 + heldout[arm])]
                curve += [{"step": 200 * i + 199, "val/loss": v} for i, v in enumerate(losses)]
            write_metrics(run, [*curve, {"step": 999 if long else 499, "val/exact_match": sum(rights) / 20}])
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("cuttlefish", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def test_page_opens_with_the_verdict_paired_by_seed(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    verdict = read_verdict(tmp_path / "out" / "cuttlefish.md")
    # shown: vs query (both regions), vs mean pooling beyond, token growth; within noise: the adapter in
    # distribution; contradicted: the adapter beyond (patching alone is 0.1 better)
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (4, 1, 1)
    assert "Cuttlefish − query (8), paired by seed | +0.233 [+0.090, +0.377] | **shown** |" in text
    assert "| +0.400 [+0.400, +0.400] | **shown** |" in text  # extrapolation vs query
    assert "extrapolation − in distribution (per seed) | +3.000 [+3.000, +3.000] | **shown** |" in text
    assert "Cuttlefish − SAP, paired by seed | +0.000 [-0.248, +0.248] | **not shown (within noise)** |" in text
    assert "| -0.100 [-0.100, -0.100] | **contradicted** |" in text
    assert "What this demo cannot test:" in text
    assert text.index("## Verdict") < text.index("## Fair test") < text.index("## Accuracy by structure size")


def test_fair_test_reads_the_failure_the_gate_and_the_plateau(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Accuracy by structure size")]
    assert "query (8), accuracy in distribution − extrapolation, paired by seed, 0.300 ± 0.000" in fair
    assert "the failure occurs: met." in fair
    assert "gives 0.000 ± 0.000 of the held-out structures a single token" in fair
    assert "3.000 ± 0.000 [3.000, 3.000] more tokens on average beyond 100 atoms than up to it: met." in fair
    assert "Cuttlefish +0.0%" in fair and "more than 5%: **met**." in fair
    collapsed = build(make_sweep(collapsed=True, loss_drop=0.05), tmp_path / "out2")
    fair = collapsed[collapsed.index("## Fair test") : collapsed.index("## Accuracy by structure size")]
    assert "gives 1.000 ± 0.000 of the held-out structures a single token" in fair
    assert "**not met** (the gate collapses towards one patch" in fair
    assert "more than 5%: **not met** (still falling: mean_pool, query (8), SAP, Cuttlefish)" in fair


def test_the_budget_alone_is_a_verdict_line_when_the_uniform_gate_ran(make_sweep, tmp_path, monkeypatch):
    """The uniform-gate control (k = ceil(rho n), a gate that cannot collapse) against mean pooling beyond the
    training sizes: the scaling-aware budget without the learned gate."""
    monkeypatch.setattr(f"{__name__}.ARMS", (*ARMS, "cuttlefish_uniform"))
    monkeypatch.setitem(CORRECT, "cuttlefish_uniform", ((8, 6), (8, 7), (8, 6)))
    text = build(make_sweep(), tmp_path / "out")
    row = next(x for x in text.splitlines() if "(the budget alone: a gate that cannot collapse)" in x)
    assert "cuttlefish_uniform − mean_pool, paired by seed" in row
    assert row.endswith("| +0.233 [+0.090, +0.377] | **shown** |")
    verdict = read_verdict(tmp_path / "out" / "cuttlefish.md")
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (5, 1, 1)


def test_each_seeds_learning_rate_is_chosen_on_the_other_seeds(make_sweep, tmp_path):
    """Every arm at two grid points (:func:`correct`): every arm but the query connector gets ``low`` at every seed;
    the query connector gets ``low`` at seed 0 and ``high`` at seeds 1 and 2, and the page reports those runs."""
    text = build(make_sweep(grid=True), tmp_path / "out")
    tuning = text[text.index("## Learning rate chosen per arm") : text.index("## Accuracy by structure size")]
    assert "| query (8) | low (0.0003): 0.450; high (0.001): 0.533 | low x1, high x2 |" in tuning
    assert "| Cuttlefish | low (0.0003): 0.767; high (0.001): 0.567 | low x3 |" in tuning
    # the reported query runs: seed 0 at low (6 of 10 right in distribution), seeds 1 and 2 at high (4 of 10)
    sizes = text[text.index("## Accuracy by structure size") :]
    assert "| query (8) | 0.467 ± 0.115 [0.180, 0.754] | 0.233 ± 0.058 [0.090, 0.377] |" in sizes
    assert "| Cuttlefish | 0.833 ± 0.058 [0.690, 0.977] | 0.700 ± 0.000 [0.700, 0.700] |" in sizes
    fair = text[text.index("## Fair test") : text.index("## Learning rate chosen per arm")]
    assert "Every arm ran the same 2-point learning-rate grid (0.0003, 0.001)" in fair
    assert "Leave one seed out" in fair and "never on the questions it reports" in fair and "): met." in fair
    assert "learning rate from the grid low 0.0003, high 0.001" in text


def test_a_grid_point_added_by_a_later_launch_joins_the_grid(make_sweep, tmp_path):
    """The first launch ran {3e-4, 1e-3}, a later one 1e-4 (its config holds the three-point grid): the page reads
    the union, lowest first, and chooses among all three (1e-4 is one right answer below 3e-4 on every seed)."""
    text = build(make_sweep(grid=True, vlow=True), tmp_path / "out")
    tuning = text[text.index("## Learning rate chosen per arm") : text.index("## Accuracy by structure size")]
    assert "| Cuttlefish | vlow (0.0001): 0.667; low (0.0003): 0.767; high (0.001): 0.567 | low x3 |" in tuning
    assert "Every arm ran the same 3-point learning-rate grid (0.0001, 0.0003, 0.001)" in text
    assert "learning rate from the grid vlow 0.0001, low 0.0003, high 0.001" in text
    # the query connector's seeds 1 and 2 take the grid's highest point (see correct()); every other choice is inner
    assert "Choices on an edge of the grid (the best point may lie beyond it): query (8) (high x2)." in tuning


def test_the_grid_is_the_points_that_ran_at_the_rates_they_trained_with(make_sweep, tmp_path):
    """Every run's config declares a third point (``demo.lr_grid`` with 1e-4) that no launch ran: the page's grid is
    the two points that ran, each labelled with the learning rate its runs trained with (``module.optimizer.lr``)."""
    sweep = make_sweep(grid=True)
    for run in sweep.runs:
        run.config["demo"]["lr_grid"] = {"vlow": 1e-4, **run.config["demo"]["lr_grid"]}
    text = build(sweep, tmp_path / "out")
    assert "Every arm ran the same 2-point learning-rate grid (0.0003, 0.001)" in text
    assert "vlow" not in text


def test_the_chosen_points_retrained_for_longer_are_reported_only_when_every_arm_has_them(make_sweep, tmp_path):
    """Grid runs still falling (500 steps); a later launch retrains every arm's chosen point at every seed for 1000
    steps (flat loss, one more right answer per region): the page reports those runs and reads their plateau. When
    only one arm is retrained the longer runs are left out (the arms would differ in effort)."""
    text = build(make_sweep(grid=True, loss_drop=0.05, retrain=ARMS), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Learning rate chosen per arm")]
    assert "grid (0.0003, 0.001) for 500 steps of batch 16" in fair
    assert "the same rule (the table below), then retrained for 1000 steps at every seed;" in fair
    assert "more than 5%: **met**." in fair
    tuning = text[text.index("## Learning rate chosen per arm") : text.index("## Accuracy by structure size")]
    assert "each arm's chosen point is then retrained at every seed for 1000 steps" in tuning
    assert "| query (8) | low (0.0003): 0.450; high (0.001): 0.533 | low x1, high x2 |" in tuning  # chosen on the grid
    sizes = text[text.index("## Accuracy by structure size") :]
    assert "| Cuttlefish | 0.933 ± 0.058 [0.790, 1.077] | 0.800 ± 0.000 [0.800, 0.800] |" in sizes
    assert "learning rate from the grid low 0.0003, high 0.001 (every arm the same grid at 500 steps;" in text
    assert ", 1000 steps of batch 16," in text
    partial = build(make_sweep(grid=True, loss_drop=0.05, retrain=("cuttlefish",)), tmp_path / "out2")
    assert "3 longer runs are left out: they do not retrain every reported run at one length." in partial
    assert "then retrained" not in partial and "more than 5%: **not met**" in partial
    sizes = partial[partial.index("## Accuracy by structure size") :]
    assert "| Cuttlefish | 0.833 ± 0.058 [0.690, 0.977] | 0.700 ± 0.000 [0.700, 0.700] |" in sizes


def test_the_plateau_is_read_on_the_held_out_loss_when_every_reported_run_validated_during_training(
    make_sweep, tmp_path
):
    """The retrained runs' training loss is flat, but where they validated every 200 steps the page reads the
    held-out loss over the last validation interval: falling 10% for one arm is not a plateau; rising (past its best)
    is; one arm without the curve sends the page back to the training loss, said so."""
    arms = dict.fromkeys(ARMS, 0.03) | {"query": -0.10}
    text = build(make_sweep(grid=True, loss_drop=0.05, retrain=ARMS, heldout=arms), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Learning rate chosen per arm")]
    assert "Held-out-loss change (`val/loss`; the reported runs validated every 200 steps) over the last" in fair
    assert "query (8) -10.0%" in fair and "Cuttlefish +3.0%" in fair
    assert "more than 5%: **not met** (still falling: query (8))." in fair
    assert "held-out loss change over the last validation interval" in text  # the training table's column
    rising = build(
        make_sweep(grid=True, loss_drop=0.05, retrain=ARMS, heldout=dict.fromkeys(ARMS, 0.03)), tmp_path / "o2"
    )
    assert "more than 5%: **met**." in rising and "a rising held-out loss is past its best" in rising
    # a cosine schedule flattens the last interval by itself: the page says so after the reading
    assert (
        "more than 5%: **met**. Every arm's learning rate follows a cosine schedule that decays to 0.1 of its peak by "
        "the end of training, so a flat last validation interval does not show" in rising
    )
    partial = {a: -0.10 for a in ARMS if a != "query"}
    text = build(make_sweep(grid=True, loss_drop=0.05, retrain=ARMS, heldout=partial), tmp_path / "o3")
    fair = text[text.index("## Fair test") : text.index("## Learning rate chosen per arm")]
    assert "Training-loss change over the last 20%" in fair and "more than 5%: **met**." in fair  # flat training loss
    assert "so a flat last 20% of training does not show" in fair
    assert "held-out loss change over the last validation interval" not in text
