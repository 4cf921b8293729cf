"""Causal-LM family (SFT, weighted SFT, masked SFT): masked token loss with an explicit normalizer,
perplexity and generation-based exact match."""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from zoo.answers import EXACT_ANSWER
from zoo.backbones.base import Backbone
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder
from zoo.losses import IGNORE_INDEX, NLL_NORMALIZERS, SAMPLE_REDUCTIONS, masked_nll, nll_normalizer
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.generating import EVAL_SPLITS, GeneratingModule
from zoo.protocols import Verifier
from zoo.quant.base import Quantizer

# The shared completion format's verifier (kept under its former name; configs pass the task: verifier: ${task}).
exact_answer_match = EXACT_ANSWER


class CausalLMModule(GeneratingModule):
    """Supervised fine-tuning of a causal LM, plain, weighted (per-sample ``loss_weight``) or masked.

    Loss of a batch: ``L = sum_i w_i l_i / N``, computed by :func:`zoo.losses.masked_nll`, where

    - ``m_it`` marks the positions that carry loss: every label that is not ``-100``. Label masks are the *only*
      way to choose which tokens are trained: plain SFT masks prompt and padding, DRIFT keeps only the last
      assistant turn, N-MARS masked SFT masks the spans it does not train; the datamodule writes the labels;
    - ``w_i`` is the per-sample weight, the batch's ``loss_weight`` column (``[B]``; the datamodule reads it from
      the rows, see ``datamodule.weight_column``; absent = 1);
    - ``l_i`` depends on ``sample_reduction``: ``token_sum`` gives ``sum_t m_it (-log p_it)``, ``token_mean``
      gives ``sum_t m_it (-log p_it) / n_i`` with ``n_i = sum_t m_it`` (DRIFT: mean token CE of each sample);
    - ``N`` depends on ``normalizer``: ``tokens`` gives ``sum_i n_i`` (labelled tokens in the batch; the
      default, with ``token_sum`` the usual token-mean SFT loss), ``sequences`` gives ``B`` (the batch size:
      ``sum_i w_i l_i / B``, DRIFT's default ``mean(w * l)`` with ``token_mean``), ``self_normalised`` gives
      ``sum_i w_i`` (the weighted mean ``sum_i w_i l_i / sum_i w_i``, DRIFT's ``BATCH_WEIGHT_NORMAL``).

    With every ``w_i = 1`` the loss is bit-identical to the unweighted loss of the same modes.

    Validation/test: loss, perplexity (torchmetrics) and, with ``generate_on_eval``, generation through the
    decoder scored by ``verifier(completion, answer)`` into ``{split}/exact_match``
    (:class:`~zoo.modules.generating.GeneratingModule`). ``validation_step``, ``test_step`` and ``predict_step``
    return a :class:`~zoo.protocols.GenerationOutput`.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        normalizer: str = "tokens",
        sample_reduction: str = "token_sum",
        generate_on_eval: bool = True,
        verifier: Verifier | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        super().__init__(
            backbone,
            quantizer,
            optimizer,
            scheduler,
            generation,
            decoder=decoder,
            verifier=verifier,
            generate_on_eval=generate_on_eval,
        )
        if normalizer not in NLL_NORMALIZERS:
            raise ConfigError(f"module.normalizer must be one of {NLL_NORMALIZERS}, got {normalizer!r}")
        if sample_reduction not in SAMPLE_REDUCTIONS:
            raise ConfigError(f"module.sample_reduction must be one of {SAMPLE_REDUCTIONS}, got {sample_reduction!r}")
        self.normalizer = normalizer
        self.sample_reduction = sample_reduction
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler", "verifier", "decoder"])
        self.metrics = torch.nn.ModuleDict(
            {
                f"{split}_{name}": metric
                for split in EVAL_SPLITS
                for name, metric in (("perplexity", Perplexity(ignore_index=IGNORE_INDEX)), ("loss", MeanMetric()))
            }
        )

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, logits, num_tokens)`` of a batch (the loss of the class docstring)."""
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        weights = batch.get("loss_weight")
        normalizer = nll_normalizer(self.normalizer, batch["input_ids"].shape[0], weights)
        loss, num_tokens = masked_nll(
            logits, batch["labels"], weights, normalizer, sample_reduction=self.sample_reduction
        )
        return loss, logits, num_tokens

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss, _, num_tokens = self.loss(batch)
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self.log("train/tokens", num_tokens.float(), reduce_fx="sum", batch_size=1)
        return loss

    def eval_losses(self, batch: dict[str, Any], split: str) -> None:
        loss, logits, _ = self.loss(batch)
        size = batch["input_ids"].shape[0]
        self.metrics[f"{split}_loss"].update(loss)
        self.metrics[f"{split}_perplexity"].update(logits[:, :-1].float(), batch["labels"][:, 1:])
        self.log(f"{split}/loss", self.metrics[f"{split}_loss"], prog_bar=split == "val", batch_size=size)
        self.log(f"{split}/perplexity", self.metrics[f"{split}_perplexity"], batch_size=size)


__all__ = ["CausalLMModule", "exact_answer_match"]
