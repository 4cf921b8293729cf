"""Ground-truth redundancy of generated reasonings (tasks whose reference reasonings label redundant steps).

Logs, for training rollouts (``pl_module.last_rollout``) and validation generations, under ``train/`` and ``val/``:
``think_tokens`` (tokens inside ``<think>...</think>``), ``think_steps``, ``redundant_rate`` (fraction of generated
steps that are not essential steps of the reference) and ``essential_retention`` (fraction of the reference's
essential steps present), :func:`zoo.rl.thoughtfold.redundancy_stats`. Completions without a reasoning block count
0 think tokens and are left out of the step statistics. Any generating method can be measured (GRPO, length
penalties, GR3, ThoughtFold).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from zoo.answers import STEP_DELIMITER
from zoo.errors import ConfigError
from zoo.rl.thoughtfold import reasoning_stats


class ReasoningRedundancy(Callback):
    """Think length and ground-truth redundancy of rollouts and validation generations.

    Args:
        reference_column: the batch column with the reference completion (``datamodule.completion_column``).
        redundant_column: the batch column with the reference's per-step redundancy labels
            (``task=multisum_redundant``: ``step_redundant``).
        delimiter: the step delimiter of the task's reasonings.
    """

    def __init__(
        self,
        reference_column: str = "reference",
        redundant_column: str = "step_redundant",
        delimiter: str = STEP_DELIMITER,
    ) -> None:
        super().__init__()
        self.reference_column = reference_column
        self.redundant_column = redundant_column
        self.delimiter = delimiter

    def stats(self, pl_module: pl.LightningModule, texts: list[str], batch: dict[str, Any]) -> dict[str, float]:
        """Mean statistics of ``texts`` (rows in group order: ``len(texts)`` a multiple of the batch's prompts)."""
        columns = batch.get("columns", {})
        missing = [c for c in (self.reference_column, self.redundant_column) if c not in columns]
        if missing:
            raise ConfigError(
                f"ReasoningRedundancy needs the batch columns {missing}: set datamodule.completion_column="
                f"{self.reference_column} and use a task whose rows carry '{self.redundant_column}' "
                "(task=multisum_redundant)"
            )
        prompts = len(batch["prompts"])
        repeat = len(texts) // prompts if prompts and len(texts) % prompts == 0 else 0
        if not repeat:
            return {}

        def count_tokens(body: str) -> int:
            return len(pl_module.tokenizer(body, add_special_tokens=False)["input_ids"])

        rows = [
            reasoning_stats(
                text,
                columns[self.reference_column][i // repeat],
                columns[self.redundant_column][i // repeat],
                count_tokens,
                self.delimiter,
            )
            for i, text in enumerate(texts)
        ]
        steps = [r for r in rows if "think_steps" in r]
        out = {"think_tokens": sum(r["think_tokens"] for r in rows) / len(rows)}
        for key in ("think_steps", "redundant_rate", "essential_retention"):
            if steps:
                out[key] = sum(s[key] for s in steps) / len(steps)
        return out

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        rollout = getattr(pl_module, "last_rollout", None)
        if not rollout or "texts" not in rollout:
            return
        for key, value in self.stats(pl_module, list(rollout["texts"]), batch).items():
            pl_module.log(f"train/{key}", float(value), batch_size=len(rollout["texts"]))

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not isinstance(outputs, dict) or not outputs.get("texts"):
            return
        texts = list(outputs["texts"])
        for key, value in self.stats(pl_module, texts, batch).items():
            pl_module.log(f"val/{key}", float(value), on_step=False, on_epoch=True, batch_size=len(texts))


__all__ = ["ReasoningRedundancy"]
