"""The generating family base: what every module that writes text in validation/test/predict shares.

One constructor piece and one evaluation step instead of a copy per family (SFT, GRPO, structure LM, VaLR, ...):

* the **decoder seam** (``module/decoder=sample|stepwise|...``; :mod:`zoo.generation.decoders`) through which
  :meth:`GeneratingModule.generate` and every evaluation generation run;
* the **verifier** (the task's, ``verifier: ${task}`` in the configs; :class:`zoo.answers.AnswerVerifier`);
* the **evaluation sampling** (``eval_generation``; the ``generation`` settings when not given);
* the evaluation step: family losses -> generate -> verify -> ``{split}/exact_match`` -> a
  :class:`~zoo.protocols.GenerationOutput` (the dict callbacks rely on; its ``meta`` holds the decoder's per-row
  statistics, :meth:`~zoo.protocols.GenerationResult.row_meta`: ``finished``, ``completion_tokens``, and e.g.
  DTS's branch events); ``predict_step`` generates and verifies.

A family customises it through four small hooks: :meth:`~GeneratingModule.eval_losses` (its evaluation losses),
:meth:`~GeneratingModule.generate_batch` (how a batch is decoded, plus per-row meta),
:meth:`~GeneratingModule.prompts_and_answers` (where the batch keeps them) and
:meth:`~GeneratingModule.log_generation` (extra per-batch metrics).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric

from zoo.answers import EXACT_ANSWER
from zoo.backbones.base import Backbone
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder, SampleDecoder
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooModule
from zoo.protocols import GenerationOutput, GenerationResult, SamplingParams, Verifier
from zoo.quant.base import Quantizer

EVAL_SPLITS = ("val", "test")


class GeneratingModule(ZooModule):
    """Base of the generating family modules (not a method by itself).

    Args:
        backbone, quantizer, optimizer, scheduler: as :class:`~zoo.modules.base.ZooModule`.
        generation: default :class:`~zoo.generation.SamplingParams` fields of :meth:`generate`.
        decoder: the decoder (``module/decoder=<name>``); ``None`` = :class:`~zoo.generation.SampleDecoder`.
        verifier: ``(completion, answer) -> bool``, normally the task (``verifier: ${task}``); ``None`` = the
            shared completion format's exact verifier (:data:`zoo.answers.EXACT_ANSWER`).
        eval_generation: :class:`~zoo.generation.SamplingParams` fields of evaluation generation; ``None`` = the
            ``generation`` settings.
        generate_on_eval: generate and verify in validation/test (``predict`` always generates).
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        *,
        decoder: Decoder | None = None,
        verifier: Verifier | None = None,
        eval_generation: dict[str, Any] | None = None,
        generate_on_eval: bool = True,
    ) -> None:
        super().__init__(backbone, quantizer, optimizer, scheduler, generation)
        self.decoder: Decoder = decoder if decoder is not None else SampleDecoder()
        self.verifier: Verifier = verifier if verifier is not None else EXACT_ANSWER
        self.eval_sampling = SamplingParams(**eval_generation) if eval_generation is not None else self.sampling
        self.generate_on_eval = generate_on_eval
        self.exact_match = nn.ModuleDict({split: MeanMetric() for split in EVAL_SPLITS})

    # -- generation protocol ----------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: torch.Tensor | None,
        prompt_attention_mask: torch.Tensor | None = None,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        **model_inputs: Any,
    ) -> GenerationResult:
        """Generation protocol: decode left-padded prompts (or ``inputs_embeds``) with :attr:`decoder`."""
        self.configure_model()
        return self.decoder(
            self.model,
            self.tokenizer,
            prompt_ids,
            prompt_attention_mask,
            inputs_embeds=inputs_embeds,
            params=params or self.sampling,
            generator=generator,
            **model_inputs,
        )

    # -- checks before the run ---------------------------------------------------------------------------------
    def generation_splits(self, datamodule: Any, stage: str) -> list[str]:
        """The splits of ``datamodule`` this module generates from in ``stage`` (evaluation generation)."""
        if stage == "predict":
            return [getattr(datamodule, "predict_split", "test")]
        if not self.generate_on_eval:
            return []
        return {"fit": ["val"], "validate": ["val"], "test": ["test"]}.get(stage, [])

    def training_generation(self, stage: str) -> list[tuple[str, int]]:
        """``(split, max_new_tokens)`` of what the module generates from while it trains in ``stage`` (rollouts;
        default: nothing)."""
        return []

    def check_data(self, datamodule: Any, stage: str) -> None:
        """Before the run (``train.py`` calls it once the datamodule is set up, before the run directory is written):
        the longest prompt of every split the stage generates from, plus the budget it generates with
        (:attr:`eval_sampling`'s ``max_new_tokens`` for evaluation, :meth:`training_generation`'s for rollouts) and
        the tokens the decoder declares it injects, must fit the backbone's context; otherwise the decoder's own check
        (:func:`zoo.generation.sampling.check_context`) would stop the run at its first generation, after the training
        steps before it. Datamodules without encoded ``prompt_ids`` items are not checked here."""
        context = self.backbone.context_length() if self.backbone is not None else None
        if context is None or not hasattr(datamodule, "dataset"):
            return
        injected = getattr(self.decoder, "max_injected_tokens", lambda: 0)()
        planned = [(split, self.eval_sampling.max_new_tokens) for split in self.generation_splits(datamodule, stage)]
        for split, budget in [*planned, *self.training_generation(stage)]:
            lengths = [len(item["prompt_ids"]) for item in datamodule.dataset(split) if "prompt_ids" in item]
            longest = max(lengths, default=0)
            if lengths and longest + budget + injected > context:
                over = sum(n + budget + injected > context for n in lengths)
                extra = f" + up to {injected} tokens the decoder injects" if injected else ""
                raise ConfigError(
                    f"{split}: {over} of {len(lengths)} prompts do not fit the backbone's context of {context} "
                    f"positions with max_new_tokens {budget}{extra} (the longest prompt has {longest} tokens); this "
                    f"would stop the run at its first generation. Lower module.generation.max_new_tokens (or the "
                    f"module's eval_generation) to at most {context - longest - injected}, or shorten the prompts"
                )

    # -- family hooks -----------------------------------------------------------------------------------------
    def eval_losses(self, batch: dict[str, Any], split: str) -> None:
        """Compute and log the family's evaluation losses of a batch (default: none)."""

    def generate_batch(self, batch: dict[str, Any]) -> tuple[GenerationResult, dict[str, list[Any]]]:
        """Decode an evaluation batch with :attr:`eval_sampling`; returns the result and extra per-row meta."""
        return self.generate(batch["prompt_ids"], batch["prompt_attention_mask"], self.eval_sampling), {}

    def prompts_and_answers(self, batch: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
        """Prompt texts and reference answers (``None`` when the batch has none) of a batch."""
        answers = batch.get("answers")
        if answers is None:
            answers = batch.get("columns", {}).get("answer")
        return list(batch["prompts"]), (list(answers) if answers is not None else None)

    def log_generation(self, output: GenerationOutput, result: GenerationResult, split: str) -> None:
        """Log extra metrics of an evaluated batch's generations (default: none)."""

    # -- steps ------------------------------------------------------------------------------------------------
    def generate_output(self, batch: dict[str, Any]) -> tuple[GenerationOutput, GenerationResult]:
        """Generate, verify against the answers, and pack the generation protocol dict."""
        result, extra = self.generate_batch(batch)
        prompts, answers = self.prompts_and_answers(batch)
        correct = [bool(self.verifier(t, a)) for t, a in zip(result.texts, answers)] if answers is not None else []
        output = GenerationOutput(
            prompt_ids=result.prompt_ids,
            completion_ids=result.completion_ids,
            texts=result.texts,
            logprobs=result.logprobs,
            meta={"prompts": prompts, "answers": answers or [], "correct": correct, **result.row_meta(), **extra},
        )
        return output, result

    def eval_step(self, batch: dict[str, Any], split: str) -> GenerationOutput:
        """Validation/test: family losses, then (``generate_on_eval``) generation, verification and
        ``{split}/exact_match``."""
        self.eval_losses(batch, split)
        if not self.generate_on_eval:
            return GenerationOutput(meta={})
        output, result = self.generate_output(batch)
        correct = output["meta"]["correct"]
        if correct:
            metric = self.exact_match[split]
            metric.update(torch.tensor(correct, dtype=torch.float, device=self.device))
            self.log(f"{split}/exact_match", metric, prog_bar=True, batch_size=len(correct))
        self.log_generation(output, result, split)
        return output

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> GenerationOutput:
        return self.eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> GenerationOutput:
        return self.eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> GenerationOutput:
        return self.generate_output(batch)[0]


__all__ = ["EVAL_SPLITS", "GeneratingModule"]
