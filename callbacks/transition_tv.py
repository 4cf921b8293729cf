"""``TransitionTV``: how close a model's next-token distributions are to the true rows of a Markov chain.

The sample-efficiency measurement of "Memory as a Markov Matrix" (arXiv 2605.04308): after new token ``j`` the
model should predict ``P'_j = sum_i w_ji P_{D_j,i}`` (:class:`zoo.data.markov.NewTokens`). At the end of every
evaluation epoch of the chosen stages (outside the sanity check) the callback scores fixed held-out contexts --
``contexts_per_token`` chain prefixes ending in each new token, and ``old_contexts`` prefixes ending in an old
state (the base model's own fit of ``P``) -- and logs (core: :func:`zoo.data.markov.transition_tv`):

* ``{log_prefix}/new_tv``: mean over new tokens and contexts of ``TV(p_hat(. | context + j), P'_j)``;
* ``{log_prefix}/new_tv_of_mean``: mean over new tokens of the TV of the context-averaged prediction;
* ``{log_prefix}/old_tv``: mean of ``TV(p_hat(. | context ending in i), P_i)`` (the floor the frozen model sets);
* ``{log_prefix}/old_new_mass``: mean probability the model puts on the new tokens right after an old-only context
  (0 unless the new tokens have output rows, ``module.output_rows=true``: the mass old-only contexts lose);
* ``{log_prefix}/old_tv_change``: ``old_tv`` minus the base model's ``old_tv`` on the same contexts (the base: the
  model at fit start with the vocabulary extension removed, or as it is when the module has none); exactly 0 when
  the old logits and the vocabulary are unchanged;
* ``{log_prefix}/new_tv_start`` / ``old_tv_start``: ``new_tv`` of the untrained new rows and the base model's
  ``old_tv``, both taken at fit start (the reference of "how much of the gap training closed");
* with ``path``: one JSON line per new token (step, stage, token, its dictionary, ``tv``, ``tv_of_mean``).

Needs a module with ``model`` (a causal LM) and ``tokenizer`` that knows the task's new token strings (as
``+method=vocab_extend`` registers them) and one token per state character (the tiny backbone's tokenizer).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import EvaluationCallback, append_jsonl, log_stage_metrics
from zoo.data.markov import MarkovChainTask, state_token_ids, transition_tv
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import ConfigError


class TransitionTV(EvaluationCallback):
    """Log the total variation between the model's successor distributions and the chain's true rows.

    Args:
        task: the Markov task (its chain, new tokens and true rows ``P'_j``).
        contexts_per_token: held-out contexts per new token.
        old_contexts: held-out contexts ending in an old state (0: no ``old_tv``).
        seed: seed of the contexts (fixed: every evaluation scores the same contexts).
        batch_size: contexts per forward pass.
        stages: among ``validate``, ``test``.
        log_prefix: metric names are ``{log_prefix}/{name}``.
        path: a JSONL file for the per-token records (``None``: not written).
    """

    def __init__(
        self,
        task: MarkovChainTask,
        contexts_per_token: int = 32,
        old_contexts: int = 128,
        seed: int = 0,
        batch_size: int = 64,
        stages: Sequence[str] = ("validate",),
        log_prefix: str = "transition_tv",
        path: str | None = None,
    ) -> None:
        super().__init__(stages, allowed=("validate", "test"))
        if not callable(getattr(task, "successor_context", None)):
            raise ConfigError(f"TransitionTV needs a Markov task (task=markov); got {type(task).__name__}")
        if contexts_per_token < 1 or old_contexts < 0 or batch_size < 1:
            raise ConfigError("TransitionTV: contexts_per_token and batch_size must be >= 1, old_contexts >= 0")
        self.task = task
        self.contexts_per_token = contexts_per_token
        self.old_contexts = old_contexts
        self.seed = seed
        self.batch_size = batch_size
        self.log_prefix = log_prefix
        self.path = path
        self.last: dict[str, float] = {}
        # taken at fit start (kept in the callback state, so a resumed run keeps the untrained reference)
        self.start: dict[str, float] = {}

    @property
    def state_key(self) -> str:
        return self._generate_state_key(log_prefix=self.log_prefix, seed=self.seed)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if getattr(pl_module, "tokenizer", None) is None or not hasattr(pl_module, "model"):
            raise ConfigError(
                f"TransitionTV needs a module with `model` and `tokenizer`; got {type(pl_module).__name__}"
            )
        tokenizer = pl_module.tokenizer
        unknown = [t for t in self.task.new_tokens if len(tokenizer(t, add_special_tokens=False)["input_ids"]) != 1]
        if unknown:
            raise ConfigError(
                f"TransitionTV: the tokenizer does not hold the new tokens {unknown} as single tokens "
                "(extend the vocabulary first: +method=vocab_extend)"
            )

    @torch.no_grad()
    def _probs(self, pl_module: Any, texts: list[str]) -> torch.Tensor:
        """``[N, V']`` float64 next-token probabilities after each text (BOS + text)."""
        tokenizer, model = pl_module.tokenizer, pl_module.model
        was_training = model.training
        model.eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        out = []
        for start in range(0, len(texts), self.batch_size):
            sequences = [encode_prompt(tokenizer, t) for t in texts[start : start + self.batch_size]]
            ids = pad_sequences(sequences, pad, "right").to(pl_module.device)
            mask = pad_sequences([[1] * len(s) for s in sequences], 0, "right").to(pl_module.device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            last = torch.tensor([len(s) - 1 for s in sequences], device=logits.device)
            out.append(torch.softmax(logits[torch.arange(len(sequences)), last].double(), dim=-1).cpu())
        model.train(was_training)
        return torch.cat(out)

    def _contexts(self) -> tuple[list[tuple[str, torch.Tensor]], list[tuple[str, torch.Tensor]]]:
        """The held-out contexts: ``contexts_per_token`` per new token (token-major), then the old-only ones."""
        rng = random.Random(self.seed)
        m, k = self.task.num_new_tokens, self.contexts_per_token
        new = [self.task.successor_context(rng, j) for j in range(m) for _ in range(k)]
        old = [self.task.successor_context(rng) for _ in range(self.old_contexts)]
        return new, old

    def _new_token_ids(self, tokenizer: Any) -> list[int]:
        return [int(tokenizer.convert_tokens_to_ids(t)) for t in self.task.new_tokens]

    def old_probs_of_base(self, pl_module: Any) -> torch.Tensor:
        """``[old_contexts, V]`` next-token probabilities of the base model after the old-only contexts: the module's
        model with its vocabulary extension removed (``vocab_extension``), or the model itself without one."""
        _, old = self._contexts()
        extension = getattr(pl_module, "vocab_extension", None)
        if extension is not None:
            extension.remove()
        try:
            return self._probs(pl_module, [text for text, _ in old])
        finally:
            if extension is not None:
                extension.attach()

    def measure(self, pl_module: Any) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The metrics and the per-token records for the module's model now (``old_tv_change`` and the ``*_start``
        values need the reference taken at fit start; without it they are left out)."""
        state_ids = state_token_ids(pl_module.tokenizer, self.task.num_states)
        m, k = self.task.num_new_tokens, self.contexts_per_token
        new, old = self._contexts()
        contexts = new + old
        # old-only contexts in their own batches, as the base model's are scored at fit start: with unchanged old
        # logits the two passes are bit-identical (no batch-composition noise in old_tv_change)
        probs = self._probs(pl_module, [text for text, _ in new])
        if old:
            probs = torch.cat([probs, self._probs(pl_module, [text for text, _ in old])])
        rows = torch.stack([row for _, row in contexts])
        tv = transition_tv(probs, rows, state_ids)
        new_tv = tv[: m * k].view(m, k)
        mean_probs = probs[: m * k].view(m, k, -1).mean(1)
        tv_of_mean = transition_tv(mean_probs, self.task.new.rows, state_ids)
        metrics = {"new_tv": float(new_tv.mean()), "new_tv_of_mean": float(tv_of_mean.mean())}
        if old:
            metrics["old_tv"] = float(tv[m * k :].mean())
            emitted = [i for i in self._new_token_ids(pl_module.tokenizer) if i < probs.shape[-1]]
            metrics["old_new_mass"] = float(probs[m * k :, emitted].sum(-1).mean()) if emitted else 0.0
            if "old_tv_start" in self.start:
                metrics["old_tv_change"] = metrics["old_tv"] - self.start["old_tv_start"]
        metrics.update(self.start)
        records = [
            {
                "token": self.task.new_tokens[j],
                "dictionary": self.task.dictionaries[j],
                "tv": float(new_tv[j].mean()),
                "tv_of_mean": float(tv_of_mean[j]),
            }
            for j in range(m)
        ]
        return metrics, records

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take the reference: the untrained new rows' ``new_tv`` and the base model's ``old_tv``."""
        if self.start:  # restored from a checkpoint
            return
        state_ids = state_token_ids(pl_module.tokenizer, self.task.num_states)
        now, _ = self.measure(pl_module)
        self.start = {"new_tv_start": now["new_tv"]}
        if self.old_contexts:
            _, old = self._contexts()
            base = self.old_probs_of_base(pl_module)
            rows = torch.stack([row for _, row in old])
            self.start["old_tv_start"] = float(transition_tv(base, rows, state_ids).mean())

    def state_dict(self) -> dict[str, Any]:
        return {"start": dict(self.start)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.start = dict(state_dict.get("start") or {})

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last, records = self.measure(pl_module)
        log_stage_metrics(trainer, pl_module, self.last, self.log_prefix, stage)
        if self.path is not None and trainer.is_global_zero:
            append_jsonl(
                Path(self.path),
                ({"step": trainer.global_step, "stage": stage, **r} for r in records),
                trainer.global_rank,
            )


__all__ = ["TransitionTV"]
