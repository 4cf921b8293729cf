"""The VaLR page (demos/valr.py) on a 4-arm x 3-seed sweep whose outcomes the test chooses: it opens with the
generated Verdict (VaLR vs CoT SFT overall and on the longest chains, VaLR vs latents without alignment, the step
probe), each effect paired by seed, and has a generated Fair-test section that says from the numbers whether the
baseline's failure (accuracy falling with chain length) occurs and whether each stage reached a plateau."""

from __future__ import annotations

import pytest
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

ARMS = ("stage1", "cot", "latent", "valr")
SEEDS = (0, 1, 2)
CONFIG = {
    "task": {"grid": 4, "min_steps": 1, "max_steps": 4, "filler": 2},
    "backbone": {"image_pool": 3, "num_image_tokens": 9, "num_hidden_layers": 4, "hidden_size": 64},
    "demo": {"labels": {"cot": "CoT SFT", "latent": "latents", "valr": "VaLR"}, "stage1": {"steps": 800}},
    "module": {"stage": "cot", "num_latents": 4, "optimizer": {"lr": 0.001}},
    "datamodule": {"source": {"num_val": 20}, "batch_size": 32},
    "trainer": {"max_steps": 600},
}


def correct(arm: str, seed: int, long_chain_ok: int) -> tuple[int, int]:
    """Right answers out of 10 on 1-step and on 4-step questions: VaLR 9 and 8-9 (seed 0: 8); every other arm 9 and
    ``long_chain_ok``."""
    if arm == "valr":
        return 9, 8 if seed == 0 else 9
    return 9, long_chain_ok


@pytest.fixture
def make_sweep(tmp_path):
    def make(long_chain_ok: int = 6, lm_loss_drop: float = 0.0) -> Sweep:
        name = f"{long_chain_ok}{lm_loss_drop}"
        stage1 = tmp_path / "cache" / "demo_policy" / f"valr_stage1{name}"
        write_metrics(stage1, [{"step": 99, "val/exact_match": 0.80}, {"step": 199, "val/exact_match": 0.81}])
        artifacts = [{"kind": "demo_policy", "name": "valr_stage1", "path": str(stage1), "metrics": {}}]
        root = write_sweep(tmp_path / f"sweep{name}", {"demo/valr/arm": ",".join(ARMS), "seed": "0,1,2"})
        number = 0
        for arm in ARMS:
            for seed in SEEDS:
                short, long = correct(arm, seed, long_chain_ok)
                records = [
                    {"step": 599, "correct": i < short, "num_steps": 1, "completion": "x </think> 1"} for i in range(10)
                ]
                records += [
                    {"step": 599, "correct": i < long, "num_steps": 4, "completion": "x </think> 4"} for i in range(10)
                ]
                probe = 0.6 + 0.01 * seed + ({"latent": (0.01, -0.02, 0.015)[seed]}.get(arm, 0.0))
                run = write_run(
                    root,
                    f"{arm}/seed{seed}",
                    {"demo/valr/arm": arm, "seed": seed},
                    {**CONFIG, "seed": seed},
                    number,
                    info={"artifacts": artifacts, "wall_seconds": 10.0},
                    files={"eval_records.jsonl": records},
                )
                rows = [{"step": s, "train/lm_loss": 1.0 - lm_loss_drop * s} for s in range(8)]
                rows.append(
                    {
                        "step": 599,
                        "probe/step_accuracy": probe,
                        "vision_probe/teacher_cell_accuracy": 1.0,
                        "vision_probe/student_cell_accuracy": 0.75 + 0.01 * seed,
                        "vision_probe/cell_majority": 0.4,
                    }
                )
                write_metrics(run, rows)
                number += 1
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("valr", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def test_page_opens_with_the_verdict_paired_by_seed(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    verdict = read_verdict(tmp_path / "out" / "valr.md")
    # shown: VaLR above CoT overall and on 4-step questions, above latents; within noise: the step probe
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (3, 1, 0)
    assert "| held-out accuracy, VaLR − CoT SFT, paired by seed | +0.133 [+0.062, +0.205] | **shown** |" in text
    assert "| held-out accuracy on 4-step questions, VaLR − CoT SFT, paired by seed | +0.267 [+0.123, +0.410] |" in text
    assert "| -0.002 [-0.049, +0.045] | **not shown (within noise)** |" in text  # probe, VaLR - latents
    assert "What this demo cannot test:" in text
    assert text.index("## Verdict") < text.index("## Fair test") < text.index("## Reading")


def test_fair_test_says_whether_the_baselines_failure_occurs(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Reading")]
    assert (
        "1-step minus 4-step questions, paired by seed, 0.300 ± 0.000 [0.300, 0.300]; the failure occurs: met." in fair
    )
    assert "(teacher − student, paired by seed): 0.240 ± 0.010 [0.215, 0.265]: met" in fair
    assert "0.800 (step 99), 0.810 (step 199)" in fair and "a plateau by this check: **met**" in fair
    assert "CoT SFT +0.0%; latents +0.0%; VaLR +0.0%" in fair and "in every arm: **met**" in fair
    assert "3 seeds (0, 1, 2)" in fair
    flat = build(make_sweep(long_chain_ok=9, lm_loss_drop=0.05), tmp_path / "out2")
    fair = flat[flat.index("## Fair test") : flat.index("## Reading")]
    assert "0.000 ± 0.000 [0.000, 0.000]; the long chains are not harder for it here" in fair
    assert "**does not occur (not met)**" in fair
    assert "in every arm: **not met**" in fair
