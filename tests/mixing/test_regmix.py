"""RegMix (arXiv 2407.01492) pieces matched to the repo (sail-sg/regmix): the proxy mixtures of
``mixture_config/synthesize_mixture.py`` (``Dir(c * prior)``, 15 strengths, maximum-usage bound, rounding,
de-duplication), the notebook's LightGBM (defaults, early stopping) and its ``Dir(prior)`` simulation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from zoo.errors import ConfigError
from zoo.mixing.regmix import (
    LinearRegressor,
    fit_regressor,
    mixture_prior,
    predict_best_mixture,
    sample_mixtures,
    usage_bound,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_proxy_mixtures_are_dirichlet_of_c_times_the_prior_not_c_k_prior():
    """``Dir(alpha)`` with ``sum alpha = c`` has ``Var w_k = p_k (1 - p_k) / (c + 1)``; ``Dir(c K prior)`` would give
    ``/ (c K + 1)``, three times smaller here (K = 4, c = 2)."""
    prior = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    c = 2.0
    w = sample_mixtures(prior, 4000, concentration=(c, c), min_weight=0.0, num_strengths=1, sample_multiplier=1)
    expected = prior * (1 - prior) / (c + 1)
    torch.testing.assert_close(w.var(dim=0), expected, rtol=0.1, atol=0)
    torch.testing.assert_close(w.mean(dim=0), prior, rtol=0.05, atol=0)
    wrong = prior * (1 - prior) / (c * len(prior) + 1)
    assert bool((w.var(dim=0) > 2 * wrong).all())


def test_strengths_are_the_repo_grid_of_15_log_spaced_values():
    """Mean largest weight over many draws: one strength of the grid (c = 0.1, very sparse) against the repo's 15
    values between 0.1 and 5 (many near-uniform draws), against a single c = 5."""
    prior = torch.full((4,), 0.25, dtype=torch.float64)
    settings = {"min_weight": 0.0, "sample_multiplier": 3}  # c = 0.1 draws exact one-hot duplicates
    sparse = sample_mixtures(prior, 3000, concentration=(0.1, 0.1), num_strengths=1, **settings)
    grid = sample_mixtures(prior, 3000, concentration=(0.1, 5.0), **settings)
    flat = sample_mixtures(prior, 3000, concentration=(5.0, 5.0), num_strengths=1, **settings)
    peaks = [float(m.max(dim=1).values.mean()) for m in (sparse, grid, flat)]
    assert peaks[0] > 0.9 and peaks[2] < 0.6 and peaks[2] < peaks[1] < peaks[0]


def test_no_domain_is_sampled_beyond_its_maximum_usage():
    """``MAXIMUM_USAGE = 15``: a domain holding 0.1% of the tokens gets at most 1.5% of the mixture."""
    shares = torch.tensor([0.9, 0.09, 0.009, 0.001], dtype=torch.float64)
    bound = usage_bound(shares, 15)
    torch.testing.assert_close(bound, torch.tensor([1.0, 1.0, 0.135, 0.015], dtype=torch.float64))
    prior = mixture_prior(shares, temperature=0.5)
    free = sample_mixtures(prior, 200, min_weight=1e-3, seed=1)
    assert bool((free > bound).any()), "without the bound the tempered prior oversamples the small domains"
    bounded = sample_mixtures(prior, 200, min_weight=1e-3, seed=1, bound=bound)
    assert bool((bounded <= bound + 1e-3 / 2).all())  # the bound, up to the rounding to multiples of 1e-3
    assert torch.equal(usage_bound(shares, None), torch.ones(4, dtype=torch.float64))
    with pytest.raises(ConfigError, match="max_usage"):
        usage_bound(shares, 0)


def test_mixtures_are_rounded_to_the_minimum_and_distinct():
    prior = torch.full((3,), 1 / 3, dtype=torch.float64)
    w = sample_mixtures(prior, 40, min_weight=0.05, seed=0)
    steps = w / 0.05
    torch.testing.assert_close(steps, steps.round(), atol=1e-9, rtol=0)  # np.round(w / m) * m
    assert len(np.unique(w.numpy().round(9), axis=0)) == 40  # de-duplicated
    assert float((w.sum(dim=1) - 1).abs().max()) <= 3 * 0.05 / 2 + 1e-12
    # rows of multiples of 0.05 summing to 0.95, 1 or 1.05: 210 + 231 + 253 points; asking for more is a clear error
    with pytest.raises(ConfigError, match="distinct mixtures"):
        sample_mixtures(prior, 700, min_weight=0.05, seed=0)


def test_lightgbm_stops_early_on_the_held_out_proxies():
    pytest.importorskip("lightgbm")
    from zoo.mixing.regmix import LightGBMRegressor

    assert LightGBMRegressor().model.get_params()["min_child_samples"] == 20  # LightGBM's (the notebook's) default
    rng = torch.Generator().manual_seed(0)
    x = sample_mixtures(torch.full((4,), 0.25, dtype=torch.float64), 60, seed=2)
    y = torch.rand(60, generator=rng, dtype=torch.float64)  # noise: the held-out l2 stops improving at once
    full = LightGBMRegressor(min_child_samples=2).fit(x[:45], y[:45])
    stopped = LightGBMRegressor(min_child_samples=2).fit(x[:45], y[:45], eval_set=(x[45:], y[45:]))
    assert full.num_trees == 1000 and stopped.num_trees < 100
    final = fit_regressor("lightgbm", x, y, min_child_samples=2)
    assert isinstance(final, LightGBMRegressor) and final.num_trees < 100
    assert isinstance(fit_regressor("linear", x, y), LinearRegressor)


class RecordingLinear(LinearRegressor):
    """The real ridge regressor, keeping the candidates it was asked to score."""

    def predict(self, mixtures):
        self.seen = mixtures
        return super().predict(mixtures)


def test_simulated_candidates_are_dirichlet_of_the_prior():
    """The notebook simulates ``np.random.dirichlet(prior_dist * 1, 100000)``: total concentration 1, no minimum, no
    rounding, so ``Var w_k = p_k (1 - p_k) / 2`` and many entries are below 2e-4."""
    prior = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    mixtures = sample_mixtures(prior, 32, seed=0)
    model = RecordingLinear().fit(mixtures, mixtures @ torch.tensor([3.0, 1.0, 2.0, 4.0], dtype=torch.float64))
    best = predict_best_mixture(model, prior, num_simulations=20000, top_k=16, seed=3)
    seen = model.seen
    torch.testing.assert_close(seen.sum(dim=1), torch.ones(20000, dtype=torch.float64))
    torch.testing.assert_close(seen.var(dim=0), prior * (1 - prior) / 2, rtol=0.1, atol=0)
    assert bool(((seen > 0) & (seen < 2e-4)).any())
    assert int(best.argmax()) == 1 and best.sum().item() == pytest.approx(1.0)


def test_the_toy_lightgbm_setting_lives_in_the_toy_configs():
    for path in ("method/regmix.yaml", "demo/gem/mixer/regmix.yaml"):
        node = OmegaConf.load(CONF / path)
        regmix = node.datamodule.sampler.weights_file
        assert regmix.regressor_options.min_child_samples == 2 and regmix.max_usage == 15
