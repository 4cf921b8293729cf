"""Greedy multi-turn evaluation with feedback in validation and test of any generating module."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import EvaluationCallback, require_generating_module
from zoo.data.feedback import ChatPolicy, Episode, FeedbackEnvironment, run_episodes
from zoo.data.multiturn import MultiTurnAccuracy
from zoo.errors import ConfigError
from zoo.protocols import SamplingParams

#: split name of the metrics -> evaluation stage
SPLITS = {"val": "validate", "test": "test"}


class MultiTurnEvaluation(EvaluationCallback):
    """Plays the retry-with-feedback episodes of every validation/test prompt greedily (temperature 0, as DRIFT's
    released evaluation; or sampled) with the module's ``generate`` and logs
    :class:`~zoo.data.multiturn.MultiTurnAccuracy`: ``{split}/{prefix}multi@k`` for ``k = 1..max_turns`` (solved within
    ``k`` turns: the cumulative accuracy per turn; ``multi@1`` is the turn-1 accuracy) and
    ``{split}/{prefix}mean_turns_to_solve`` (over the solved episodes).

    Episodes start from the batch's ``conversations`` when it has them
    (:class:`~zoo.datamodules.MultiTurnSFTDataModule`, :class:`~zoo.datamodules.MultiTurnPromptDataModule`), else
    from the environment's first message for each of its ``prompts``; answers come from ``answers`` or the ``answer``
    column. Works with any module that follows the generation protocol (``tokenizer``, ``model``, ``generate``).

    Args:
        environment: the feedback environment (turns, feedback, verifier, chat format).
        max_new_tokens: tokens per turn.
        splits: where to evaluate (``val`` and/or ``test``).
        do_sample, temperature: sampled episodes instead of greedy ones (the policy's distribution rather than its
            mode; seeded, so every evaluation draws the same noise).
        samples: episodes per prompt (sampled evaluation).
        prefix: put before the metric names (e.g. ``sampled_``, for a second instance beside the greedy one).
        seed: seed of the sampled evaluation.
    """

    def __init__(
        self,
        environment: FeedbackEnvironment,
        max_new_tokens: int = 48,
        splits: tuple[str, ...] = ("val", "test"),
        do_sample: bool = False,
        temperature: float = 1.0,
        samples: int = 1,
        prefix: str = "",
        seed: int = 0,
    ) -> None:
        unknown = sorted(set(splits) - set(SPLITS))
        if unknown or not splits:
            raise ConfigError(f"callbacks.multiturn_eval.splits: unknown {unknown}; use {sorted(SPLITS)}")
        super().__init__([SPLITS[split] for split in splits])
        if samples < 1 or (samples > 1 and not do_sample):
            raise ConfigError("callbacks.multiturn_eval.samples must be >= 1, and > 1 only with do_sample=true")
        self.environment = environment
        self.params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature)
        self.splits = tuple(splits)
        self.samples = samples
        self.prefix = prefix
        self.seed = seed
        self.metrics = {split: MultiTurnAccuracy(environment.max_turns) for split in self.splits}
        self._generator: torch.Generator | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "MultiTurnEvaluation")
        for metric in self.metrics.values():
            metric.to(pl_module.device)

    # -- episodes -----------------------------------------------------------------------------------------------------
    def evaluate_batch(self, pl_module: pl.LightningModule, batch: dict[str, Any], split: str) -> list[Episode]:
        """Play the batch's episodes greedily, update the split's metric, and return the episodes."""
        answers = batch.get("answers")
        if answers is None:
            answers = batch.get("columns", {}).get("answer")
        if answers is None:
            raise ConfigError(
                "MultiTurnEvaluation: the evaluation batches carry no answers ('answers' or an 'answer' column)"
            )
        conversations = batch.get("conversations") or [self.environment.initial_messages(p) for p in batch["prompts"]]
        episodes = [
            self.environment.reset(c, a, str(i), j)
            for i, (c, a) in enumerate(zip(conversations, answers))
            for j in range(self.samples)
        ]
        generator = self._generator if self.params.do_sample else None
        policy = ChatPolicy.for_module(pl_module, self.environment.chat_format, self.params, generator)
        run_episodes(self.environment, episodes, policy)
        self.metrics[split].to(pl_module.device).update([e.t_star for e in episodes])
        return episodes

    def log_split(self, pl_module: pl.LightningModule, split: str) -> None:
        metric = self.metrics[split]
        if metric.update_count == 0:
            return
        values = metric.compute()
        for name, value in values.items():
            prog_bar = name == f"multi@{metric.max_turns}" and not self.prefix
            pl_module.log(f"{split}/{self.prefix}{name}", value.float(), prog_bar=prog_bar)
        metric.reset()

    def _seed(self, pl_module: pl.LightningModule) -> None:
        """Every evaluation of a sampled instance draws the same noise (comparable across steps)."""
        self._generator = torch.Generator(device=pl_module.device).manual_seed(self.seed)

    # -- evaluation hooks -------------------------------------------------------------------------------------------
    @staticmethod
    def _split(stage: str) -> str:
        return "val" if stage == "validate" else stage

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._seed(pl_module)

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        self.evaluate_batch(pl_module, batch, self._split(stage))

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.log_split(pl_module, self._split(stage))
