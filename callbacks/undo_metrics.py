"""N-MARS evaluation metrics of any generating module: how generations use ``<UNDO>``, and the safety gap."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.errors import ConfigError
from zoo.generation.undo import UNDO_TOKEN, trace_undo, undo_token_id
from zoo.losses import masked_token_logprobs

SPLITS = ("val", "test")


class UndoMetrics(Callback):
    """Logs, per validation/test epoch, from the generation-protocol dict of each batch (``completion_ids`` = the
    physical generations, ``meta["correct"]`` = the verifier on the resolved outputs):

    - ``{split}/undo_rate``: fraction of generations with at least one ``<UNDO>``;
    - ``{split}/undos_per_generation``: mean number of ``<UNDO>`` per generation;
    - ``{split}/failed_correction_rate``: among generations with an ``<UNDO>``, the fraction whose resolved output
      is still wrong [assumed definition; logged only when some generation used ``<UNDO>``];

    and, when the batch carries ``masked_out_labels`` (augmented rows: the error tokens a loss mask keeps out of
    training, :class:`zoo.datamodules.SFTDataModule`), the **safety gap** measure

    - ``{split}/deviation_logprob``: mean ``log p(e_t | prefix)`` of the error tokens of the held-out rows given
      their prefix (one extra forward pass per batch). Plain SFT on augmented rows trains these tokens, masked SFT
      does not: the paper's claim is that this stays lower under masked SFT.

    Args:
        undo_token: the UNDO token string.
        splits: where to measure (``val``, ``test``).

    The module must have a ``tokenizer`` and a ``model`` (every zoo generating module).
    """

    def __init__(self, undo_token: str = UNDO_TOKEN, splits: tuple[str, ...] | list[str] = SPLITS) -> None:
        super().__init__()
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown:
            raise ConfigError(f"UndoMetrics: splits must be among {SPLITS}, got {unknown}")
        self.undo_token = undo_token
        self.splits = tuple(splits)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not hasattr(pl_module, "tokenizer") or not hasattr(pl_module, "model"):
            raise ConfigError(
                f"UndoMetrics needs a zoo generating module (with tokenizer and model), got {type(pl_module).__name__}"
            )

    def measure(self, pl_module: pl.LightningModule, outputs: Any, batch: Any, split: str) -> None:
        """Log the metrics of one evaluated batch."""
        if split not in self.splits:
            return
        completion_ids = outputs.get("completion_ids") if isinstance(outputs, dict) else None
        if completion_ids is not None and completion_ids.numel():
            self._log_generations(pl_module, completion_ids, outputs.get("meta", {}).get("correct") or [], split)
        labels = batch.get("masked_out_labels") if isinstance(batch, dict) else None
        if labels is not None and bool((labels != -100).any()):
            self._log_deviation_logprob(pl_module, batch, labels, split)

    def _log_generations(
        self, pl_module: pl.LightningModule, completion_ids: torch.Tensor, correct: list[bool], split: str
    ) -> None:
        tokenizer = pl_module.tokenizer
        undo_id = undo_token_id(tokenizer, self.undo_token)
        eos = tokenizer.eos_token_id
        counts = []
        for row in completion_ids.tolist():
            row = row[: row.index(eos)] if eos in row else row
            counts.append(trace_undo(row, undo_id).num_undos)
        used = [c > 0 for c in counts]
        size = len(counts)
        pl_module.log(f"{split}/undo_rate", sum(used) / size, batch_size=size, on_epoch=True, on_step=False)
        pl_module.log(
            f"{split}/undos_per_generation", sum(counts) / size, batch_size=size, on_epoch=True, on_step=False
        )
        failed = [not ok for ok, u in zip(correct, used) if u]
        if failed:
            rate = sum(failed) / len(failed)
            pl_module.log(f"{split}/failed_correction_rate", rate, batch_size=len(failed), on_epoch=True, on_step=False)

    @torch.no_grad()
    def _log_deviation_logprob(
        self, pl_module: pl.LightningModule, batch: dict[str, Any], labels: torch.Tensor, split: str
    ) -> None:
        logits = pl_module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logp, mask = masked_token_logprobs(logits.float(), labels)
        count = int(mask.sum())
        pl_module.log(
            f"{split}/deviation_logprob", float(logp.sum()) / count, batch_size=count, on_epoch=True, on_step=False
        )

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self.measure(pl_module, outputs, batch, "val")

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.measure(pl_module, outputs, batch, "test")
