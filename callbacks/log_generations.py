"""Log a few prompts / completions / rewards every N steps: to every logger that supports tables and to a
JSONL file in the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only


class LogGenerations(Callback):
    """Samples of training rollouts (``pl_module.last_rollout``: ``prompts``, ``texts``, ``rewards``) and of
    validation outputs (the generation-protocol dict: ``texts`` and ``meta``).

    Args:
        every_n_steps: training steps between two logged samples.
        num_samples: rows per sample.
        filename: JSONL file written in ``trainer.default_root_dir``.
    """

    def __init__(self, every_n_steps: int = 50, num_samples: int = 4, filename: str = "generations.jsonl") -> None:
        super().__init__()
        if every_n_steps < 1 or num_samples < 1:
            raise ValueError("every_n_steps and num_samples must be >= 1")
        self.every_n_steps = every_n_steps
        self.num_samples = num_samples
        self.filename = filename

    def path(self, trainer: pl.Trainer) -> Path:
        return Path(trainer.default_root_dir) / self.filename

    @rank_zero_only
    def _emit(self, trainer: pl.Trainer, split: str, rows: list[dict[str, Any]]) -> None:
        path = self.path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            for row in rows:
                handle.write(json.dumps({"split": split, "step": trainer.global_step, **row}, default=str) + "\n")
        columns = sorted({k for row in rows for k in row})
        data = [[row.get(c) for c in columns] for row in rows]
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):  # W&B, MLflow-style loggers
                logger.log_table(key=f"{split}/generations", columns=columns, data=data, step=trainer.global_step)
            elif hasattr(getattr(logger, "experiment", None), "add_text"):  # TensorBoard
                table = " | ".join(columns) + "\n" + "|".join("---" for _ in columns) + "\n"
                table += "\n".join(" | ".join(str(v).replace("\n", "\\n") for v in r) for r in data)
                logger.experiment.add_text(f"{split}/generations", table, global_step=trainer.global_step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = getattr(pl_module, "last_rollout", None)
        if not rollout or trainer.global_step % self.every_n_steps:
            return
        rewards = rollout["rewards"].reshape(-1).tolist()
        rows = [
            {"prompt": p, "completion": t, "reward": r}
            for p, t, r in list(zip(rollout["prompts"], rollout["texts"], rewards))[: self.num_samples]
        ]
        self._emit(trainer, "train", rows)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if batch_idx != 0 or not isinstance(outputs, dict) or "texts" not in outputs:
            return
        meta = outputs.get("meta", {})
        rows = []
        for i, text in enumerate(outputs["texts"][: self.num_samples]):
            row = {"completion": text}
            for key in ("prompts", "answers", "correct"):
                if isinstance(meta.get(key), list) and i < len(meta[key]):
                    row[key.rstrip("s")] = meta[key][i]
            rows.append(row)
        self._emit(trainer, "val", rows)
