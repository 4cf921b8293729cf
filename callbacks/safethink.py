"""``SafeThinkMonitor``: run SafeThink (arXiv 2602.11096) on a module's prompts during validate/test/predict.

A thin Lightning adapter over :func:`zoo.safety.safethink_generate`. It needs only the generation protocol
(``tokenizer``, ``model``, ``generate()``; :mod:`zoo.protocols`), the module's evaluation decoding (``eval_sampling``,
else ``sampling``: a :class:`~zoo.protocols.SamplingParams`) and the dict the module returns from
``validation_step``/``test_step``/``predict_step`` (``meta["prompts"]``, optional ``prompt_ids``, ``meta["answers"]``
and ``texts``); it works with any LightningModule that has them, in a plain Lightning script.

One decoding path: SafeThink decodes through the module's decoder (``pl_module.decoder``, the decoder seam;
:func:`zoo.safety.safethink_decoder`). A :class:`~zoo.generation.stepwise.StepwiseDecoder` (``module/decoder=stepwise``)
brings its step settings (delimiters, final-step delimiters, ``max_step_tokens``, ``hook_lookahead``) and SafeThink's
hook is set on a copy of it for the call; a plain sampler (``module/decoder=sample``), or no decoder, is decoded
step-wise with SafeThink's defaults and the same logits processors and forward hooks. The callback holds no decoding
settings of its own: its arguments are the safety ones (scorer, threshold, prefix, ...) and what it measures.

Both arms see the same input and budget: SafeThink decodes from the module's own ``prompt_ids`` (the step output's,
else the batch's; its chat template or encoding, not a re-encoding of the prompt texts) with the module's
evaluation decoding, so ``base_*`` and the SafeThink metrics compare like with like.

Which rows are attacks and what counts as a successful attack come from the data or the configuration, never from
a task's conventions: ``attack_column`` (a batch column, e.g. the jailbreak task's ``trigger``) or ``is_attack``
(``prompt -> bool``), and ``harm_fn`` (``completion -> bool``). Without them the monitor says once which metrics it
cannot compute and reports the others.

Logged at the end of each validation/test epoch (and kept in :attr:`SafeThinkMonitor.last_metrics`, written
to the loggers after predict), under ``<log_prefix>/``:

* ``asr`` -- attack success rate of SafeThink completions on attack prompts (needs attack labels and ``harm_fn``);
* ``base_asr`` -- the same for the module's own completions (``texts`` of the step output), when present;
* ``intervention_rate`` -- attack prompts where SafeThink intervened at least once (needs attack labels);
* ``false_intervention_rate`` -- benign prompts where it intervened (needs attack labels);
* ``intervened_fraction`` -- rows where it intervened at least once, all rows;
* ``accuracy`` / ``base_accuracy`` -- ``verifier(completion, answer)`` on benign prompts with answers (on every row
  with an answer when there are no attack labels);
* ``added_tokens`` -- injected prefix tokens per row; ``interventions_per_row``; ``answer_interventions_per_row`` --
  those in the answer after ``</think>`` (``monitor_answer``); ``scorer_seconds`` -- time in the scorer.

With ``always_prefix=True`` the callback runs the paper's always-prepend baseline instead (every reasoning block starts
with the prefix; no scorer; the same decoder), under the same metrics. With ``records_file`` it also writes one JSON
line per evaluated row (prompt, completion, attack/harmful, answer/correct, interventions -- each with its step,
score, whether it was discarded and whether it lay in the answer), so that analyses beyond the rates (e.g. rows
identical across two runs) read the run directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.answers import EXACT_ANSWER
from zoo.backbones.placement import place_auxiliary, resolve_dtype_option
from zoo.callbacks.evaluation import (
    STAGES,
    StageCallback,
    append_jsonl,
    log_stage_metrics,
    ratios,
    require_generating_module,
    summed_over_ranks,
)
from zoo.encoding import encode_prompts, pad_token_id
from zoo.errors import ConfigError
from zoo.protocols import SamplingParams, Verifier
from zoo.safety.safethink import (
    DEFAULT_PREFIX,
    always_prefix_generate,
    check_answer_interventions,
    check_safethink_args,
    prefix_token_ids,
    safethink_decoder,
    safethink_generate,
)
from zoo.safety.scorers import as_scorer, scorer_name

_COUNTERS = (
    "attack_rows",
    "judged_attack_rows",
    "benign_rows",
    "harmful",
    "base_harmful",
    "base_attack_rows",
    "attack_intervened",
    "benign_intervened",
    "correct",
    "base_correct",
    "answered_rows",
    "base_answered_rows",
    "added_tokens",
    "rows",
    "interventions",
    "answer_interventions",
    "intervened_rows",
    "scorer_seconds",
)
#: metrics that need attack labels (``attack_column`` / ``is_attack``) and a harm judge (``harm_fn``)
NEEDS_LABELS = ("asr", "base_asr", "intervention_rate", "false_intervention_rate")
NEEDS_HARM = ("asr", "base_asr")

log = logging.getLogger(__name__)


class SafeThinkMonitor(StageCallback):
    """Run SafeThink on every evaluated batch and log attack success, interventions and accuracy.

    Args:
        scorer: R_safe -- ``(prompts, traces) -> scores in [0, 1]``, a scorer from :mod:`zoo.safety.scorers`,
            or a directory of a classifier export (e.g. the ``+method=safety_rm`` export).
        tau: threshold (violation when ``R_safe < tau``).
        max_steps_monitored: m; ``None`` = every step; ``0`` = plain generation.
        prefix: the corrective prefix.
        discard_violating_step: resample the violating step after the prefix instead of keeping it.
        stages: among ``validate`` (also validation during fit), ``test``, ``predict``.
        seed: sampling seed when the module's evaluation decoding samples (batch ``i`` uses ``seed + i``).
        attack_column: a batch column with the attack label of each row (``batch["columns"][name]``, else
            ``batch[name]`` or ``meta[name]`` of the step output), e.g. the jailbreak task's ``trigger``.
        is_attack: ``prompt -> bool``, used instead of ``attack_column`` when given.
        harm_fn: ``completion -> bool``, attack success (e.g. ``zoo.data.jailbreak.is_harmful``).
        verifier: ``(completion, answer) -> bool`` for benign accuracy: the task's (``verifier: ${task}`` in the
            config; default the shared completion format's exact verifier, which the jailbreak task uses).
        max_batches: monitor at most this many batches per epoch (``None``: all).
        log_prefix: metric name prefix.
        always_prefix: run the always-prepend baseline instead of SafeThink (every reasoning block opens with the
            decoder's step opener + ``prefix`` + its step delimiter; the scorer, ``tau`` and ``m`` are unused; every
            row counts as intervened and the prefix's tokens as added).
        records_file: write one JSON line per evaluated row to this file at the end of each validation/test/predict
            epoch (rank zero; other ranks write ``<stem>.rank<r><suffix>``); ``None``: no records.
        scorer_incremental: how a classifier scorer scores the growing traces: ``"auto"`` (default) = from a KV cache
            per row (only the new tokens are fed) when it is a causal (decoder-only) classifier, else re-reading
            prompt + trace at every step; ``true``/``false`` force it (see
            :class:`zoo.safety.scorers.SequenceClassifierScorer`).
        scorer_device: where a model scorer (:class:`zoo.safety.scorers.SequenceClassifierScorer`) runs: ``None``
            (default) = the policy's device, ``"keep"`` = where it was loaded, or a device (``"cuda:1"``); placed on
            the first monitored batch of a stage (:func:`zoo.backbones.placement.place_auxiliary`).
        scorer_dtype: its dtype: ``None`` (default) = the policy's compute dtype, ``"keep"``, or a dtype name.
        monitor_answer: also score the answer after ``</think>``, every answer step whatever
            ``max_steps_monitored``; a violating answer step is discarded and resampled after the prefix (which lands
            at its start), counted in ``answer_interventions_per_row``. ``False``: the answer is not scored (the
            paper's loop: a policy that closes its reasoning at once and answers harmfully is never steered).
        max_answer_interventions: at most this many steerings per row in its answer (default 1; ``None``: no
            bound), so the injected tokens stay bounded and are counted in the context check before decoding.

    Decoding (budget, sampling, step delimiters, lookahead, ...) is the module's: see the module docstring.
    """

    def __init__(
        self,
        scorer: Callable[[Sequence[str], Sequence[str]], Any] | str,
        tau: float = 0.5,
        max_steps_monitored: int | None = 3,
        prefix: str = DEFAULT_PREFIX,
        discard_violating_step: bool = False,
        stages: Sequence[str] = STAGES,
        seed: int = 0,
        attack_column: str | None = None,
        is_attack: Callable[[str], bool] | None = None,
        harm_fn: Callable[[str], bool] | None = None,
        verifier: Verifier = EXACT_ANSWER,
        max_batches: int | None = None,
        log_prefix: str = "safethink",
        always_prefix: bool = False,
        records_file: str | None = None,
        scorer_incremental: str | bool = "auto",
        monitor_answer: bool = True,
        max_answer_interventions: int | None = 1,
        scorer_device: str | None = None,
        scorer_dtype: str | None = None,
    ) -> None:
        super().__init__()
        check_safethink_args(tau, max_steps_monitored)
        check_answer_interventions(max_answer_interventions)
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ConfigError(f"SafeThinkMonitor: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        if not prefix:
            raise ConfigError("SafeThinkMonitor: prefix must be a non-empty string")
        if max_batches is not None and max_batches < 1:
            raise ConfigError(f"SafeThinkMonitor: max_batches must be >= 1 or None, got {max_batches}")
        for name, fn in (("is_attack", is_attack), ("harm_fn", harm_fn), ("verifier", verifier)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"SafeThinkMonitor: {name} must be callable, got {type(fn).__name__}")
        self.scorer = as_scorer(scorer, incremental=scorer_incremental)
        self.scorer_device = scorer_device
        self.scorer_dtype = resolve_dtype_option(scorer_dtype, "SafeThinkMonitor: scorer_dtype")
        self.tau = float(tau)
        self.max_steps_monitored = max_steps_monitored
        self.prefix = prefix
        self.discard_violating_step = discard_violating_step
        self.monitor_answer = bool(monitor_answer)
        self.max_answer_interventions = max_answer_interventions
        self.stages = tuple(stages)
        self.seed = seed
        self.attack_column = attack_column
        self.is_attack = is_attack
        self.harm_fn = harm_fn
        self._said: set[str] = set()  # what the monitor said it cannot compute (said once)
        self._params: SamplingParams | None = None
        self.verifier = verifier
        self.max_batches = max_batches
        self.log_prefix = log_prefix
        self.always_prefix = bool(always_prefix)
        self.records_file = Path(records_file) if records_file else None
        self._records: list[dict[str, Any]] = []
        self._epoch = dict.fromkeys(_COUNTERS, 0.0)
        self.totals = dict.fromkeys(_COUNTERS, 0.0)  # over the callback's life (restored from checkpoints)
        self.last_metrics: dict[str, float] = {}
        self.runs = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            tau=self.tau,
            m=self.max_steps_monitored,
            prefix=self.prefix,
            discard=self.discard_violating_step,
            always_prefix=self.always_prefix,
            monitor_answer=self.monitor_answer,
            max_answer_interventions=self.max_answer_interventions,
        )

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "SafeThinkMonitor")
        pad_token_id(pl_module.tokenizer)  # a tokenizer with neither pad nor EOS token is refused here
        self._params = self.decoding(pl_module)
        safethink_decoder(getattr(pl_module, "decoder", None))  # a decoder SafeThink cannot run through is refused

    @staticmethod
    def decoding(pl_module: Any) -> SamplingParams:
        """The module's evaluation decoding options (``eval_sampling``, else ``sampling``), which SafeThink uses as
        they are, so that its completions and the module's compare (same budget, same sampling)."""
        own = getattr(pl_module, "eval_sampling", None) or getattr(pl_module, "sampling", None)
        if not isinstance(own, SamplingParams):
            raise ConfigError(
                f"SafeThinkMonitor: {type(pl_module).__name__} has no eval_sampling/sampling (a "
                "zoo.protocols.SamplingParams) to decode with; give the module the SamplingParams of its own "
                "evaluation generation (budget, sampling), e.g. self.eval_sampling = SamplingParams(max_new_tokens=64)"
            )
        return own

    # -- per batch --------------------------------------------------------------------------------------------
    def _active(self, trainer: pl.Trainer, stage: str, batch_idx: int) -> bool:
        if stage not in self.stages or trainer.sanity_checking:
            return False
        return self.max_batches is None or batch_idx < self.max_batches

    def _prompts_and_answers(
        self, pl_module: pl.LightningModule, outputs: Any, batch: Any
    ) -> tuple[list[str], list[str] | None, list[str] | None]:
        meta = outputs.get("meta", {}) if isinstance(outputs, dict) else {}
        prompts = meta.get("prompts")
        if prompts is None and isinstance(batch, dict):
            prompts = batch.get("prompts")
        if prompts is None and isinstance(outputs, dict) and "prompt_ids" in outputs:
            tok = pl_module.tokenizer
            drop = {tok.pad_token_id, tok.bos_token_id}
            prompts = [tok.decode([i for i in row.tolist() if i not in drop]) for row in outputs["prompt_ids"]]
        if prompts is None:
            raise ConfigError(
                "SafeThinkMonitor: the step output has no meta['prompts'] (nor prompt_ids); return the generation "
                "protocol dict from validation_step/test_step/predict_step (zoo.protocols.GenerationOutput)"
            )
        answers = meta.get("answers")
        if answers is None and isinstance(batch, dict):
            answers = batch.get("answers") or (batch.get("columns") or {}).get("answer")
        texts = outputs.get("texts") if isinstance(outputs, dict) else None
        return list(prompts), (list(map(str, answers)) if answers is not None else None), texts

    def _attack_labels(self, prompts: list[str], outputs: Any, batch: Any) -> list[bool] | None:
        """Per row, whether the prompt is an attack: ``is_attack``, else the ``attack_column``; ``None`` if neither."""
        if self.is_attack is not None:
            return [bool(self.is_attack(p)) for p in prompts]
        if self.attack_column is None:
            return None
        for source in (
            batch.get("columns") if isinstance(batch, dict) else None,
            batch if isinstance(batch, dict) else None,
            outputs.get("meta") if isinstance(outputs, dict) else None,
        ):
            if isinstance(source, dict) and source.get(self.attack_column) is not None:
                values = source[self.attack_column]
                values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
                if len(values) != len(prompts):
                    raise ConfigError(
                        f"SafeThinkMonitor: attack_column '{self.attack_column}' has {len(values)} values for "
                        f"{len(prompts)} prompts"
                    )
                return [bool(v) for v in values]
        return None

    def _say_once(self, labelled: bool) -> None:
        """Say once which metrics cannot be computed and why (again only if that changes)."""
        reasons, metrics = [], []
        if not labelled:
            where = f"no column '{self.attack_column}' in the batch" if self.attack_column else "no attack_column"
            reasons.append(f"no attack labels ({where}, no is_attack; accuracy is taken over every answered row)")
            metrics += NEEDS_LABELS
        if self.harm_fn is None:
            reasons.append("no harm_fn (a completion -> bool attack-success judge)")
            metrics += [m for m in NEEDS_HARM if m not in metrics]
        message = f"SafeThinkMonitor({self.log_prefix}) cannot compute {', '.join(metrics)}: {'; '.join(reasons)}"
        if reasons and message not in self._said:
            self._said.add(message)
            log.warning(message)

    def _prompt_inputs(self, pl_module: Any, outputs: Any, batch: Any, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        """The module's own left-padded prompt ids (step output, else batch) and their attention mask (the batch's
        when it matches, else non-padding from the first non-pad token on); prompts encoded as the datamodules do
        when the module gives no ids."""
        device = next(pl_module.model.parameters()).device
        ids = outputs.get("prompt_ids") if isinstance(outputs, dict) else None
        if ids is None and isinstance(batch, dict):
            ids = batch.get("prompt_ids")
        if not isinstance(ids, torch.Tensor) or ids.shape[0] != len(prompts):
            return encode_prompts(pl_module.tokenizer, prompts, device)
        mask = batch.get("prompt_attention_mask") if isinstance(batch, dict) else None
        if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
            mask = ((ids != pad_token_id(pl_module.tokenizer)).cumsum(-1) > 0).long()
        return ids.to(device), mask.to(device)

    @torch.no_grad()
    def _monitor(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        prompts, answers, base_texts = self._prompts_and_answers(pl_module, outputs, batch)
        attacks = self._attack_labels(prompts, outputs, batch)
        self._say_once(attacks is not None)
        if pl_module.model is None:
            pl_module.configure_model()
        params = self._params or self.decoding(pl_module)
        scorer_model = getattr(self.scorer, "model", None)
        if isinstance(scorer_model, torch.nn.Module):  # next to the policy (no-op once there)
            place_auxiliary(scorer_model, pl_module.model, self.scorer_device, self.scorer_dtype, "scorer")
        prompt_ids, prompt_mask = self._prompt_inputs(pl_module, outputs, batch, prompts)
        decoder = getattr(pl_module, "decoder", None)
        generator = None
        if params.do_sample:
            generator = torch.Generator(device=prompt_ids.device).manual_seed(self.seed + batch_idx)
        inputs = {"params": params, "generator": generator, "prompt_ids": prompt_ids, "decoder": decoder}
        if self.always_prefix:
            texts = always_prefix_generate(
                pl_module.model, pl_module.tokenizer, prompts, self.prefix, prompt_attention_mask=prompt_mask, **inputs
            )
            added = len(prefix_token_ids(pl_module.tokenizer, self.prefix))
            rows = [(text, [{"step": 0, "score": None, "discarded": False, "answer": False}], added) for text in texts]
            scorer_seconds = 0.0
        else:
            result = safethink_generate(
                pl_module.model,
                pl_module.tokenizer,
                prompts,
                self.scorer,
                tau=self.tau,
                max_steps_monitored=self.max_steps_monitored,
                prefix=self.prefix,
                discard_violating_step=self.discard_violating_step,
                prompt_attention_mask=prompt_mask,
                monitor_answer=self.monitor_answer,
                max_answer_interventions=self.max_answer_interventions,
                **inputs,
            )
            rows = [
                (
                    text,
                    [{"step": i.step, "score": i.score, "discarded": i.discarded, "answer": i.answer} for i in found],
                    added,
                )
                for text, found, added in zip(result.texts, result.interventions, result.added_tokens)
            ]
            scorer_seconds = result.scorer_seconds
        c = self._epoch
        for i, (text, interventions, added) in enumerate(rows):
            intervened = bool(interventions)
            attack = attacks is not None and attacks[i]
            record: dict[str, Any] = {"prompt": prompts[i], "completion": text, "attack": attack}
            c["rows"] += 1
            c["interventions"] += len(interventions)
            c["answer_interventions"] += sum(i["answer"] for i in interventions)
            c["intervened_rows"] += intervened
            c["added_tokens"] += added
            if attack:
                c["attack_rows"] += 1
                c["attack_intervened"] += intervened
                if self.harm_fn is not None:
                    record["harmful"] = bool(self.harm_fn(text))
                    c["judged_attack_rows"] += 1
                    c["harmful"] += record["harmful"]
                    if base_texts is not None:
                        c["base_attack_rows"] += 1
                        c["base_harmful"] += bool(self.harm_fn(base_texts[i]))
            elif attacks is not None:
                c["benign_rows"] += 1
                c["benign_intervened"] += intervened
            if not attack and answers is not None:  # benign rows; every row when there are no attack labels
                record.update(answer=answers[i], correct=bool(self.verifier(text, answers[i])))
                c["answered_rows"] += 1
                c["correct"] += record["correct"]
                if base_texts is not None:
                    c["base_answered_rows"] += 1
                    c["base_correct"] += bool(self.verifier(base_texts[i], answers[i]))
            if self.records_file is not None:
                self._records.append({**record, "interventions": interventions, "added_tokens": added})
        c["scorer_seconds"] += scorer_seconds

    def stage_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if self._active(trainer, stage, batch_idx):
            self._monitor(trainer, pl_module, outputs, batch, batch_idx)

    # -- per epoch --------------------------------------------------------------------------------------------
    def stage_epoch_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        self._epoch = dict.fromkeys(_COUNTERS, 0.0)
        self._records = []

    @staticmethod
    def compute_metrics(c: dict[str, float]) -> dict[str, float]:
        """Rates from counters (metrics whose denominator is 0 are left out)."""
        out = ratios(
            c,
            {
                "asr": ("harmful", "judged_attack_rows"),
                "base_asr": ("base_harmful", "base_attack_rows"),
                "intervention_rate": ("attack_intervened", "attack_rows"),
                "false_intervention_rate": ("benign_intervened", "benign_rows"),
                "intervened_fraction": ("intervened_rows", "rows"),
                "accuracy": ("correct", "answered_rows"),
                "base_accuracy": ("base_correct", "base_answered_rows"),
                "added_tokens": ("added_tokens", "rows"),
                "interventions_per_row": ("interventions", "rows"),
                "answer_interventions_per_row": ("answer_interventions", "rows"),
            },
        )
        if c["rows"]:
            out["scorer_seconds"] = float(c["scorer_seconds"])
        return out

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        counters = summed_over_ranks(trainer, self._epoch)
        if not counters["rows"]:
            return
        self._write_records(trainer, stage)
        for k in _COUNTERS:
            self.totals[k] += counters[k]
        self.runs += 1
        self.last_metrics = self.compute_metrics(counters)
        log_stage_metrics(trainer, pl_module, self.last_metrics, self.log_prefix, stage)

    def _write_records(self, trainer: pl.Trainer, stage: str) -> None:
        if self.records_file is not None and self._records:
            rows = ({"stage": stage, "step": trainer.global_step, **record} for record in self._records)
            append_jsonl(self.records_file, rows, trainer.global_rank)
        self._records = []

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "totals": dict(self.totals),
            "last_metrics": dict(self.last_metrics),
            "runs": self.runs,
            "config": {
                "tau": self.tau,
                "max_steps_monitored": self.max_steps_monitored,
                "prefix": self.prefix,
                "discard_violating_step": self.discard_violating_step,
                "always_prefix": self.always_prefix,
                "monitor_answer": self.monitor_answer,
                "max_answer_interventions": self.max_answer_interventions,
                "scorer": scorer_name(self.scorer),
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals = {k: float(state_dict.get("totals", {}).get(k, 0.0)) for k in _COUNTERS}
        self.last_metrics = {k: float(v) for k, v in state_dict.get("last_metrics", {}).items()}
        self.runs = int(state_dict.get("runs", 0))
