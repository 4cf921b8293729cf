"""DoReMi (arXiv 2305.10429) and RegMix (arXiv 2407.01492) cores: weight updates, excess loss, mixtures, regression."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.errors import ConfigError, DataError
from zoo.mixing import (
    DoReMiWeights,
    domain_excess_loss,
    domain_loss_weights,
    doremi_update,
    holdout_spearman,
    make_regressor,
    mixture_prior,
    predict_best_mixture,
    sample_mixtures,
    spearman,
)
from zoo.mixing.doremi import resolve_absent
from zoo.mixing.regmix import LinearRegressor


def test_doremi_weights_stay_on_simplex_with_floor():
    g = torch.Generator().manual_seed(0)
    weights = torch.full((5,), 0.2, dtype=torch.float64)
    c = 0.05
    for _ in range(50):
        weights = doremi_update(weights, 10 * torch.rand(5, generator=g, dtype=torch.float64), eta=1.0, smoothing=c)
        assert weights.sum().item() == pytest.approx(1.0)
        assert (weights >= c / 5 - 1e-12).all()


def test_larger_excess_loss_gains_weight():
    weights = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    new = doremi_update(weights, torch.tensor([0.1, 0.8, 0.1, 0.0]), eta=1.0, smoothing=1e-3)
    assert new[1] > weights[1]
    assert new[1] == new.max()
    assert new[3] < weights[3]
    # hand value: softmax(log w + eta * excess) smoothed
    expected = torch.softmax(torch.log(weights) + torch.tensor([0.1, 0.8, 0.1, 0.0], dtype=torch.float64), 0)
    assert torch.allclose(new, 0.999 * expected + 0.001 / 4)


def test_zero_excess_only_moves_toward_uniform():
    weights = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    new = doremi_update(weights, torch.zeros(3), eta=1.0, smoothing=0.1)
    assert torch.allclose(new, 0.9 * weights + 0.1 / 3)
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    assert (new - uniform).norm() < (weights - uniform).norm()


def test_an_empty_domain_keeps_its_last_score_by_default():
    """Official rule (doremi/trainer.py update_domain_weights): a domain absent from the step keeps its last score;
    ``absent_domains="zero"`` scores it 0. An unresolved NaN never reaches the update."""
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    last = torch.tensor([0.1, 0.7, 0.2], dtype=torch.float64)
    excess = torch.tensor([0.5, math.nan, 0.0], dtype=torch.float64)
    assert torch.equal(resolve_absent(excess, last), torch.tensor([0.5, 0.7, 0.0], dtype=torch.float64))
    assert torch.equal(resolve_absent(excess, last, "zero"), torch.tensor([0.5, 0.0, 0.0], dtype=torch.float64))
    with pytest.raises(DataError, match="NaN excess"):
        doremi_update(weights, excess, eta=1.0, smoothing=1e-3)
    with pytest.raises(DataError, match="infinite excess"):
        doremi_update(weights, torch.tensor([math.inf, 0.0, 0.0]), eta=1.0, smoothing=1e-3)
    with pytest.raises(ConfigError, match="absent_domains"):
        resolve_absent(excess, last, "drop")


def test_returned_weights_are_the_running_average():
    state = DoReMiWeights(3, eta=1.0, smoothing=1e-3)
    seen = []
    for excess in ([1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.5]):
        seen.append(state.step(torch.tensor(excess)).clone())
    assert torch.allclose(state.average, torch.stack(seen).mean(dim=0))
    assert not torch.allclose(state.average, state.current)
    restored = DoReMiWeights(3)
    restored.load_state_dict(state.state_dict())
    assert torch.allclose(restored.average, state.average) and restored.steps == 3


def test_domain_excess_loss_clips_and_averages_over_tokens():
    proxy = torch.tensor([[2.0, 1.0, 9.0], [0.5, 0.5, 0.0], [3.0, 3.0, 3.0]])
    ref = torch.tensor([[1.0, 2.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, False], [True, True, False], [True, True, True]])
    excess = domain_excess_loss(proxy, ref, mask, torch.tensor([0, 0, 1]), 3)
    # domain 0: tokens (2-1)+, (1-2)+, (0.5-1)+, (0.5-0)+ = 1, 0, 0, 0.5 over 4 tokens; domain 1: 2 on 3 tokens
    assert excess[0].item() == pytest.approx(1.5 / 4)
    assert excess[1].item() == pytest.approx(2.0)
    assert math.isnan(excess[2].item())


def test_domain_loss_weights_give_the_weighted_per_domain_mean():
    token_losses = [torch.tensor([1.0, 3.0]), torch.tensor([2.0]), torch.tensor([10.0, 10.0, 10.0])]
    domains = torch.tensor([0, 0, 1])
    counts = torch.tensor([2.0, 1.0, 3.0])
    alpha = torch.tensor([0.8, 0.2])
    w = domain_loss_weights(alpha, counts, domains)
    loss = sum(wi * t.sum() for wi, t in zip(w, token_losses)) / counts.sum()
    expected = 0.8 * (6.0 / 3) + 0.2 * 10.0
    assert loss.item() == pytest.approx(expected)


def test_dirichlet_mixtures_sum_to_one_and_respect_the_minimum():
    prior = mixture_prior([1000, 300, 50, 5, 1], temperature=0.5)
    mixtures = sample_mixtures(prior, 500, min_weight=0.01, seed=3)
    assert mixtures.shape == (500, 5)
    # rounded to multiples of min_weight after renormalising (the repo): sums within K * min_weight / 2 of 1
    assert float((mixtures.sum(dim=1) - 1).abs().max()) <= 5 * 0.01 / 2 + 1e-12
    positive = mixtures[mixtures > 0]
    assert (positive >= 0.01).all()
    assert (mixtures == 0).any()  # small concentrations do produce sparse mixtures
    assert torch.equal(mixtures, sample_mixtures(prior, 500, min_weight=0.01, seed=3))


def test_prior_temperature():
    assert torch.allclose(mixture_prior([4, 1], temperature=0.5), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    with pytest.raises(ConfigError, match="token_counts"):
        mixture_prior([3, 0])


@pytest.mark.parametrize("regressor", ["linear", "lightgbm"])
def test_regressor_top_k_concentrates_on_the_best_domain(regressor):
    if regressor == "lightgbm":
        pytest.importorskip("lightgbm")
    cost = torch.tensor([3.0, 1.0, 2.5, 4.0], dtype=torch.float64)  # domain 1 is best
    prior = torch.full((4,), 0.25, dtype=torch.float64)
    mixtures = sample_mixtures(prior, 64, seed=0)
    losses = mixtures @ cost
    model = make_regressor(regressor).fit(mixtures, losses)
    best = predict_best_mixture(model, prior, num_simulations=5000, top_k=32, seed=1)
    assert int(best.argmax()) == 1
    assert best[1] > 0.5
    assert best.sum().item() == pytest.approx(1.0)


def test_spearman_and_holdout_probe():
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, 20.0, 30.0])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 2.0, 1.0])) == pytest.approx(-1.0)
    cost = torch.tensor([3.0, 1.0, 2.5], dtype=torch.float64)
    mixtures = sample_mixtures(torch.full((3,), 1 / 3, dtype=torch.float64), 40, seed=0)
    rhos = holdout_spearman(mixtures, mixtures @ cost, regressor="linear", num_splits=5)
    assert min(rhos) > 0.9
    shuffled = holdout_spearman(mixtures, torch.rand(40, generator=torch.Generator().manual_seed(0)), "linear", 5)
    assert sum(shuffled) / 5 < 0.6


def test_missing_lightgbm_gives_an_actionable_message(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "lightgbm":
            raise ImportError("no lightgbm")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(ConfigError, match=r"paperzoo\[mixing\].*regressor=linear"):
        make_regressor("lightgbm")
    assert isinstance(make_regressor("auto"), LinearRegressor)
