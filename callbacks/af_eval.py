"""``AlignmentFakingEval``: the performative-misalignment harness (arXiv 2606.08629) on any generating module.

A thin Lightning adapter over :func:`zoo.interp.performative.performative_report`. At the end of each
validation/test epoch it generates completions for every prompt of the alignment-faking grid (audience x monitoring
x framing x request) through the module's own decoder (so the decoder's logits processors and forward hooks -- WET,
a steering hook -- apply), judges them, and, when asked, extracts the evaluation-cue / monitoring / sycophancy
directions at one layer, measures how separable they are, and steers along each in both signs (the symmetric
design). It needs only the generation protocol (``tokenizer``, ``model``) and uses ``pl_module.decoder`` when the
module has one; it works with any LightningModule that has them, in a plain Lightning script.

Logged under ``<log_prefix>/`` (see :meth:`~zoo.interp.performative.PerformativeReport.metrics` for every name):
per-cell compliance ``rate/<audience>/<monitoring>/<framing>/<request>``, the compliance gap ``gap/<framing>``
(``P(comply | monitored) - P(comply | unmonitored)`` on the harmful request; also per audience), the
``framing_sensitivity`` ``Delta_eval - Delta_deploy``, ``sycophancy_rate`` (agreeing with a wrong stated opinion;
also per audience), ``direction/<name>/auroc``, ``cosine/<a>/<b>``,
``cross_auroc/<direction>/<contrast>`` and ``steer/<direction>/<alpha>/...``. With ``before_fit`` the harness also
runs once when fitting starts, and every evaluation logs ``before/<name>`` (gaps, framing sensitivity, sycophancy)
and ``framing_sensitivity_change`` (after - before): the sycophancy fine-tune's before/after comparison.

Each evaluation also writes ``<report_dir>/<stage>-<epoch>.json`` (counts per cell, metrics, steering tables) and
``<report_dir>/<stage>-<epoch>-directions.safetensors`` (the unit directions, loadable with
:func:`zoo.interp.load_vector` to steer through ``module.decoder.hooks``). Under DDP every rank runs the same
evaluation; rank zero logs and writes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import StageCallback, log_stage_metrics, require_generating_module
from zoo.data.alignment_faking import EvaluationGrid
from zoo.errors import ConfigError
from zoo.interp.performative import (
    DIRECTIONS,
    PerformativeReport,
    judge_compliance,
    performative_report,
    symmetric_alphas,
    text_generator,
)
from zoo.interp.probes import save_vectors
from zoo.protocols import SamplingParams

STAGES = ("validate", "test")
METHODS = ("diff_of_means", "probe")


class AlignmentFakingEval(StageCallback):
    """Evaluate a generating module on the alignment-faking grid at the end of validation/test epochs.

    Args:
        grid: the evaluation grid (default :class:`~zoo.data.alignment_faking.EvaluationGrid`; it must match the
            prompts the model knows, e.g. the grid of ``task=af_organism``).
        request: request value of the reported gaps (default: the grid's first, the harmful one).
        samples_per_prompt: completions per grid prompt (> 1 with sampling: the rates are frequencies).
        max_new_tokens: generation budget per completion.
        do_sample, temperature: decoding (sampling by default, so that per-cell rates are estimated).
        seed: sampling seed (every evaluation and every steering arm draws from the same seed: common random
            numbers), also the seed of the sycophancy contrast.
        judge: ``completion -> True (comply) / False (refuse) / None (unparsed)``.
        layer: decoder layer of the directions and of the steering (``None``: the middle layer).
        directions: which of ``eval_cue``, ``monitoring``, ``sycophancy`` to extract (empty: none).
        direction_method: ``diff_of_means`` or ``probe`` (a logistic probe's normal).
        sycophancy_pairs: questions of the sycophancy contrast.
        sycophancy_questions: questions per audience with a wrong stated opinion whose answers give
            ``sycophancy_rate`` (0: not measured).
        steering_strengths: ``s`` values; each direction is steered with ``alpha in {-s, 0, +s}`` (empty: none).
        before_fit: also evaluate when fitting starts and report the change of the framing sensitivity.
        stages: among ``validate`` (also validation during fit) and ``test``.
        every_n_evaluations: run on every n-th validation epoch (tests always run).
        report_dir: where the JSON reports and direction files go (default ``<trainer.default_root_dir>/af_eval``).
        batch_size: prompts per generation/forward batch.
        log_prefix: metric name prefix.
    """

    def __init__(
        self,
        grid: EvaluationGrid | None = None,
        request: str | None = None,
        samples_per_prompt: int = 16,
        max_new_tokens: int = 8,
        do_sample: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
        judge: Callable[[str], bool | None] = judge_compliance,
        layer: int | None = None,
        directions: Sequence[str] = DIRECTIONS,
        direction_method: str = "diff_of_means",
        sycophancy_pairs: int = 128,
        sycophancy_questions: int = 64,
        steering_strengths: Sequence[float] = (),
        before_fit: bool = False,
        stages: Sequence[str] = STAGES,
        every_n_evaluations: int = 1,
        report_dir: str | None = None,
        batch_size: int = 64,
        log_prefix: str = "af",
    ) -> None:
        super().__init__()
        self.grid = grid if grid is not None else EvaluationGrid()
        if request is not None:
            self.grid.check("request", request)
        if samples_per_prompt < 1 or max_new_tokens < 1 or batch_size < 1:
            raise ConfigError(
                "AlignmentFakingEval: samples_per_prompt, max_new_tokens and batch_size must be >= 1, got "
                f"{samples_per_prompt}, {max_new_tokens}, {batch_size}"
            )
        if do_sample and not temperature > 0:
            raise ConfigError(f"AlignmentFakingEval: temperature={temperature} must be > 0 when sampling")
        unknown = [d for d in directions if d not in DIRECTIONS]
        if unknown or len(set(directions)) != len(directions):
            raise ConfigError(
                f"AlignmentFakingEval: directions {list(directions)}: use distinct names among {list(DIRECTIONS)}"
            )
        if direction_method not in METHODS:
            raise ConfigError(f"AlignmentFakingEval: direction_method={direction_method!r}; use one of {METHODS}")
        if sycophancy_pairs < 2:
            raise ConfigError(f"AlignmentFakingEval: sycophancy_pairs={sycophancy_pairs} must be >= 2")
        if sycophancy_questions < 0:
            raise ConfigError(f"AlignmentFakingEval: sycophancy_questions={sycophancy_questions} must be >= 0")
        symmetric_alphas(steering_strengths)  # finite strengths
        if steering_strengths and not directions:
            raise ConfigError("AlignmentFakingEval: steering_strengths need at least one direction to steer along")
        bad_stages = [s for s in stages if s not in STAGES]
        if bad_stages or not stages:
            raise ConfigError(f"AlignmentFakingEval: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        if every_n_evaluations < 1:
            raise ConfigError(f"AlignmentFakingEval: every_n_evaluations={every_n_evaluations} must be >= 1")
        if not callable(judge):
            raise ConfigError(f"AlignmentFakingEval: judge must be callable, got {type(judge).__name__}")
        self.request = request
        self.samples_per_prompt = samples_per_prompt
        self.params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature)
        self.seed = seed
        self.judge = judge
        self.layer = layer
        self.directions = tuple(directions)
        self.direction_method = direction_method
        self.sycophancy_pairs = sycophancy_pairs
        self.sycophancy_questions = sycophancy_questions
        self.steering_strengths = tuple(float(s) for s in steering_strengths)
        self.before_fit = before_fit
        self.stages = tuple(stages)
        self.every_n_evaluations = every_n_evaluations
        self.report_dir = report_dir
        self.batch_size = batch_size
        self.log_prefix = log_prefix
        self.before_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.last_report: PerformativeReport | None = None
        self._evaluations = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(grid=json.dumps(self.grid.describe(), sort_keys=True), seed=self.seed)

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "AlignmentFakingEval")

    # -- the evaluation ---------------------------------------------------------------------------------------
    def evaluate(self, pl_module: Any) -> PerformativeReport:
        """Run the harness on the module's current model (through its decoder when it has one)."""
        if pl_module.model is None:
            pl_module.configure_model()
        generate = text_generator(
            pl_module.model,
            pl_module.tokenizer,
            self.params,
            self.seed,
            self.batch_size,
            decoder=getattr(pl_module, "decoder", None),
        )
        return performative_report(
            generate,
            pl_module.model,
            pl_module.tokenizer,
            self.grid,
            request=self.request,
            samples_per_prompt=self.samples_per_prompt,
            judge=self.judge,
            layer=self.layer,
            directions=self.directions,
            method=self.direction_method,
            sycophancy_pairs=self.sycophancy_pairs,
            sycophancy_questions=self.sycophancy_questions,
            seed=self.seed,
            steering_strengths=self.steering_strengths,
            batch_size=self.batch_size,
        )

    def _report_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.report_dir) if self.report_dir is not None else Path(trainer.default_root_dir) / "af_eval"

    def _write(self, trainer: pl.Trainer, report: PerformativeReport, name: str) -> None:
        if not trainer.is_global_zero:
            return
        folder = self._report_dir(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        record = {**report.to_dict(), "before_metrics": self.before_metrics or None}
        (folder / f"{name}.json").write_text(json.dumps(record, indent=2, default=str))
        if report.directions:
            save_vectors(folder / f"{name}-directions.safetensors", {n: d.vector for n, d in report.directions.items()})

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.before_fit or self.before_metrics:
            return
        with torch.no_grad():
            report = self.evaluate(pl_module)
        self.before_metrics = report.metrics()
        self._write(trainer, report, "before_fit")

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        if stage == "validate":
            self._evaluations += 1
            if (self._evaluations - 1) % self.every_n_evaluations:
                return
        report = self.evaluate(pl_module)
        metrics = report.metrics()
        if self.before_metrics:
            behaviour = ("gap/", "framing_sensitivity", "sycophancy_rate")
            gaps = {k: v for k, v in self.before_metrics.items() if k.startswith(behaviour)}
            metrics.update({f"before/{k}": v for k, v in gaps.items()})
            metrics["framing_sensitivity_change"] = (
                metrics["framing_sensitivity"] - self.before_metrics["framing_sensitivity"]
            )
        self.last_report, self.last_metrics = report, metrics
        self._write(trainer, report, f"{stage}-epoch{trainer.current_epoch}")
        finite = {k: v for k, v in metrics.items() if math.isfinite(v)}
        log_stage_metrics(trainer, pl_module, finite, self.log_prefix, stage)

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "before_metrics": dict(self.before_metrics),
            "last_metrics": dict(self.last_metrics),
            "evaluations": self._evaluations,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.before_metrics = {k: float(v) for k, v in state_dict.get("before_metrics", {}).items()}
        self.last_metrics = {k: float(v) for k, v in state_dict.get("last_metrics", {}).items()}
        self._evaluations = int(state_dict.get("evaluations", 0))
