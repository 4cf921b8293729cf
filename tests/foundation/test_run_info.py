"""run_info.json of a run: machine, start/finish and wall time, and the artifacts the run used -- here an artifact
requested the way demo configs do (a ``zoo.cli.artifacts.train_artifact`` node in place of a path)."""

from __future__ import annotations

import datetime
import json

from zoo.artifacts import artifacts_mark, artifacts_used, ensure
from zoo.cli.train import run


def test_a_train_artifact_node_builds_once_and_each_run_records_it(train_cfg, tmp_path):
    node = {
        "_target_": "zoo.cli.artifacts.train_artifact",
        "kind": "demo_policy",
        "name": "toy",
        "overrides": [
            "+method=sft",
            "datamodule.source.num_train=32",
            "datamodule.source.num_val=8",
            "datamodule.batch_size=16",
            "trainer.max_steps=2",
            "module.generation.max_new_tokens=4",
        ],
        "cache_dir": str(tmp_path / "cache"),
    }
    items = ", ".join(f"{k}: {json.dumps(v)}" for k, v in node.items())  # Hydra's dict syntax: bare keys
    overrides = [
        f"backbone.init_from={{{items}}}",
        "stage=validate",
        "datamodule.source.num_val=8",
        "module.generation.max_new_tokens=4",
    ]
    run(train_cfg(overrides))
    first = json.loads((tmp_path / "run" / "run_info.json").read_text())
    (used,) = first["artifacts"]
    assert used["kind"] == "demo_policy" and used["name"] == "toy" and used["built_now"]
    assert used["path"].startswith(str(tmp_path / "cache" / "demo_policy" / "toy-"))
    assert "val/loss" in used["metrics"]
    start, end = (datetime.datetime.fromisoformat(first[k]) for k in ("started_at", "finished_at"))
    assert start <= end and first["wall_seconds"] >= 0
    assert first["machine"]["cpu_count"] >= 1 and first["machine"]["torch_threads"] >= 1

    run(train_cfg(overrides))  # the second run reuses it
    second = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert [(a["path"], a["built_now"]) for a in second["artifacts"]] == [(used["path"], False)]


def test_artifacts_used_lists_each_path_once_from_a_mark(tmp_path):
    def build(directory):
        (directory / "x").write_text("1")
        return {"metrics": {"m": 1.0}}

    mark = artifacts_mark()
    a = ensure("toy", {"a": 1}, build, tmp_path)
    ensure("toy", {"a": 1}, build, tmp_path)
    later = artifacts_mark()
    b = ensure("toy", {"b": 2}, build, tmp_path)
    assert [(u["path"], u["built_now"], u["metrics"]) for u in artifacts_used(mark)] == [
        (str(a), True, {"m": 1.0}),
        (str(b), True, {"m": 1.0}),
    ]
    assert [u["path"] for u in artifacts_used(later)] == [str(b)]
