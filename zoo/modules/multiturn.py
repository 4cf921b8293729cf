"""Multi-turn feedback episodes in the generating family.

* :class:`MultiTurnRolloutModule` -- offline rollout collection as its own stage (``python train.py
  +method=drift_rollouts``): ``predict`` over the prompts samples ``n_traj`` episodes per prompt from the reference
  policy (the module's backbone: the cached base policy, an exported model or a Hugging Face checkpoint) through the
  decoder seam, batched over the prompts of a batch, and appends them to a rollout file (:mod:`zoo.data.rollouts`)
  with a progress bar. Resumable: rerunning the same command continues a killed collection without duplicating or
  losing trajectories (a batch's sampling is seeded by its first prompt id, so regenerated prompts get the
  trajectories an uninterrupted run would have written).
* :class:`MultiTurnRollout` -- the multi-turn rollout seam of :class:`~zoo.modules.GRPOModule`
  (``module.rollout``; online multi-turn GRPO, DRIFT's slow reference): ``G`` episodes per prompt, the reward of a
  trajectory is its discounted return, the loss covers its assistant turns.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from zoo.backbones.base import Backbone
from zoo.data.feedback import ChatPolicy, Episode, FeedbackEnvironment, run_episodes
from zoo.data.multiturn import episode_row, trajectory_rows
from zoo.data.rollouts import RolloutWriter
from zoo.errors import ConfigError, DataError
from zoo.generation.decoders import Decoder
from zoo.modules.generating import GeneratingModule
from zoo.modules.grpo import repeat_rows
from zoo.protocols import GenerationResult
from zoo.quant.base import Quantizer
from zoo.rl.drift import discounted_return

log = logging.getLogger("zoo")


def keyed_generator(seed: int, key: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded from ``(seed, key)`` (SHA-256), independent of anything run before."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") % (2**63))


def batch_answers(batch: dict[str, Any]) -> list[Any]:
    """The reference answers of a prompt batch (its ``answer`` column)."""
    answers = batch.get("columns", {}).get("answer") or batch.get("answers")
    if answers is None or any(a is None for a in answers):
        raise DataError("multi-turn episodes need the reference answer of every prompt: an 'answer' column")
    return list(answers)


class MultiTurnRolloutModule(GeneratingModule):
    """Collects offline multi-turn rollouts of the backbone (the reference policy) into a rollout file.

    Args:
        backbone: the reference policy (``backbone.init_from``: ``base``, an export directory, a ``.ckpt``; or
            ``backbone=hf``).
        environment: the feedback environment (verifier, turns, feedback, penalties, chat format).
        output: the rollout file (JSONL; ``<output>.meta.json`` beside it).
        n_traj: trajectories per prompt (the released script: 16; DRIFT's demo: 8).
        gamma: discount of the file's ``return`` field (training recomputes returns with its own ``gamma``).
        seed: base seed of the sampling.
        generation: sampling of every turn (released script: temperature 1.0, top-p 1.0, up to 512 tokens).
        quantizer, decoder: as :class:`~zoo.modules.GeneratingModule`.
        progress: show a progress bar (trajectories).

    Raises:
        ConfigError: ``n_traj < 1``; more than one device.
    """

    def __init__(
        self,
        backbone: Backbone,
        environment: FeedbackEnvironment,
        output: str,
        n_traj: int = 8,
        gamma: float = 0.9,
        seed: int = 0,
        generation: dict[str, Any] | None = None,
        quantizer: Quantizer | None = None,
        decoder: Decoder | None = None,
        progress: bool = True,
    ) -> None:
        generation = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 48, **(generation or {})}
        super().__init__(backbone, quantizer, generation=generation, decoder=decoder, verifier=environment.verifier)
        if n_traj < 1:
            raise ConfigError(f"module.n_traj must be >= 1, got {n_traj}")
        discounted_return([], gamma)  # validates gamma
        self.environment = environment
        self.output = str(output)
        self.n_traj = n_traj
        self.gamma = gamma
        self.seed = seed
        self.progress = progress
        self.writer: RolloutWriter | None = None
        self.stats = {"trajectories": 0, "solved": 0, "solved_turn1": 0, "tokens": 0, "turns": 0, "out_of_context": 0}
        self.seconds = 0.0
        self._started: float | None = None
        self._bar: Any = None
        self._seen: set[str] = set()
        self.save_hyperparameters(ignore=["backbone", "quantizer", "environment", "decoder"])

    def collection_spec(self) -> dict[str, Any]:
        """What the rollouts depend on (stored beside the file; a resume must match it)."""
        prompts = (self.run_config or {}).get("datamodule", {}).get("source")
        return {
            "environment": self.environment.describe(),
            "reference": self.backbone.describe(),
            "n_traj": self.n_traj,
            "gamma": self.gamma,
            "seed": self.seed,
            "generation": vars(self.sampling),
            "decoder": repr(self.decoder),
            "prompts": prompts,
        }

    # -- predict --------------------------------------------------------------------------------------------------
    def on_predict_start(self) -> None:
        if self.trainer.world_size > 1:
            raise ConfigError("rollout collection writes one file from one process: use trainer.devices=1")
        self.writer = RolloutWriter(self.output, self.n_traj, self.collection_spec()).open()
        self._seen = set()
        self._started = time.perf_counter()
        done = self.writer.trajectories
        if done:
            log.info("%s: resuming a collection, %d trajectories already there", self.output, done)
        datamodule = getattr(self.trainer, "datamodule", None)
        split = getattr(datamodule, "predict_split", None)
        total = len(datamodule.dataset(split)) * self.n_traj if split is not None else None
        self._bar = tqdm(
            total=total,
            initial=done,
            unit="traj",
            desc="rollouts",
            disable=not (self.progress and self.trainer.is_global_zero),
        )

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        ids = [str(p) for p in batch["columns"]["prompt_id"]]
        repeated = sorted({p for p in ids if p in self._seen or ids.count(p) > 1})
        if repeated:
            raise DataError(f"prompt_id(s) {repeated[:3]} appear more than once among the prompts; ids must be unique")
        self._seen |= set(ids)
        todo = {p for p in ids if not self.writer.is_done(p)}
        if not todo:
            return {}
        # the whole batch is sampled (same generator, same rows as an uninterrupted run); done prompts are not written
        episodes = [e for e in self.collect(batch["conversations"], batch_answers(batch), ids) if e.prompt_id in todo]
        self.writer.write([episode_row(self.environment, e, self.gamma) for e in episodes])
        self.stats["trajectories"] += len(episodes)
        self.stats["solved"] += sum(e.t_star is not None for e in episodes)
        self.stats["solved_turn1"] += sum(e.t_star == 1 for e in episodes)
        self.stats["out_of_context"] += sum(e.out_of_context for e in episodes)
        self.stats["turns"] += sum(e.turns for e in episodes)
        self.stats["tokens"] += sum(e.completion_tokens for e in episodes)
        self._bar.update(len(episodes))
        return {}

    def collect(self, conversations: list[Any], answers: list[Any], prompt_ids: list[str]) -> list[Episode]:
        """``n_traj`` episodes of every prompt (contiguous groups), sampled with a generator keyed by the first id."""
        episodes = [
            self.environment.reset(conversation, answer, pid, j)
            for conversation, answer, pid in zip(conversations, answers, prompt_ids)
            for j in range(self.n_traj)
        ]
        generator = keyed_generator(self.seed, prompt_ids[0], self.device)
        policy = ChatPolicy.for_module(self, self.environment.chat_format, self.sampling, generator)
        return run_episodes(self.environment, episodes, policy)

    def on_predict_end(self) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None
        if self._bar is not None:
            self._bar.close()
        if self.writer is not None:
            self.writer.close()
        summary = self.summary()
        log.info(
            "rollouts in %s: %d new trajectories (%d in the file), %.3f solved at turn 1, %.3f within %d turns, %.2f "
            "turns on average",
            self.output,
            self.stats["trajectories"],
            self.writer.trajectories if self.writer is not None else 0,
            summary["rollouts/turn1_accuracy"],
            summary["rollouts/solved"],
            self.environment.max_turns,
            summary["rollouts/mean_turns"],
        )
        # Lightning does not log from predict: the summary goes to the loggers and to the run's final metrics
        metrics = {k: torch.tensor(v) for k, v in summary.items()}
        self.trainer.callback_metrics.update(metrics)
        for logger in self.trainer.loggers:
            logger.log_metrics(summary, step=0)

    def summary(self) -> dict[str, float]:
        """Statistics of the trajectories collected by this run (new ones only; ``rollouts/seconds``: wall-clock of the
        collection, ``rollouts/tokens``: tokens generated)."""
        n = max(self.stats["trajectories"], 1)
        return {
            "rollouts/new_trajectories": float(self.stats["trajectories"]),
            "rollouts/file_trajectories": float(self.writer.trajectories if self.writer is not None else 0),
            "rollouts/turn1_accuracy": self.stats["solved_turn1"] / n,
            "rollouts/solved": self.stats["solved"] / n,
            "rollouts/mean_turns": self.stats["turns"] / n,
            "rollouts/tokens_per_trajectory": self.stats["tokens"] / n,
            "rollouts/tokens": float(self.stats["tokens"]),
            "rollouts/seconds": self.seconds,
            "rollouts/out_of_context": self.stats["out_of_context"] / n,
        }


class MultiTurnRollout:
    """The multi-turn rollout seam of :class:`~zoo.modules.GRPOModule` (``module.rollout``).

    For every prompt of the batch (rows of :class:`~zoo.datamodules.MultiTurnPromptDataModule`: ``conversations``,
    the ``answer`` column), ``group_size`` episodes are played with the module's rollout sampling through its decoder.
    The reward of a trajectory is its discounted return (:func:`zoo.rl.drift.discounted_return`, the penalties of
    the environment included), shaped and turned into group-relative advantages by the module's seams; the policy
    loss covers the assistant tokens of the whole conversation (``train_turns=all``) or only its last turn
    (``last``); the feedback and the prompt carry no label.

    Args:
        environment: the feedback environment.
        gamma: discount of the return (DRIFT's 0.9 by default, so both optimise the same return).
        train_turns: ``all`` | ``last``.
    """

    def __init__(self, environment: FeedbackEnvironment, gamma: float = 0.9, train_turns: str = "all") -> None:
        if train_turns not in ("all", "last"):
            raise ConfigError(f"module.rollout.train_turns must be 'all' or 'last', got {train_turns!r}")
        discounted_return([], gamma)  # validates gamma
        self.environment = environment
        self.gamma = gamma
        self.train_turns = train_turns

    def __call__(self, module: Any, batch: dict[str, Any]) -> dict[str, Any]:
        """The rollout dict of :meth:`GRPOModule.rollout`, plus ``rows`` (the token rows to train on)."""
        if "conversations" not in batch:
            raise ConfigError(
                "module.rollout=multi_turn needs the conversations of datamodule=multiturn_prompts (a "
                "MultiTurnPromptDataModule)"
            )
        g = module.group_size
        env = self.environment
        answers = batch_answers(batch)
        ids = [str(p) for p in batch["columns"].get("prompt_id", range(len(answers)))]
        episodes = [
            env.reset(conversation, answer, pid, j)
            for conversation, answer, pid in zip(batch["conversations"], answers, ids)
            for j in range(g)
        ]
        device = module.device
        generator = torch.Generator(device=device).manual_seed(int(torch.initial_seed()) % (2**31) + module.global_step)
        policy = ChatPolicy.for_module(module, env.chat_format, module.sampling, generator)
        run_episodes(env, episodes, policy)
        rows = trajectory_rows(module.tokenizer, env.chat_format, episodes, self.train_turns)
        rows = {k: v.to(device) for k, v in rows.items()}
        rewards = torch.tensor(
            [
                discounted_return(e.turn_rewards, self.gamma, e.format_penalty, env.episode_repeat_penalty(e))
                for e in episodes
            ],
            dtype=torch.float,
            device=device,
        )
        trained = rows["labels"] != -100
        lengths = trained.sum(-1).to(rewards)
        num_groups = len(answers)
        budget = module.sampling.max_new_tokens * env.max_turns
        shaped = module.shaper(rewards.view(num_groups, g), lengths.view(num_groups, g), budget)
        advantages = module.advantage(shaped).reshape(-1)
        texts = ["\n".join(m["content"] for m in e.messages if m["role"] == "assistant") for e in episodes]
        result = GenerationResult(  # what the GRPO diagnostics read: trained tokens per trajectory, finished flags
            prompt_ids=rows["input_ids"][:, :0],
            completion_ids=rows["input_ids"],
            completion_mask=trained.long(),
            logprobs=torch.zeros_like(rows["input_ids"], dtype=torch.float),
            texts=texts,
            finished=torch.tensor([e.finished for e in episodes], device=device),
        )
        return {
            "result": result,
            "rows": (rows["input_ids"], rows["attention_mask"], rows["position_ids"], rows["labels"]),
            "prompt_mask": rows["attention_mask"][:, :0],
            "prompts": repeat_rows(batch["prompts"], g),
            "texts": texts,
            "rewards": rewards.view(num_groups, g),
            "reward_components": rewards[:, None],
            "shaped": shaped,
            "lengths": lengths.view(num_groups, g),
            "advantages": advantages,
            "correct": [e.t_star is not None for e in episodes],
            "episodes": episodes,
            "turns": torch.tensor([e.turns for e in episodes], dtype=torch.float),
            "tokens_generated": policy.tokens_generated,
        }


__all__ = ["MultiTurnRollout", "MultiTurnRolloutModule", "batch_answers", "keyed_generator"]
