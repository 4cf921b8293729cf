"""ThoughtFold as the GRPO family's auxiliary loss: correct rollouts pruned introspectively into span-masked DPO pairs.

Paper: "ThoughtFold: Folding Reasoning Chains via Introspective Preference Learning", arXiv:2606.03503 (ICML 2026).
The search, pair masks and importance scores are cores in :mod:`zoo.rl.thoughtfold`; this adapter feeds them the
module's policy (validation sampling through ``module.decoder``, importance forwards) and turns the pairs into the
auxiliary items of :class:`zoo.modules.GRPOModule` (``module/grpo/aux=thoughtfold``).

Equation -> function:

- per-step pipeline (outcome-correct rollouts -> phase 1 -> phase 2 -> pairs) -> :meth:`ThoughtFoldLoss.prepare`
- validation of a candidate (``repeat`` answers after ``<think>candidate</think>``, budget = original length)
  -> :meth:`ThoughtFoldLoss.validate`
- masked DPO of the pairs, ``-log sigmoid(beta_D [(log pi - log pi_ref)(c) - (log pi - log pi_ref)(r)])`` summed
  over the step's pairs / their number -> :meth:`ThoughtFoldLoss.loss` (:func:`zoo.rl.losses.masked_dpo_loss`)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import torch

from zoo.errors import ConfigError
from zoo.losses import IGNORE_INDEX
from zoo.rl.auxiliary import AuxiliaryLoss
from zoo.rl.losses import masked_dpo_loss, pair_side_logprobs
from zoo.rl.thoughtfold import (
    FoldTarget,
    PreferencePair,
    ThoughtFolder,
    Verdict,
    answer_is_valid,
    attention_importance,
    completion_text,
    encode_pair,
    join_steps,
    leave_one_out_importance,
    parse_reasoning,
    passes,
    require_eager_attention,
    split_steps,
)
from zoo.tokens import THINK_CLOSE, THINK_OPEN

IMPORTANCE = ("leave_one_out", "attention")
REFERENCES = ("rollout", "frozen")


@dataclass
class PairItems:
    """The step's DPO pairs as padded token rows (``{side}_input_ids`` / ``_attention_mask`` / ``_labels``) and
    their reference log-probabilities ``ref_chosen``, ``ref_rejected`` ``[size]``."""

    size: int
    batch: dict[str, torch.Tensor]
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor
    normalizer: float | None = None  # None: size; under data parallelism set by the module (all-reduced)


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


class ThoughtFoldLoss(AuxiliaryLoss):
    """ThoughtFold's span-masked DPO pairs as an auxiliary loss of GRPO.

    Args:
        weight: DPO-vs-GRPO loss weight ([assumed] 1; the loss worker is not released).
        beta: DPO temperature ``beta_D`` ([assumed] 0.1, the usual DPO value; notes' demo setting).
        reference: ``frozen`` = a frozen copy of the initial policy (the SFT/base policy: standard DPO; [assumed]
            default, the paper and the released code do not fix it), ``rollout`` = the policy at rollout time, before
            the step's updates (with one update per step the policy equals the reference at every update: the loss is
            exactly ``log 2`` and its gradient a fixed push, whatever the policy has learnt).
        importance: ``leave_one_out`` (default: the answer's log-probability drop without each step; any attention
            backend) or ``attention`` (attention from the answer, the released scoring; eager attention only).
        repeat: validation answers sampled per candidate (released: 4).
        threshold: accept a candidate when its correct rate is at least this (released: 0.7).
        rate_over: the correct rate's denominator, ``all`` samples ([assumed]) or the ``valid`` ones.
        use_overjump: also train the over-simplified-failure pairs (off, as in the released trainer, which skips
            them; the README says failures are used as rejected samples). They are built and counted either way.
        max_rollouts: fold at most this many correct rollouts per step (drawn at random; ``None`` = all;
            [assumed] the pair sampling rate is not released).
        validation_temperature: sampling temperature of validation answers (``None`` = the rollout's).
        folder: the search and pair settings (:class:`zoo.rl.thoughtfold.ThoughtFolder`).
    """

    def __init__(
        self,
        weight: float = 1.0,
        beta: float = 0.1,
        reference: str = "frozen",
        importance: str = "leave_one_out",
        repeat: int = 4,
        threshold: float = 0.7,
        rate_over: str = "all",
        use_overjump: bool = False,
        max_rollouts: int | None = None,
        validation_temperature: float | None = None,
        folder: ThoughtFolder | None = None,
    ) -> None:
        super().__init__(weight)
        if not beta > 0:
            raise ConfigError(f"module.aux.beta must be > 0 (DPO temperature), got {beta}")
        if reference not in REFERENCES:
            raise ConfigError(f"module.aux.reference must be one of {REFERENCES}, got {reference!r}")
        if importance not in IMPORTANCE:
            raise ConfigError(f"module.aux.importance must be one of {IMPORTANCE}, got {importance!r}")
        if repeat < 1:
            raise ConfigError(f"module.aux.repeat must be >= 1, got {repeat}")
        if not 0 < threshold <= 1:
            raise ConfigError(f"module.aux.threshold must be in (0, 1], got {threshold}")
        if rate_over not in ("all", "valid"):
            raise ConfigError(f"module.aux.rate_over must be 'all' or 'valid', got {rate_over!r}")
        if max_rollouts is not None and max_rollouts < 1:
            raise ConfigError(f"module.aux.max_rollouts must be >= 1 or null, got {max_rollouts}")
        self.beta = float(beta)
        self.reference = reference
        self.importance = importance
        self.repeat = int(repeat)
        self.threshold = float(threshold)
        self.rate_over = rate_over
        self.use_overjump = bool(use_overjump)
        self.max_rollouts = max_rollouts
        self.validation_temperature = validation_temperature
        self.folder = folder or ThoughtFolder()
        self.ref_model: torch.nn.Module | None = None
        self.last_pairs: list[PreferencePair] = []
        self._metrics: dict[str, float] = {}

    # -- seam -------------------------------------------------------------------------------------------------
    def setup(self, module: Any) -> None:
        if self.importance == "attention":
            require_eager_attention(module.model)
        if self.reference == "frozen" and self.ref_model is None:
            self.ref_model = module.frozen_reference()

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def encode(self, module: Any, text: str) -> list[int]:
        return module.tokenizer(text, add_special_tokens=False)["input_ids"]

    def targets(self, module: Any, rollout: dict[str, Any]) -> tuple[list[FoldTarget], dict[str, float]]:
        """The outcome-correct rollouts to fold; rollouts without a reasoning block or with an unparsable answer are
        skipped and counted."""
        counts = {"skipped_no_reasoning": 0.0, "skipped_unparsable_answer": 0.0}
        targets = []
        for row, (text, correct) in enumerate(zip(rollout["texts"], rollout.get("correct") or [])):
            if not correct:
                continue
            parsed = parse_reasoning(text)
            if isinstance(parsed, str):
                counts[f"skipped_{parsed}"] += 1
                continue
            targets.append(FoldTarget(row, split_steps(parsed.body, self.folder.delimiter), parsed.answer))
        if self.max_rollouts is not None and len(targets) > self.max_rollouts:
            rng = random.Random(int(module.global_step))
            targets = sorted(rng.sample(targets, self.max_rollouts), key=lambda t: t.row)
        return targets, counts

    @torch.no_grad()
    def prepare(self, module: Any, rollout: dict[str, Any]) -> PairItems | None:
        """Fold the step's correct rollouts with the current policy and build the DPO items (no gradient)."""
        self.last_pairs = []
        if rollout.get("correct") is None or rollout.get("answers") is None:
            raise ConfigError(
                "module/grpo/aux=thoughtfold needs reference answers in the prompts (an 'answer' column) to verify "
                "rollouts and prunings"
            )
        result = rollout["result"]
        prompt_ids = [
            row[mask.bool()].tolist() for row, mask in zip(result.prompt_ids.cpu(), rollout["prompt_mask"].cpu())
        ]
        lengths = result.lengths.tolist()
        targets, counts = self.targets(module, rollout)
        cost = {"validation_samples": 0.0, "validation_tokens": 0.0, "importance_forwards": 0.0}

        def validate(queries: list[tuple[int, list[int]]]) -> list[Verdict]:
            cands = [(targets[t], [targets[t].steps[j] for j in kept]) for t, kept in queries]
            verdicts = self.validate(module, cands, prompt_ids, lengths, rollout["answers"])
            cost["validation_samples"] += len(cands) * self.repeat
            cost["validation_tokens"] += self._last_validation_tokens
            return verdicts

        def importance(t: int, steps: list[str], answer: str) -> list[float]:
            cost["importance_forwards"] += 1
            target = targets[t]

            def encode(text: str) -> list[int]:
                return self.encode(module, text)

            if self.importance == "attention":
                return attention_importance(
                    module.model, prompt_ids[target.row], steps, answer, encode, self.folder.delimiter
                )
            pad = module.tokenizer.pad_token_id
            return leave_one_out_importance(
                module.model, prompt_ids[target.row], steps, answer, encode, pad, self.folder.delimiter
            )

        pairs, stats = self.folder.search(targets, validate, importance) if targets else ([], {})
        used = [p for p in pairs if self.use_overjump or not p.kind.startswith("overjump")]
        self.last_pairs = used
        folded = max(len(targets), 1)
        self._metrics = {
            "tf_rollouts_folded": float(len(targets)),
            **{f"tf_{k}": v for k, v in counts.items()},
            "tf_candidates": stats.get("candidates", 0.0),
            "tf_pairs_built": float(len(pairs)),
            "tf_pairs_accepted": float(len(used)),
            "tf_tail_pruned_steps": stats.get("tail_pruned_steps", 0.0) / folded,
            "tf_fold_pruned_steps": stats.get("fold_pruned_steps", 0.0) / folded,
            **{f"tf_{k}": v for k, v in cost.items()},
        }
        if not used:
            return None
        return self.items(module, used, prompt_ids)

    def validate(
        self,
        module: Any,
        candidates: list[tuple[FoldTarget, list[str]]],
        prompt_ids: list[list[int]],
        lengths: list[int],
        answers: list[Any],
    ) -> list[Verdict]:
        """Sample ``repeat`` answers after ``prompt <think>candidate</think>`` for every candidate in one batch; an
        answer is valid when it ends within the original completion's remaining length and does not re-open the
        reasoning block; a candidate passes when its correct rate reaches ``threshold``."""
        rows, budgets = [], []
        for target, steps in candidates:
            prefix = self.encode(module, f"{THINK_OPEN}{join_steps(steps, self.folder.delimiter)}{THINK_CLOSE}")
            budgets.append(max(lengths[target.row] - len(prefix), 1))
            rows += [prompt_ids[target.row] + prefix] * self.repeat
        pad = module.tokenizer.pad_token_id
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=module.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
        params = replace(module.sampling, max_new_tokens=max(budgets), do_sample=True)
        params = params.with_temperature(self.validation_temperature)
        seed = int(torch.initial_seed()) % (2**31) + 7919 * int(module.global_step) + len(rows)
        generator = torch.Generator(device=ids.device).manual_seed(seed)
        result = module.generate(ids, mask.to(module.device), params, generator)
        self._last_validation_tokens = float(result.lengths.sum())
        verdicts = []
        for c, (target, steps) in enumerate(candidates):
            block = range(c * self.repeat, (c + 1) * self.repeat)
            texts = [result.texts[i] for i in block]
            valid = [
                answer_is_valid(result.texts[i], bool(result.finished[i])) and int(result.lengths[i]) <= budgets[c]
                for i in block
            ]
            correct = [
                bool(module.verifier(completion_text(steps, text, self.folder.delimiter), answers[target.row]))
                for text in texts
            ]
            good = [t for t, v, k in zip(texts, valid, correct) if v and k]
            wrong = [t for t, v, k in zip(texts, valid, correct) if v and not k and t.strip()]
            verdicts.append(
                Verdict(
                    passes(correct, valid, self.threshold, self.rate_over),
                    good[0] if good else None,
                    wrong[0] if wrong else None,
                )
            )
        return verdicts

    def items(self, module: Any, pairs: list[PreferencePair], prompt_ids: list[list[int]]) -> PairItems:
        """Padded token rows of the pairs and their reference log-probabilities (computed now, before any update)."""
        encoded = [encode_pair(p, prompt_ids[p.row], lambda text: self.encode(module, text)) for p in pairs]
        pad = module.tokenizer.pad_token_id
        batch: dict[str, torch.Tensor] = {}
        for side in ("chosen", "rejected"):
            ids = [e[f"{side}_input_ids"] for e in encoded]
            batch[f"{side}_input_ids"] = _pad(ids, pad).to(module.device)
            batch[f"{side}_attention_mask"] = _pad([[1] * len(r) for r in ids], 0).to(module.device)
            batch[f"{side}_labels"] = _pad([e[f"{side}_labels"] for e in encoded], IGNORE_INDEX).to(module.device)
        reference = self.ref_model if self.reference == "frozen" else module.model
        if reference.device != module.device:
            reference.to(module.device)
        chosen, rejected = [], []
        for chunk in module.micro_batches(len(pairs)):
            c, r = pair_side_logprobs(reference, {k: v[chunk] for k, v in batch.items()}, pad)
            chosen.append(c)
            rejected.append(r)
        return PairItems(len(pairs), batch, torch.cat(chosen).detach(), torch.cat(rejected).detach())

    def loss(self, module: Any, items: PairItems, rows: slice) -> torch.Tensor:
        """Masked DPO of the pairs ``rows`` divided by the step's number of pairs (micro-batch invariant; under data
        parallelism the all-reduced number over the ranks, ``items.normalizer``)."""
        chosen, rejected = pair_side_logprobs(
            module.model, {k: v[rows] for k, v in items.batch.items()}, module.tokenizer.pad_token_id
        )
        return masked_dpo_loss(
            chosen,
            rejected,
            items.ref_chosen[rows],
            items.ref_rejected[rows],
            self.beta,
            normalizer=items.size if items.normalizer is None else items.normalizer,
        )


__all__ = ["PairItems", "ThoughtFoldLoss"]
