"""The ThoughtFold page (demos/thoughtfold.py) on a sweep whose outcomes the test chooses (4 arms × 2 grid points ×
3 seeds, each run's greedy decodes of 10 held-out prompts in ``eval_records.jsonl``): it opens with the generated
Verdict (ThoughtFold against GRPO on length, accuracy and lines, against the length penalties on length and accuracy,
paired by seed), picks each arm's setting on the first half of the held-out prompts and reports the second half, and
its Fair-test section reads the plateau of the chosen settings' training curves and whether the length penalty's
known failure (dropping essential lines) occurred."""

from __future__ import annotations

import pytest
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

ARMS = ("grpo", "additive", "gr3", "thoughtfold")
POINTS = ("p0", "p1")
SEEDS = (0, 1, 2)
STEPS = 16  # logged every step: quarters of 4 points
LABELS = {
    "grpo": "GRPO",
    "additive": "GRPO + additive length penalty",
    "gr3": "GRPO + GR3",
    "thoughtfold": "GRPO + ThoughtFold",
}
GRID = {
    "grpo": {"p0": 0.0001, "p1": 0.0002},
    "additive": {"p0": 0.2, "p1": 0.5},
    "gr3": {"p0": 0.1, "p1": 0.3},
    "thoughtfold": {"p0": 0.1, "p1": 1.0},
}
KNOBS = {"grpo": "learning rate", "additive": "lambda", "gr3": "alpha", "thoughtfold": "DPO weight"}
# the setting the selection half picks (ThoughtFold's is not the grid's first, so "take the first" is told apart)
CHOSEN = {"grpo": "p0", "additive": "p0", "gr3": "p0", "thoughtfold": "p1"}
# the held-out prompts in evaluation order: the first 5 are the selection half, the last 5 the reported half; every
# product has two digits, so the reasoning bodies have 22 characters (two products and `check ok`), 13 (the two
# products) or 6 (one product)
PROMPTS = (
    ((3, 6), (3, 9)),
    ((5, 3), (9, 2)),
    ((9, 6), (5, 3)),
    ((2, 8), (5, 8)),
    ((9, 5), (7, 5)),
    ((2, 8), (3, 4)),
    ((4, 7), (6, 3)),
    ((8, 8), (2, 9)),
    ((3, 4), (7, 7)),
    ((6, 6), (4, 5)),
)
HALF = len(PROMPTS) // 2
FULL, FOLDED, DROPPED = "full", "folded", "dropped"


def record(prompt: tuple[tuple[int, int], ...], kind: str, correct: bool = True) -> dict:
    """One greedy decode of the last validation: ``full`` keeps the reference's redundant ``check ok`` line (22
    think tokens, redundant-line rate 1/3), ``folded`` drops it (13 tokens, rate 0), ``dropped`` also drops the first
    (essential) product line (6 tokens, retention 0.5)."""
    lines = [f"{a}*{b}={a * b}" for a, b in prompt]
    answer = sum(a * b for a, b in prompt)
    body = {FULL: [*lines, "check ok"], FOLDED: lines, DROPPED: lines[1:]}[kind]
    return {
        "stage": "validate",
        "step": STEPS - 1,
        "prompt": "+".join(f"{a}*{b}" for a, b in prompt) + "=",
        "completion": "<think>" + "\n".join(body) + f"</think>{answer if correct else answer + 1}",
        "reference": "<think>" + "\n".join([*lines, "check ok"]) + f"</think>{answer}",
        "step_redundant": [False, False, True],
        "correct": correct,
    }


def decodes(arm: str, point: str, seed: int, additive_drops: int) -> list[tuple[str, bool]]:
    """(kind, correct) of each held-out prompt of one run.

    The chosen setting folds every selection-half prompt (13 tokens) where the other setting keeps the ``check``
    lines (22 tokens) at the same exact match; on the reported half the other setting would be the shorter one (6
    tokens, every decode correct), so picking on the reported half, or reporting the selection half, changes the
    numbers. Reported half of the chosen settings: GRPO keeps every redundant line; ThoughtFold folds all but one
    prompt at seed 2, the additive penalty all but one at seed 0 (level with ThoughtFold: paired think-token
    differences -1.8, 0, +1.8) and drops an essential line in the first ``additive_drops`` prompts; GR3 keeps the
    redundant lines and gets the first prompt wrong (exact match 0.8)."""
    if point != CHOSEN[arm]:
        return [(FULL, True)] * HALF + [(DROPPED, True)] * HALF
    reported = {
        "grpo": [(FULL, True)] * HALF,
        "gr3": [(FULL, False)] + [(FULL, True)] * (HALF - 1),
        "thoughtfold": [(FULL if seed == 2 and i == 0 else FOLDED, True) for i in range(HALF)],
        "additive": [(FULL if seed == 0 and i == 0 else FOLDED, True) for i in range(HALF)],
    }[arm]
    if arm == "additive":
        reported = [(DROPPED, True)] * additive_drops + reported[additive_drops:]
    return [(FOLDED, True)] * HALF + reported


