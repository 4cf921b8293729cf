"""``EvalRecords``: one JSON line per evaluated row of a generating module, written into the run directory.

Breakdowns that the logged means cannot give (accuracy by difficulty, by structure size or question kind, false
positives of yes/no answers, rows that agree across two runs, tokens per structure against its size) read these
records instead of re-running the model. The callback relies only on the generation-protocol dict that
``validation_step``/``test_step``/``predict_step`` return (``texts`` and ``meta``; :mod:`zoo.protocols`), plus
optional per-row fields of the batch, so it works with any generating module, in a plain Lightning script too.

A record holds ``stage``, ``step`` (the trainer's global step), ``completion`` (``texts[i]``), every per-row list of
``meta`` under its singular name where one is known (``prompts`` -> ``prompt``, ``answers`` -> ``answer``, other keys
as they are, e.g. ``correct``, ``num_tokens``) and the requested ``batch_fields``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.errors import ConfigError

STAGES = ("validate", "test", "predict")
SINGULAR = {"prompts": "prompt", "answers": "answer"}


def _plain(value: Any) -> Any:
    """A JSON-able copy (tensors and numpy values to lists/numbers)."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


class EvalRecords(pl.Callback):
    """Write the per-row results of every evaluated batch to a JSONL file at the end of each epoch.

    Args:
        path: the JSONL file (``${paths.output_dir}/eval_records.jsonl`` in configs); lines are appended, one per row;
            on ranks other than zero ``<stem>.rank<r><suffix>``.
        stages: among ``validate`` (also validation during fit), ``test``, ``predict``.
        batch_fields: per-row fields taken from the batch as well (``batch[k]``, ``batch["meta"][k]`` or
            ``batch["columns"][k]``; tensors become lists), e.g. ``[num_steps]``.
        max_batches: record at most this many batches per epoch (``None``: all).
    """

    def __init__(
        self,
        path: str,
        stages: Sequence[str] = STAGES,
        batch_fields: Sequence[str] = (),
        max_batches: int | None = None,
    ) -> None:
        super().__init__()
        if not path:
            raise ConfigError("EvalRecords needs a path (e.g. ${paths.output_dir}/eval_records.jsonl)")
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ConfigError(f"EvalRecords: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        if max_batches is not None and max_batches < 1:
            raise ConfigError(f"EvalRecords: max_batches must be >= 1 or None, got {max_batches}")
        self.path = Path(path)
        self.stages = tuple(stages)
        self.batch_fields = tuple(batch_fields)
        self.max_batches = max_batches
        self._rows: list[dict[str, Any]] = []
        self.written = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(path=str(self.path))

    def _field(self, batch: Any, name: str) -> Any:
        if isinstance(batch, dict):
            for container in (batch, batch.get("meta") or {}, batch.get("columns") or {}):
                if isinstance(container, dict) and name in container:
                    return container[name]
        raise ConfigError(
            f"EvalRecords: batch_fields asks for {name!r}, but the batch has no such field "
            f"(keys: {sorted(batch) if isinstance(batch, dict) else type(batch).__name__})"
        )

    def _record(self, trainer: pl.Trainer, outputs: Any, batch: Any, batch_idx: int, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        if self.max_batches is not None and batch_idx >= self.max_batches:
            return
        if not isinstance(outputs, dict) or "texts" not in outputs:
            raise ConfigError(
                "EvalRecords needs the generation-protocol dict (texts, meta) from the module's evaluation steps "
                "(zoo.protocols.GenerationOutput); is generate_on_eval off?"
            )
        texts = list(outputs["texts"])
        n = len(texts)
        columns: dict[str, list[Any]] = {}
        for key, value in (outputs.get("meta") or {}).items():
            value = _plain(value)
            if isinstance(value, list) and len(value) == n:
                columns[SINGULAR.get(key, key)] = value
        for name in self.batch_fields:
            value = _plain(self._field(batch, name))
            if not isinstance(value, list) or len(value) != n:
                raise ConfigError(f"EvalRecords: batch field {name!r} is not one value per row ({n} rows)")
            columns[name] = value
        for i, text in enumerate(texts):
            row = {"stage": stage, "step": trainer.global_step, "completion": text}
            row.update({key: value[i] for key, value in columns.items()})
            self._rows.append(row)

    def _flush(self, trainer: pl.Trainer, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking or not self._rows:
            self._rows = []
            return
        path = self.path
        if trainer.global_rank:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            for row in self._rows:
                handle.write(json.dumps(row, default=str) + "\n")
        self.written += len(self._rows)
        self._rows = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._record(trainer, outputs, batch, batch_idx, "validate")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._record(trainer, outputs, batch, batch_idx, "test")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._record(trainer, outputs, batch, batch_idx, "predict")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, "validate")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, "test")

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._flush(trainer, "predict")


def read_records(path: str | Path, stage: str | None = None) -> list[dict[str, Any]]:
    """The records of an :class:`EvalRecords` file (of one ``stage`` when given)."""
    with Path(path).open() as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [r for r in rows if stage is None or r.get("stage") == stage]


__all__ = ["EvalRecords", "read_records"]
