"""The WET page (demos/wet.py) on a sweep whose outcomes the test chooses: it opens with the generated Verdict (WMR
rises under drift, H flags misattribution, the gate opens on the rows that go wrong, WET against no intervention,
random heads and probe-accuracy heads on drift rows, in-distribution accuracy kept; paired by seed), shows the overlap
of the rankers' head sets and the gate on misattributed vs correct rows, and has a generated Fair-test section."""

from __future__ import annotations

import pytest
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

ARMS = ("none", "wet", "random", "probe")
SEEDS = (0, 1, 2)
WET_HEADS = [[2, 0], [3, 1], [4, 2], [5, 3]]
RANDOM_HEADS = [[2, 0], [2, 1], [2, 2], [2, 3]]


def wrong_on_drift(arm: str, seed: int) -> int:
    """Misattributed drift rows out of 20: none and random 8, WET 4 on every seed (-0.2 paired: shown), probe-accuracy
    heads 4 + (2, -2, 0) by seed (WET − probe: -0.1, +0.1, 0: within noise)."""
    return {"none": 8, "random": 8, "wet": 4, "probe": 4 + (2, -2, 0)[seed]}[arm]


def records(arm: str, seed: int, gate_on_wrong: float) -> list[dict]:
    """20 in-distribution rows (correct, gate closed) and 20 drift rows (a late mention of W1), of which
    ``wrong_on_drift`` are misattributed (H 1.0, gate ``gate_on_wrong``) and the rest correct (H 0.2, gate 0)."""
    base = {"stage": "test", "prompt": "W0:ab E01=", "world": 0, "entity": 1, "completion": "A", "answer": "A"}
    rows = [
        {**base, "distance": 4, "conflict_world": -1, "correct": True, "misattributed": False, "attributed_world": 0}
        | {"entropy": 0.1, "gate": 0.0}
        for _ in range(20)
    ]
    wrong = wrong_on_drift(arm, seed)
    for i in range(20):
        bad = i < wrong
        rows.append(
            {**base, "distance": 30, "conflict_world": 1, "correct": not bad, "misattributed": bad}
            | {
                "attributed_world": 1 if bad else 0,
                "entropy": 1.0 if bad else 0.2,
                "gate": gate_on_wrong if bad else 0.0,
            }
        )
    return rows


