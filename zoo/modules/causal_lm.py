"""Causal-LM family (SFT, weighted SFT, masked SFT): masked token loss with an explicit normalizer,
perplexity and generation-based exact match."""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from zoo.backbones.base import Backbone
from zoo.data.tasks import EXACT_ANSWER, Verifier
from zoo.generation.decoders import Decoder
from zoo.losses import IGNORE_INDEX, masked_nll
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.generating import EVAL_SPLITS, GeneratingModule
from zoo.quant.base import Quantizer

# The shared completion format's verifier (kept under its former name; configs pass the task: verifier: ${task}).
exact_answer_match = EXACT_ANSWER


class CausalLMModule(GeneratingModule):
    """Supervised fine-tuning of a causal LM.

    Loss: ``sum_i w_i sum_t m_it (-log p_it) / N`` where ``m`` masks prompt and padding (labels ``-100``),
    ``w_i`` are per-sequence weights (``loss_weight`` in the batch; 1 by default) and ``N`` is the
    normalizer: ``tokens`` (loss tokens in the batch) or ``sequences`` (batch size).

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
        if normalizer not in ("tokens", "sequences"):
            raise ValueError(f"module.normalizer must be 'tokens' or 'sequences', got {normalizer!r}")
        self.normalizer = normalizer
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler", "verifier", "decoder"])
        self.metrics = torch.nn.ModuleDict(
            {
                f"{split}_{name}": metric
                for split in EVAL_SPLITS
                for name, metric in (("perplexity", Perplexity(ignore_index=IGNORE_INDEX)), ("loss", MeanMetric()))
            }
        )

    def loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, logits, num_tokens)`` of a batch."""
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        normalizer = None if self.normalizer == "tokens" else float(batch["input_ids"].shape[0])
        loss, num_tokens = masked_nll(logits, batch["labels"], batch.get("loss_weight"), normalizer)
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
