"""``WETCallback``: WET (World Entropy Tethering) on any generating module, through the decoder hook seam.

A thin Lightning adapter over :mod:`zoo.interp.wet` (a reconstruction; see ``docs/methods/wet.md``). At the start
of validation/test/predict it gets the world-entropy probe and the head ranking of the module's model -- read from
``artifact_dir`` when given, else fitted on labelled prompts from ``source`` (through the artifact cache
:func:`zoo.artifacts.ensure` when ``cache_dir`` is set, keyed by the model's weights and the fit settings; in memory
otherwise), and fitted again only when the model's weights changed since -- and appends a
:class:`~zoo.interp.wet.WETHook` to ``pl_module.decoder.hooks``, so the entropy-gated head rescaling acts at every
decode step of whatever decoder the module uses; the hook is removed when the loop ends (it never touches training
steps, and teacher-forced evaluation losses are not rescaled).

Logged at the end of each validation/test epoch (``predict``: written to the loggers and kept in
:attr:`WETCallback.last_metrics`), under ``<log_prefix>/``:

* ``prompt_entropy`` -- mean world entropy ``H`` at the answer position (the last prompt token);
* ``gate_mean`` / ``gate_open_rate`` -- mean gate ``g`` there and the fraction of rows with ``g > 0`` (on
  in-distribution prompts: the false-gate rate);
* ``step_gate_mean`` / ``step_gate_open_rate`` -- the same over the later decode steps (when any);
* with ``task`` (a :class:`~zoo.data.multiworld.MultiWorldRecallTask`): ``accuracy``, ``misattribution_rate``
  (answers that are the entity's value in another world) and ``entropy_auroc`` (AUROC of ``H`` at the answer
  position for predicting a misattribution, when both outcomes occur);
* ``fit/probe_accuracy``, ``fit/probe_entropy`` -- in-sample diagnostics of the probe in use.

With ``records_file`` it also writes one JSON line per scored row at the end of each epoch (``stage``, ``step``,
``prompt``, ``world``, ``entity``, ``distance``, ``conflict_world``, ``completion``, ``answer``, ``correct``,
``misattributed``, ``attributed_world``, ``entropy``, ``gate``): breakdowns by distractor distance or by a late
conflicting mention, and the entropy AUROC on any subset, come from it. With ``fit_file`` it writes the fit in use
(tethering heads, every head's score, the ranker, the probe's diagnostics, ``alpha``/``eta``/``beta``) as JSON when
a stage starts.

Under DDP the counters are summed over ranks; ``entropy_auroc`` uses the rows of each rank separately (rank 0's
value is logged).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.artifacts import ensure, model_fingerprint
from zoo.callbacks.evaluation import (
    STAGES,
    StageCallback,
    append_jsonl,
    log_stage_metrics,
    ratios,
    require_generating_module,
    summed_over_ranks,
)
from zoo.data.multiworld import MultiWorldRecallTask
from zoo.data.sources import RowSource
from zoo.errors import ConfigError
from zoo.interp.probes import LinearProbe, auroc
from zoo.interp.wet import (
    HeadRanker,
    ScoreMatchingRanker,
    WETArtifact,
    WETHook,
    WorldBatch,
    WorldEntropyProbe,
    check_gate_threshold,
    check_probe_positions,
    fit_wet,
)

SPLITS = ("train", "val", "test")
_COUNTERS = (
    "rows",
    "entropy_sum",
    "gate_sum",
    "gate_open",
    "step_positions",
    "step_gate_sum",
    "step_gate_open",
    "judged_rows",
    "correct",
    "misattributed",
)


class WETCallback(StageCallback):
    """Entropy-gated rescaling of world-tethering heads during a generating module's decoding, with gate statistics.

    Args:
        probe_layer: decoder layer whose residual the world probe reads; the gated heads lie above it
            [reconstruction].
        num_worlds: ``K``.
        source: rows with a prompt and a world label (``world_field``) to fit the probe and rank the heads on (e.g.
            a :class:`~zoo.data.sources.TaskSource` of the multi-world task; also ``answer`` and
            ``counterfactual_prompt`` for the patching ranker). May be ``None`` with ``artifact_dir``.
        ranker: head ranker (default :class:`~zoo.interp.wet.ScoreMatchingRanker`) [reconstruction].
        num_heads: tethering heads (the top ranked above the probe layer) [reconstruction].
        alpha: amplification ``1 + alpha g`` of tethering heads [reconstruction]; 0 disables WET (the logits are
            then bit-identical to the unhooked model, and the statistics are still logged: the baseline arm).
        eta: gate threshold, ``< log K`` [reconstruction]; used when ``eta_quantile`` is ``None``.
        beta: suppression ``1 - beta g`` of the other heads above the probe layer (0 = off) [reconstruction].
        split: split of ``source`` the fit reads (``train``: prompts the model was trained on, disjoint from the
            evaluation splits of the same task source).
        max_rows: at most this many rows (the first ones) of that split.
        world_field: the row field holding the world label.
        probe_l2: L2 penalty of the probe.
        artifact_dir: a directory holding a fit (:meth:`~zoo.interp.wet.WETArtifact.save`) to use as it is.
        cache_dir: fit through the artifact cache under this root (kind ``wet_fit``, keyed by
            :func:`~zoo.artifacts.model_fingerprint` of the model and every fit setting), so runs with the same model
            and settings share one fit; ``None``: fit in memory.
        task: the multi-world task, to score answers (accuracy, misattribution, entropy AUROC); ``None`` skips.
        stages: among ``validate`` (also validation during fit), ``test``, ``predict``.
        batch_size: rows per forward when fitting.
        log_prefix: metric name prefix.
        records_file: write one JSON line per scored row (needs ``task``) to this file at the end of each epoch
            (appended; ``<stem>.rank<r><suffix>`` on rank ``r > 0``); ``None``: no records.
        fit_file: write the fit in use (heads, head scores, ranker, probe diagnostics, gate settings) to this JSON
            file when a stage starts; ``None``: not written.
        probe_positions: where the probe is fitted: ``last`` (the last prompt token), ``anchors`` (the prompt tokens
            ``anchor_pattern`` matches) or ``anchors+last`` [reconstruction; :data:`zoo.interp.wet.PROBE_POSITIONS`].
        anchor_pattern: regular expression locating the anchor in each prompt (its first group when it has one);
            needed by ``anchors`` and ``anchors+last``.
        eta_quantile: calibrate the gate threshold as this quantile of ``H`` at the last prompt token of the
            ``calibration_split`` prompts of ``source`` (held out from the fit; in distribution), part of the fit
            (:func:`zoo.interp.wet.calibrate_eta`); ``None``: use ``eta``.
        calibration_split: split of ``source`` the calibration reads (at most ``max_rows`` rows).
    """

    def __init__(
        self,
        probe_layer: int,
        num_worlds: int,
        source: RowSource | None = None,
        ranker: HeadRanker | None = None,
        num_heads: int = 2,
        alpha: float = 1.0,
        eta: float = 0.5,
        beta: float = 0.0,
        split: str = "train",
        max_rows: int | None = 1024,
        world_field: str = "world",
        probe_l2: float = 1e-3,
        artifact_dir: str | None = None,
        cache_dir: str | None = None,
        task: MultiWorldRecallTask | None = None,
        stages: Sequence[str] = STAGES,
        batch_size: int = 64,
        log_prefix: str = "wet",
        records_file: str | None = None,
        fit_file: str | None = None,
        probe_positions: str = "last",
        anchor_pattern: str | None = None,
        eta_quantile: float | None = None,
        calibration_split: str = "val",
    ) -> None:
        super().__init__()
        check_probe_positions(probe_positions)
        if probe_positions != "last" and not anchor_pattern:
            raise ConfigError(
                f"WETCallback: probe_positions={probe_positions!r} reads the prompt anchors: set anchor_pattern (a "
                "regular expression locating the world's name in each prompt, e.g. '^W(\\d+)')"
            )
        if eta_quantile is not None and not 0.0 < eta_quantile < 1.0:
            raise ConfigError(f"WETCallback: eta_quantile={eta_quantile} must be in (0, 1) or null")
        if calibration_split not in SPLITS:
            raise ConfigError(f"WETCallback: calibration_split={calibration_split!r}; use one of {SPLITS}")
        if eta_quantile is not None and calibration_split == split:
            raise ConfigError(
                f"WETCallback: calibration_split={calibration_split!r} is the fit's split: calibrate eta on prompts "
                "the probe was not fitted on"
            )
        if isinstance(probe_layer, bool) or not isinstance(probe_layer, int) or probe_layer < 0:
            raise ConfigError(f"WETCallback: probe_layer must be a layer index >= 0, got {probe_layer!r}")
        check_gate_threshold(eta, num_worlds)
        if not 0.0 <= beta <= 1.0:
            raise ConfigError(f"WETCallback: beta={beta} must be in [0, 1] (other heads are scaled by 1 - beta g)")
        if not math.isfinite(alpha):
            raise ConfigError(f"WETCallback: alpha={alpha!r} must be finite")
        if num_heads < 1:
            raise ConfigError(f"WETCallback: num_heads={num_heads} must be >= 1")
        if split not in SPLITS:
            raise ConfigError(f"WETCallback: split={split!r}; use one of {SPLITS}")
        if max_rows is not None and max_rows < 2:
            raise ConfigError(f"WETCallback: max_rows={max_rows} must be >= 2 (or null for all rows)")
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ConfigError(f"WETCallback: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        if source is None and artifact_dir is None:
            raise ConfigError(
                "WETCallback: give source (rows with prompts and world labels to fit the probe on) or artifact_dir "
                "(a directory holding a fitted probe and head ranking)"
            )
        if task is not None and not isinstance(task, MultiWorldRecallTask):
            raise ConfigError(
                f"WETCallback: task must be a zoo.data.multiworld.MultiWorldRecallTask (to score answers) or null, got "
                f"{type(task).__name__}"
            )
        self.probe_layer = probe_layer
        self.num_worlds = num_worlds
        self.source = source
        self.ranker = ranker if ranker is not None else ScoreMatchingRanker()
        self.num_heads = num_heads
        self.alpha, self.eta, self.beta = float(alpha), float(eta), float(beta)
        self.split = split
        self.max_rows = max_rows
        self.world_field = world_field
        self.probe_l2 = probe_l2
        self.artifact_dir = artifact_dir
        self.cache_dir = cache_dir
        self.task = task
        self.stages = tuple(stages)
        self.batch_size = batch_size
        self.log_prefix = log_prefix
        self.records_file = Path(records_file) if records_file else None
        self.fit_file = Path(fit_file) if fit_file else None
        self.probe_positions = probe_positions
        self.anchor_pattern = anchor_pattern
        self.eta_quantile = eta_quantile
        self.calibration_split = calibration_split
        self._records: list[dict[str, Any]] = []
        self.artifact: WETArtifact | None = None
        self.hook: WETHook | None = None
        self.fingerprint: str | None = None  # of the weights the artifact in use was fitted on
        self._epoch = dict.fromkeys(_COUNTERS, 0.0)
        self._entropies: list[float] = []
        self._misattributed: list[bool] = []
        self.last_metrics: dict[str, float] = {}

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            probe_layer=self.probe_layer, alpha=self.alpha, eta=self.eta, beta=self.beta, heads=self.num_heads
        )

    @property
    def eta_in_use(self) -> float:
        """The gate threshold the hook uses: the fit's calibrated one with ``eta_quantile``, else ``eta``."""
        if self.eta_quantile is None:
            return self.eta
        if self.artifact is None or self.artifact.eta is None:
            raise ConfigError("WETCallback: eta_quantile is set but the fit in use has no calibrated eta")
        return self.artifact.eta

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The tethering heads in use (empty before the first fit/load)."""
        return list(self.hook.heads) if self.hook is not None else []

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "WETCallback", needs_decoder=True)

    # -- fitting ----------------------------------------------------------------------------------------------
    def fit(self, pl_module: Any) -> WETArtifact:
        """Fit the probe and the head ranking on ``source`` with the module's current model (pure in the model)."""
        if self.source is None:
            raise ConfigError("WETCallback: no source of labelled prompts is configured to fit the probe on")
        device = next(pl_module.model.parameters()).device
        batch = WorldBatch.from_rows(
            pl_module.tokenizer,
            self._rows(self.split),
            world_field=self.world_field,
            answer_field="answer" if self.ranker.needs_counterfactuals else None,
            counterfactual_field="counterfactual_prompt" if self.ranker.needs_counterfactuals else None,
            device=device,
            anchor_pattern=self.anchor_pattern if self.probe_positions != "last" else None,
        )
        calibration = None
        if self.eta_quantile is not None:
            calibration = WorldBatch.from_rows(
                pl_module.tokenizer,
                self._rows(self.calibration_split),
                world_field=self.world_field,
                answer_field=None,
                counterfactual_field=None,
                device=device,
            )
        return fit_wet(
            pl_module.model,
            batch,
            self.probe_layer,
            self.num_worlds,
            self.ranker,
            l2=self.probe_l2,
            batch_size=self.batch_size,
            probe_positions=self.probe_positions,
            calibration=calibration,
            eta_quantile=self.eta_quantile,
        )

    def _rows(self, split: str) -> list[dict[str, Any]]:
        rows = list(self.source.rows(split, ("prompt",)))
        return rows[: self.max_rows] if self.max_rows is not None else rows

    def fit_spec(self, fingerprint: str) -> dict[str, Any]:
        """What determines a fit: the model's weights and every fit setting (the artifact cache's key)."""
        if self.source is None:
            raise ConfigError("WETCallback: no source of labelled prompts is configured to fit the probe on")
        ranker = {k: v for k, v in vars(self.ranker).items() if not k.startswith("_")}
        return {
            "model": fingerprint,
            "source": self.source.describe(),
            "split": self.split,
            "max_rows": self.max_rows,
            "world_field": self.world_field,
            "probe_layer": self.probe_layer,
            "num_worlds": self.num_worlds,
            "probe_l2": self.probe_l2,
            "probe_positions": self.probe_positions,
            "anchor_pattern": self.anchor_pattern if self.probe_positions != "last" else None,
            "eta_quantile": self.eta_quantile,
            "calibration_split": self.calibration_split if self.eta_quantile is not None else None,
            "ranker": {"type": f"{type(self.ranker).__module__}.{type(self.ranker).__qualname__}", **ranker},
        }

    def _artifact(self, pl_module: Any) -> WETArtifact:
        """The fit to use: ``artifact_dir``'s, the cached/kept one of these weights, or a new one."""
        if self.artifact_dir is not None:
            if self.artifact is None:
                self.artifact = self._checked(WETArtifact.load(self.artifact_dir), self.artifact_dir)
            return self.artifact
        fingerprint = model_fingerprint(pl_module.model)
        if self.artifact is not None and fingerprint == self.fingerprint:
            return self.artifact
        if self.cache_dir is None:
            artifact = self.fit(pl_module)
        else:
            path = ensure(
                "wet_fit",
                self.fit_spec(fingerprint),
                lambda directory: self.fit(pl_module).save(directory),
                self.cache_dir,
                name=f"layer{self.probe_layer}-{type(self.ranker).__name__}",
                reason="WETCallback: the world probe and head ranking of this model",
            )
            artifact = self._checked(WETArtifact.load(path), path)
        self.fingerprint = fingerprint
        return artifact

    def _checked(self, artifact: WETArtifact, where: Any) -> WETArtifact:
        if artifact.probe.layer != self.probe_layer or artifact.probe.num_worlds != self.num_worlds:
            raise ConfigError(
                f"WETCallback: the fit at {where} has probe_layer={artifact.probe.layer}, "
                f"num_worlds={artifact.probe.num_worlds}; the callback is set to probe_layer={self.probe_layer}, "
                f"num_worlds={self.num_worlds}"
            )
        if self.eta_quantile is not None and artifact.eta is None:
            raise ConfigError(
                f"WETCallback: eta_quantile={self.eta_quantile} but the fit at {where} has no calibrated eta"
            )
        return artifact

    # -- attach / detach ----------------------------------------------------------------------------------------
    def _active(self, trainer: pl.Trainer, stage: str) -> bool:
        return stage in self.stages and not trainer.sanity_checking

    def _attach(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if not self._active(trainer, stage):
            return
        if pl_module.model is None:
            pl_module.configure_model()
        self._reset()
        self.artifact = self._artifact(pl_module)
        heads = self.artifact.heads(self.num_heads)
        hook = WETHook(self.artifact.probe, heads, self.alpha, self.eta_in_use, self.beta)
        hook.controller(pl_module.model)  # every setting checked against the model before any decode
        self.hook = hook
        pl_module.decoder.hooks.append(hook)
        self._write_fit(trainer, stage)

    def _write_fit(self, trainer: pl.Trainer, stage: str) -> None:
        if self.fit_file is None or not trainer.is_global_zero or self.artifact is None:
            return
        record = {
            "stage": stage,
            "step": trainer.global_step,
            "heads": [list(h) for h in self.heads],
            "head_scores": self.artifact.head_scores.tolist(),
            "ranker": self.artifact.ranker,
            "probe_layer": self.probe_layer,
            "fit_metrics": dict(self.artifact.metrics),
            "alpha": self.alpha,
            "eta": self.eta_in_use,
            "eta_quantile": self.eta_quantile,
            "probe_positions": self.probe_positions,
            "beta": self.beta,
        }
        self.fit_file.parent.mkdir(parents=True, exist_ok=True)
        self.fit_file.write_text(json.dumps(record, indent=2))

    def _detach(self, pl_module: Any) -> None:
        hooks = getattr(getattr(pl_module, "decoder", None), "hooks", None)
        if self.hook is not None and isinstance(hooks, list):
            while self.hook in hooks:
                hooks.remove(self.hook)

    def stage_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        self._attach(trainer, pl_module, stage)

    def stage_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        self._detach(pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._detach(pl_module)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._detach(pl_module)

    # -- per batch --------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._epoch = dict.fromkeys(_COUNTERS, 0.0)
        self._entropies, self._misattributed = [], []
        self._records = []

    def stage_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if not self._active(trainer, stage) or self.hook is None:
            return
        records = self.hook.take()
        if not records:
            return
        entropy = torch.cat([r.prompt_entropy for r in records])
        gate = torch.cat([r.prompt_gate for r in records])
        steps = torch.cat([r.step_gates for r in records])
        c = self._epoch
        c["rows"] += entropy.numel()
        c["entropy_sum"] += float(entropy.sum())
        c["gate_sum"] += float(gate.sum())
        c["gate_open"] += float((gate > 0).sum())
        c["step_positions"] += steps.numel()
        c["step_gate_sum"] += float(steps.sum())
        c["step_gate_open"] += float((steps > 0).sum())
        if self.task is not None:
            self._score_answers(outputs, entropy, gate)

    def _score_answers(self, outputs: Any, entropy: torch.Tensor, gate: torch.Tensor) -> None:
        meta = outputs.get("meta", {}) if isinstance(outputs, dict) else {}
        prompts, texts = meta.get("prompts"), outputs.get("texts") if isinstance(outputs, dict) else None
        if prompts is None or texts is None or len(prompts) != len(texts):
            return
        per_row = len(prompts) == entropy.numel()
        for i, (prompt, text) in enumerate(zip(prompts, texts)):
            described = self.task.describe_prompt(prompt)
            if described is None:
                continue
            world, entity = described["world"], described["entity"]
            answer = self.task.extract_answer(text) or ""
            correct = answer == self.task.value_text(self.task.value(world, entity))
            wrong_world = self.task.misattributed(world, entity, answer)
            self._epoch["judged_rows"] += 1
            self._epoch["correct"] += correct
            self._epoch["misattributed"] += wrong_world
            if per_row:
                self._entropies.append(float(entropy[i]))
                self._misattributed.append(wrong_world)
            if self.records_file is not None and per_row:
                attributed = self.task.attribute(entity, answer) if answer else None
                self._records.append(
                    {
                        "prompt": prompt,
                        **described,
                        "completion": text,
                        "answer": answer,
                        "correct": bool(correct),
                        "misattributed": bool(wrong_world),
                        "attributed_world": -1 if attributed is None else attributed,
                        "entropy": float(entropy[i]),
                        "gate": float(gate[i]),
                    }
                )

    # -- per epoch --------------------------------------------------------------------------------------------
    def compute_metrics(self, c: dict[str, float]) -> dict[str, float]:
        """Rates from the epoch's counters (and the per-row entropy AUROC); metrics without data are left out."""
        metrics = ratios(
            c,
            {
                "prompt_entropy": ("entropy_sum", "rows"),
                "gate_mean": ("gate_sum", "rows"),
                "gate_open_rate": ("gate_open", "rows"),
                "step_gate_mean": ("step_gate_sum", "step_positions"),
                "step_gate_open_rate": ("step_gate_open", "step_positions"),
                "accuracy": ("correct", "judged_rows"),
                "misattribution_rate": ("misattributed", "judged_rows"),
            },
        )
        if len(set(self._misattributed)) == 2:
            metrics["entropy_auroc"] = auroc(torch.tensor(self._entropies), torch.tensor(self._misattributed))
        return metrics

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if not self._active(trainer, stage):
            return
        counters = summed_over_ranks(trainer, self._epoch)
        if not counters["rows"]:
            return
        fit = {f"fit/{k}": v for k, v in self.artifact.metrics.items() if k != "rows"} if self.artifact else {}
        self.last_metrics = {**self.compute_metrics(counters), **fit}
        log_stage_metrics(trainer, pl_module, self.last_metrics, self.log_prefix, stage)
        if self.records_file is not None and self._records:
            rows = ({"stage": stage, "step": trainer.global_step, **r} for r in self._records)
            append_jsonl(self.records_file, rows, trainer.global_rank)
        self._records = []

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"last_metrics": dict(self.last_metrics), "heads": self.heads}
        if self.artifact is not None and self.artifact.probe.probe.weight is not None:
            state["artifact"] = {
                "probe_weight": self.artifact.probe.probe.weight.cpu(),
                "probe_bias": self.artifact.probe.probe.bias.cpu(),
                "head_scores": self.artifact.head_scores.cpu(),
                "ranker": self.artifact.ranker,
                "metrics": dict(self.artifact.metrics),
                "eta": self.artifact.eta,
                "fingerprint": self.fingerprint,
            }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_metrics = {k: float(v) for k, v in state_dict.get("last_metrics", {}).items()}
        saved = state_dict.get("artifact")
        if saved is not None:
            probe = WorldEntropyProbe(
                self.probe_layer, self.num_worlds, LinearProbe.from_weights(saved["probe_weight"], saved["probe_bias"])
            )
            eta = saved.get("eta")
            self.artifact = WETArtifact(
                probe,
                saved["head_scores"],
                saved["ranker"],
                dict(saved["metrics"]),
                None if eta is None else float(eta),
            )
            self.fingerprint = saved.get("fingerprint")
