"""N-MARS evaluation metrics of any generating module: how generations use ``<UNDO>``, and the safety gap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import EvaluationCallback, require_generating_module
from zoo.errors import ConfigError
from zoo.generation.undo import UNDO_TOKEN, trace_undo, undo_token_id
from zoo.losses import masked_token_logprobs
from zoo.protocols import SamplingParams

SPLIT_OF_STAGE = {"validate": "val", "test": "test"}


class UndoMetrics(EvaluationCallback):
    """Logs, per validation/test epoch, from the generation-protocol dict of each batch (``completion_ids`` = the
    physical generations, ``meta["correct"]`` = the verifier on the resolved outputs):

    - ``{split}/undo_rate``: fraction of generations with at least one ``<UNDO>``;
    - ``{split}/undos_per_generation``: mean number of ``<UNDO>`` per generation;
    - ``{split}/failed_correction_rate``: among generations with an ``<UNDO>``, the fraction whose resolved output
      is still wrong [assumed definition; logged only when some generation used ``<UNDO>``];

    the same three plus ``exact_match`` (of the resolved outputs) under ``{split}/T<t>/...`` for each of
    ``temperatures``: the batch's prompts are decoded again by the module's decoder with sampling at temperature
    ``t`` (the module's ``max_new_tokens``; seeded per batch, so a run is reproducible);

    and, when the batch carries ``masked_out_labels`` (augmented rows: the error tokens a loss mask keeps out of
    training, :class:`zoo.datamodules.SFTDataModule`), the **safety gap** measure

    - ``{split}/deviation_logprob``: mean ``log p(e_t | prefix)`` of the error tokens of the held-out rows given
      their prefix (one extra forward pass per batch). Plain SFT on augmented rows trains these tokens, masked SFT
      does not: the paper's claim is that this stays lower under masked SFT.

    Args:
        undo_token: the UNDO token string.
        stages: where to measure (``validate``, ``test``).
        temperatures: sampling temperatures of the extra decodes (empty: none).
        seed: seed of the extra decodes (batch ``b`` at temperature index ``j`` uses ``(seed, j, b)``).
        max_batches: measure the first batches of an epoch only (``None``: all).

    The module must be a zoo generating module (tokenizer, model, ``generate``, ``verifier``).
    """

    def __init__(
        self,
        undo_token: str = UNDO_TOKEN,
        stages: Sequence[str] = ("validate", "test"),
        temperatures: Sequence[float] = (),
        seed: int = 0,
        max_batches: int | None = None,
    ) -> None:
        super().__init__(stages, max_batches, allowed=tuple(SPLIT_OF_STAGE))
        bad = [t for t in temperatures if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0]
        if bad:
            raise ConfigError(f"UndoMetrics: temperatures must be numbers > 0, got {list(temperatures)}")
        self.undo_token = undo_token
        self.temperatures = tuple(float(t) for t in temperatures)
        self.seed = seed

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "UndoMetrics")

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        self.measure(pl_module, outputs, batch, SPLIT_OF_STAGE[stage], batch_idx)

    def measure(self, pl_module: Any, outputs: Any, batch: Any, split: str, batch_idx: int = 0) -> None:
        """Log the metrics of one evaluated batch of ``split`` (``val`` / ``test``)."""
        completion_ids = outputs.get("completion_ids") if isinstance(outputs, dict) else None
        if completion_ids is not None and completion_ids.numel():
            correct = outputs.get("meta", {}).get("correct") or []
            self._log_generations(pl_module, completion_ids, correct, split)
        if self.temperatures and isinstance(batch, dict) and "prompt_ids" in batch:
            self._log_sampled(pl_module, batch, split, batch_idx)
        labels = batch.get("masked_out_labels") if isinstance(batch, dict) else None
        if labels is not None and bool((labels != -100).any()):
            self._log_deviation_logprob(pl_module, batch, labels, split)

    def _log(self, pl_module: Any, name: str, value: float, size: int) -> None:
        pl_module.log(name, value, batch_size=size, on_epoch=True, on_step=False)

    def _log_generations(
        self, pl_module: Any, completion_ids: torch.Tensor, correct: Sequence[bool], split: str
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
        self._log(pl_module, f"{split}/undo_rate", sum(used) / size, size)
        self._log(pl_module, f"{split}/undos_per_generation", sum(counts) / size, size)
        failed = [not ok for ok, u in zip(correct, used) if u]
        if failed:
            self._log(pl_module, f"{split}/failed_correction_rate", sum(failed) / len(failed), len(failed))

    @torch.no_grad()
    def _log_sampled(self, pl_module: Any, batch: dict[str, Any], split: str, batch_idx: int) -> None:
        prompts, answers = pl_module.prompts_and_answers(batch)
        if answers is None:
            raise ConfigError("UndoMetrics: temperatures need reference answers in the evaluation batches")
        max_new_tokens = pl_module.eval_sampling.max_new_tokens
        for j, temperature in enumerate(self.temperatures):
            params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature)
            generator = torch.Generator(device=batch["prompt_ids"].device)
            generator.manual_seed((self.seed * 1_000_003 + j) * 1_000_003 + batch_idx)
            result = pl_module.generate(batch["prompt_ids"], batch["prompt_attention_mask"], params, generator)
            correct = [bool(pl_module.verifier(t, a)) for t, a in zip(result.texts, answers)]
            prefix = f"{split}/T{temperature:g}"
            self._log(pl_module, f"{prefix}/exact_match", sum(correct) / len(correct), len(correct))
            self._log_generations(pl_module, result.completion_ids, correct, prefix)

    @torch.no_grad()
    def _log_deviation_logprob(self, pl_module: Any, batch: dict[str, Any], labels: torch.Tensor, split: str) -> None:
        logits = pl_module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logp, mask = masked_token_logprobs(logits.float(), labels)
        count = int(mask.sum())
        self._log(pl_module, f"{split}/deviation_logprob", float(logp.sum()) / count, count)
