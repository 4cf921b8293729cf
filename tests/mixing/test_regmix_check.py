"""RegMix's run-time check (callbacks/regmix_check.py) and its selection split (zoo/data/regmix_split.py): the run that
trains on RegMix's mixture logs the held-out rank correlation before its first step, in its own run directory, and
RegMix's proxies can score on a split the final model is not reported on."""

from __future__ import annotations

import csv
import json
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from zoo.callbacks import RegMixCheck
from zoo.data.regmix_split import RegMixSelectionSource
from zoo.data.sources import RowSource
from zoo.errors import ConfigError
from zoo.mixing.regmix import holdout_spearman, lightgbm_available

DOMAINS = ["b00", "b01", "b02", "b03"]


def write_regmix(directory, *, noise: float, num: int = 24, seed: int = 0, splits: int = 6):
    """A ``weights.json`` + ``regmix.json`` as ``zoo.cli.mixing.regmix_weights`` writes them: proxies whose loss is a
    linear function of the mixture plus ``noise``, and the per-split rho of the linear regressor."""
    rng = np.random.default_rng(seed)
    mixtures = torch.as_tensor(rng.dirichlet(np.ones(len(DOMAINS)), num), dtype=torch.float64)
    losses = mixtures @ torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    losses = losses + noise * torch.as_tensor(rng.normal(size=num))
    rhos = holdout_spearman(mixtures, losses, "linear", splits, seed=seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "weights.json").write_text(json.dumps(dict(zip(DOMAINS, [0.7, 0.1, 0.1, 0.1]))))
    report = {
        "spearman": rhos,
        "spearman_mean": sum(rhos) / len(rhos),
        "proxies": [{"mixture": dict(zip(DOMAINS, m)), "loss": v} for m, v in zip(mixtures.tolist(), losses.tolist())],
    }
    (directory / "regmix.json").write_text(json.dumps(report))
    return directory / "weights.json", rhos


class Tiny(pl.LightningModule):
    """One parameter; counts its training steps."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return ((self.w - batch) ** 2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(8, 1), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(callback, tmp_path, module=None):
    module = module or Tiny()
    trainer = pl.Trainer(
        max_steps=2,
        logger=CSVLogger(tmp_path / "logs", name="", version=""),
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    return module, trainer


def logged(tmp_path) -> dict[str, str]:
    with (tmp_path / "logs" / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return {k: v for row in rows for k, v in row.items() if k.startswith("regmix/") and v != ""}


def test_the_check_logs_rho_in_the_run_directory_before_the_first_step(tmp_path):
    weights, rhos = write_regmix(tmp_path / "mixture", noise=0.01)
    callback = RegMixCheck(weights, output_file=tmp_path / "run" / "regmix_check.json", num_splits=6)
    module, _ = fit(callback, tmp_path)
    assert module.steps == 2
    metrics = logged(tmp_path)
    assert float(metrics["regmix/spearman"]) == pytest.approx(sum(rhos) / len(rhos), abs=1e-12)
    assert float(metrics["regmix/spearman"]) > 0.8  # a nearly linear loss: the regressor ranks held-out proxies
    assert float(metrics["regmix/works"]) == 1.0 and float(metrics["regmix/proxies"]) == 24.0
    written = json.loads((tmp_path / "run" / "regmix_check.json").read_text())
    assert written["spearman_splits"] == pytest.approx(rhos) and written["works"] is True


def test_compared_regressor_uses_the_same_splits(tmp_path):
    """Recomputing the linear regressor's rho with the same seed gives exactly the values the RegMix step wrote: the
    compared regressors see the same held-out proxies."""
    weights, rhos = write_regmix(tmp_path / "mixture", noise=0.5, seed=3)
    callback = RegMixCheck(weights, compare=["linear"], num_splits=6, seed=3)
    fit(callback, tmp_path)
    assert callback.result["compare"]["linear"]["splits"] == pytest.approx(rhos, abs=1e-12)
    assert float(logged(tmp_path)["regmix/spearman_linear"]) == pytest.approx(sum(rhos) / len(rhos), abs=1e-12)


@pytest.mark.skipif(not lightgbm_available(), reason="LightGBM is not installed")
def test_lightgbm_rho_is_logged_beside_the_chosen_regressors(tmp_path):
    weights, _ = write_regmix(tmp_path / "mixture", noise=0.01, num=40)
    callback = RegMixCheck(weights, compare=["lightgbm"], num_splits=4, regressor_options={"min_child_samples": 2})
    fit(callback, tmp_path)
    value = float(logged(tmp_path)["regmix/spearman_lightgbm"])
    assert not math.isnan(value) and value > 0.3  # trees rank a nearly linear loss too, less well than the line


def test_a_regressor_that_does_not_rank_stops_the_run_when_asked(tmp_path):
    weights, rhos = write_regmix(tmp_path / "mixture", noise=100.0, seed=1)
    assert sum(rhos) / len(rhos) < 0.3  # pure noise
    stop = RegMixCheck(weights, min_rho=0.5, on_fail="stop", num_splits=6, seed=1)
    module = Tiny()
    with pytest.raises(ConfigError, match="do not support"):
        fit(stop, tmp_path, module)
    assert module.steps == 0
    warn = RegMixCheck(weights, min_rho=0.5, num_splits=6, seed=1)
    module, _ = fit(warn, tmp_path / "warn")
    assert module.steps == 2 and warn.result["works"] is False


def test_bad_settings_and_a_missing_report_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="on_fail"):
        RegMixCheck(tmp_path / "weights.json", on_fail="ignore")
    with pytest.raises(ConfigError, match="unknown regressor"):
        RegMixCheck(tmp_path / "weights.json", compare=["xgboost"])
    with pytest.raises(ConfigError, match="no regmix.json"):
        fit(RegMixCheck(tmp_path / "weights.json"), tmp_path)


class Splits(RowSource):
    def rows(self, split, required_fields=()):
        return [{"text": split}]


def test_selection_source_reads_val_from_the_test_split():
    source = RegMixSelectionSource(Splits())
    assert [source.rows(s)[0]["text"] for s in ("train", "val", "test")] == ["train", "test", "test"]
    assert RegMixSelectionSource(Splits(), val_split="val").rows("val")[0]["text"] == "val"
    assert source.describe()["val_split"] == "test"
    with pytest.raises(ConfigError, match="val_split"):
        RegMixSelectionSource(Splits(), val_split="dev")


def test_gem_demo_selects_regmix_on_the_test_split_and_checks_rho_before_the_final_lm():
    """conf/demo/gem/mixer/regmix.yaml: the proxies' val split is the corpus' test split; the final LM reads the corpus
    itself (reported on val); the check reads the mixture the run trains on."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+demo=gem", "demo/gem/mixer=regmix"])
    node = cfg.datamodule.sampler.weights_file
    proxy_source = node.proxy_values["datamodule.source"]
    assert proxy_source._target_ == "zoo.data.regmix_split.RegMixSelectionSource"
    assert proxy_source.val_split == "test" and node.target_metric == "val/loss"
    assert cfg.datamodule.source._target_ == "zoo.data.mixture_corpus.BucketedCorpusSource"
    check = cfg.callbacks.regmix_check
    assert check._target_ == "zoo.callbacks.RegMixCheck" and "lightgbm" in check.compare
    assert check.num_splits == node.num_splits and check.seed == node.seed
    assert check.regressor_options == node.regressor_options
