"""The zoo's DoReMi and RegMix pieces against the official code, transcribed line by line.

Official code compared: sangmichaelxie/doremi at 7cde52d (``doremi/trainer.py``, ``update_domain_weights``,
``doremiv1``) and sail-sg/regmix at b004d3a (``regression_fitting/regression.ipynb``: the simulation, the top-k
average and ``scipy.stats.spearmanr``). The transcriptions below keep the official expressions; only the state the
official trainer keeps on ``self`` is passed in. The results page of the GEM demo cites these tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from zoo.mixing.doremi import DoReMiWeights, domain_excess_loss
from zoo.mixing.regmix import LinearRegressor, predict_best_mixture, spearman


def official_doremi_update(
    train_domain_weights: torch.Tensor,
    perdomain_scores_state: torch.Tensor,
    scores: torch.Tensor,
    scores_mask: torch.Tensor,
    domain_ids: torch.Tensor,
    reweight_eta: float,
    reweight_eps: float,
) -> torch.Tensor:
    """``DoReMiTrainer.update_domain_weights`` (doremiv1), with ``self.model.perdomain_scores`` as
    ``perdomain_scores_state`` (updated in place) and the weights returned instead of written."""
    perdomain_scores = []
    for domain_id in range(len(train_domain_weights)):
        domain_mask = domain_ids == domain_id
        perdomain_scores_mask = scores_mask[domain_mask]
        if domain_mask.sum() > 0:
            curr_domain_scores = torch.clip(scores[domain_mask][perdomain_scores_mask], min=0).mean()
        else:
            curr_domain_scores = perdomain_scores_state[domain_id]
        perdomain_scores.append(curr_domain_scores)
    perdomain_scores_state[:] = torch.tensor(perdomain_scores).float()
    log_new_train_domain_weights = torch.log(train_domain_weights) + reweight_eta * perdomain_scores_state
    log_new_train_domain_weights = log_new_train_domain_weights - torch.logsumexp(log_new_train_domain_weights, dim=0)
    return (1 - reweight_eps) * torch.exp(log_new_train_domain_weights) + reweight_eps / len(
        log_new_train_domain_weights
    )


def test_doremi_update_is_the_official_step():
    """Twenty steps over 5 domains with batches of 3 rows, so that domains are often absent (the official rule keeps
    their last score); eta 1, smoothing 1e-3, every score starting at log |vocabulary| as the official model does.
    The official code holds the scores in float32, so the weights agree to float32 precision."""
    k, eta, eps, vocab = 5, 1.0, 1e-3, 64
    generator = torch.Generator().manual_seed(0)
    zoo = DoReMiWeights(k, eta=eta, smoothing=eps, initial_score=math.log(vocab))
    weights = torch.full((k,), 1.0 / k)
    scores_state = torch.full((k,), math.log(vocab))
    absent_steps = 0
    for _ in range(20):
        domain_ids = torch.randint(0, k, (3,), generator=generator)
        proxy = torch.rand(3, 8, generator=generator) * 3
        reference = torch.rand(3, 8, generator=generator) * 3
        mask = torch.rand(3, 8, generator=generator) > 0.2
        mask[:, 0] = True
        absent_steps += int(len(set(domain_ids.tolist())) < k)
        weights = official_doremi_update(weights, scores_state, proxy - reference, mask, domain_ids, eta, eps)
        ours = zoo.step(domain_excess_loss(proxy, reference, mask, domain_ids, k))
        torch.testing.assert_close(ours, weights.double(), rtol=0, atol=1e-6)
    assert absent_steps == 20  # three rows never cover five domains: every step exercises the absent-domain rule
    assert float((zoo.current - 1 / k).abs().max()) > 1e-2  # the weights moved


@pytest.mark.parametrize("seed", [0, 1])
def test_regmix_top_k_average_is_the_notebooks(seed):
    """The notebook: ``samples = np.random.dirichlet(prior_dist * 1, 100000)``, ``simulation =
    predictor.predict(samples)``, ``top_k_samples = samples[np.argsort(simulation)[0:k]]``, ``optimal_data_mixture =
    np.mean(top_k_samples, axis=0)``; on the same draws (the zoo's seeded generator) the mixtures agree to rounding."""
    rng = np.random.default_rng(10 + seed)
    prior = torch.as_tensor(rng.dirichlet(np.ones(7)), dtype=torch.float64)
    mixtures = torch.as_tensor(rng.dirichlet(np.ones(7), 40), dtype=torch.float64)
    losses = mixtures @ torch.as_tensor(rng.normal(size=7)) + 0.01 * torch.as_tensor(rng.normal(size=40))
    predictor = LinearRegressor().fit(mixtures, losses)
    num, k = 20_000, 128

    ours = predict_best_mixture(predictor, prior, num, k, seed=seed).numpy()

    prior_dist = prior.numpy()
    samples = np.random.default_rng(seed).dirichlet(prior_dist * 1, num)
    simulation = predictor.predict(torch.as_tensor(samples)).numpy()
    top_k_samples = samples[np.argsort(simulation)[0:k]]
    optimal_data_mixture = np.mean(top_k_samples, axis=0)
    np.testing.assert_allclose(ours, optimal_data_mixture, rtol=0, atol=1e-12)


def test_spearman_is_scipys():
    """The notebook's probe is ``scipy.stats.spearmanr``; with ties (average ranks) as well."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 6, size=15).astype(float)
        b = a + rng.normal(size=15)
        assert spearman(torch.as_tensor(a), torch.as_tensor(b)) == pytest.approx(spearmanr(a, b)[0], abs=1e-12)
