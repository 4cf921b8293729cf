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

from zoo.callbacks.evaluation import STAGES, EvaluationCallback, append_jsonl
from zoo.errors import ConfigError

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


class EvalRecords(EvaluationCallback):
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
        super().__init__(stages, max_batches)
        if not path:
            raise ConfigError("EvalRecords needs a path (e.g. ${paths.output_dir}/eval_records.jsonl)")
        self.path = Path(path)
        self.batch_fields = tuple(batch_fields)
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

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._rows = []

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
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

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._rows:
            append_jsonl(self.path, self._rows, trainer.global_rank)
            self.written += len(self._rows)
        self._rows = []


def read_records(path: str | Path, stage: str | None = None) -> list[dict[str, Any]]:
    """The records of an :class:`EvalRecords` file (of one ``stage`` when given)."""
    with Path(path).open() as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [r for r in rows if stage is None or r.get("stage") == stage]


__all__ = ["EvalRecords", "read_records"]
