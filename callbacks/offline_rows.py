"""Write the rows an offline stage produces (``stage=predict``) to a resumable JSONL file, batch by batch."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BasePredictionWriter

from zoo.callbacks.evaluation import log_stage_metrics
from zoo.data.offline import ResumableJsonlWriter
from zoo.errors import ConfigError

log = logging.getLogger("zoo")

# The parts of the run's config that decide what an offline stage writes (its resume spec).
SPEC_KEYS = ("task", "backbone", "quant", "datamodule", "module", "seed")


class OfflineRowWriter(BasePredictionWriter):
    """Writes ``prediction["rows"]`` of every predict batch to ``path`` (a
    :class:`~zoo.data.offline.ResumableJsonlWriter`).

    Running the same stage again with the same ``path`` resumes it: the rows file is cut back to its last completed
    batch, completed batches are not written again, and the module skips their work when it has a
    ``skip_batches`` set (the protocol of offline modules, e.g. :class:`zoo.modules.nmars.UndoAugmentationModule`):
    this callback fills it in ``setup``. A file written with another configuration (``spec_keys`` of the run's
    resolved config) is refused.

    Args:
        path: the JSONL file (e.g. ``${paths.output_dir}/export/rows.jsonl``).
        spec_keys: top-level keys of the resolved run config that make up the resume spec.
        rows_key: the key of the predict-step output that holds the rows (a list of dicts).
        summary_keys: numeric row fields summarised at the end of the stage: logged as ``offline/rows`` (rows this
            run wrote; batches kept from an interrupted run are not counted), ``offline/mean_<key>`` and
            ``offline/nonzero_<key>`` (fraction of rows where the field is not 0), e.g. ``[num_undos]``.

    Single-process only (one writer per file): a run with several processes is refused.
    """

    def __init__(
        self, path: str, spec_keys: Sequence[str] = SPEC_KEYS, rows_key: str = "rows", summary_keys: Sequence[str] = ()
    ) -> None:
        super().__init__(write_interval="batch")
        if not path:
            raise ConfigError("OfflineRowWriter needs a path (callbacks.<name>.path)")
        self.path = Path(path)
        self.spec_keys = tuple(spec_keys)
        self.rows_key = rows_key
        self.summary_keys = tuple(summary_keys)
        self.writer: ResumableJsonlWriter | None = None
        self._counts: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "predict":
            return
        if trainer.world_size > 1:
            raise ConfigError(
                f"OfflineRowWriter writes one file from one process; this run has {trainer.world_size} processes "
                "(use trainer.devices=1 for offline stages)"
            )
        config = getattr(pl_module, "run_config", None) or {}
        spec = {key: config.get(key) for key in self.spec_keys if key in config}
        self.writer = ResumableJsonlWriter(self.path, spec)
        done = self.writer.open()
        if isinstance(getattr(pl_module, "skip_batches", None), set):
            pl_module.skip_batches = set(done)

    def write_on_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.writer is None:
            return
        rows = prediction.get(self.rows_key) if isinstance(prediction, dict) else None
        if rows is None:
            raise ConfigError(
                f"OfflineRowWriter: the predict step of {type(pl_module).__name__} returned no {self.rows_key!r} "
                "list; use it with an offline stage module"
            )
        self.writer.write_batch(batch_idx, rows)
        self._count(rows)

    def _count(self, rows: Sequence[dict[str, Any]]) -> None:
        counts = self._counts
        counts["rows"] = counts.get("rows", 0) + len(rows)
        for key in self.summary_keys:
            values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
            if len(values) != len(rows):
                raise ConfigError(f"OfflineRowWriter: summary key {key!r} is not a number in every row")
            counts[f"sum_{key}"] = counts.get(f"sum_{key}", 0) + sum(values)
            counts[f"nonzero_{key}"] = counts.get(f"nonzero_{key}", 0) + sum(v != 0 for v in values)

    def summary(self) -> dict[str, float]:
        """``rows``, ``mean_<key>`` and ``nonzero_<key>`` of the rows this run wrote (means only when it wrote one)."""
        rows = self._counts.get("rows", 0)
        out = {"rows": float(rows)}
        if rows:
            for key in self.summary_keys:
                out[f"mean_{key}"] = self._counts[f"sum_{key}"] / rows
                out[f"nonzero_{key}"] = self._counts[f"nonzero_{key}"] / rows
        return out

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._counts = {}

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.writer is None:
            return
        log_stage_metrics(trainer, pl_module, self.summary(), "offline", "predict")
        if trainer.is_global_zero:
            log.info("%d rows in %s", self.writer.num_rows, self.path)
