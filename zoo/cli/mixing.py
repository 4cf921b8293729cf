"""Mixtures built by the normal app through the artifact cache: DoReMi's weights, RegMix's proxies and prediction.

Used from configs as ``_target_`` nodes: prerequisite plans (:func:`zoo.artifacts.prerequisite`) that the CLI builds
before the job (:func:`zoo.cli.prerequisites.prepare`); the path they return is what the consuming node receives, e.g.
the mixture datamodule's ``datamodule.sampler.weights_file``:

* :func:`artifact_file` -- a file inside the artifact built by ``python train.py <overrides>`` (DoReMi's average
  weights, ``export/domain_weights.json``; a bucketed corpus, ``export``);
* :func:`regmix_weights` -- RegMix: ``num_proxies`` proxy runs over Dirichlet mixtures (each a cached artifact, the
  normal app with ``datamodule.sampler.weights`` set), a regressor from mixture to the proxies' target metric, the
  top-k average of simulated mixtures, and the rank correlation on held-out proxies; the result is itself cached
  (kind ``regmix_mixture``: ``weights.json`` and ``regmix.json``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.artifacts import Plan, Prerequisite, ensure, prerequisite, read_meta
from zoo.cli.artifacts import compose_config
from zoo.errors import ConfigError
from zoo.mixing.regmix import (
    fit_regressor,
    holdout_spearman,
    mixture_prior,
    predict_best_mixture,
    sample_mixtures,
    usage_bound,
)

log = logging.getLogger("zoo")


def _plain(value: Any) -> Any:
    """A config node as plain containers, interpolations resolved (values passed by a non-recursive node)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


@prerequisite
def artifact_file(
    kind: str,
    overrides: Sequence[str],
    file: str = "export",
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "",
    cache_dir: str | None = None,
    root_dir: str | None = None,
) -> Plan:
    """``<artifact>/<file>`` of the artifact trained by ``python train.py <overrides>`` (built on first use; ``file``
    is relative to the artifact directory, e.g. ``export/domain_weights.json``)."""
    values = {key: _plain(value) for key, value in (values or {}).items()}
    directory = yield Prerequisite(kind, tuple(overrides), values, name=name, cache_dir=cache_dir, root_dir=root_dir)
    path = Path(directory) / file
    if not path.exists():
        raise ConfigError(f"the {kind} artifact at {directory} has no {file}")
    return str(path)


def domain_token_counts(
    overrides: Sequence[str], values: Mapping[str, Any] | None, root_dir: str | None, cache_dir: str | None
) -> dict[str, float]:
    """Characters of text per domain in the training split of the proxies' datamodule (the token counts of a
    character-level tokenizer; RegMix's prior)."""
    cfg = compose_config(overrides, values, root_dir=root_dir, cache_dir=cache_dir)
    source = instantiate(cfg.datamodule.source, _convert_="all")
    column = cfg.datamodule.sampler.get("domain_column", "domain")
    text_column = cfg.datamodule.get("text_column", "text")
    counts: dict[str, float] = {}
    for index, row in enumerate(source.rows("train")):
        if column not in row:
            raise ConfigError(f"train row {index} has no '{column}' column (datamodule.sampler.domain_column)")
        counts[str(row[column])] = counts.get(str(row[column]), 0.0) + len(str(row.get(text_column, "")))
    return dict(sorted(counts.items()))


