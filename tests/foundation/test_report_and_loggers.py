"""zoo.report turns runs into a markdown table and a PNG; loggers: CSV default, TensorBoard option."""

import csv
import re

import pytest

from zoo.cli.train import run
from zoo.report import markdown_table, summarize
from zoo.report.__main__ import main as report_main


def write_run(root, name, overrides, rows):
    run_dir = root / name
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    with (run_dir / "csv" / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["step", "epoch", "train/loss", "val/exact_match"])
        writer.writeheader()
        writer.writerows(rows)


def test_report_table_holds_the_last_value_of_each_metric_per_arm(tmp_path):
    write_run(
        tmp_path,
        "0",
        ["module/grpo/shaper=gr3"],
        [
            {"step": 0, "epoch": 0, "train/loss": 2.0, "val/exact_match": ""},
            {"step": 10, "epoch": 0, "train/loss": 1.0, "val/exact_match": 0.5},
        ],
    )
    write_run(
        tmp_path,
        "1",
        ["module/grpo/shaper=none"],
        [{"step": 10, "epoch": 0, "train/loss": 3.0, "val/exact_match": 0.25}],
    )
    columns, rows = summarize(tmp_path)
    assert columns == ["train/loss", "val/exact_match"]
    assert rows == [
        {"run": "module/grpo/shaper=gr3", "train/loss": 1.0, "val/exact_match": 0.5},
        {"run": "module/grpo/shaper=none", "train/loss": 3.0, "val/exact_match": 0.25},
    ]
    assert "| module/grpo/shaper=gr3 | 1 | 0.5 |" in markdown_table(columns, rows)
    report_main([str(tmp_path), "--out", str(tmp_path / "out" / "r")])
    assert (tmp_path / "out" / "r.md").read_text().count("module/grpo/shaper=") == 2
    assert (tmp_path / "out" / "r.png").stat().st_size > 1000


def test_a_missing_root_or_an_unknown_demo_is_said(tmp_path, monkeypatch, capsys):
    """``python -m zoo.report /nonexistent`` says the path does not exist (it said no runs were found under it);
    ``demo <unknown>`` names the known demos (it said there was no sweep of that demo, as if it were one); both exit
    with status 2 (they exited 1)."""
    with pytest.raises(SystemExit) as stopped:
        report_main([str(tmp_path / "nonexistent")])
    assert stopped.value.code == 2
    assert re.match(r"^error: .*nonexistent does not exist; give a run directory", capsys.readouterr().err)
    monkeypatch.chdir(tmp_path)  # no demos/ folder here: the names come from the installed conf/demo
    with pytest.raises(SystemExit) as stopped:
        report_main(["demo", "nosuch", "--log-dir", str(tmp_path)])
    assert stopped.value.code == 2
    assert re.search(r"unknown demo 'nosuch'.*known demos: .*\bgr3\b.*\bxguard\b", capsys.readouterr().err)


def test_tensorboard_logger_option(train_cfg, tmp_path):
    run(
        train_cfg(
            [
                "logger=many",
                "debug=limit",
                "export=false",
                "datamodule.source.num_train=64",
                "datamodule.source.num_val=8",
            ]
        )
    )
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()
