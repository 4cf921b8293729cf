"""RegMix's predictability check, logged by the run that trains on RegMix's mixture before its first step.

RegMix (arXiv 2407.01492) trusts its mixture only as far as the regressor ranks mixtures it has not seen (the paper's
"mixing predictability": Spearman rho on held-out proxies). ``zoo.cli.mixing.regmix_weights`` writes the per-split
rho next to the mixture (``regmix.json`` beside ``weights.json``); this callback reads it when training starts,
before the final LM takes a step, and puts it in the run directory:

- logged metrics (step 0 of ``csv/metrics.csv``): ``regmix/spearman`` (mean over the splits), ``regmix/spearman_sd``,
  ``regmix/spearman_splits``, ``regmix/proxies``, ``regmix/works`` (1 when the mean rho exceeds ``min_rho``), and for
  each regressor of ``compare`` its own held-out rho on the *same* proxies and splits, ``regmix/spearman_<name>``
  (e.g. LightGBM, the official regressor, beside the ridge fallback the mixture was chosen with);
- ``output_file`` (JSON): the same numbers with the per-split values.

A mean rho at or below ``min_rho`` is logged as a warning (``on_fail: warn``) or stops the run before training
(``on_fail: stop``, a ``ConfigError``): the final LM would test a mixture the proxies do not support.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.errors import ConfigError
from zoo.mixing.regmix import REGRESSORS, holdout_spearman, lightgbm_available

log = logging.getLogger("zoo")

ON_FAIL = ("warn", "stop")


def read_regmix_report(weights_file: str | Path) -> dict[str, Any]:
    """``regmix.json`` beside a RegMix ``weights.json`` (``ConfigError`` when there is none)."""
    path = Path(weights_file).parent / "regmix.json"
    if not path.is_file():
        raise ConfigError(
            f"RegMixCheck: no regmix.json beside {weights_file} (datamodule.sampler.weights_file must be the "
            "weights.json of zoo.cli.mixing.regmix_weights)"
        )
    return json.loads(path.read_text())


def check_report(
    report: Mapping[str, Any],
    *,
    min_rho: float = 0.0,
    compare: Sequence[str] = (),
    num_splits: int = 10,
    seed: int = 0,
    regressor_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The check's numbers from a ``regmix.json``: the chosen regressor's per-split rho (as written) and each
    ``compare`` regressor's, recomputed on the same proxies with the same splits (``holdout_spearman`` with the same
    seed draws the same permutations)."""
    rhos = [float(r) for r in report.get("spearman", [])]
    finite = [r for r in rhos if not math.isnan(r)]
    mean = sum(finite) / len(finite) if finite else math.nan
    sd = (
        math.sqrt(sum((r - mean) ** 2 for r in finite) / (len(finite) - 1)) if len(finite) > 1 else math.nan
    )  # sample sd over the splits
    proxies = report.get("proxies", [])
    out: dict[str, Any] = {
        "spearman": mean,
        "spearman_sd": sd,
        "spearman_splits": rhos,
        "proxies": len(proxies),
        "min_rho": min_rho,
        "works": bool(finite) and mean > min_rho,
        "compare": {},
    }
    if compare and len(proxies) >= 4:
        domains = sorted(proxies[0]["mixture"])
        mixtures = torch.tensor([[p["mixture"][d] for d in domains] for p in proxies], dtype=torch.float64)
        losses = torch.tensor([float(p["loss"]) for p in proxies], dtype=torch.float64)
        for name in compare:
            values = holdout_spearman(mixtures, losses, name, num_splits, seed=seed, **dict(regressor_options or {}))
            kept = [v for v in values if not math.isnan(v)]
            out["compare"][name] = {"spearman": sum(kept) / len(kept) if kept else math.nan, "splits": values}
    return out


class RegMixCheck(Callback):
    """Read RegMix's held-out rank correlation when training starts and log it in the run directory.

    Args:
        weights_file: the run's ``datamodule.sampler.weights_file`` (RegMix's ``weights.json``).
        output_file: where the check's JSON goes (e.g. ``${paths.output_dir}/regmix_check.json``); ``None``: none.
        min_rho: the arm works when the mean held-out rho exceeds this (0: better than chance on average).
        on_fail: ``warn`` (log and train) or ``stop`` (refuse to train the final LM).
        compare: other regressors (``lightgbm``, ``linear``) whose held-out rho on the same proxies is logged too;
            one that is not installed is skipped with a warning.
        num_splits, seed, regressor_options: those of the RegMix step (same splits; LightGBM's options).
    """

    def __init__(
        self,
        weights_file: str | Path,
        output_file: str | Path | None = None,
        min_rho: float = 0.0,
        on_fail: str = "warn",
        compare: Sequence[str] = (),
        num_splits: int = 10,
        seed: int = 0,
        regressor_options: Mapping[str, Any] | None = None,
    ) -> None:
        if on_fail not in ON_FAIL:
            raise ConfigError(f"RegMixCheck.on_fail must be one of {ON_FAIL}, got {on_fail!r}")
        unknown = [name for name in compare if name not in REGRESSORS or name == "auto"]
        if unknown:
            raise ConfigError(f"RegMixCheck.compare: unknown regressor(s) {unknown}; use lightgbm or linear")
        self.weights_file = weights_file
        self.output_file = output_file
        self.min_rho = float(min_rho)
        self.on_fail = on_fail
        self.compare = [n for n in compare if n != "lightgbm" or lightgbm_available()]
        if len(self.compare) < len(compare):
            log.warning("RegMixCheck: LightGBM is not installed; its held-out rho is not compared")
        self.num_splits = num_splits
        self.seed = seed
        self.regressor_options = dict(regressor_options or {})
        self.result: dict[str, Any] | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        result = check_report(
            read_regmix_report(self.weights_file),
            min_rho=self.min_rho,
            compare=self.compare,
            num_splits=self.num_splits,
            seed=self.seed,
            regressor_options=self.regressor_options,
        )
        self.result = result
        if self.output_file is not None and trainer.is_global_zero:
            path = Path(self.output_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2, sort_keys=True))
        metrics = {
            "regmix/spearman": result["spearman"],
            "regmix/spearman_sd": result["spearman_sd"],
            "regmix/spearman_splits": float(len(result["spearman_splits"])),
            "regmix/proxies": float(result["proxies"]),
            "regmix/works": float(result["works"]),
            **{f"regmix/spearman_{name}": v["spearman"] for name, v in result["compare"].items()},
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if not result["works"]:
            message = (
                f"RegMix's regressor ranks held-out proxies at rho {result['spearman']:.3f} (mean of "
                f"{len(result['spearman_splits'])} splits, {result['proxies']} proxies), not above {self.min_rho}: the "
                "final LM trains on a mixture the proxies do not support"
            )
            if self.on_fail == "stop":
                raise ConfigError(message + " (callbacks.regmix_check.on_fail=stop)")
            log.warning(message)
