"""Pairwise preference family: DPO on (prompt, chosen, rejected) pairs with per-side token masks.

Paper: Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly a Reward Model",
arXiv:2305.18290 (NeurIPS 2023). The family is also the home of span-masked DPO (ThoughtFold, notes ``rl.md`` §4):
which tokens of each side are scored is decided by the labels alone (``-100`` = not scored).

Equation -> function:

- ``log pi(y | x) = sum_t m_t log pi(y_t | x, y_<t)`` over a side's mask -> :func:`zoo.losses.masked_sequence_logprobs`
  (both sides in one forward: :meth:`PreferenceModule.side_logprobs`)
- (DPO eq. 7) ``L = -mean_i log sigmoid(beta [(c_i - rc_i) - (r_i - rr_i)])``   -> :func:`zoo.rl.masked_dpo_loss`
- implicit reward ``r(x, y) = beta (log pi(y|x) - log pi_ref(y|x))`` (paper §5)  -> :meth:`PreferenceModule.pair_terms`
- frozen reference ``pi_ref``: the initial policy or a given export/checkpoint   -> :meth:`ZooModule.frozen_reference`
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric

from zoo.backbones.base import Backbone
from zoo.errors import ConfigError
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooModule
from zoo.quant.base import Quantizer
from zoo.rl.losses import masked_dpo_loss, pair_side_logprobs

SIDES = ("chosen", "rejected")
PAIR_METRICS = ("loss", "reward_accuracy", "reward_margin", "reward_chosen", "reward_rejected")


class PreferenceModule(ZooModule):
    """DPO: raise the policy's log-ratio to a frozen reference on the chosen side over the rejected side.

    Batch (``zoo.datamodules.PreferenceDataModule``): ``{side}_input_ids``, ``{side}_attention_mask`` and
    ``{side}_labels`` (``[B, T_side]``, right-padded) for ``side`` in ``chosen``/``rejected``; a side's loss covers the
    positions whose label is not ``-100`` (the completion by default; any span for span-masked pairs).

    Loss: :func:`zoo.rl.masked_dpo_loss` over the pairs of the batch. Logged under ``train/``, ``val/``, ``test/``:
    ``loss``, ``reward_accuracy`` (fraction of pairs whose implicit reward prefers the chosen side),
    ``reward_margin`` (mean chosen minus rejected reward), ``reward_chosen``, ``reward_rejected`` (implicit rewards
    ``beta * (log pi - log pi_ref)``); ``train/logp_chosen``, ``train/logp_rejected`` (policy log-probabilities).

    Args:
        backbone, quantizer, optimizer, scheduler, generation: as :class:`~zoo.modules.base.ZooModule`.
        beta: DPO temperature (paper: 0.1; 0.5 for TL;DR summarization).
        reference: ``None`` = the initial policy (the usual DPO reference: the SFT model), or an export directory /
            zoo ``.ckpt`` to use as ``pi_ref``.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        beta: float = 0.1,
        reference: str | None = None,
    ) -> None:
        super().__init__(backbone, quantizer, optimizer, scheduler, generation)
        if not beta > 0:
            raise ConfigError(f"module.beta must be > 0 (DPO temperature), got {beta}")
        self.beta = float(beta)
        self.reference = reference
        self.ref_model: torch.nn.Module | None = None
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler"])
        self.metrics = torch.nn.ModuleDict(
            {f"{split}_{name}": MeanMetric() for split in ("val", "test") for name in PAIR_METRICS}
        )

    # -- model ------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        if self.ref_model is None:
            reference = self.frozen_reference(self.reference)
            policy_vocab = self.model.get_input_embeddings().num_embeddings
            if reference.get_input_embeddings().num_embeddings != policy_vocab:
                raise ConfigError(
                    f"module.reference={self.reference}: its vocabulary "
                    f"({reference.get_input_embeddings().num_embeddings}) differs from the policy's ({policy_vocab})"
                )
            object.__setattr__(self, "ref_model", reference)  # not a submodule: never saved, never optimized

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # -- loss -------------------------------------------------------------------------------------------------
    def side_logprobs(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen [B], rejected [B])``: each side's log-probability over its mask, both sides in one forward
        (:func:`zoo.rl.losses.pair_side_logprobs`)."""
        return pair_side_logprobs(model, batch, self.tokenizer.pad_token_id)

    def pair_terms(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The DPO loss of the batch and its diagnostics (implicit rewards, accuracy, margin, log-probs)."""
        chosen, rejected = self.side_logprobs(self.model, batch)
        if self.ref_model.device != chosen.device:
            self.ref_model.to(chosen.device)
        with torch.no_grad():
            ref_chosen, ref_rejected = self.side_logprobs(self.ref_model, batch)
        loss = masked_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, self.beta)
        reward_chosen = self.beta * (chosen - ref_chosen).detach()
        reward_rejected = self.beta * (rejected - ref_rejected).detach()
        return {
            "loss": loss,
            "reward_chosen": reward_chosen,
            "reward_rejected": reward_rejected,
            "reward_margin": reward_chosen - reward_rejected,
            "reward_accuracy": (reward_chosen > reward_rejected).float(),
            "logp_chosen": chosen.detach(),
            "logp_rejected": rejected.detach(),
        }

    # -- steps ------------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        terms = self.pair_terms(batch)
        self.check_finite(terms["loss"])
        size = batch["chosen_input_ids"].shape[0]
        for name, value in terms.items():
            prog = name in ("loss", "reward_accuracy")
            self.log(f"train/{name}", value.mean(), prog_bar=prog, batch_size=size)
        return terms["loss"]

    def _eval_step(self, batch: dict[str, Any], split: str) -> dict[str, torch.Tensor]:
        terms = self.pair_terms(batch)
        size = batch["chosen_input_ids"].shape[0]
        for name in PAIR_METRICS:
            metric = self.metrics[f"{split}_{name}"]
            if terms[name].dim() == 0:  # the batch's mean loss, weighted by its number of pairs
                metric.update(terms[name], weight=size)
            else:  # one value per pair
                metric.update(terms[name])
            self.log(f"{split}/{name}", metric, prog_bar=split == "val" and name == "reward_accuracy", batch_size=size)
        return terms

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, torch.Tensor]:
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, torch.Tensor]:
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """Score pairs: per pair the implicit rewards of both sides and whether the chosen side wins."""
        terms = self.pair_terms(batch)
        return {
            "meta": {
                "prompts": batch["prompts"],
                "reward_chosen": terms["reward_chosen"].tolist(),
                "reward_rejected": terms["reward_rejected"].tolist(),
                "prefers_chosen": terms["reward_accuracy"].bool().tolist(),
            }
        }
