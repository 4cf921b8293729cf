"""``python train.py +method=textresnet | textgrad``: the textual optimizers on the app (backbone none, one textual
step per training step, history/summary in the run directory, prompts in checkpoints, clear errors)."""

from __future__ import annotations

import json

import pytest

from zoo.cli.train import build, run, user_message
from zoo.textopt import DeepChainSim


@pytest.mark.parametrize("method", ["textresnet", "textgrad"])
def test_method_runs_on_the_simulator_and_writes_history_and_summary(method, train_cfg, tmp_path):
    cfg = train_cfg([f"+method={method}", "datamodule.steps=3", "module.problem.depth=6", "seed=1"])
    assert cfg.backbone is None and cfg.module.optimizer == method
    metrics = run(cfg)
    out = tmp_path / "run"
    rows = [json.loads(line) for line in (out / "textopt_history.jsonl").read_text().splitlines()]
    summary = json.loads((out / "textopt_summary.json").read_text())
    assert [r["step"] for r in rows] == [1, 2, 3] and summary["method"] == method
    assert metrics["val/accuracy"] == summary["test_accuracy"]
    sim = DeepChainSim(depth=6, seed=1)
    assert summary["faulty_final"] == len(sim.faulty(summary["instructions"]))
    assert json.loads((out / "export" / "instructions.json").read_text()) == summary["instructions"]
    header = (out / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "train/proxy_calls" in header and "train/accuracy" in header


def test_checkpoint_holds_the_instructions_densities_and_history(train_cfg):
    cfg = train_cfg(["+method=textresnet", "module.problem.depth=5", "seed=2"])
    module, _, _ = build(cfg)
    module.tracker.step(module.problem.train_examples([0, 1, 2, 3]))
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    fresh, _, _ = build(cfg)
    assert fresh.method.instructions() != module.method.instructions()  # the step changed something
    fresh.on_load_checkpoint(json.loads(json.dumps(checkpoint)))
    assert fresh.method.instructions() == module.method.instructions()
    assert fresh.method.scheduler.density == module.method.scheduler.density
    assert fresh.tracker.history == module.tracker.history
    assert fresh.method.log.snapshot() == module.method.log.snapshot()


def test_bad_settings_are_one_clear_error(train_cfg, tmp_path):
    with pytest.raises(Exception) as err:
        build(train_cfg(["+method=textresnet", "module.optimizer=adamw"]))
    assert "textual optimizer 'adamw'" in user_message(err.value)
    data = tmp_path / "qa.jsonl"
    data.write_text('{"input": "2+2=", "answer": "4"}\n')
    qa = ["module/textopt/problem=qa", f"module.problem.path={data}", "module.problem.instructions=[Answer.]"]
    with pytest.raises(Exception) as err:
        build(train_cfg(["+method=textgrad", *qa]))
    assert "choose one with backend=" in user_message(err.value)
    with pytest.raises(Exception) as err:
        build(train_cfg(["+method=textresnet", "module.problem.noise=0.9"]))
    assert "noise" in user_message(err.value)


def test_real_path_config_with_a_scripted_backend(train_cfg, tmp_path):
    # the scripted backend stands in for an endpoint (control flow of the config path; real models: test_textgrad.py)
    data = tmp_path / "qa.jsonl"
    data.write_text('{"input": "2+2=", "answer": "4"}\n')
    cfg = train_cfg(
        [
            "+method=textresnet",
            "module/textopt/problem=qa",
            f"module.problem.path={data}",
            "module.problem.instructions=[Answer.]",
            "backend=scripted",
            'backend.responses=["4"]',
            "datamodule.steps=1",
            "datamodule.batch_size=1",
        ]
    )
    metrics = run(cfg)
    assert metrics["val/accuracy"] == 1.0