@pytest.fixture
def make_sweep(tmp_path):
    def make(probe_heads=None, gate_on_wrong=0.6, last_losses=(0.0100, 0.0099), seeds_launched=SEEDS):
        policy = tmp_path / "cache" / "base_policy" / "multiworld"
        write_metrics(policy, [{"step": i, "val/loss": v} for i, v in enumerate((0.9, *last_losses))])
        root = write_sweep(tmp_path / "sweep", {"demo/wet/arm": ",".join(ARMS), "seed": "0,1,2"})
        number = 0
        for arm in ARMS:
            for seed in seeds_launched:
                heads = {
                    "none": WET_HEADS,
                    "wet": WET_HEADS,
                    "random": RANDOM_HEADS,
                    "probe": (probe_heads or {}).get(seed, WET_HEADS[:2] + RANDOM_HEADS[2:]),
                }[arm]
                config = {
                    "seed": seed,
                    "task": {"num_worlds": 4, "num_entities": 20, "min_distractors": 0, "max_distractors": 8},
                    "eval_task": {"min_distractors": 0, "max_distractors": 40, "conflict_prob": 0.25},
                    "backbone": {"num_hidden_layers": 6, "num_attention_heads": 8},
                    "base_policy": {"num_train": 16000, "max_epochs": 3, "batch_size": 64, "lr": 0.003},
                    "callbacks": {
                        "wet": {
                            "probe_layer": 1,
                            "num_heads": 4,
                            "alpha": 0.0 if arm == "none" else 1.0,
                            "eta": 0.5,
                            "beta": 0.0,
                            "eta_quantile": 0.95,
                            "calibration_split": "val",
                            "probe_positions": "anchors+last",
                            "anchor_pattern": "^W(\\d+)",
                            "max_rows": 1024,
                            "source": {"num_val": 1024},
                        }
                    },
                    "demo": {
                        "bins": [[0, 8], [9, 16], [17, 24], [25, 32], [33, 48]],
                        "labels": {"none": "no intervention", "wet": "WET (score-matching heads)"},
                    },
                }
                write_run(
                    root,
                    f"{arm}/seed{seed}",
                    {"demo/wet/arm": arm, "seed": seed},
                    config,
                    number,
                    metrics={"test/wet/misattribution_rate": 0.1},
                    info={
                        "artifacts": [{"kind": "base_policy", "path": str(policy), "metrics": {"val/exact_match": 1.0}}]
                    },
                    files={
                        "wet_records.jsonl": records(arm, seed, gate_on_wrong),
                        "wet_fit.json": [{"heads": heads, "eta": 0.05 + 0.01 * seed}],
                    },
                )
                number += 1
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("wet", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def test_page_opens_with_the_verdict_paired_by_seed(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    verdict = read_verdict(tmp_path / "out" / "wet.md")
    # WMR rises (0.4 vs 0 in distribution), H flags it, the gate opens on wrong rows, WET below none and random,
    # accuracy in distribution kept: shown; WET vs probe heads (-0.1, +0.1, 0): not shown
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (6, 1, 0)
    assert "| WET lowers world misattribution under drift vs no intervention |" in text
    assert "| -0.200 [-0.200, -0.200] | **shown** |" in text
    row = next(line for line in text.splitlines() if "vs rescaling the top heads by probe accuracy |" in line)
    assert row.endswith("| **not shown (within noise)** |") and "| +0.000 [" in row
    assert "| +0.400 [+0.400, +0.400] | **shown** |" in text  # drift − in distribution, no intervention
    assert "| +0.600 [+0.600, +0.600] | **shown** |" in text  # mean g, misattributed − correct


def test_head_overlap_and_gate_tables_come_from_the_runs(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    # WET {L2H0, L3H1, L4H2, L5H3} vs random {L2H0..L2H3}: 1 shared of 7; vs probe {L2H0, L3H1, L2H2, L2H3}: 2 of 6
    assert "| WET (score-matching heads) vs random | 0.14 | 0.14 | 0.14 |" in text
    assert "| WET (score-matching heads) vs probe | 0.33 | 0.33 | 0.33 |" in text
    assert "| no intervention | 0.600 ± 0.000 | 0.000 ± 0.000 | 1.000 ± 0.000 | 0.000 ± 0.000 |" in text
    assert "η = 0.050–0.070 over the runs" in text
    # the reading: the calibrated threshold and the mean factor on misattributed rows (1 + 1.0 * 0.6)
    assert "(η calibrated as the 0.95 quantile of `H` on in-distribution `val` prompts)" in text
    assert "with mean g 0.600 (a mean factor 1 + α g of 1.600 on the rescaled heads at α = 1)" in text


def test_fair_test_reads_failure_heads_thresholds_and_plateau(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## What this scale")]
    assert "misattributes 0.400 of the drift rows" in fair and "**met**." in fair
    assert "pick different heads: **met**" in fair and "higher on the rows that go wrong" in fair
    assert "None for any" in fair and "0.95 quantile of `H` on the `val` split" in fair
    assert "change over the last epoch -1.0%" in fair and "**met**)" in fair
    assert "3 seeds" in fair


def test_same_heads_closed_gate_and_a_moving_loss_are_flagged(make_sweep, tmp_path):
    same = dict.fromkeys(SEEDS, WET_HEADS)
    text = build(make_sweep(probe_heads=same, gate_on_wrong=0.0, last_losses=(0.02, 0.01)), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## What this scale")]
    assert "| WET (score-matching heads) vs probe | 1.00 | 1.00 | 1.00 |" in text
    assert "not higher on the rows that go wrong" in fair
    assert "-50.0% (-0.0100 nats per token" in fair and "**not met**)" in fair
    # a loss at its floor: -16.7% of 0.0006 is 0.0001 nats, below the absolute tolerance
    floor = build(make_sweep(last_losses=(0.0006, 0.0005)), tmp_path / "out2")
    fair = floor[floor.index("## Fair test") : floor.index("## What this scale")]
    assert "change over the last epoch -16.7% (-0.0001 nats per token" in fair and "**met**)" in fair
    verdict = read_verdict(tmp_path / "out" / "wet.md")
    gate = next(line for line in text.splitlines() if line.startswith("| the gate opens on the rows that go wrong |"))
    assert gate.endswith("| **not shown (within noise)** |")
    assert verdict.shown == 5


def test_the_heads_table_puts_each_run_under_its_own_seed(make_sweep, tmp_path):
    """Runs launched seed 2 first (a merged sweep's order): each column still holds its own seed's heads."""
    per_seed = {
        0: [[4, 0], [4, 1], [5, 0], [5, 1]],
        1: [[4, 2], [4, 3], [5, 2], [5, 3]],
        2: [[4, 4], [4, 5], [5, 4], [5, 5]],
    }
    text = build(make_sweep(probe_heads=per_seed, seeds_launched=(2, 0, 1)), tmp_path / "out")
    assert "| arm | seed 0 | seed 1 | seed 2 |" in text
    assert "| probe | L4H0, L4H1, L5H0, L5H1 | L4H2, L4H3, L5H2, L5H3 | L4H4, L4H5, L5H4, L5H5 |" in text
