"""GRPO family module: rollouts -> rewards -> shaper -> advantages -> clipped policy loss -> aggregation.

Every stage is a core passed in through the constructor (a Hydra group each, owned by this family:
``module/grpo/rewards``, ``module/grpo/shaper``, ``module/grpo/advantage``, ``module/grpo/policy_loss``,
``module/grpo/aggregation``), so GR3, DAPO's overlong punishment, Dr.GRPO, RLOO and later methods are configs, not
subclasses.

One training step (manual optimization, GRPO / DAPO, see ``zoo.rl``):

1. sample ``G`` completions per prompt through the module's decoder (``module/decoder``, :mod:`zoo.generation`);
2. score them with the reward functions (TRL signature; dataset columns and ``step`` reach them);
3. shape the ``[num_groups, G]`` rewards (e.g. GR3 ``r / (1 + alpha * l / mean_l)``) and compute advantages;
4. for ``num_iterations`` optimizer steps, over micro-batches: per-token clipped loss against the rollout's
   old log-probs (+ ``beta`` * k3 KL to a frozen reference when ``beta > 0``), aggregated with a normalizer
   computed **once per optimizer step** from the whole batch's completion mask (micro-batch invariant).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from zoo.backbones.base import Backbone
from zoo.data.tasks import Verifier
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder
from zoo.generation.sampling import GenerationResult
from zoo.losses import masked_token_entropy, masked_token_logprobs
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.generating import GeneratingModule
from zoo.protocols import GenerationOutput
from zoo.quant.base import Quantizer
from zoo.rl import (
    ClippedPolicyLoss,
    GRPOAdvantage,
    LossAggregator,
    NoShaping,
    reward_group_stats,
    reward_matrix,
)
from zoo.rl.advantages import AdvantageEstimator
from zoo.rl.shapers import RewardShaper

RewardFns = Mapping[str, Callable[..., Sequence[float]]] | Sequence[Callable[..., Sequence[float]]]


def repeat_rows(values: Sequence[Any], times: int) -> list[Any]:
    """``[a, b] -> [a]*times + [b]*times`` (groups are contiguous blocks of ``G``)."""
    return [v for v in values for _ in range(times)]


class GRPOModule(GeneratingModule):
    """Group Relative Policy Optimization with pluggable seams.

    Args:
        backbone, quantizer, optimizer, scheduler: as :class:`~zoo.modules.base.ZooModule`.
        rewards: reward functions (TRL signature), a mapping name -> function.
        reward_weights: weight per reward function (mapping by name); ``None`` = 1 each.
        shaper: reward shaper applied to ``[num_groups, G]`` rewards (``NoShaping``, ``GR3Shaper``, ...).
        advantage: advantage estimator (``GRPOAdvantage``, ``DrGRPOAdvantage``, ``RLOOAdvantage``).
        policy_loss: per-token clipped objective (``eps_low``, ``eps_high``, ``beta``).
        aggregation: loss aggregation mode with its normalizer.
        group_size: ``G`` completions per prompt.
        num_iterations: optimizer steps per rollout batch (``mu``; 1 = strictly on-policy).
        micro_batch_size: completions per forward/backward pass (memory knob; does not change the gradient).
        max_grad_norm: gradient clipping (manual optimization; keep ``trainer.gradient_clip_val`` null).
        generation: rollout sampling (``do_sample``, ``temperature``, ``max_new_tokens``, ...).
        eval_generation: validation decoding (greedy by default, with the rollout ``max_new_tokens``).
        verifier: ``(completion, answer) -> bool`` for the true accuracy tracked beside the reward (the task's,
            ``verifier: ${task}``).
        decoder: the decoder of rollouts and evaluation (``module/decoder``; default plain sampling). It must show
            every completion token its sampling context in one forward pass (``consistent_with_forward``).

    Reward functions receive ``prompts``, ``completions`` (the result's texts), ``completion_ids`` (each rollout's
    generated token ids, as TRL passes them), the dataset columns and ``step``. A reward function with a
    ``bind_tokenizer(tokenizer)`` method gets the policy's tokenizer when the module is built (TRL's
    ``reward_processing_classes`` in spirit; e.g. :class:`zoo.rl.nmars.NMarsReward`).
    """

    def __init__(
        self,
        backbone: Backbone,
        rewards: RewardFns,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        reward_weights: Mapping[str, float] | None = None,
        shaper: RewardShaper | None = None,
        advantage: AdvantageEstimator | None = None,
        policy_loss: ClippedPolicyLoss | None = None,
        aggregation: LossAggregator | None = None,
        group_size: int = 8,
        num_iterations: int = 1,
        micro_batch_size: int = 64,
        max_grad_norm: float | None = 1.0,
        generation: dict[str, Any] | None = None,
        eval_generation: dict[str, Any] | None = None,
        verifier: Verifier | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        generation = {"do_sample": True, "temperature": 1.0, "max_new_tokens": 64, **(generation or {})}
        eval_generation = {
            "max_new_tokens": generation["max_new_tokens"],
            "do_sample": False,
            **(eval_generation or {}),
        }
        super().__init__(
            backbone,
            quantizer,
            optimizer,
            scheduler,
            generation,
            decoder=decoder,
            verifier=verifier,
            eval_generation=eval_generation,
        )
        self.automatic_optimization = False
        if group_size < 2:
            raise ConfigError(
                f"module.group_size={group_size}: group-relative advantages need at least 2 completions per prompt"
            )
        if num_iterations < 1 or micro_batch_size < 1:
            raise ConfigError("module.num_iterations and module.micro_batch_size must be >= 1")
        if not self.decoder.consistent_with_forward:
            raise ConfigError(
                f"module.decoder {self.decoder!r} samples tokens in contexts a forward pass over the completion "
                "does not show (e.g. undo decoding with mode=crop), so GRPO cannot score its rollouts; use a decoder "
                "that keeps them (module.decoder.mode=keep)"
            )
        for fn in rewards.values() if isinstance(rewards, Mapping) else rewards:
            if callable(getattr(fn, "bind_tokenizer", None)):
                fn.bind_tokenizer(self.tokenizer)
        self.rewards = rewards
        self.reward_weights = reward_weights
        self.shaper = shaper or NoShaping()
        self.advantage = advantage or GRPOAdvantage()
        self.policy_loss = policy_loss or ClippedPolicyLoss()
        self.aggregation = aggregation or LossAggregator("token_mean")
        self.group_size = group_size
        self.num_iterations = num_iterations
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.ref_model: torch.nn.Module | None = None
        self.last_rollout: dict[str, Any] = {}
        ignore = ["backbone", "quantizer", "optimizer", "scheduler", "rewards", "shaper", "advantage"]
        self.save_hyperparameters(ignore=[*ignore, "policy_loss", "aggregation", "verifier", "decoder"])

    # -- model ------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        if self.policy_loss.needs_reference and self.ref_model is None:
            # not a submodule: never saved, never optimized
            object.__setattr__(self, "ref_model", self.frozen_reference())

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def configure_optimizers(self) -> Any:
        config = super().configure_optimizers()
        if isinstance(config, dict) and self.num_iterations > 1:
            # one scheduler step per optimizer step: rebuild with num_iterations x batches
            optimizer = config["optimizer"]
            total = int(self.trainer.estimated_stepping_batches) * self.num_iterations
            config["lr_scheduler"]["scheduler"] = self.scheduler_factory(optimizer, total_steps=total)
        return config

    # -- rollout ----------------------------------------------------------------------------------------------
    def rollout(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Sample ``G`` completions per prompt, score, shape and compute advantages (no gradient)."""
        g = self.group_size
        prompt_ids = batch["prompt_ids"].repeat_interleave(g, dim=0)
        prompt_mask = batch["prompt_attention_mask"].repeat_interleave(g, dim=0)
        generator = torch.Generator(device=prompt_ids.device).manual_seed(
            int(torch.initial_seed()) % (2**31) + self.global_step
        )
        result = self.generate(prompt_ids, prompt_mask, self.sampling, generator)
        prompts = repeat_rows(batch["prompts"], g)
        columns = {k: repeat_rows(v, g) for k, v in batch.get("columns", {}).items()}
        columns["step"] = [self.global_step] * len(prompts)
        columns["completion_ids"] = [
            row[: int(n)] for row, n in zip(result.completion_ids.tolist(), result.completion_mask.sum(-1).tolist())
        ]
        matrix = reward_matrix(self.rewards, prompts, result.texts, columns)
        weights = self._reward_weights(matrix.shape[1]).to(matrix)
        rewards = (matrix @ weights).to(self.device)
        lengths = result.lengths.to(rewards)
        num_groups = len(batch["prompts"])
        shaped = self.shaper(rewards.view(num_groups, g), lengths.view(num_groups, g), self.sampling.max_new_tokens)
        advantages = self.advantage(shaped).reshape(-1)
        answers = columns.get("answer")
        correct = [self.verifier(t, a) for t, a in zip(result.texts, answers)] if answers else None
        return {
            "result": result,
            "prompt_mask": prompt_mask,
            "prompts": prompts,
            "texts": result.texts,
            "rewards": rewards.view(num_groups, g),
            "reward_components": matrix,
            "shaped": shaped,
            "lengths": lengths.view(num_groups, g),
            "advantages": advantages,
            "correct": correct,
        }

    def _reward_weights(self, count: int) -> torch.Tensor:
        if self.reward_weights is None:
            return torch.ones(count)
        names = list(self.rewards) if isinstance(self.rewards, Mapping) else []
        unknown = set(self.reward_weights) - set(names)
        if unknown:
            raise ConfigError(f"module.reward_weights names unknown reward functions {sorted(unknown)}; known {names}")
        return torch.tensor([float(self.reward_weights.get(n, 1.0)) for n in names])

    @staticmethod
    def sequences(result: GenerationResult, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(input_ids, attention_mask, position_ids, labels)`` of prompt + completion rows."""
        input_ids = torch.cat([result.prompt_ids, result.completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, result.completion_mask], dim=1)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        labels[:, : result.prompt_ids.shape[1]] = -100
        return input_ids, attention_mask, position_ids, labels

    def token_logprobs(
        self, model: torch.nn.Module, rows: tuple[torch.Tensor, ...], with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (temperature-scaled, as sampled) of the completion tokens: ``[N, T-1]``."""
        input_ids, attention_mask, position_ids, labels = rows
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        if self.sampling.temperature != 1.0:
            logits = logits / self.sampling.temperature
        logp, mask = masked_token_logprobs(logits, labels)
        entropy = masked_token_entropy(logits.detach(), labels)[0] if with_entropy else None
        return logp, mask, entropy

    # -- training ---------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        rollout = self.rollout(batch)
        self.last_rollout = rollout
        rows = self.sequences(rollout["result"], rollout["prompt_mask"])
        # With one optimizer step per rollout the old policy is the current one: its log-probs are the detached
        # log-probs of the loss forward (as TRL does), which saves a forward pass.
        old, ref = self.reference_logprobs(rows, need_old=self.num_iterations > 1)
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        for _ in range(self.num_iterations):
            loss, metrics = self.policy_gradients(rows, rollout["advantages"], old, ref)
            if self.max_grad_norm:
                self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
        self.log_rollout(rollout, loss, metrics)

    def micro_batches(self, num_rows: int) -> list[slice]:
        """Row slices of at most ``micro_batch_size``."""
        return [slice(i, min(i + self.micro_batch_size, num_rows)) for i in range(0, num_rows, self.micro_batch_size)]

    @torch.no_grad()
    def reference_logprobs(
        self, rows: tuple[torch.Tensor, ...], need_old: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Old-policy log-probs (the rollout policy, before any update; ``None`` unless ``need_old``) and
        reference log-probs (``None`` unless ``beta > 0``)."""
        chunks = self.micro_batches(rows[0].shape[0])
        old = None
        if need_old:
            old = torch.cat([self.token_logprobs(self.model, tuple(t[c] for t in rows))[0] for c in chunks])
        if self.ref_model is None:
            return old, None
        return old, torch.cat([self.token_logprobs(self.ref_model, tuple(t[c] for t in rows))[0] for c in chunks])

    def policy_gradients(
        self,
        rows: tuple[torch.Tensor, ...],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Accumulate the gradient of one optimizer step over micro-batches.

        The aggregation normalizer is computed once from the whole step's completion mask, so the summed
        micro-batch gradients equal the full-batch gradient whatever ``micro_batch_size`` is.
        ``old_logp=None`` means on-policy: the old log-probs are the detached current ones (ratio 1).
        Returns the step's loss (sum over micro-batches) and the mean of the per-micro-batch metrics.
        """
        completion_mask = rows[3][:, 1:] != -100
        normalizer = self.aggregation.normalizer(completion_mask, max_length=self.sampling.max_new_tokens)
        total = torch.zeros((), device=rows[0].device)
        metrics: dict[str, list[torch.Tensor]] = {}
        for chunk in self.micro_batches(rows[0].shape[0]):
            logp, mask, entropy = self.token_logprobs(self.model, tuple(t[chunk] for t in rows), with_entropy=True)
            ref = None if ref_logp is None else ref_logp[chunk]
            old = logp.detach() if old_logp is None else old_logp[chunk]
            per_token, info = self.policy_loss(logp, old, advantages[chunk], mask, ref)
            loss = self.aggregation(per_token, mask, normalizer)
            self.check_finite(loss)
            if self._trainer is not None:
                self.manual_backward(loss)
            else:  # used outside a Trainer (tests, notebooks)
                loss.backward()
            total = total + loss.detach()
            info["entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
            for key, value in info.items():
                metrics.setdefault(key, []).append(value.detach())
        return total, {k: torch.stack(v).mean() for k, v in metrics.items()}

    def log_rollout(self, rollout: dict[str, Any], loss: torch.Tensor, loss_metrics: dict[str, torch.Tensor]) -> None:
        """Diagnostics every step: lengths, truncation, zero-std groups, rewards before/after shaping, the loss
        metrics, and the ``metrics()`` of the shaper and advantage seams."""
        result: GenerationResult = rollout["result"]
        lengths = result.lengths.float()
        finished = result.finished
        stats = reward_group_stats(rollout["rewards"])
        shaped = rollout["shaped"]
        values = {
            "loss": loss,
            "completion_length": lengths.mean(),
            "completion_length_min": lengths.min(),
            "completion_length_max": lengths.max(),
            "terminated_length": lengths[finished].mean() if finished.any() else torch.tensor(0.0),
            "clipped_ratio": (~finished).float().mean(),
            "frac_reward_zero_std": stats["frac_reward_zero_std"],
            "reward": rollout["rewards"].mean(),
            "reward_std": rollout["rewards"].std(),
            "shaped_reward": shaped.mean(),
            "shaped_reward_std": shaped.std(),
            "advantage_abs": rollout["advantages"].abs().mean(),
            **loss_metrics,
        }
        if rollout["correct"] is not None:
            values["accuracy"] = torch.tensor(rollout["correct"], dtype=torch.float).mean()
        for seam in (self.shaper, self.advantage):  # each seam reports its own state (e.g. GR3: gr3_alpha)
            values.update({k: torch.as_tensor(v, dtype=torch.float) for k, v in seam.metrics().items()})
        size = len(rollout["texts"])
        for key, value in values.items():
            prog = key in ("reward", "completion_length", "accuracy")
            self.log(f"train/{key}", value.float().to(self.device), prog_bar=prog, batch_size=size)

    # -- evaluation -------------------------------------------------------------------------------------------
    def log_generation(self, output: GenerationOutput, result: GenerationResult, split: str) -> None:
        size = len(result.texts)
        self.log(f"{split}/completion_length", result.lengths.float().mean(), batch_size=size)
        self.log(f"{split}/clipped_ratio", (~result.finished).float().mean(), batch_size=size)
