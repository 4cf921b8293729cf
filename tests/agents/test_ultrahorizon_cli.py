"""``python train.py +method=ultrahorizon``: an episode method on the same app (backbone none, stage test/predict,
Hydra multirun over seeds, agents and difficulties, trajectories in the run directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hydra.errors import InstantiationException

from zoo.cli.train import build, run, user_message
from zoo.errors import ConfigError

from conftest import REPO_ROOT

SMALL = ["datamodule.episodes=2", "env.required_steps=6"]


def test_ultrahorizon_runs_as_a_test_stage_without_a_backbone(train_cfg, tmp_path):
    cfg = train_cfg(["+method=ultrahorizon", *SMALL])
    assert cfg.backbone is None and cfg.stage == "test"
    module, datamodule, _ = build(cfg)
    assert type(module).__name__ == "EpisodeModule" and not hasattr(datamodule, "tokenizer")
    metrics = run(cfg)
    assert {"test/score", "test/score_ci95", "test/tool_calls", "test/committed"} <= set(metrics)
    rows = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == [0, 1]
    assert metrics["test/score"] == pytest.approx(sum(r["score"] for r in rows) / 2)
    assert metrics["test/committed"] == 1.0 and all(r["committed"] for r in rows)
    assert rows[0]["env"] == "ultrahorizon/grid" and rows[0]["agent"] == "hypothesis_elimination+crnr"
    assert rows[0]["steps"][0]["tool"] == "get_current_state" and rows[0]["report"]["source"] == "rubric"
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()


def test_predict_stage_writes_commits_and_scores(train_cfg, tmp_path):
    run(train_cfg(["+method=ultrahorizon", *SMALL, "stage=predict", "env=ultrahorizon/sequence", "agent=random"]))
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and set(json.loads(rows[0]["completion"])) == {f"rule_{i}" for i in range(1, 6)}
    assert {"episode", "score", "tool_calls", "committed"} <= set(rows[0])


def test_llm_agent_through_a_scripted_backend_and_crnr(train_cfg, tmp_path):
    call = {"name": "input_sequences", "arguments": {"main_sequence": "ABCDE", "vice_sequence": "EDCBA"}}
    replies = json.dumps([f"<tool_call>{json.dumps(call)}</tool_call>", "no call"])
    overrides = ["env=ultrahorizon/sequence", "agent=llm", "backend=scripted", f"backend.responses={replies}"]
    cfg = train_cfg(["+method=ultrahorizon", *SMALL, *overrides, "module.crnr_window=6"])
    metrics = run(cfg)
    assert metrics["test/committed"] == 0.0 and metrics["test/failed_steps"] > 0 and metrics["test/tokens"] > 0
    row = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert row["refreshes"] > 0 and len(row["steps"]) == 24  # 4 x required_steps


def test_llm_agent_without_a_backend_is_one_clear_error(train_cfg):
    with pytest.raises(InstantiationException) as info:  # raised when the run is built, before any episode
        build(train_cfg(["+method=ultrahorizon", "agent=llm"]))
    assert "needs a model backend" in user_message(info.value)


def test_judge_backend_composes_into_the_environment(train_cfg):
    cfg = train_cfg(
        ["+method=ultrahorizon", "env=ultrahorizon/bio", "+backend@env.judge=openai_compat", "env.judge.model=j"]
    )
    assert cfg.env.judge.model == "j" and cfg.env._target_ == "zoo.agents.AlienGeneticsLab"
    assert cfg.backend is None


def test_hydra_multirun_over_seeds_agents_and_difficulties(tmp_path, zoo_main):
    code, _, err = zoo_main(
        [
            "-m",
            "+method=ultrahorizon",
            f"paths.log_dir={tmp_path}",
            "datamodule.episodes=1",
            "env.required_steps=5",
            "seed=0,1",
            "agent=random,hypothesis_elimination",
            "env.difficulty=easy,hard",
        ],
        REPO_ROOT,
    )
    assert code == 0, err[-3000:]
    runs = sorted(Path(p).parent for p in tmp_path.glob("train/multiruns/*/*/trajectories.jsonl"))
    assert len(runs) == 8
    settings = set()
    for run_dir in runs:
        row = json.loads((run_dir / "trajectories.jsonl").read_text())
        seed = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())["seed"]
        settings.add((row["agent"], row["difficulty"], seed))
        assert (run_dir / "csv" / "metrics.csv").is_file()
    assert settings == {
        (a, d, s) for a in ("random+crnr", "hypothesis_elimination+crnr") for d in ("easy", "hard") for s in (0, 1)
    }


def test_backbone_none_with_a_model_method_is_one_clear_error(train_cfg):
    with pytest.raises(ConfigError, match=r"backbone=none builds no model.*CausalLMModule"):
        build(train_cfg(["backbone=none"]))


def test_released_harness_is_the_default_and_the_others_are_options(train_cfg):
    """interface.py always gives PythonExecute and OpenManus keeps CRNR (WINDOW_SIZE 200) on."""
    cfg = train_cfg(["+method=ultrahorizon", *SMALL])
    assert cfg.module.crnr_window == 200 and cfg.module.code_tool is True
    module, _, _ = build(cfg)
    trajectory = module.run_batch([0])[0]
    assert trajectory.agent == "hypothesis_elimination+crnr"
    bare = train_cfg(["+method=ultrahorizon", *SMALL, "module.crnr_window=null", "module.code_tool=false"])
    assert bare.module.crnr_window is None and bare.module.code_tool is False
    assert build(bare)[0].run_batch([0])[0].agent == "hypothesis_elimination"
