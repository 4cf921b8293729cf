"""Causal-LM family (SFT, weighted SFT, masked SFT): masked token loss with an explicit normalizer,
perplexity and generation-based exact match."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.text import Perplexity

from zoo.backbones.base import Backbone
from zoo.data.tasks import extract_answer
from zoo.losses import IGNORE_INDEX, masked_nll
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooModule
from zoo.protocols import GenerationOutput
from zoo.quant.base import Quantizer

Verifier = Callable[[str, str], bool]


def exact_answer_match(completion: str, answer: str) -> bool:
    """The default verifier: extracted answer (text after ``</think>``) equals the reference exactly."""
    predicted = extract_answer(completion)
    return predicted is not None and predicted == str(answer).strip()


class CausalLMModule(ZooModule):
    """Supervised fine-tuning of a causal LM.

    Loss: ``sum_i w_i sum_t m_it (-log p_it) / N`` where ``m`` masks prompt and padding (labels ``-100``),
    ``w_i`` are per-sequence weights (``loss_weight`` in the batch; 1 by default) and ``N`` is the
    normalizer: ``tokens`` (loss tokens in the batch) or ``sequences`` (batch size).

    Validation/test: loss, perplexity (torchmetrics) and, with ``generate_on_eval``, greedy generation
    scored by ``verifier(completion, answer)`` into ``{split}/exact_match``. ``validation_step``,
    ``test_step`` and ``predict_step`` return a :class:`~zoo.protocols.GenerationOutput`.
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
        verifier: Verifier = exact_answer_match,
    ) -> None:
        super().__init__(backbone, quantizer, optimizer, scheduler, generation)
        if normalizer not in ("tokens", "sequences"):
            raise ValueError(f"module.normalizer must be 'tokens' or 'sequences', got {normalizer!r}")
        self.normalizer = normalizer
        self.generate_on_eval = generate_on_eval
        self.verifier = verifier
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler", "verifier"])
        self.metrics = torch.nn.ModuleDict(
            {
                f"{split}_{name}": metric
                for split in ("val", "test")
                for name, metric in (
                    ("perplexity", Perplexity(ignore_index=IGNORE_INDEX)),
                    ("exact_match", MeanMetric()),
                    ("loss", MeanMetric()),
                )
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

    def _eval_step(self, batch: dict[str, Any], split: str) -> GenerationOutput:
        loss, logits, _ = self.loss(batch)
        size = batch["input_ids"].shape[0]
        self.metrics[f"{split}_loss"].update(loss)
        self.metrics[f"{split}_perplexity"].update(logits[:, :-1].float(), batch["labels"][:, 1:])
        output = self._generate_output(batch) if self.generate_on_eval else GenerationOutput(meta={})
        if self.generate_on_eval:
            self.metrics[f"{split}_exact_match"].update(torch.tensor(output["meta"]["correct"], dtype=torch.float))
            self.log(f"{split}/exact_match", self.metrics[f"{split}_exact_match"], prog_bar=True, batch_size=size)
        self.log(f"{split}/loss", self.metrics[f"{split}_loss"], prog_bar=split == "val", batch_size=size)
        self.log(f"{split}/perplexity", self.metrics[f"{split}_perplexity"], batch_size=size)
        return output

    def _generate_output(self, batch: dict[str, Any]) -> GenerationOutput:
        result = self.generate(batch["prompt_ids"], batch["prompt_attention_mask"])
        correct = [self.verifier(t, a) for t, a in zip(result.texts, batch["answers"])]
        return GenerationOutput(
            prompt_ids=result.prompt_ids,
            completion_ids=result.completion_ids,
            texts=result.texts,
            logprobs=result.logprobs,
            meta={"prompts": batch["prompts"], "answers": batch["answers"], "correct": correct},
        )

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> GenerationOutput:
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> GenerationOutput:
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> GenerationOutput:
        return self._generate_output(batch)