def curves(arm: str, point: str, drift: dict[str, float]) -> list[dict[str, float]]:
    """The ``ReasoningRedundancy`` training curves, flat except the think tokens over the last quarter of the steps,
    which move by the fraction ``drift[arm]`` of their level at the chosen setting, and fall by 30% at the setting
    not chosen (which the plateau reading leaves out)."""
    move = drift.get(arm, 0.0) if point == CHOSEN[arm] else -0.3
    return [
        {
            "step": step,
            "train/think_tokens": 20.0 * (1 + (move if step >= STEPS - STEPS // 4 else 0.0)),
            "train/redundant_rate": 0.3,
            "train/essential_retention": 1.0,
            "train/accuracy": 0.9,
        }
        for step in range(STEPS)
    ]


@pytest.fixture
def make_sweep(tmp_path):
    def make(additive_drops: int = 0, drift: dict[str, float] | None = None) -> Sweep:
        root = write_sweep(
            tmp_path / "sweep",
            {"seed": "0,1,2", "demo/thoughtfold/arm": ",".join(ARMS), "demo.point": ",".join(POINTS)},
        )
        number = 0
        for seed in SEEDS:
            for arm in ARMS:
                for point in POINTS:
                    config = {
                        "seed": seed,
                        "task": {
                            "_target_": "zoo.data.tasks.MultiSum",
                            "min_operands": 4,
                            "max_operands": 4,
                            "min_value": 2,
                            "max_value": 9,
                            "partials": "products",
                            "redundant_prob": 0.5,
                            "check_states_value": False,
                        },
                        "datamodule": {"batch_size": 8, "source": {"num_val": len(PROMPTS)}},
                        "trainer": {"max_steps": STEPS},
                        "demo": {
                            "paper": "thoughtfold",
                            "point": point,
                            "grid": GRID,
                            "knobs": KNOBS,
                            "em_tolerance": 0.02,
                            "labels": LABELS,
                        },
                    }
                    rows = [
                        record(prompt, kind, correct)
                        for prompt, (kind, correct) in zip(PROMPTS, decodes(arm, point, seed, additive_drops))
                    ]
                    run = write_run(
                        root,
                        f"{arm}/{point}/seed{seed}",
                        {"seed": seed, "demo/thoughtfold/arm": arm, "demo.point": point},
                        config,
                        number,
                        files={"eval_records.jsonl": rows},
                    )
                    write_metrics(run, curves(arm, point, drift or {}))
                    number += 1
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("thoughtfold", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def fair_point(text: str, name: str) -> str:
    fair = text[text.index("## Fair test") :]
    return next(line for line in fair.splitlines() if line.startswith(f"- **{name}"))


def test_page_opens_with_the_verdict_shorter_than_grpo_and_level_with_the_additive_penalty(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    # against GRPO: think tokens -9, -9, -7.2 per seed (shown), exact match level (inside ±0.05: shown), redundant
    # lines -1/3, -1/3, -4/15 (shown), retention level (inside ±0.02: shown); against the additive penalty: think
    # tokens -1.8, 0, +1.8 (not shown), exact match level (not "more accurate": not shown); against GR3: 9, 9, 7.2
    # tokens fewer (shown) and 0.2 more exact match every seed (shown)
    verdict = read_verdict(tmp_path / "out" / "thoughtfold.md")
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (6, 2, 0)
    assert "<!-- verdict: shown=6 not_shown=2 contradicted=0 -->" in lines[4]
    assert row(text, "| ThoughtFold reasons in fewer tokens than GRPO |").endswith(
        "| think tokens, ThoughtFold − GRPO | -8.4 [-11.0, -5.8] | **shown** |"
    )
    assert row(text, "| ... at equal accuracy (within ±0.05) |").endswith("| +0.000 [+0.000, +0.000] | **shown** |")
    assert row(text, "| ... by removing redundant lines |").endswith("| -0.311 [-0.407, -0.215] | **shown** |")
    assert row(text, "| ... and not essential ones (retention within ±0.02) |").endswith("| **shown** |")
    assert row(text, "| ThoughtFold reasons in fewer tokens than GRPO + additive length penalty ").endswith(
        "| +0.0 [-4.5, +4.5] | **not shown (within noise)** |"
    )
    assert row(text, "| ThoughtFold is more accurate than GRPO + additive length penalty ").endswith(
        "| **not shown (within noise)** |"
    )
    assert row(text, "| ThoughtFold reasons in fewer tokens than GRPO + GR3 ").endswith("| **shown** |")
    assert row(text, "| ThoughtFold is more accurate than GRPO + GR3 ").endswith(
        "| +0.200 [+0.200, +0.200] | **shown** |"
    )


def test_setting_is_chosen_on_the_selection_half_and_reported_on_the_other_half(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    # selection half: ThoughtFold's DPO weight 1.0 folds (13 tokens) where 0.1 keeps the check lines (22 tokens)
    selection = row(text, "| GRPO + ThoughtFold | DPO weight 0.1: ")
    assert "DPO weight 0.1: EM 1.000, 22.0 tokens |" in selection
    assert "DPO weight 1.0: EM 1.000, 13.0 tokens **(chosen)** |" in selection
    assert "learning rate 0.0001: EM 1.000, 13.0 tokens **(chosen)**" in row(text, "| GRPO | learning rate 0.0001: ")
    # reported half of the chosen setting: 13, 13 and (4 × 13 + 22) / 5 = 14.8 tokens; not the selection half's 13.0
    # nor DPO weight 0.1's 6.0 (the reported half would pick it)
    assert row(text, "| GRPO + ThoughtFold | DPO weight 1.0 |").startswith(
        "| GRPO + ThoughtFold | DPO weight 1.0 | 1.000 ± 0.000 [1.000, 1.000] | 13.6 ± 1.0 [11.0, 16.2] | "
        "0.022 ± 0.038 [-0.073, 0.118] | 1.000 ± 0.000 [1.000, 1.000] |"
    )
    assert row(text, "| GRPO | learning rate 0.0001 |").startswith(
        "| GRPO | learning rate 0.0001 | 1.000 ± 0.000 [1.000, 1.000] | 22.0 ± 0.0 [22.0, 22.0] | "
        "0.333 ± 0.000 [0.333, 0.333] |"
    )
    assert "| GRPO + GR3 | alpha 0.1 | 0.800 ± 0.000 [0.800, 0.800] | 22.0 ± 0.0 [22.0, 22.0] |" in text
    assert "| DPO weight 0.1 | 1.000 ± 0.000 [1.000, 1.000] | 6.0 " not in text
    assert "(5 prompts per run;" in fair_point(text, "Chosen on a split that is not reported")


@pytest.mark.parametrize(
    ("drift", "met", "part"),
    [
        # GRPO's think tokens fall 4% (below the 5% of PLATEAU) and the settings not chosen fall 30% (not read): met
        ({"grpo": -0.04}, True, "GRPO: think_tokens -0.8 [-0.8, -0.8] (-4.0%), accuracy +0.000"),
        # ThoughtFold's think tokens still fall 20%: not met, whatever the sign
        ({"thoughtfold": -0.2}, False, "GRPO + ThoughtFold: think_tokens -4.0 [-4.0, -4.0] (-20.0%)"),
        ({"additive": 0.2}, False, "GRPO + additive length penalty: think_tokens +4.0 [+4.0, +4.0] (+20.0%)"),
    ],
    ids=["grpo_falls_4pct", "thoughtfold_falls_20pct", "additive_rises_20pct"],
)
def test_plateau_is_met_only_when_every_chosen_curve_has_settled(make_sweep, tmp_path, drift, met, part):
    line = fair_point(build(make_sweep(drift=drift), tmp_path / "out"), "Trained to a plateau")
    assert line.startswith(f"- **Trained to a plateau** ({'met' if met else 'not met'}): ")
    assert f"the last quarter of the {STEPS} steps" in line and part in line


@pytest.mark.parametrize(
    ("drops", "retention", "occurred"),
    [(0, "1.000 ± 0.000", False), (1, "0.900 ± 0.000", True)],
    ids=["keeps_every_line", "drops_an_essential_line"],
)
def test_the_length_penalty_failure_is_said_not_to_occur_only_when_retention_stays_near_one(
    make_sweep, tmp_path, drops, retention, occurred
):
    line = fair_point(build(make_sweep(additive_drops=drops), tmp_path / "out"), "The baselines' known failures")
    assert f"the additive penalty's essential-line retention, reported split, {retention}" in line
    assert "GRPO's at the end, reported split, 0.333 ± 0.000" in line
    said = "so the length penalty's failure did **not** occur here"
    assert (said not in line) is occurred
    assert line.endswith(".") and (line.endswith(f"{retention}.") is occurred)
