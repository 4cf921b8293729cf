"""``WatermarkCallback``: watermark a generating module's texts in validate/test/predict and measure detection.

A thin Lightning adapter (a :class:`~zoo.callbacks.evaluation.StageCallback`; epoch counters summed over ranks and
rates logged with the shared helpers of :mod:`zoo.callbacks.evaluation`) over
:class:`zoo.watermark.decoder.SemanticWatermarkDecoder` and :func:`zoo.watermark.detect.detect` (SemStamp, k-SemStamp
and X-Guard differ only in the decoder's partition). It needs the generation protocol only (``tokenizer``,
``model``; :mod:`zoo.protocols`) and the prompts of each evaluated batch (``meta["prompts"]`` of the step output or
``batch["prompts"]``), so it works with any LightningModule that has them, in a plain Lightning script. When the
module has a decoder (the decoder seam), its logits processors and forward hooks apply to the watermarked generation
too.

For every evaluated batch (at most ``max_rows`` prompts of at most ``max_batches`` batches per epoch) it writes one
watermarked text per prompt (sampled with ``temperature`` / ``top_k`` / ``top_p``; batch ``i`` seeded with
``seed + i``), detects it at the fixed ``threshold``, detects it again after each configured attack, and (with
``plain_baseline``) writes an unwatermarked text with the same decoder at ``max_trials = 1`` and detects that (the
false-positive rate on the model's own text).

Logged at the end of each validation/test epoch (and kept in :attr:`WatermarkCallback.last_metrics`, written to
the loggers after predict), under ``<log_prefix>/``:

* ``wsr`` -- Watermark Success Rate: sentences accepted by the test within ``max_trials`` / sentences written;
* ``mean_trials`` -- candidates drawn per accepted sentence;
* ``sentences`` -- sentences per watermarked text;
* ``sampled_per_kept_token`` -- tokens sampled over all candidates per token kept (the rejection overhead);
* ``nll`` -- text quality: the mean negative log-probability of the kept tokens under the model's sampling
  distribution (``softmax(logits / temperature)``; lower = more typical text for the model);
* ``z`` / ``detection_rate`` -- mean z over texts with a defined z, and the fraction of texts detected
  (``z > threshold``; a text with fewer than two sentences is never detected);
* ``undefined_rate`` -- texts whose z is undefined (fewer than two sentences);
* ``plain_z`` / ``plain_detection_rate`` / ``plain_nll`` -- the same on the unwatermarked texts (``nll -
  plain_nll`` is the quality cost of the watermark);
* ``<attack>/z`` / ``<attack>/detection_rate`` -- the watermarked texts after each attack.

With ``human`` (unwatermarked reference texts, :func:`zoo.watermark.evaluation.human_texts`) also:

* ``occupancy_entropy`` -- entropy of the regions of the human sentences over ``log R`` (1 = equal mass);
* ``human_green_rate`` / ``human_green_rate_sd`` -- ``P(green | human)`` averaged over ``keys`` keys and its sd
  over keys (``gamma`` for every key only under equal mass);
* ``human_fpr_empirical_mean`` / ``_sd`` / ``_max`` -- per key, the false-positive rate **measured** on the human
  texts at the fixed threshold (the fraction detected, :func:`~zoo.watermark.evaluation.empirical_fpr`);
* ``human_fpr_mean`` / ``human_fpr_sd`` / ``human_fpr_max`` -- the binomial **approximation** of the same per-key
  rate (the tail at that key's green probability, sentences taken as independent);
* ``human_detection_rate`` -- human texts detected under the run's key (its measured FPR);
* ``threshold_at_fpr`` -- the z threshold whose measured FPR on the human texts under the run's key is at most
  ``fpr`` (:func:`~zoo.watermark.evaluation.empirical_threshold`);
* ``tpr_at_fpr`` and ``<attack>/tpr_at_fpr`` -- the detection rate at the threshold that flags ``fpr`` of the
  human texts under the run's key;
* ``human_fpr_at_threshold`` and ``plain_fpr_at_threshold`` -- the human texts, and the model's own unwatermarked
  texts, flagged at ``threshold_at_fpr``;
* ``human/<family>/detection_rate``, ``human/<family>/fpr_at_threshold`` and ``human/<family>/occupancy_entropy``
  -- the same per family of human texts (``human`` given as a list).

``human`` may list several families of negatives (say grammar texts and real sentences); they are pooled. With
``calibration > 0`` that fraction of each family's texts (a seeded split,
:func:`~zoo.watermark.evaluation.split_negatives`) only chooses ``threshold_at_fpr``, and ``human_detection_rate``,
``human_fpr_at_threshold`` and the per-family rates are measured on the other texts: the reported FPR is then out
of sample. The per-key calibration uses every human text (it chooses nothing).

and the per-key values are written to ``<save_dir>/calibration.json`` (``keys``, ``green_rate``, ``fpr_empirical``,
``fpr``: the binomial approximation).

In predict, each row of the step output's ``meta`` also gets ``watermarked``, ``watermark_z``,
``watermark_detected``, ``watermark_wsr`` (and ``plain``, ``plain_z`` with the baseline), so ``predictions.jsonl``
holds them. At setup the partition (fit on first use when the decoder is configured with fit settings) is saved to
``<save_dir>/partition.safetensors`` + ``.json`` with ``watermark.json`` (key, gamma, threshold), ready for
``python -m zoo.watermark.detect --key <key> --partition <save_dir>/partition.safetensors text.txt``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import (
    STAGES,
    StageCallback,
    log_stage_metrics,
    ratios,
    require_generating_module,
    summed_over_ranks,
)
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.protocols import SamplingParams
from zoo.watermark.attacks import Attack
from zoo.watermark.decoder import SemanticWatermarkDecoder, WatermarkGenerationResult
from zoo.watermark.detect import DEFAULT_Z_THRESHOLD, detect
from zoo.watermark.evaluation import (
    empirical_fpr,
    empirical_threshold,
    false_positive_rate,
    green_probability_per_key,
    human_texts,
    occupancy_entropy,
    split_negatives,
    tpr_at_fpr,
    transition_counts,
    z_scores_per_key,
)

_BASE_COUNTERS = (
    "texts",
    "sentences",
    "passed",
    "trials",
    "kept_tokens",
    "kept_nll",
    "sampled_tokens",
    "z_sum",
    "z_defined",
    "detected",
    "plain_texts",
    "plain_kept_tokens",
    "plain_kept_nll",
    "plain_z_sum",
    "plain_z_defined",
    "plain_detected",
)


class WatermarkCallback(StageCallback):
    """Watermark every evaluated batch's prompts and log success, trials and detection (module docstring).

    Args:
        decoder: the watermark decoder (or a mapping of :class:`~zoo.watermark.decoder.SemanticWatermarkDecoder`
            arguments).
        stages: among ``validate`` (also validation during fit), ``test``, ``predict``.
        max_new_tokens: token budget of one text (default: ``max_sentences x sentence_max_tokens`` of the decoder,
            else the module's ``sampling.max_new_tokens``).
        temperature, top_k, top_p: sampling of the candidates (SemStamp samples at temperature 0.7).
        seed: sampling seed (batch ``i`` uses ``seed + i``; the unwatermarked baseline another stream).
        threshold: the fixed detection threshold on z.
        plain_baseline: also write and detect unwatermarked texts.
        attacks: name -> attack (``text -> text``, :mod:`zoo.watermark.attacks`) applied before detection.
        max_rows: prompts watermarked per batch (``None``: all).
        max_batches: batches per epoch (``None``: all).
        human: keyword arguments of :func:`~zoo.watermark.evaluation.human_texts` (``corpus``, ``texts``,
            ``sentences``, ``seed``): unwatermarked reference texts for calibration and TPR at ``fpr``; or a list
            of such mappings, each with an optional ``name`` (default: its corpus), the families of negatives
            (same ``sentences`` in each); ``None`` skips those metrics.
        calibration: fraction of each family's human texts that only chooses ``threshold_at_fpr`` (0: every text
            chooses it and is reported).
        keys: keys (``0 .. keys - 1``) of the per-key calibration.
        fpr: the false-positive rate of ``tpr_at_fpr``.
        save_dir: where the partition and settings are saved at setup (default ``<default_root_dir>/watermark``).
        log_prefix: metric name prefix.
    """

    def __init__(
        self,
        decoder: SemanticWatermarkDecoder | Mapping[str, Any],
        stages: Sequence[str] = ("test", "predict"),
        max_new_tokens: int | None = None,
        temperature: float = 0.7,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        threshold: float = DEFAULT_Z_THRESHOLD,
        plain_baseline: bool = True,
        attacks: Mapping[str, Attack] | None = None,
        max_rows: int | None = 16,
        max_batches: int | None = 1,
        human: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        calibration: float = 0.0,
        keys: int = 200,
        fpr: float = 0.01,
        save_dir: str | None = None,
        log_prefix: str = "watermark",
    ) -> None:
        super().__init__()
        unknown = [s for s in stages if s not in STAGES]
        if unknown or not stages:
            raise ConfigError(f"WatermarkCallback: stages must be a non-empty subset of {STAGES}, got {list(stages)}")
        attacks = dict(attacks or {})
        for name, value in (("max_new_tokens", max_new_tokens), ("max_rows", max_rows), ("max_batches", max_batches)):
            if value is not None and value < 1:
                raise ConfigError(f"WatermarkCallback: {name} must be >= 1 or null, got {value}")
        if temperature <= 0:
            raise ConfigError(f"WatermarkCallback: temperature must be > 0, got {temperature}")
        for name, attack in attacks.items():
            if not callable(attack) or "/" in name:
                raise ConfigError(
                    f"WatermarkCallback: attack {name!r} must be a callable text -> text named without '/'"
                )
        if keys < 1 or not 0.0 <= fpr < 1.0:
            raise ConfigError(f"WatermarkCallback: need keys >= 1 and fpr in [0, 1), got {keys} and {fpr}")
        self.decoder = decoder if isinstance(decoder, SemanticWatermarkDecoder) else SemanticWatermarkDecoder(**decoder)
        self.families, self.human, self.human_sentences, self.calibration_texts = _negatives(human, calibration)
        self.keys = int(keys)
        self.fpr = float(fpr)
        self._calibration: dict[str, float] | None = None
        self._human_z: list[float | None] | None = None
        self._z: dict[str, list[float | None]] = {}
        self.per_key: dict[str, list[float]] = {}
        self.max_new_tokens = max_new_tokens
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.threshold = float(threshold)
        self.plain_baseline = plain_baseline
        self.attacks = attacks
        self.max_rows = max_rows
        self.stages = tuple(stages)
        self.max_batches = max_batches
        self.log_prefix = log_prefix
        self.save_dir = save_dir
        self.saved_partition: Path | None = None
        self.counters = (*_BASE_COUNTERS, *(f"{a}/{k}" for a in attacks for k in ("z_sum", "z_defined", "detected")))
        self.counts = dict.fromkeys(self.counters, 0.0)
        self.last_metrics: dict[str, float] = {}

    # -- setup ------------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        require_generating_module(pl_module, "WatermarkCallback")
        scheme = self.decoder.scheme  # load the encoder, load or fit the partition now (errors before any step)
        if trainer.is_global_zero:
            self.saved_partition = self._save(trainer, scheme)

    def _save(self, trainer: pl.Trainer, scheme: Any) -> Path:
        folder = Path(self.save_dir) if self.save_dir else Path(trainer.default_root_dir) / "watermark"
        path = scheme.partitioner.save(folder / "partition", encoder=scheme.encoder.name)
        settings = {
            "partition": str(path),
            "encoder": scheme.encoder.name,
            "key": scheme.key,
            "gamma": scheme.gamma,
            "threshold": self.threshold,
            "margin": self.decoder.margin,
            "max_trials": self.decoder.max_trials,
        }
        (folder / "watermark.json").write_text(json.dumps(settings, indent=2) + "\n")
        return path

    # -- per batch --------------------------------------------------------------------------------------------
    def _params(self, pl_module: Any) -> SamplingParams:
        budget = self.max_new_tokens
        if budget is None and self.decoder.max_sentences is not None:
            budget = self.decoder.max_sentences * self.decoder.sentence_max_tokens
        if budget is None:
            budget = getattr(getattr(pl_module, "sampling", None), "max_new_tokens", 64)
        return SamplingParams(
            max_new_tokens=budget, do_sample=True, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p
        )

    @contextmanager
    def _with_module_decoder(self, pl_module: Any) -> Iterator[None]:
        """The module decoder's processors and hooks join the watermark decoder's for one call."""
        own = self.decoder.processors, self.decoder.hooks
        module_decoder = getattr(pl_module, "decoder", None)
        self.decoder.processors = [*own[0], *getattr(module_decoder, "processors", ())]
        self.decoder.hooks = [*own[1], *getattr(module_decoder, "hooks", ())]
        try:
            yield
        finally:
            self.decoder.processors, self.decoder.hooks = own

    def _generate(
        self, pl_module: Any, prompts: list[str], seed: int, plain: bool = False
    ) -> WatermarkGenerationResult:
        device = next(pl_module.model.parameters()).device
        ids, mask = encode_prompts(pl_module.tokenizer, prompts, device)
        generator = torch.Generator(device=device).manual_seed(seed)
        params = self._params(pl_module)
        with self._with_module_decoder(pl_module):
            decoder = self.decoder.unwatermarked() if plain else self.decoder
            return decoder(pl_module.model, pl_module.tokenizer, ids, mask, params=params, generator=generator)

    def _detect(self, texts: Sequence[str], prefix: str) -> list[float | None]:
        c = self.counts
        zs = []
        for text in texts:
            result = detect(text, self.decoder.scheme, threshold=self.threshold)
            zs.append(result.z)
            if result.z is not None:
                c[f"{prefix}z_sum"] += result.z
                c[f"{prefix}z_defined"] += 1
            c[f"{prefix}detected"] += result.detected
        self._z.setdefault(prefix, []).extend(zs)
        return zs

    def calibration(self) -> dict[str, float]:
        """Metrics of the human texts (computed once: they depend on the scheme only)."""
        if self._calibration is None:
            scheme = self.decoder.scheme
            results = [detect(text, scheme, threshold=self.threshold) for text in self.human]
            self._human_z = [r.z for r in results]
            regions = [r.regions for r in results]
            num_regions = scheme.partitioner.num_regions
            p = green_probability_per_key(transition_counts(regions, num_regions), range(self.keys), scheme.gamma)
            fpr = torch.tensor(
                [false_positive_rate(float(x), self.human_sentences - 1, scheme.gamma, self.threshold) for x in p],
                dtype=torch.float64,
            )
            z = z_scores_per_key(regions, num_regions, range(self.keys), scheme.gamma)
            measured = torch.tensor([empirical_fpr(row.tolist(), self.threshold) for row in z], dtype=torch.float64)
            self._calibration = {
                "occupancy_entropy": occupancy_entropy(torch.tensor([r for rs in regions for r in rs]), num_regions),
                "human_green_rate": float(p.mean()),
                "human_green_rate_sd": float(p.std()) if len(p) > 1 else 0.0,
                "human_fpr_mean": float(fpr.mean()),
                "human_fpr_sd": float(fpr.std()) if len(fpr) > 1 else 0.0,
                "human_fpr_max": float(fpr.max()),
                "human_fpr_empirical_mean": float(measured.mean()),
                "human_fpr_empirical_sd": float(measured.std()) if len(measured) > 1 else 0.0,
                "human_fpr_empirical_max": float(measured.max()),
            }
            chosen, reported = self.calibration_texts
            threshold = empirical_threshold([self._human_z[i] for i in chosen], self.fpr)
            self._calibration["human_detection_rate"] = sum(results[i].detected for i in reported) / len(reported)
            self._calibration["threshold_at_fpr"] = threshold
            self._calibration["human_fpr_at_threshold"] = empirical_fpr([self._human_z[i] for i in reported], threshold)
            for name, members in self.families.items():
                shown = [i for i in reported if i in members]
                self._calibration[f"human/{name}/detection_rate"] = sum(results[i].detected for i in shown) / len(shown)
                self._calibration[f"human/{name}/fpr_at_threshold"] = empirical_fpr(
                    [self._human_z[i] for i in shown], threshold
                )
                self._calibration[f"human/{name}/occupancy_entropy"] = occupancy_entropy(
                    torch.tensor([r for i in sorted(members) for r in regions[i]]), num_regions
                )
            self.per_key = {
                "keys": list(range(self.keys)),
                "green_rate": p.tolist(),
                "fpr_empirical": measured.tolist(),
                "fpr": fpr.tolist(),
            }
        return self._calibration

    def _write_calibration(self, trainer: pl.Trainer) -> None:
        """``<save_dir>/calibration.json``: per-key green rates and FPRs of the human texts (rank zero)."""
        if not trainer.is_global_zero or not self.per_key:
            return
        folder = Path(self.save_dir) if self.save_dir else Path(trainer.default_root_dir) / "watermark"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            **self.per_key,
            "human_texts": len(self.human),
            "human_sentences": self.human_sentences,
            "threshold": self.threshold,
            **(self._calibration or {}),
        }
        (folder / "calibration.json").write_text(json.dumps(record, indent=2) + "\n")

    def stage_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        if self.max_batches is None or batch_idx < self.max_batches:
            self._watermark(pl_module, outputs, batch, batch_idx, stage)

    @torch.no_grad()
    def _watermark(self, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str) -> None:
        prompts = _prompts(outputs, batch)[: self.max_rows]
        if not prompts:
            return
        if getattr(pl_module, "model", None) is None:
            pl_module.configure_model()
        result = self._generate(pl_module, prompts, self.seed + batch_idx)
        c = self.counts
        c["kept_nll"] += _kept_nll(result)
        for text, kept in zip(result.watermarked, result.completion_mask.sum(-1).tolist()):
            c["texts"] += 1
            c["sentences"] += len(text.samples)
            c["passed"] += sum(s.passed for s in text.samples)
            c["trials"] += sum(s.trials for s in text.samples)
            c["kept_tokens"] += kept
        c["sampled_tokens"] += sum(result.sampled_tokens)
        z = self._detect(result.texts, "")
        for name, attack in self.attacks.items():
            self._detect([attack(text) for text in result.texts], f"{name}/")
        plain_texts: list[str] = []
        plain_z: list[float | None] = []
        if self.plain_baseline:
            plain = self._generate(pl_module, prompts, self.seed + 1_000_003 + batch_idx, plain=True)
            plain_texts = plain.texts
            c["plain_texts"] += len(plain_texts)
            c["plain_kept_tokens"] += float(plain.completion_mask.sum())
            c["plain_kept_nll"] += _kept_nll(plain)
            plain_z = self._detect(plain_texts, "plain_")
        if stage == "predict" and isinstance(outputs, dict):
            self._annotate(outputs, result, z, plain_texts, plain_z)

    def _annotate(
        self,
        outputs: dict[str, Any],
        result: WatermarkGenerationResult,
        z: list[float | None],
        plain_texts: list[str],
        plain_z: list[float | None],
    ) -> None:
        """Per-row watermark columns in the predict output's meta (rows past ``max_rows`` get None)."""
        meta = outputs.setdefault("meta", {})
        rows = len(outputs.get("texts") or meta.get("prompts") or result.texts)

        def column(values: Sequence[Any]) -> list[Any]:
            return [*values, *([None] * (rows - len(values)))]

        meta["watermarked"] = column(result.texts)
        meta["watermark_z"] = column(z)
        meta["watermark_detected"] = column([v is not None and v > self.threshold for v in z])
        meta["watermark_wsr"] = column([t.success_rate for t in result.watermarked])
        if self.plain_baseline:
            meta["plain"] = column(plain_texts)
            meta["plain_z"] = column(plain_z)

    # -- per epoch --------------------------------------------------------------------------------------------
    def stage_epoch_start(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        self.counts = dict.fromkeys(self.counters, 0.0)
        self._z = {}

    def compute_metrics(self, c: Mapping[str, float]) -> dict[str, float]:
        """Rates from counters (metrics whose denominator is 0 are left out)."""
        spec = {
            "wsr": ("passed", "sentences"),
            "mean_trials": ("trials", "sentences"),
            "sentences": ("sentences", "texts"),
            "sampled_per_kept_token": ("sampled_tokens", "kept_tokens"),
            "nll": ("kept_nll", "kept_tokens"),
            "plain_nll": ("plain_kept_nll", "plain_kept_tokens"),
            "z": ("z_sum", "z_defined"),
            "detection_rate": ("detected", "texts"),
            "plain_z": ("plain_z_sum", "plain_z_defined"),
            "plain_detection_rate": ("plain_detected", "plain_texts"),
        }
        for name in self.attacks:
            spec[f"{name}/z"] = (f"{name}/z_sum", f"{name}/z_defined")
            spec[f"{name}/detection_rate"] = (f"{name}/detected", "texts")
        metrics = ratios(c, spec)
        if c["texts"]:
            metrics["undefined_rate"] = 1.0 - c["z_defined"] / c["texts"]
        return metrics

    def stage_epoch_end(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if stage not in self.stages or trainer.sanity_checking:
            return
        counters = summed_over_ranks(trainer, self.counts)
        if not counters["texts"]:
            return
        metrics = self.compute_metrics(counters)
        if self.human:
            metrics.update(self.calibration())
            self._write_calibration(trainer)
            chosen = [(self._human_z or [])[i] for i in self.calibration_texts[0]]
            for prefix in ("", *(f"{name}/" for name in self.attacks)):
                tpr, _ = tpr_at_fpr(self._z.get(prefix, []), chosen, self.fpr)
                metrics[f"{prefix}tpr_at_fpr"] = tpr
            if self._z.get("plain_"):
                metrics["plain_fpr_at_threshold"] = empirical_fpr(self._z["plain_"], metrics["threshold_at_fpr"])
        self.last_metrics = metrics
        log_stage_metrics(trainer, pl_module, metrics, self.log_prefix, stage)

    # -- state ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"last_metrics": dict(self.last_metrics)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_metrics = {k: float(v) for k, v in state_dict.get("last_metrics", {}).items()}


def _negatives(
    human: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None, calibration: float
) -> tuple[dict[str, set[int]], list[str], int, tuple[list[int], list[int]]]:
    """The human texts of one or several families: ``(family -> text indices, texts, sentences per text,
    (calibration indices, reported indices))``, each family split on its own (:func:`split_negatives`)."""
    if not human:
        return {}, [], 0, ([], [])
    specs = [human] if isinstance(human, Mapping) else list(human)
    families: dict[str, set[int]] = {}
    texts: list[str] = []
    chosen: list[int] = []
    reported: list[int] = []
    sentences = {int(spec.get("sentences", 20)) for spec in specs}
    if len(sentences) != 1:
        raise ConfigError(f"WatermarkCallback: every family of human texts needs the same sentences, got {sentences}")
    for spec in specs:
        options = {k: v for k, v in spec.items() if k != "name"}
        name = str(spec.get("name") or options.get("corpus", "topics"))
        if name in families or "/" in name:
            raise ConfigError(f"WatermarkCallback: human families need distinct names without '/', got {name!r}")
        family = human_texts(**options)
        a, b = split_negatives(len(family), calibration, int(options.get("seed", 12345)))
        chosen += [len(texts) + i for i in a]
        reported += [len(texts) + i for i in b]
        families[name] = set(range(len(texts), len(texts) + len(family)))
        texts += family
    return families, texts, sentences.pop(), (chosen, reported)


def _kept_nll(result: WatermarkGenerationResult) -> float:
    """Summed negative log-probability of the kept (completion) tokens of a generation."""
    return -float((result.logprobs * result.completion_mask).sum())


def _prompts(outputs: Any, batch: Any) -> list[str]:
    meta = outputs.get("meta", {}) if isinstance(outputs, dict) else {}
    prompts = meta.get("prompts")
    if prompts is None and isinstance(batch, dict):
        prompts = batch.get("prompts")
    if prompts is None:
        raise ConfigError(
            "WatermarkCallback: neither the step output's meta['prompts'] nor batch['prompts'] exists; return the "
            "generation protocol dict from validation_step/test_step/predict_step (zoo.protocols.GenerationOutput)"
        )
    return [str(p) for p in prompts]
