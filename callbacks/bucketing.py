"""Write what a bucketing stage (``+method=gem``) returns: the bucketed rows, the held-out splits and the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from zoo.callbacks.evaluation import append_jsonl, log_stage_metrics
from zoo.errors import ConfigError


class BucketWriter(Callback):
    """Writes ``<directory>/train.jsonl`` (rows with the bucket column), ``val.jsonl``/``test.jsonl`` (the source's
    held-out splits, unchanged, when it has them) and ``buckets.json`` (metrics and bucket sizes), and logs the metrics
    as ``bucketing/<name>``. Works with :class:`zoo.modules.bucketing.BucketingModule` (``stage=predict``).

    Args:
        directory: output folder (``${paths.output_dir}/export``: the run's export, a cacheable artifact).
    """

    def __init__(self, directory: str) -> None:
        if not directory:
            raise ConfigError("BucketWriter needs a directory (callbacks.<name>.directory)")
        self.directory = Path(directory)

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        if not isinstance(outputs, dict) or "rows" not in outputs or "metrics" not in outputs:
            raise ConfigError(f"BucketWriter needs a bucketing module's output, got one of {type(pl_module).__name__}")
        log_stage_metrics(trainer, pl_module, outputs["metrics"], "bucketing", "predict")
        if not trainer.is_global_zero:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        write_jsonl(self.directory / "train.jsonl", outputs["rows"])
        for split, rows in outputs.get("extra", {}).items():
            if rows:
                write_jsonl(self.directory / f"{split}.jsonl", rows)
        summary = {"metrics": outputs["metrics"], "buckets": outputs["buckets"]}
        (self.directory / "buckets.json").write_text(json.dumps(summary, indent=2, sort_keys=True))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` with one JSON line per row."""
    path.unlink(missing_ok=True)
    append_jsonl(path, rows)
