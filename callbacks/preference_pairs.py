"""The preference pairs an auxiliary loss built in each training step, as JSON lines (what was pruned, what was kept).

Any ``module/grpo/aux`` seam that keeps ``last_pairs`` (:class:`zoo.rl.thoughtfold.PreferencePair` records, e.g.
ThoughtFold's span-masked DPO pairs) can be audited: one line per pair with the step, the rollout row, the pair's kind,
both sides' full texts and the text of their scored spans (the tokens that carry the DPO loss).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from zoo.callbacks.evaluation import append_jsonl


class PreferencePairRecords(Callback):
    """Append the auxiliary loss's pairs of every training step to ``path`` (JSON lines).

    Args:
        path: the records file (``<stem>.rank<r>.jsonl`` on ranks > 0).
        every_n_steps: record the pairs of every n-th optimizer step.
    """

    def __init__(self, path: str | Path, every_n_steps: int = 1) -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"PreferencePairRecords every_n_steps must be >= 1, got {every_n_steps}")
        self.path = Path(path)
        self.every_n_steps = int(every_n_steps)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        pairs = getattr(getattr(pl_module, "aux", None), "last_pairs", None)
        step = trainer.global_step
        if not pairs or step % self.every_n_steps:
            return
        append_jsonl(
            self.path,
            (
                {
                    "step": step,
                    "row": pair.row,
                    "kind": pair.kind,
                    "chosen": pair.text("chosen"),
                    "rejected": pair.text("rejected"),
                    "chosen_scored": pair.text("chosen", scored_only=True),
                    "rejected_scored": pair.text("rejected", scored_only=True),
                    **{f"meta_{k}": v for k, v in pair.meta.items()},
                }
                for pair in pairs
            ),
            rank=trainer.global_rank,
        )
