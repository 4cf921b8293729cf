"""Forgetting on old-only held-out contexts, logged at every validation (the "no forgetting" check of
arXiv 2605.04308, "Memory as a Markov Matrix"; core: :func:`zoo.vocab.forgetting_metrics`).

At fit start the module's model scores a fixed set of contexts that contain old tokens only; these reference
logits over the old vocabulary are kept in the callback's state (so a resumed run compares with the model before
training, not with the checkpoint). At the end of every validation epoch the contexts are scored again and
``{log_prefix}/max_abs_logit_diff``, ``kl_mean``, ``kl_max`` and ``new_token_mass`` are logged.

With ``check_removal`` the callback also checks reversibility: at fit start it copies the model's state with the
vocabulary extension removed (``vocab_extension.remove()``); at every validation it removes the extension again and
logs ``{log_prefix}/removed_max_abs_param_diff`` (largest change of any entry of that state; ``inf`` when an entry
is missing or changed shape) and ``{log_prefix}/removed_max_abs_logit_diff`` (old-only contexts, against the
reference), then splices the new rows back. Both are exactly 0 when only the new rows trained. The copy lives in
memory only: a run resumed from a checkpoint does not log them.

Needs a module with ``model`` (a Hugging Face causal LM, built by fit start) and ``tokenizer``. A module that
extends the vocabulary exposes ``vocab_extension`` (a :class:`zoo.vocab.VocabularyExtension`); its
``first_new_id`` is the old vocabulary size. Works in any Lightning project with such a module.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.data.sources import RowSource
from zoo.datamodules.base import encode_completion
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import ConfigError, DataError
from zoo.vocab.extension import mask_new_token_logits
from zoo.vocab.forgetting import forgetting_metrics

METRICS = ("max_abs_logit_diff", "kl_mean", "kl_max", "new_token_mass")


class ForgettingMonitor(Callback):
    """Log how far the model's predictions on old-only contexts moved since fit start.

    Args:
        source: rows of old-only text (``prompt`` and optional ``completion``, encoded like SFT rows: BOS + prompt
            + completion + EOS), e.g. the held-out split of the base task's :class:`~zoo.data.sources.TaskSource`.
        texts: literal contexts instead of ``source`` (BOS + text).
        split: the split of ``source`` to read.
        max_contexts: at most this many contexts (the first ones).
        batch_size: contexts per forward pass.
        old_vocab_size: number of old tokens (logit columns compared); ``None``: the module's
            ``vocab_extension.first_new_id``, else every logit column at fit start.
        mask_new_logits: compare the logits with new tokens masked on old-only contexts
            (:func:`zoo.vocab.mask_new_token_logits`): what a consumer that applies the mask sees.
        log_prefix: metric names are ``{log_prefix}/{metric}``.
        check_removal: also log the reversibility metrics (needs the module's ``vocab_extension``).
    """

    def __init__(
        self,
        source: RowSource | None = None,
        texts: Sequence[str] | None = None,
        split: str = "val",
        max_contexts: int = 64,
        batch_size: int = 32,
        old_vocab_size: int | None = None,
        mask_new_logits: bool = False,
        log_prefix: str = "forgetting",
        check_removal: bool = False,
    ) -> None:
        super().__init__()
        if (source is None) == (texts is None):
            raise ConfigError("ForgettingMonitor needs exactly one of source (a RowSource) or texts")
        if texts is not None and not texts:
            raise ConfigError("ForgettingMonitor: texts is empty")
        if max_contexts < 1 or batch_size < 1:
            raise ConfigError("ForgettingMonitor: max_contexts and batch_size must be >= 1")
        self.source = source
        self.texts = None if texts is None else list(texts)
        self.split = split
        self.max_contexts = max_contexts
        self.batch_size = batch_size
        self.old_vocab_size = old_vocab_size
        self.mask_new_logits = mask_new_logits
        self.log_prefix = log_prefix
        self.check_removal = check_removal
        self.base_state: dict[str, torch.Tensor] | None = None
        self.input_ids: torch.Tensor | None = None
        self.attention_mask: torch.Tensor | None = None
        self.reference: torch.Tensor | None = None
        self.last: dict[str, float] = {}
        self._warned = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(log_prefix=self.log_prefix)

    # -- set-up ---------------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if getattr(pl_module, "tokenizer", None) is None or not hasattr(pl_module, "model"):
            raise ConfigError(
                "ForgettingMonitor needs a module with `model` (a causal LM) and `tokenizer`; "
                f"got {type(pl_module).__name__}"
            )
        if self.check_removal and not hasattr(pl_module, "vocab_extension"):
            raise ConfigError(
                f"ForgettingMonitor(check_removal=true) needs a module with a vocab_extension (+method=vocab_extend); "
                f"got {type(pl_module).__name__}"
            )
        if self.input_ids is None:
            self.input_ids, self.attention_mask = self._encode(pl_module.tokenizer)

    def _encode(self, tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.texts is not None:
            sequences = [encode_prompt(tokenizer, t) for t in self.texts[: self.max_contexts]]
        else:
            rows = self.source.rows(self.split, ("prompt",))[: self.max_contexts]
            sequences = [
                encode_prompt(tokenizer, r["prompt"])
                + (encode_completion(tokenizer, r["completion"]) if r.get("completion") else [])
                for r in rows
            ]
        if not sequences:
            raise DataError(f"ForgettingMonitor: split '{self.split}' of the context source has no rows")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return pad_sequences(sequences, pad, "right"), pad_sequences([[1] * len(s) for s in sequences], 0, "right")

    def _old_vocab_size(self, pl_module: pl.LightningModule, width: int) -> int:
        if self.old_vocab_size is not None:
            return int(self.old_vocab_size)
        extension = getattr(pl_module, "vocab_extension", None)
        return int(extension.first_new_id) if extension is not None else width

    # -- scoring --------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _logits(self, pl_module: pl.LightningModule) -> torch.Tensor:
        model = pl_module.model
        was_training = model.training
        model.eval()
        device = pl_module.device
        chunks = []
        for start in range(0, self.input_ids.shape[0], self.batch_size):
            ids = self.input_ids[start : start + self.batch_size].to(device)
            mask = self.attention_mask[start : start + self.batch_size].to(device)
            chunks.append(model(input_ids=ids, attention_mask=mask).logits.float().cpu())
        model.train(was_training)
        return torch.cat(chunks)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.reference is not None:  # restored from a checkpoint: keep the pre-training reference
            return
        logits = self._logits(pl_module)
        self.old_vocab_size = self._old_vocab_size(pl_module, logits.shape[-1])
        old_ids = self.input_ids.masked_fill(self.attention_mask == 0, 0)
        if (old_ids >= self.old_vocab_size).any():
            row = int((old_ids >= self.old_vocab_size).any(-1).nonzero()[0])
            raise DataError(
                f"ForgettingMonitor: context {row} contains a new token (id >= {self.old_vocab_size}); "
                "forgetting is measured on old-only contexts"
            )
        self.reference = logits[..., : self.old_vocab_size].clone()
        if self.check_removal:
            extension = pl_module.vocab_extension
            extension.remove()
            try:
                self.base_state = {k: v.detach().clone() for k, v in extension.model.state_dict().items()}
            finally:
                extension.attach()

    def measure(self, pl_module: pl.LightningModule) -> dict[str, float]:
        """The forgetting metrics of the module's model now (needs the reference taken at fit start)."""
        if self.reference is None:
            raise RuntimeError("ForgettingMonitor has no reference yet (it is taken at fit start)")
        logits = self._logits(pl_module)
        if self.mask_new_logits:
            logits = mask_new_token_logits(logits, self.input_ids, self.old_vocab_size)
        metrics = forgetting_metrics(self.reference, logits, self.attention_mask)
        values = {name: float(metrics[name]) for name in METRICS}
        if self.check_removal and self.base_state is not None:
            values.update(self.removal(pl_module))
        return values

    def removal(self, pl_module: pl.LightningModule) -> dict[str, float]:
        """Reversibility: remove the extension, compare the model's state and old-context logits with the copies
        taken at fit start, splice the new rows back."""
        extension = pl_module.vocab_extension
        extension.remove()
        try:
            state = extension.model.state_dict()
            param_diff = 0.0
            for key, before in self.base_state.items():
                now = state.get(key)
                if now is None or now.shape != before.shape:
                    param_diff = float("inf")
                    break
                if before.is_floating_point():
                    param_diff = max(
                        param_diff, float((now.detach().cpu().double() - before.cpu().double()).abs().max())
                    )
                elif not torch.equal(now.cpu(), before.cpu()):
                    param_diff = float("inf")
            logits = self._logits(pl_module)
            logit_diff = float(
                (logits[..., : self.old_vocab_size] - self.reference).abs()[self.attention_mask.bool()].max()
            )
        finally:
            extension.attach()
        return {"removed_max_abs_param_diff": param_diff, "removed_max_abs_logit_diff": logit_diff}

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self.reference is None:
            if not self._warned:
                warnings.warn(
                    "ForgettingMonitor: no reference logits (they are taken at fit start, or restored with the "
                    "callback state when fitting from a checkpoint); nothing logged",
                    stacklevel=1,
                )
                self._warned = True
            return
        self.last = self.measure(pl_module)
        for name, value in self.last.items():
            pl_module.log(f"{self.log_prefix}/{name}", value, batch_size=1)

    # -- state ----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "old_vocab_size": self.old_vocab_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.reference = state_dict.get("reference")
        self.old_vocab_size = state_dict.get("old_vocab_size", self.old_vocab_size)


__all__ = ["METRICS", "ForgettingMonitor"]