@prerequisite
def regmix_weights(
    proxy_overrides: Sequence[str],
    proxy_values: Mapping[str, Any] | None = None,
    num_proxies: int = 16,
    proxy_steps: int = 100,
    target_metric: str = "val/loss",
    temperature: float = 0.5,
    concentration: Sequence[float] = (0.1, 5.0),
    min_weight: float = 2e-4,
    max_usage: float | None = 15.0,
    regressor: str = "auto",
    regressor_options: Mapping[str, Any] | None = None,
    num_simulations: int = 100_000,
    top_k: int = 128,
    num_splits: int = 10,
    seed: int = 0,
    *,
    name: str = "",
    cache_dir: str | None = None,
    root_dir: str | None = None,
) -> Plan:
    """Run RegMix and return the path of the predicted mixture ``weights.json`` (``{domain: weight}``).

    Args:
        proxy_overrides: ``python train.py`` overrides of one proxy run (the mixture datamodule with
            ``datamodule/sampler=weighted``, a small model, few steps); each proxy adds its own weights.
        proxy_values: dotted key -> whole config node set on every proxy run (e.g. ``datamodule.source``, the data
            of the consuming run; give the node with ``_recursive_: false`` on the calling node).
        num_proxies: proxy runs (paper: 512; fewer at toy scale, say why where you choose).
        proxy_steps: training steps of each proxy (``trainer.max_steps``; validation at the last step).
        target_metric: the proxy's final metric to minimise (``val/loss``: the held-out loss).
        temperature, concentration, min_weight: Dirichlet prior of the proxy and simulated mixtures
            (:func:`zoo.mixing.regmix.sample_mixtures`; RegMix: 0.5, [0.1, 5], 2e-4).
        max_usage: no proxy mixture uses a domain beyond this many epochs of its tokens (RegMix: 15; ``None``: no
            bound; :func:`zoo.mixing.regmix.usage_bound`).
        regressor: ``auto`` | ``lightgbm`` | ``linear``.
        regressor_options: keyword arguments of the LightGBM regressor (e.g. ``min_child_samples`` for a few proxies).
        num_simulations, top_k: simulated mixtures ``Dir(token shares)`` and how many of the best are averaged
            (RegMix: 100k, 128).
        num_splits: random held-out splits of the Spearman probe.
        seed: seed of the mixtures.
    """
    overrides = [*proxy_overrides, f"trainer.max_steps={proxy_steps}", f"trainer.val_check_interval={proxy_steps}"]
    values = {key: _plain(value) for key, value in (proxy_values or {}).items()}
    counts = domain_token_counts(overrides, values, root_dir, cache_dir)
    domains = list(counts)
    prior = mixture_prior([counts[d] for d in domains], temperature)
    shares = mixture_prior([counts[d] for d in domains], 1.0)
    options = dict(_plain(regressor_options) or {})
    mixtures = sample_mixtures(
        prior,
        num_proxies,
        concentration=tuple(concentration),
        min_weight=min_weight,
        seed=seed,
        bound=usage_bound(shares, max_usage),
    )
    losses = []
    for index, mixture in enumerate(mixtures.tolist()):
        directory = yield Prerequisite(
            "regmix_proxy",
            tuple(overrides),
            {**values, "datamodule.sampler.weights": dict(zip(domains, mixture))},
            name=f"{name}-proxy{index}" if name else f"proxy{index}",
            reason=f"RegMix proxy {index + 1}/{num_proxies}",
            cache_dir=cache_dir,
            root_dir=root_dir,
        )
        metrics = read_meta(directory).get("metrics", {})
        if target_metric not in metrics:
            raise ConfigError(f"RegMix proxy {directory} did not report {target_metric} (has {sorted(metrics)})")
        losses.append(float(metrics[target_metric]))
    spec = {
        "domains": domains,
        "mixtures": mixtures.tolist(),
        "losses": losses,
        "regressor": regressor,
        "num_simulations": num_simulations,
        "top_k": min(top_k, num_simulations),
        "seed": seed,
        "prior": prior.tolist(),
        "concentration": list(concentration),
        "min_weight": min_weight,
        "max_usage": max_usage,
        "regressor_options": options,
    }

    def build(directory: Path) -> dict[str, Any]:
        loss_tensor = torch.tensor(losses, dtype=torch.float64)
        rhos = (
            holdout_spearman(mixtures, loss_tensor, regressor, num_splits, seed=seed, **options)
            if num_proxies >= 4
            else []
        )
        model = fit_regressor(regressor, mixtures, loss_tensor, seed=seed, **options)
        best = predict_best_mixture(model, shares, num_simulations, min(top_k, num_simulations), seed=seed + 1)
        weights = dict(zip(domains, best.tolist()))
        (directory / "weights.json").write_text(json.dumps(weights, indent=2, sort_keys=True))
        finite = [r for r in rhos if r == r]
        report = {
            "weights": weights,
            "spearman": rhos,
            "spearman_mean": sum(finite) / len(finite) if finite else float("nan"),
            "proxies": [{"mixture": dict(zip(domains, m)), "loss": v} for m, v in zip(mixtures.tolist(), losses)],
        }
        (directory / "regmix.json").write_text(json.dumps(report, indent=2, sort_keys=True))
        return {"metrics": {"regmix/spearman": report["spearman_mean"]}}

    path = ensure("regmix_mixture", spec, build, cache_dir, name=name, reason="fit the RegMix regressor")
    return str(path / "weights.json")
