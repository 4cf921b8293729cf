"""The Persona2Web page (demos/persona2web.py) on a sweep whose outcomes the test chooses: it opens with the generated
Verdict (history vs no-history at the ambiguous levels, the level-3 control, pre-execution vs on-demand, the
reasoning-aware credit), has a generated Fair-test section, leaves the tiny LM (which cannot act) out of the score
tables and says why with the numbers of the sweep's cloning_cost.json; demos/_persona2web_cloning.py measures those
numbers through the real agent_sft demonstration path."""

from __future__ import annotations

import json
import sys

import pytest
from sweep_files import write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "demos"))

import _persona2web_cloning

ARMS = ("random", "no_history", "pre_execution", "on_demand", "oracle", "llm_tiny")
SEEDS = (0, 1, 2)
NOISE = 12


def episode(success: float, web_outcome: float | None = None, acted: bool = True, tags: tuple = ()) -> dict:
    scores = {"P_web": success, "P_pref": success, "Intent": success, "Success": success}
    outcome = {**scores, "P_web": success if web_outcome is None else web_outcome}
    step = {"tool": "open_site" if acted else None, "ok": acted}
    return {
        "steps": [step, step],
        "committed": acted,
        "tags": list(tags),
        "report": {"raw": {"outcome": outcome, "reasoning": scores, "memory_reads": 2}},
    }


def outcomes(level: int, arm: str, seed: int) -> list[dict]:
    """Two episodes per run: history resolves level 1, everyone solves level 3, on-demand solves half of level 1,
    the random agent guesses the site right once without history."""
    if arm == "llm_tiny":
        return [episode(0.0, acted=False), episode(0.0, acted=False)]
    if level == 3 and arm != "random":
        return [episode(1.0), episode(1.0)]
    if arm in ("pre_execution", "oracle"):
        return [episode(1.0), episode(1.0)]
    if arm == "on_demand":
        return [episode(1.0), episode(0.0, tags=("retrieval_failure",))]
    if arm == "random":
        return [episode(0.0, web_outcome=1.0), episode(0.0)]
    return [episode(0.0, tags=("retrieval_failure",)), episode(0.0, tags=("retrieval_failure",))]


@pytest.fixture
def sweep_dir(tmp_path):
    root = write_sweep(
        tmp_path / "sweep",
        {"env.distractors": str(NOISE), "env.level": "1,3", "demo/persona2web/arm": ",".join(ARMS), "seed": "0,1,2"},
    )
    number = 0
    for level in (1, 3):
        for arm in ARMS:
            for seed in SEEDS:
                config = {
                    "seed": seed,
                    "env": {"level": level, "distractors": NOISE, "scheme": "on-demand", "threshold": "auto"},
                    "datamodule": {"episodes": 2},
                    "demo": {"labels": {"no_history": "no-history", "llm_tiny": "tiny local LM"}},
                }
                write_run(
                    root,
                    f"distractors{NOISE}/level{level}/{arm}/seed{seed}",
                    {"env.distractors": NOISE, "env.level": level, "demo/persona2web/arm": arm, "seed": seed},
                    config,
                    number,
                    metrics={"test/tokens": 100.0},
                    files={"trajectories.jsonl": outcomes(level, arm, seed)},
                )
                number += 1
    return root


CLONING = {
    "distractors": NOISE,
    "levels": [1, 3],
    "by_teacher_level": {
        "pre_execution/level1": {
            "teacher": "pre_execution",
            "level": 1,
            "episodes": 5,
            "rows": 3,
            "teacher_score": 0.8,
            "lengths": [3612, 19681, 23078],
        }
    },
    "agent_sft_context": 8192,
    "agent_sft_arch": {"num_hidden_layers": 4, "hidden_size": 128},
    "reply_tokens": 1024,
    "agent_sft_steps": 150,
    "tiny_lm_context": 256,
    "steps": [
        {"tokens": 19681, "seconds": 61.5, "peak_rss_mib": 1800.0},
        {"tokens": 23078, "seconds": 81.0, "peak_rss_mib": 2103.0},
    ],
    "commit": "0123456789abcdef",
    "dirty": False,
    "measured_at": "2026-01-01T00:00:00+00:00",
    "load_average": 12.0,
}


def test_page_opens_with_the_verdict_and_leaves_the_tiny_lm_out_with_the_measured_reason(sweep_dir, tmp_path):
    (sweep_dir / "cloning_cost.json").write_text(json.dumps(CLONING))
    builder = load_page_builder("persona2web", REPO_ROOT / "demos")
    page = builder.build(Sweep.load(sweep_dir), tmp_path / "out")[0]
    text = page.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    # level 1: both history schemes vs no-history, the level-3 control, pre-execution vs on-demand, the guess
    verdict = read_verdict(page)
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (5, 0, 0)
    assert "| the gain is the ambiguity's: with everything stated (level 3) history adds nothing |" in text
    fair = text[text.index("## Fair test") : text.index("## P_web")]
    assert "the no-history agent scores SR 0.000 there" in fair and "scores 1.000 at level 3" in fair
    assert "Not applicable to the score tables" in fair and "every verdict effect is at least 0.1" in fair
    # the released budget of both schemes (top_k=20): the page does not explain the scheme gap by top-k
    assert "pre-execution at most 5 queries × top-20, on-demand top-20" in fair
    assert "top-20 vs top-20" in text and "top-10" not in text
    tables = text[text.index("## P_web") : text.index("## Error tags")]
    assert "| tiny local LM |" not in tables
    assert "Left out of the score tables (they cannot act): tiny local LM: none of its 24 replies" in tables
    cloning = text[text.index("### Why the tiny LM") :]
    assert "3612 / 19681 / 23078" in cloning and "14× the tiny LM's context of 256" in cloning
    assert "holds 1 of 3 rows beside its 1024-token reply budget; the other 2 are longer" in cloning
    assert "81.0 s and 2103 MiB at the longest (23078 tokens)" in cloning
    assert "150 steps at the median length take about 154 min" in cloning


def test_page_without_the_cloning_measurement_says_how_to_make_it(sweep_dir, tmp_path):
    builder = load_page_builder("persona2web", REPO_ROOT / "demos")
    text = builder.build(Sweep.load(sweep_dir), tmp_path / "out")[0].read_text()
    assert "Not measured for this sweep (no `cloning_cost.json`; run `python demos/_persona2web_cloning.py" in text


def test_cloning_cost_is_measured_on_the_agent_sft_rows_of_the_sweeps_levels(sweep_dir):
    result = _persona2web_cloning.measure(sweep_dir, episodes=1, step_tokens=64)
    assert json.loads((sweep_dir / "cloning_cost.json").read_text())["levels"] == [1, 3]
    assert result["distractors"] == NOISE and result["agent_sft_context"] == 8192 and result["reply_tokens"] == 1024
    teachers = ("pre_execution", "on_demand")
    assert set(result["by_teacher_level"]) == {f"{t}/level{lv}" for t in teachers for lv in (1, 3)}
    level1 = result["by_teacher_level"]["pre_execution/level1"]
    # one row per model request; the first prompt is the system prompt with its tools, later ones add history reads
    assert level1["rows"] >= 5 and level1["lengths"][0] > 3000 and level1["lengths"][-1] > 8192 - 1024
    assert all(step["tokens"] == 64 and step["seconds"] > 0 for step in result["steps"])
