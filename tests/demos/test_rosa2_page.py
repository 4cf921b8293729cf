"""The ROSA2 page (demos/rosa2.py) on a sweep whose outcomes the test chooses: it opens with the generated Verdict
(words + weights against weights only and against words only, and the parameter shift, per hint probability) and has a
generated Fair-test section (the baselines' failures, the same ROSA step for ROSA and ROSA2, the policy's plateau read
from its training log)."""

from __future__ import annotations

import pytest
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

ARMS = ("static", "words", "rosa", "rosa2")
HINTS = ("0.0", "1.0")
SEEDS = (0, 1, 2)
STEP = {"beta": 0.1, "lr": 0.2, "max_update_norm": 0.5, "unobserved_reward": 0.5, "temperature": 0.0, "max_turns": 5}


def accuracy(arm: str, seed: int) -> float:
    """ROSA2 0.38 ± 0.02 above ROSA, 0.08 ± 0.02 above words only (an interval reaching below the margin)."""
    return {"static": 0.35, "words": 0.8, "rosa": 0.5, "rosa2": 0.9 - 0.02 * seed}[arm]


def conversations(arm: str) -> list[dict]:
    """One conversation of each kind; words only never solves the capability gap, ROSA never the ambiguous one."""
    solved = {
        "static": {"clear"},
        "words": {"clear", "ambiguous"},
        "rosa": {"clear", "both"},
        "rosa2": {"clear", "ambiguous", "both"},
    }[arm]
    return [
        {"conversation": {"kind": kind}, "success_turn": 2 if kind in solved else None, "turns": []}
        for kind in ("clear", "ambiguous", "both")
    ]


@pytest.fixture
def make_sweep(tmp_path):
    def make(rosa_lr: float = STEP["lr"], last_losses: tuple = (0.0300, 0.0301)):
        policy = tmp_path / "cache" / "demo_policy" / "ambiguous_ops"
        write_metrics(policy, [{"step": i, "val/loss": v} for i, v in enumerate((0.5, *last_losses))])
        root = write_sweep(
            tmp_path / "sweep",
            {"demo/rosa2/arm": ",".join(ARMS), "module.conversations.hint_prob": ",".join(HINTS), "seed": "0,1,2"},
        )
        number = 0
        for hint in HINTS:
            for arm in ARMS:
                for seed in SEEDS:
                    acc = accuracy(arm, seed)
                    shift = {"rosa": 0.5, "rosa2": 0.1}.get(arm, 0.0)
                    step = {**STEP, "lr": rosa_lr} if arm == "rosa" else STEP
                    config = {
                        "seed": seed,
                        "module": {"adapt": step, "conversations": {"hint_prob": float(hint)}},
                        "datamodule": {"episodes": 3},
                        "demo": {"labels": {"words": "words only", "rosa": "weights only (ROSA)", "rosa2": "ROSA2"}},
                    }
                    write_run(
                        root,
                        f"h{hint}/{arm}/seed{seed}",
                        {"demo/rosa2/arm": arm, "module.conversations.hint_prob": hint, "seed": seed},
                        config,
                        number,
                        metrics={
                            **{f"test/acc@{k}": acc for k in range(1, 6)},
                            "test/parameter_shift": shift,
                            "test/weight_steps": 2.0 if arm == "rosa" else 1.0 if arm == "rosa2" else 0.0,
                            "test/adapt_seconds": 0.01,
                        },
                        info={
                            "artifacts": [
                                {"kind": "demo_policy", "path": str(policy), "metrics": {"val/exact_match": 0.98}}
                            ]
                        },
                        files={"conversations.jsonl": conversations(arm)},
                    )
                    number += 1
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("rosa2", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def test_page_opens_with_the_verdict_of_each_claim_per_hint_probability(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    verdict = read_verdict(tmp_path / "out" / "rosa2.md")
    # per h: ROSA2 > ROSA (shown), ROSA2 > words only (+0.08, interval below the 0.05 margin), shift lower (shown)
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (4, 2, 0)
    assert "| words + weights beat words only (h = 0.0) |" in text
    assert "| +0.380 [+0.330, +0.430] | **shown** |" in text and "| +0.080 [+0.030, +0.130] | **not shown" in text
    # the reading agrees with the verdict: an interval above 0 but reaching inside the margin is not "shown"
    assert "against words only higher, but the interval reaches inside the 0.05 margin the Verdict uses" in text
    assert "| -0.400 [-0.400, -0.400] | **shown** |" in text


def test_fair_test_reads_the_failures_the_shared_step_and_the_plateau(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Hint probability")]
    assert "(read wrong, well trained) (h = 0.0: 0.000 vs 1.000; h = 1.0: 0.000 vs 1.000)" in fair
    assert "(ROSA) solves fewer *ambiguous* conversations than *clear* ones (h = 0.0: 0.000 vs 1.000" in fair
    assert "take the same ROSA step (beta 0.1, lr 0.2," in fair
    assert "change over its last epoch +0.3%" in fair and "**met**" in fair
    assert "2 of the 6 verdict effects are below 0.1" in fair and "would call for 5 seeds" in fair


def test_fair_test_flags_a_different_step_and_a_policy_still_improving(make_sweep, tmp_path):
    text = build(make_sweep(rosa_lr=0.05, last_losses=(0.06, 0.03)), tmp_path / "out")
    fair = text[text.index("## Fair test") : text.index("## Hint probability")]
    assert "**the ROSA step differs between ROSA and ROSA2 in lr**" in fair
    assert "-50.0%" in fair and "**not met**" in fair
