"""GRPO family module: rollouts -> rewards -> shaper -> advantages -> clipped policy loss -> aggregation.

Every stage is a core passed in through the constructor (a Hydra group each, owned by this family:
``module/grpo/rewards``, ``module/grpo/shaper``, ``module/grpo/advantage``, ``module/grpo/policy_loss``,
``module/grpo/aggregation``; an auxiliary loss ``module/grpo/aux``), so GR3, DAPO's overlong punishment, Dr.GRPO,
RLOO, ThoughtFold and later methods are configs, not subclasses.

One training step -- a **rollout step**, the unit of ``trainer.max_steps``, of the learning-rate schedule and of
``trainer.global_step`` (manual optimization, GRPO / DAPO, see ``zoo.rl``):

1. sample ``G`` completions per prompt through the module's decoder (``module/decoder``, :mod:`zoo.generation`);
2. score them with the reward functions (TRL signature; dataset columns and ``step`` reach them);
3. shape the ``[num_groups, G]`` rewards (e.g. GR3 ``r / (1 + alpha * l / mean_l)``) and compute advantages;
   with DAPO's ``dynamic_sampling``, groups whose shaped rewards are all equal (advantage 0 everywhere) are dropped
   and the batch is refilled from the next batches of prompts (at most ``max_refill_rounds`` more);
4. ``num_iterations`` optimizer updates on the rollout, over micro-batches: per-token clipped loss against the
   rollout's old log-probs (+ ``beta`` * k3 KL to a frozen reference when ``beta > 0``), aggregated with a
   normalizer computed **once per update** from the whole batch's completion mask (micro-batch invariant);
   ``mask_truncated_completions`` takes completions cut at ``max_new_tokens`` out of the loss (DAPO);
   with an auxiliary loss (``module/grpo/aux``, :mod:`zoo.rl.auxiliary`, e.g. ThoughtFold's span-masked DPO pairs),
   its items are built once before the updates and ``aux.weight`` times its loss is accumulated into every update
   (micro-batch invariant, weight 0 = the plain GRPO gradient);
5. one learning-rate scheduler step.

The ``num_iterations`` updates of a rollout step are one Lightning step: the first ``num_iterations - 1`` go through
``trainer.strategy.optimizer_step`` (the strategy's and precision plugin's handling, ``on_before_optimizer_step``
hooks) without counting a step, the last through the ``LightningOptimizer``, which counts it. So ``max_steps=6,
num_iterations=2`` is 6 rollouts and 12 updates, and callbacks keyed on ``global_step`` fire per rollout step.
(TRL counts the updates instead: its ``max_steps`` is this module's ``max_steps * num_iterations``.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from zoo.backbones.base import Backbone
from zoo.backbones.placement import place_auxiliary
from zoo.backbones.sharding import shard
from zoo.encoding import pad_width
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder
from zoo.generation.prefix import SharedPrefix
from zoo.generation.sampling import accepts_logits_to_keep
from zoo.losses import IGNORE_INDEX, masked_token_logprobs_and_entropy
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.generating import GeneratingModule
from zoo.protocols import GenerationOutput, GenerationResult, Verifier
from zoo.quant.base import Quantizer
from zoo.rl import (
    ClippedPolicyLoss,
    GRPOAdvantage,
    LossAggregator,
    NoShaping,
    RewardContext,
    constant_groups,
    reward_group_stats,
    reward_matrix,
    weighted_rewards,
)
from zoo.rl.advantages import AdvantageEstimator
from zoo.rl.auxiliary import AuxiliaryItems, AuxiliaryLoss
from zoo.rl.shapers import RewardShaper

RewardFns = Mapping[str, Callable[..., Sequence[float]]] | Sequence[Callable[..., Sequence[float]]]
RolloutSeam = Callable[[Any, dict[str, Any]], dict[str, Any]]

#: Rollout entries with one row per completion (``[N, ...]`` tensors or lists), in group order.
ROW_KEYS = ("prompt_mask", "prompts", "texts", "reward_components", "advantages", "correct", "answers")
#: Rollout entries with one row per group (``[num_groups, G]``).
GROUP_KEYS = ("rewards", "shaped", "lengths")


def repeat_rows(values: Sequence[Any], times: int) -> list[Any]:
    """``[a, b] -> [a]*times + [b]*times`` (groups are contiguous blocks of ``G``)."""
    return [v for v in values for _ in range(times)]


def select_groups(rollout: dict[str, Any], groups: torch.Tensor, group_size: int) -> dict[str, Any]:
    """The rollout restricted to the groups ``groups`` (indices into ``[num_groups]``), every entry kept aligned."""
    groups = groups.to(torch.long).flatten()
    rows = (groups[:, None] * group_size + torch.arange(group_size, device=groups.device)).flatten()
    row_list = rows.tolist()
    out = dict(rollout)
    out["result"] = rollout["result"].select(rows)
    for key in ROW_KEYS:
        value = rollout.get(key)
        if isinstance(value, torch.Tensor):
            out[key] = value[rows.to(value.device)]
        elif value is not None:
            out[key] = [value[i] for i in row_list]
    for key in GROUP_KEYS:
        out[key] = rollout[key][groups.to(rollout[key].device)]
    return out


def concat_rollouts(rollouts: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Any]:
    """Groups of several rollouts as one rollout (prompts left-padded, completions right-padded to the widest)."""
    first = rollouts[0]
    out = dict(first)
    out["result"] = GenerationResult.concat([r["result"] for r in rollouts], pad_id)
    prompt_width = out["result"].prompt_ids.shape[1]
    out["prompt_mask"] = torch.cat([pad_width(r["prompt_mask"], prompt_width, 0, "left") for r in rollouts])
    for key in (*ROW_KEYS, *GROUP_KEYS):
        if key == "prompt_mask" or first.get(key) is None:
            continue
        if isinstance(first[key], torch.Tensor):
            out[key] = torch.cat([r[key] for r in rollouts])
        else:
            out[key] = [v for r in rollouts for v in r[key]]
    return out


def completion_start(labels: torch.Tensor) -> int:
    """First column of ``labels [N, T]`` that holds a label in some row (``T - 1`` when none does), at least 1:
    the logits of positions ``start - 1 .. T - 2`` are all a loss needs."""
    labelled = (labels != IGNORE_INDEX).any(dim=0)
    if not bool(labelled.any()):
        return max(labels.shape[1] - 1, 1)
    return max(int(labelled.to(torch.int8).argmax()), 1)


class GRPOModule(GeneratingModule):
    """Group Relative Policy Optimization with pluggable seams.

    Args:
        backbone, quantizer, optimizer, scheduler: as :class:`~zoo.modules.base.ZooModule` (the scheduler's
            ``total_steps`` is the number of rollout steps).
        rewards: reward functions (TRL signature), a mapping name -> function.
        reward_weights: weight per reward function (mapping by name); ``None`` = 1 each.
        shaper: reward shaper applied to ``[num_groups, G]`` rewards (``NoShaping``, ``GR3Shaper``, ...).
        advantage: advantage estimator (``GRPOAdvantage``, ``DrGRPOAdvantage``, ``RLOOAdvantage``).
        policy_loss: per-token clipped objective (``eps_low``, ``eps_high``, ``beta``).
        aggregation: loss aggregation mode with its normalizer.
        group_size: ``G`` completions per prompt.
        num_iterations: optimizer updates per rollout step (``mu``; 1 = strictly on-policy).
        micro_batch_size: completions per forward/backward pass (memory knob; does not change the gradient).
        micro_batch_tokens: token budget of a training micro-batch, ``None`` = off. The rows are sorted by length and
            packed so that rows x (longest row of the micro-batch) <= ``micro_batch_tokens`` (and at most
            ``micro_batch_size`` rows); each micro-batch is cut to its longest row, so the padding columns of a
            batch of short and long completions are not computed (verl's dynamic batch size in spirit). Does not
            change the gradient (:meth:`row_micro_batches`).
        share_prompt_forward: run the prompt columns of the loss and reference forwards once per distinct prompt per
            update, for all micro-batches (:class:`~zoo.generation.prefix.SharedPrefix`): the same log-probs and
            gradient with ``1/G`` of the prompt compute. With dropout in the model the rows of a group share the
            prompt's dropout mask (independent masks per row need ``false``). Under data parallelism (world size > 1)
            the loss forward runs every row's prompt (each backward pass reduces the gradients there).
        max_grad_norm: gradient clipping (manual optimization; keep ``trainer.gradient_clip_val`` null).
        generation: rollout sampling (``do_sample``, ``temperature``, ``max_new_tokens``, ...).
        eval_generation: validation decoding (greedy by default, with the rollout ``max_new_tokens``).
        verifier: ``(completion, answer) -> bool`` for the true accuracy tracked beside the reward (the task's,
            ``verifier: ${task}``).
        decoder: the decoder of rollouts and evaluation (``module/decoder``; default plain sampling). It must show
            every completion token its sampling context in one forward pass (``consistent_with_forward``).
        dynamic_sampling: DAPO dynamic sampling -- drop groups whose shaped rewards are all equal and refill the
            rollout step with the informative groups of the next batches until it holds as many groups as a
            batch has prompts (extra groups are dropped). [assumed] verl filters on a configured metric (accuracy
            by default); here the criterion is "advantage 0 everywhere", the same for an unshaped binary reward.
        max_refill_rounds: at most this many extra batches per rollout step; then the step trains on the groups it
            has (none at all: no update, the batches are skipped and logged).
        mask_truncated_completions: no loss on completions that reached ``max_new_tokens`` without EOS or a stop
            string (DAPO; TRL ``mask_truncated_completions``); they still count in the group's reward statistics.
        reuse_rollout_logprobs: with ``num_iterations > 1``, take the old-policy log-probs from the rollout (the
            decoder's sampling log-probs) instead of a second forward pass, when the decoder has no logits
            processors (whose log-probs are not the policy's), the rows are the rollout's and the policy computes in
            full precision (:meth:`full_precision`): generation and training forwards agree to float rounding in
            float32 only. Under bf16/fp16 compute or quantized weights the old log-probs are recomputed with the
            training forward, so that the first update's ratio is exactly 1.
        rollout: the rollout seam (``module/grpo/rollout``): ``None`` samples ``G`` single-turn completions per prompt
            (:meth:`rollout`); a callable ``(module, batch) -> rollout dict`` replaces it, e.g. multi-turn feedback
            episodes (:class:`~zoo.modules.multiturn.MultiTurnRollout`), and may give the token rows to train on as
            ``rows``.
        aux: the auxiliary-loss seam (``module/grpo/aux``): ``None`` = none; an :class:`~zoo.rl.auxiliary.AuxiliaryLoss`
            builds extra items from each rollout step and adds ``aux.weight`` times their loss to every update.
        log_entropy: log ``train/entropy``, the mean predictive entropy of the completion tokens, computed with the
            loss's log-probs in sequence blocks (:func:`zoo.losses.masked_token_logprobs_and_entropy`); ``False``
            skips it (no softmax over the vocabulary beyond the log-probs' ``logsumexp``).

    Reward functions receive ``prompts``, ``completions`` (the result's texts), ``completion_ids`` (each rollout's
    generated token ids, as TRL passes them), the dataset columns and ``step``. A reward function with a
    ``bind_tokenizer(tokenizer)`` method gets the policy's tokenizer when the module is built (TRL's
    ``reward_processing_classes`` in spirit; e.g. :class:`zoo.rl.nmars.NMarsReward`).
    """

    def training_generation(self, stage: str) -> list[tuple[str, int]]:
        """Rollouts sample from the training prompts with :attr:`sampling`'s budget (checked before the run)."""
        return [("train", self.sampling.max_new_tokens)] if stage == "fit" else []

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
        micro_batch_tokens: int | None = None,
        share_prompt_forward: bool = True,
        max_grad_norm: float | None = 1.0,
        generation: dict[str, Any] | None = None,
        eval_generation: dict[str, Any] | None = None,
        verifier: Verifier | None = None,
        decoder: Decoder | None = None,
        dynamic_sampling: bool = False,
        max_refill_rounds: int = 3,
        mask_truncated_completions: bool = False,
        reuse_rollout_logprobs: bool = True,
        rollout: RolloutSeam | None = None,
        aux: AuxiliaryLoss | None = None,
        log_entropy: bool = True,
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
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ConfigError(f"module.micro_batch_tokens must be >= 1 or null (off), got {micro_batch_tokens}")
        if not self.decoder.consistent_with_forward:
            raise ConfigError(
                f"module.decoder {self.decoder!r} samples tokens in contexts a forward pass over the completion "
                "does not show (e.g. undo decoding with mode=crop), so GRPO cannot score its rollouts; use a decoder "
                "that keeps them (module.decoder.mode=keep)"
            )
        for fn in rewards.values() if isinstance(rewards, Mapping) else rewards:
            if callable(getattr(fn, "bind_tokenizer", None)):
                fn.bind_tokenizer(self.tokenizer)
        if max_refill_rounds < 0:
            raise ConfigError(f"module.max_refill_rounds must be >= 0, got {max_refill_rounds}")
        self.rewards = rewards
        self.reward_weights = reward_weights
        self.shaper = shaper or NoShaping()
        self.advantage = advantage or GRPOAdvantage()
        self.policy_loss = policy_loss or ClippedPolicyLoss()
        self.aggregation = aggregation or LossAggregator("token_mean")
        self.group_size = group_size
        self.num_iterations = num_iterations
        self.micro_batch_size = micro_batch_size
        self.micro_batch_tokens = micro_batch_tokens
        self.share_prompt_forward = share_prompt_forward
        self.max_grad_norm = max_grad_norm
        self.dynamic_sampling = bool(dynamic_sampling)
        self.max_refill_rounds = int(max_refill_rounds)
        self.mask_truncated_completions = bool(mask_truncated_completions)
        self.reuse_rollout_logprobs = bool(reuse_rollout_logprobs)
        self.log_entropy = bool(log_entropy)
        self.rollout_seam = rollout
        self.aux = aux
        if self.dynamic_sampling and rollout is not None:
            raise ConfigError(
                "GRPOModule: dynamic_sampling refills single-turn rollouts only; use module/grpo/rollout=single_turn "
                "or set module.dynamic_sampling=false"
            )
        self.ref_model: torch.nn.Module | None = None
        self.last_rollout: dict[str, Any] = {}
        self._pending: list[dict[str, Any]] = []  # informative groups waiting for a full rollout step
        self._logits_to_keep: bool | None = None
        ignore = ["backbone", "quantizer", "optimizer", "scheduler", "rewards", "shaper", "advantage"]
        ignore += ["policy_loss", "aggregation", "verifier", "decoder", "rollout", "aux"]
        self.save_hyperparameters(ignore=ignore)

    # -- model ------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        # under Lightning's FSDPStrategy the policy is the FSDP root, not the LightningModule: the module runs its
        # forwards and backward passes itself, which a root unit wrapping the LightningModule never sees (its first
        # manual_backward failed); norm clipping then goes through the root (ZooModule.clip_gradients)
        self.model = shard(self.model)
        if self.policy_loss.needs_reference and self.ref_model is None:
            # not a submodule: never saved, never optimized
            object.__setattr__(self, "ref_model", self.frozen_reference())
        if self.aux is not None:
            self.aux.setup(self)

    # -- checkpoints ------------------------------------------------------------------------------------------
    #: checkpoint key of the seams' state (e.g. GR3's alpha, which a calibration callback changes during training)
    SEAM_STATE_KEY = "grpo_seam_state"

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[self.SEAM_STATE_KEY] = {
            name: seam.state_dict() for name, seam in self._stateful_seams().items() if seam.state_dict()
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(self.SEAM_STATE_KEY) or {}
        for name, seam in self._stateful_seams().items():
            if name in saved:
                seam.load_state_dict(saved[name])

    def _stateful_seams(self) -> dict[str, Any]:
        """The seams with a ``state_dict``/``load_state_dict`` (the shaper, and any other seam that has them)."""
        seams = {"shaper": self.shaper, "advantage": self.advantage}
        return {k: v for k, v in seams.items() if callable(getattr(v, "state_dict", None))}

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- rollout ----------------------------------------------------------------------------------------------
    def rollout(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Sample ``G`` completions per prompt, score, shape and compute advantages (no gradient)."""
        if self.rollout_seam is not None:
            return self.rollout_seam(self, batch)
        g = self.group_size
        prompt_ids = batch["prompt_ids"].repeat_interleave(g, dim=0)
        prompt_mask = batch["prompt_attention_mask"].repeat_interleave(g, dim=0)
        # each rank samples its own completions: the global rank is folded into the seed (rank 0 keeps the
        # single-process seed; a CPU generator reads the low 32 bits of its seed, so the rank's term stays in them)
        seed = int(torch.initial_seed()) % (2**31) + self.global_step + 100_003 * len(self._pending)
        seed = (seed + self.global_rank * 2_654_435_761) % 2**32
        generator = torch.Generator(device=prompt_ids.device).manual_seed(seed)
        result = self.generate(prompt_ids, prompt_mask, self.sampling, generator)
        prompts = repeat_rows(batch["prompts"], g)
        columns = {k: repeat_rows(v, g) for k, v in batch.get("columns", {}).items()}
        columns["step"] = [self.global_step] * len(prompts)
        columns["completion_ids"] = [
            row[: int(n)] for row, n in zip(result.completion_ids.tolist(), result.completion_mask.sum(-1).tolist())
        ]
        context = RewardContext(self.reward_trainer_state())  # TRL's trainer_state / log_metric / log_extra
        matrix = reward_matrix(self.rewards, prompts, result.texts, columns, context)
        weights = self._reward_weights(matrix.shape[1]).to(matrix)
        rewards = weighted_rewards(matrix, weights, completions=result.texts).to(self.device)  # None rows left out
        lengths = result.lengths.to(rewards)
        num_groups = len(batch["prompts"])
        shaped = self.shaper(rewards.view(num_groups, g), lengths.view(num_groups, g), self.sampling.max_new_tokens)
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
            "advantages": self.advantage(shaped).reshape(-1),
            "correct": correct,
            "answers": answers,
            "reward_metrics": context.metric_means(),
            "reward_extras": dict(context.extras),
        }

    def reward_trainer_state(self) -> Any:
        """The ``transformers.TrainerState`` reward functions receive as ``trainer_state`` (TRL passes its trainer's
        state): ``global_step``, ``epoch``, ``max_steps`` and ``num_train_epochs`` (0 where Lightning has no bound)
        and the process-zero flags, from the Lightning trainer."""
        from transformers import TrainerState

        trainer = self._trainer
        max_steps = int(getattr(trainer, "max_steps", -1) or -1)
        return TrainerState(
            epoch=float(self.current_epoch),
            global_step=int(self.global_step),
            max_steps=max(max_steps, 0),
            num_train_epochs=max(int(getattr(trainer, "max_epochs", 0) or 0), 0),
            is_world_process_zero=self.global_rank == 0,
            is_local_process_zero=self.local_rank == 0,
        )

    def _reward_weights(self, count: int) -> torch.Tensor:
        if self.reward_weights is None:
            return torch.ones(count)
        names = list(self.rewards) if isinstance(self.rewards, Mapping) else []
        unknown = set(self.reward_weights) - set(names)
        if unknown:
            raise ConfigError(f"module.reward_weights names unknown reward functions {sorted(unknown)}; known {names}")
        return torch.tensor([float(self.reward_weights.get(n, 1.0)) for n in names])

    def fill_from_informative_groups(self, rollout: dict[str, Any], target_groups: int) -> dict[str, Any] | None:
        """DAPO dynamic sampling: keep the rollout's informative groups; return a rollout of ``target_groups`` of
        them (advantages recomputed over it) once enough are collected or the refill rounds are used up, else
        ``None`` (the step only collected).

        Under data parallelism the decisions are collective (each one decides whether a rank makes the collectives
        of an update): every rank keeps collecting while some rank has fewer than ``target_groups``; the step is
        skipped only when no rank collected an informative group; a rank without any while others have some takes
        part in the update with weight 0 (its last rollout, no gradient contribution)."""
        informative = torch.nonzero(~constant_groups(rollout["shaped"])).flatten()
        self._pending.append(select_groups(rollout, informative, self.group_size))
        collected = sum(p["shaped"].shape[0] for p in self._pending)
        rounds = len(self._pending) - 1
        if self._any_rank(collected < target_groups) and rounds < self.max_refill_rounds:
            return None
        pending, self._pending = self._pending, []
        if not self._any_rank(collected > 0):
            self.log("train/dynamic_sampling_skipped", float(rounds + 1), batch_size=1)
            return None
        if collected == 0:  # other ranks train on their groups: this one joins their collectives without a gradient
            return {**rollout, "train_weight": 0.0, "refill_rounds": rounds}
        merged = concat_rollouts([p for p in pending if p["shaped"].shape[0]], self.tokenizer.pad_token_id)
        if collected > target_groups:
            merged = select_groups(merged, torch.arange(target_groups), self.group_size)
        merged["advantages"] = self.advantage(merged["shaped"]).reshape(-1)
        merged["refill_rounds"] = rounds
        return merged

    # -- token rows -------------------------------------------------------------------------------------------
    def sequences(self, result: GenerationResult, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(input_ids, attention_mask, position_ids, labels)`` of prompt + completion rows; labels are the
        completion tokens (none on a truncated completion with ``mask_truncated_completions``)."""
        input_ids = torch.cat([result.prompt_ids, result.completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, result.completion_mask], dim=1)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        labels[:, : result.prompt_ids.shape[1]] = IGNORE_INDEX
        if self.mask_truncated_completions:
            labels[~result.finished.to(labels.device)] = IGNORE_INDEX
        return input_ids, attention_mask, position_ids, labels

    def token_logprobs(
        self,
        model: torch.nn.Module,
        rows: tuple[torch.Tensor, ...],
        with_entropy: bool = False,
        start: int | None = None,
        prefix: SharedPrefix | None = None,
        index: torch.Tensor | slice = slice(None),
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs (temperature-scaled, as sampled) of the labelled tokens from column ``start`` on:
        ``logp [N, T - start]``, ``mask [N, T - start]`` and, with ``with_entropy``, the summed entropy of the
        labelled positions (detached scalar).

        ``start`` defaults to :func:`completion_start`; logits are computed for positions ``start - 1 ..`` only
        (``logits_to_keep`` where the model takes it, else sliced). With ``prefix`` (:meth:`shared_prompt` of the
        batch, whose rows ``index`` these are) only the columns after the shared prompt are run.
        """
        input_ids, attention_mask, position_ids, labels = rows
        start = completion_start(labels) if start is None else start
        keep = input_ids.shape[1] - start + 1
        if prefix is not None:
            logits = prefix.logits(model, input_ids, attention_mask, position_ids, index)
        else:
            if self._logits_to_keep is None:
                self._logits_to_keep = accepts_logits_to_keep(model)
            extra = {"logits_to_keep": keep} if self._logits_to_keep else {}
            logits = model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra
            ).logits
        logits = logits[:, -keep:]
        targets = labels[:, start - 1 :]
        # the temperature divides the float32 logits, after the upcast (as the sampler does); log-probs and entropy
        # in one pass over sequence blocks (no [n, V] float32 copies)
        return masked_token_logprobs_and_entropy(
            logits, targets, with_entropy=with_entropy, temperature=self.sampling.temperature
        )

    # -- training ---------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        rollout = self.rollout(batch)
        self.last_rollout = rollout
        self.log_rollout(rollout)
        if self.dynamic_sampling:
            rollout = self.fill_from_informative_groups(rollout, target_groups=len(batch["prompts"]))
            if rollout is None:
                return
        loss, metrics = self.update_policy(rollout)
        self.log_update(rollout, loss, metrics)

    def update_policy(self, rollout: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One rollout step: ``num_iterations`` optimizer updates on the rollout, then one scheduler step."""
        own_rows = "rows" in rollout  # a rollout seam gave the token rows to train on (e.g. multi-turn episodes)
        rows = rollout["rows"] if own_rows else self.sequences(rollout["result"], rollout["prompt_mask"])
        start = completion_start(rows[3])
        old = self.rollout_logprobs(rollout, start) if self.num_iterations > 1 and not own_rows else None
        # With one update per rollout the old policy is the current one: its log-probs are the detached log-probs
        # of the loss forward (as TRL does), which saves a forward pass.
        recomputed, ref = self.reference_logprobs(rows, need_old=self.num_iterations > 1 and old is None)
        old = recomputed if old is None else old
        aux_items = self.aux.prepare(self, rollout) if self.aux is not None else None  # rollout-time policy
        if self.aux is not None:
            self.share_aux_normalizer(aux_items)
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        weight = float(rollout.get("train_weight", 1.0))
        for iteration in range(self.num_iterations):
            # the auxiliary backward passes come first: under data parallelism only the last backward pass of an
            # update (the policy loss's last micro-batch) reduces the gradients across ranks
            aux_loss = self.auxiliary_gradients(aux_items) if aux_items is not None else None
            loss, metrics = self.policy_gradients(rows, rollout["advantages"], old, ref, weight=weight)
            if aux_loss is not None:
                metrics["aux_loss"] = aux_loss
            if self.max_grad_norm:
                self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
            if iteration < self.num_iterations - 1:
                # an update inside the rollout step: the strategy's optimizer step, not counted as a Lightning step
                self.trainer.strategy.optimizer_step(optimizer.optimizer, closure=lambda: None)
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        return loss, metrics

    def rollout_logprobs(self, rollout: dict[str, Any], start: int) -> torch.Tensor | None:
        """The old-policy log-probs of the rollout's sampling, aligned with :meth:`token_logprobs` from ``start``,
        when they are the policy's (see ``reuse_rollout_logprobs``); ``None`` otherwise."""
        result: GenerationResult = rollout["result"]
        prompt_width = result.prompt_ids.shape[1]
        if not self.reuse_rollout_logprobs or self.decoder.processors or start < prompt_width:
            return None
        if not self.full_precision():
            return None
        return (result.logprobs * result.completion_mask)[:, start - prompt_width :].to(self.device)

    def full_precision(self) -> bool:
        """Whether the policy computes in float32/float64: the trainer's precision is ``32-true``/``64-true`` (no
        autocast) and every parameter is float32/float64 (no half-precision or quantized weight). Only then may the
        rollout's sampling log-probs stand for the training forward's (``reuse_rollout_logprobs``)."""
        precision = str(self._trainer.precision) if self._trainer is not None else "32-true"
        if precision not in ("32-true", "32", "64-true", "64"):
            return False
        return all(p.dtype in (torch.float32, torch.float64) for p in self.model.parameters())

    def micro_batches(self, num_rows: int) -> list[slice]:
        """Row slices of at most ``micro_batch_size``."""
        return [slice(i, min(i + self.micro_batch_size, num_rows)) for i in range(0, num_rows, self.micro_batch_size)]

    def row_micro_batches(self, rows: tuple[torch.Tensor, ...], start: int) -> list[tuple[torch.Tensor | slice, int]]:
        """The training micro-batches of token rows ``(input_ids, attention_mask, position_ids, labels)``: pairs
        ``(row index, width)``; a micro-batch is ``t[index, :width]`` of every row tensor.

        Without ``micro_batch_tokens``: slices of ``micro_batch_size`` rows at the full width. With it: rows sorted by
        their end (last attended or labelled column + 1, at least ``start + 1``), longest first, packed greedily while
        rows x width stays within the budget. Cutting columns after a row's end leaves its log-probs unchanged
        (causal attention, explicit position ids), so the summed micro-batch gradients are the full batch's.
        """
        num_rows, width = rows[0].shape
        if self.micro_batch_tokens is None:
            return [(chunk, width) for chunk in self.micro_batches(num_rows)]
        columns = torch.arange(1, width + 1, device=rows[0].device)
        used = (rows[1] != 0) | (rows[3] != IGNORE_INDEX)
        ends = (used * columns).amax(dim=1).clamp(min=start + 1)
        order = torch.argsort(ends, descending=True, stable=True)
        ends_sorted = ends[order].tolist()
        chunks: list[tuple[torch.Tensor | slice, int]] = []
        first = 0
        for i in range(1, num_rows + 1):
            chunk_width = ends_sorted[first]
            if (
                i == num_rows
                or (i - first + 1) * chunk_width > self.micro_batch_tokens
                or i - first >= self.micro_batch_size
            ):
                chunks.append((order[first:i], chunk_width))
                first = i
        return chunks

    @torch.no_grad()
    def reference_logprobs(
        self, rows: tuple[torch.Tensor, ...], need_old: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Old-policy log-probs (the rollout policy, before any update; ``None`` unless ``need_old``) and
        reference log-probs (``None`` unless ``beta > 0``), ``[N, T - start]`` (:func:`completion_start`)."""
        start = completion_start(rows[3])
        chunks = self.row_micro_batches(rows, start)

        def logprobs(model: torch.nn.Module) -> torch.Tensor:
            out = torch.zeros(rows[0].shape[0], rows[0].shape[1] - start, device=rows[0].device)
            prefix = self.shared_prompt(model, rows, start)
            for index, width in chunks:
                out[index, : width - start] = self.token_logprobs(
                    model, tuple(t[index, :width] for t in rows), start=start, prefix=prefix, index=index
                )[0]
            return out

        old = logprobs(self.model) if need_old else None
        if self.ref_model is None:
            return old, None
        place_auxiliary(self.ref_model, self.model)  # not a child: the strategy does not move it (no-op once placed)
        return old, logprobs(self.ref_model)

    def policy_gradients(
        self,
        rows: tuple[torch.Tensor, ...],
        advantages: torch.Tensor,
        old_logp: torch.Tensor | None,
        ref_logp: torch.Tensor | None = None,
        weight: float = 1.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Accumulate the gradient of one optimizer update over micro-batches.

        The aggregation normalizer is computed once from the whole batch's completion mask, so the summed
        micro-batch gradients equal the full-batch gradient whatever ``micro_batch_size`` is.
        ``old_logp=None`` means on-policy: the old log-probs are the detached current ones (ratio 1).
        ``weight=0`` runs the passes without a gradient contribution (a rank with nothing to train on while the
        other ranks train, DAPO dynamic sampling under data parallelism).
        Returns the update's loss (sum over micro-batches) and the metrics: the per-micro-batch metrics of the
        policy loss averaged, and ``entropy``, the mean entropy over all completion tokens.

        Under data parallelism (``W`` ranks; notes ``rl.md`` §0.2, DESIGN "Scale"): the normalizer is the
        all-reduced sum of the ranks' values divided by ``W`` (DDP averages the gradients), so the update is the
        single-process update on the union of the ranks' rows; the ranks agree on the number of micro-batches
        (all-reduce max; a rank with fewer runs zero-weight padding micro-batches of one row) and only the last
        backward pass reduces the gradients (the strategy's ``block_backward_sync`` for the others), so ranks that
        pack their rows differently never wait on each other's reductions.
        """
        start = completion_start(rows[3])
        completion_mask = rows[3][:, start:] != IGNORE_INDEX
        distributed = self._distributed
        local = self.aggregation.normalizer(completion_mask, max_length=self.sampling.max_new_tokens, minimum=0.0)
        if distributed:
            local = self._all_reduce(local * (weight != 0), torch.distributed.ReduceOp.SUM)
            normalizer = local.clamp(min=1.0) / self.trainer.world_size
        else:
            normalizer = local.clamp(min=1.0)
        total = torch.zeros((), device=rows[0].device)
        entropy = torch.zeros((), device=rows[0].device)
        metrics: dict[str, list[torch.Tensor]] = {}
        # under data parallelism the prompt's separate backward pass would be one more gradient reduction
        prefix = None if distributed else self.shared_prompt(self.model, rows, start)
        chunks: list[tuple[torch.Tensor | slice, int, bool]] = [
            (chunk, width, False) for chunk, width in self.row_micro_batches(rows, start)
        ]
        if distributed:
            count = self._all_reduce(torch.tensor(len(chunks), device=self.device), torch.distributed.ReduceOp.MAX)
            padding = (torch.zeros(1, dtype=torch.long, device=rows[0].device), start + 1, True)
            chunks += [padding] * (int(count) - len(chunks))
        for number, (chunk, width, is_padding) in enumerate(chunks):
            logp, mask, chunk_entropy = self.token_logprobs(
                self.model,
                tuple(t[chunk, :width] for t in rows),
                with_entropy=self.log_entropy,
                start=start,
                prefix=prefix,
                index=chunk,
            )
            ref = None if ref_logp is None else ref_logp[chunk, : width - start]
            old = logp.detach() if old_logp is None else old_logp[chunk, : width - start]
            per_token, info = self.policy_loss(logp, old, advantages[chunk], mask, ref)
            loss = self.aggregation(per_token, mask, normalizer)
            self.check_finite(loss)
            if is_padding or weight != 1.0:
                loss = loss * (0.0 if is_padding else weight)
            self.backward_pass(loss, sync=number == len(chunks) - 1)
            if is_padding:
                continue
            total = total + loss.detach()
            if chunk_entropy is not None:
                entropy = entropy + chunk_entropy
            for key, value in info.items():
                metrics.setdefault(key, []).append(value.detach())
        if prefix is not None:
            prefix.backward()  # the prompt's share of the gradient, through its one forward
        out = {k: torch.stack(v).mean() for k, v in metrics.items()}
        if self.log_entropy:
            out["entropy"] = entropy / completion_mask.sum().clamp(min=1)
        return total, out

    @property
    def _distributed(self) -> bool:
        return self._trainer is not None and self.trainer.world_size > 1

    def _all_reduce(self, value: torch.Tensor, op: Any) -> torch.Tensor:
        """``value`` reduced over the ranks with ``op`` (a ``torch.distributed.ReduceOp``); itself on one process."""
        if not self._distributed:
            return value
        value = value.detach().clone()
        torch.distributed.all_reduce(value, op=op)
        return value

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (a decision every rank takes alike)."""
        if not self._distributed:
            return flag
        return bool(self._all_reduce(torch.tensor(float(flag), device=self.device), torch.distributed.ReduceOp.MAX))

    def backward_pass(self, loss: torch.Tensor, sync: bool = True) -> None:
        """``loss.backward()`` through the strategy; under data parallelism the gradients are reduced across
        ranks only when ``sync`` (one such pass per optimizer update, its last), the other passes accumulate
        locally (``trainer.strategy.block_backward_sync``). Outside a Trainer (tests, notebooks) a plain backward."""
        if self._trainer is None:
            loss.backward()
        elif sync or not self._distributed:
            self.manual_backward(loss)
        else:
            with self.trainer.strategy.block_backward_sync():
                self.manual_backward(loss)

    def shared_prompt(self, model: torch.nn.Module, rows: tuple[torch.Tensor, ...], start: int) -> SharedPrefix | None:
        """The keys/values of the batch's distinct prompts (columns before ``start - 1``), computed once for all
        micro-batches (:class:`~zoo.generation.prefix.SharedPrefix`); ``None`` with ``share_prompt_forward`` off or
        when nothing is shared (every row then runs its prompt)."""
        if not self.share_prompt_forward:
            return None
        return SharedPrefix.compute(model, rows[0], rows[1], rows[2], split=start - 1)

    def share_aux_normalizer(self, items: AuxiliaryItems | None) -> None:
        """Under data parallelism (``W`` ranks) set ``items.normalizer`` to the all-reduced item count divided by ``W``
        (every rank calls it, also one without items this step), so that DDP's gradient average of the ranks'
        auxiliary losses is the single-process loss over the union of their items (the policy loss's normalizer is
        made collective the same way in :meth:`policy_gradients`). One process: nothing to do (the seam divides by
        ``items.size``)."""
        if not self._distributed:
            return
        local = torch.tensor(float(items.size if items is not None else 0), device=self.device)
        total = float(self._all_reduce(local, torch.distributed.ReduceOp.SUM))
        if items is not None:
            items.normalizer = max(total, 1.0) / self.trainer.world_size

    def auxiliary_gradients(self, items: AuxiliaryItems) -> torch.Tensor:
        """Accumulate ``aux.weight`` times the auxiliary loss over micro-batches of its items (the seam divides by
        a per-step normalizer, so the split does not change the gradient); returns the unweighted loss. With weight 0
        the loss is only computed for logging."""
        total = torch.zeros((), device=self.device)
        for chunk in self.micro_batches(items.size):
            if self.aux.weight == 0:
                with torch.no_grad():
                    total = total + self.aux.loss(self, items, chunk)
                continue
            loss = self.aux.loss(self, items, chunk)
            self.check_finite(loss)
            # never the update's last backward pass (the policy loss's comes after): no gradient reduction here
            self.backward_pass(self.aux.weight * loss, sync=False)
            total = total + loss.detach()
        return total

    # -- logging ----------------------------------------------------------------------------------------------
    def log_rollout(self, rollout: dict[str, Any]) -> None:
        """Diagnostics of every generated batch: lengths, truncation, zero-std groups, rewards before/after
        shaping, accuracy, and the ``metrics()`` of the shaper and advantage seams."""
        result: GenerationResult = rollout["result"]
        lengths = result.lengths.float()
        finished = result.finished
        stats = reward_group_stats(rollout["rewards"])
        shaped = rollout["shaped"]
        values = {
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
        }
        if rollout["correct"] is not None:
            values["accuracy"] = torch.tensor(rollout["correct"], dtype=torch.float).mean()
        for seam in (self.shaper, self.advantage):  # each seam reports its own state (e.g. GR3: gr3_alpha)
            values.update({k: torch.as_tensor(v, dtype=torch.float) for k, v in seam.metrics().items()})
        for key, value in rollout.get("reward_metrics", {}).items():  # reward functions' log_metric (TRL's names)
            values.setdefault(key, torch.tensor(value, dtype=torch.float))
        self._log_train(values, len(rollout["texts"]))

    def log_update(self, rollout: dict[str, Any], loss: torch.Tensor, loss_metrics: dict[str, torch.Tensor]) -> None:
        """Diagnostics of a policy update: the loss and its metrics, the advantages trained on and, with dynamic
        sampling, the groups kept and the refill rounds used."""
        values = {"loss": loss, "advantage_abs": rollout["advantages"].abs().mean(), **loss_metrics}
        if self.aux is not None:  # the seam's diagnostics of this step (pairs built, validation cost, ...)
            values.update({k: torch.as_tensor(v, dtype=torch.float) for k, v in self.aux.metrics().items()})
        if self.dynamic_sampling:
            kept = rollout["shaped"].shape[0] if rollout.get("train_weight", 1.0) else 0  # weight 0: none kept
            values["groups_kept"] = torch.tensor(float(kept))
            values["refill_rounds"] = torch.tensor(float(rollout.get("refill_rounds", 0)))
        self._log_train(values, len(rollout["texts"]))

    def _log_train(self, values: dict[str, torch.Tensor], size: int) -> None:
        """Log ``train/<key>``; under data parallelism reduced across ranks (mean; ``*_min``/``*_max`` by min/max),
        so every rank logs the same keys in the same order."""
        distributed = self._distributed
        for key in sorted(values) if distributed else values:
            prog = key in ("reward", "completion_length", "accuracy")
            reduce_fx = "max" if key.endswith("_max") else "min" if key.endswith("_min") else "mean"
            value = values[key].float().to(self.device)
            self.log(f"train/{key}", value, prog_bar=prog, batch_size=size, sync_dist=distributed, reduce_fx=reduce_fx)

    def on_train_start(self) -> None:
        self._pending = []

    # -- evaluation -------------------------------------------------------------------------------------------
    def log_generation(self, output: GenerationOutput, result: GenerationResult, split: str) -> None:
        size = len(result.texts)
        self.log(f"{split}/completion_length", result.lengths.float().mean(), batch_size=size)
        self.log(f"{split}/clipped_ratio", (~result.finished).float().mean(), batch_size=size)
