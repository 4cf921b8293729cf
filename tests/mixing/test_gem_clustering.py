"""GEM (arXiv 2605.26121) clustering cores: log-Bessel, the MM objective, E-step, balance, scale invariance, GIS."""

from __future__ import annotations

import math

import pytest
import torch

from zoo.errors import ConfigError, DataError
from zoo.mixing import (
    fit_gem,
    fit_vmf_em,
    geometric_influence_score,
    kmeans,
    log_bessel_iv,
    mass_entropy,
    normalized_mutual_info,
    spherical_kmeans,
    vmf_log_normalizer,
)
from zoo.mixing.clustering import ClusteringResult, gem_e_step, gem_objective, normalize_rows, vmf_scores


def imbalanced_blobs(sizes=(300, 100, 40, 20), dim=16, spread=0.35, seed=0):
    """Points around random unit directions, one blob per size (labels = blob)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(len(sizes), dim, generator=g), dim=1)
    x = torch.cat([centres[i] + spread * torch.randn(n, dim, generator=g) for i, n in enumerate(sizes)])
    labels = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    return x, labels


@pytest.mark.parametrize("nu", [0.0, 0.5, 1.0, 7.0, 47.0, 191.0])
def test_log_bessel_matches_scipy_where_it_is_finite(nu):
    special = pytest.importorskip("scipy.special")
    for x in (1e-3, 0.5, 3.0, 20.0, 39.0, 41.0, 150.0, 900.0, 5000.0):
        reference = math.log(special.ive(nu, x)) + x if special.ive(nu, x) > 0 else None
        if reference is None or not math.isfinite(reference):
            continue
        assert log_bessel_iv(nu, x).item() == pytest.approx(reference, rel=1e-6, abs=1e-8)


def test_log_bessel_is_finite_where_scipy_underflows():
    # d = 384 (MiniLM): order 191 at small kappa underflows in scipy.special.ive; the log stays finite and follows
    # the leading series term nu log(x/2) - lgamma(nu + 1)
    value = log_bessel_iv(191.0, 1.0).item()
    assert math.isfinite(value)
    assert value == pytest.approx(191 * math.log(0.5) - math.lgamma(192), rel=1e-3)
    assert torch.isfinite(vmf_log_normalizer(384, torch.tensor([1e-2, 50.0, 900.0, 1e4]))).all()


def test_mm_objective_never_decreases_with_kappa_fixed():
    x, _ = imbalanced_blobs()
    for lam in (0.0, 2.0, 20.0, 500.0):
        objective = fit_gem(x, 4, lam, num_iters=30, kappa=20.0, tol=0.0).objective
        assert len(objective) > 3
        assert all(b >= a - 1e-9 for a, b in zip(objective, objective[1:])), (lam, objective)


def test_e_step_never_decreases_the_objective_at_fixed_means():
    x, _ = imbalanced_blobs(seed=1)
    xn = normalize_rows(x)
    means = xn[:4]
    kappa = torch.full((4,), 15.0, dtype=torch.float64)
    scores = vmf_scores(xn, means, kappa, torch.full((4,), -math.log(4), dtype=torch.float64))
    gamma = torch.full((len(x), 4), 0.25, dtype=torch.float64)
    for lam in (1.0, 100.0, 5000.0):
        before = gem_objective(scores, gamma, lam)
        after = gem_objective(scores, gem_e_step(scores, gamma, lam), lam)
        assert after >= before - 1e-9


def test_results_rows_on_simplex_and_unit_means():
    x, _ = imbalanced_blobs()
    for result in (fit_gem(x, 5, 100.0, num_iters=10), fit_vmf_em(x, 5, num_iters=10)):
        r = result.responsibilities
        assert r.shape == (len(x), 5)
        assert (r >= 0).all()
        assert torch.allclose(r.sum(dim=1), torch.ones(len(x), dtype=r.dtype), atol=1e-9)
        assert torch.allclose(result.means.norm(dim=1), torch.ones(5, dtype=result.means.dtype), atol=1e-9)
    assert torch.allclose(spherical_kmeans(x, 5).means.norm(dim=1), torch.ones(5, dtype=torch.float64))


def test_lambda_zero_one_exact_e_step_is_the_vmf_softmax():
    x, _ = imbalanced_blobs(seed=2)
    xn = normalize_rows(x)
    g = torch.Generator().manual_seed(0)
    means = torch.nn.functional.normalize(torch.randn(4, xn.shape[1], generator=g, dtype=torch.float64), dim=1)
    kappa = torch.tensor([5.0, 10.0, 20.0, 40.0], dtype=torch.float64)
    scores = vmf_scores(xn, means, kappa, torch.full((4,), -math.log(4), dtype=torch.float64))
    start = torch.softmax(torch.randn(len(x), 4, generator=g, dtype=torch.float64), dim=1)  # any g^t
    step = gem_e_step(scores, start, lam=0.0, num_mirror_steps=1)
    assert torch.allclose(step, torch.softmax(scores, dim=1), atol=1e-12)


def test_mass_entropy_grows_with_lambda_on_imbalanced_data():
    # a 90/10 pair of blobs and K = 2: at lam = 0 each blob is a cluster; a large lam splits the big one
    x, _ = imbalanced_blobs(sizes=(450, 50), spread=0.3)
    lams = (0.0, 1.0, 3.0, 10.0, 5000.0)
    entropies = [mass_entropy(fit_gem(x, 2, lam, num_iters=30, kappa=40.0).responsibilities) for lam in lams]
    assert all(b >= a - 1e-6 for a, b in zip(entropies, entropies[1:])), entropies
    assert entropies[0] < 0.5
    assert entropies[-1] == pytest.approx(math.log(2), abs=1e-3)  # lam = 5000 drives the masses to uniform


@pytest.mark.parametrize("method", ["gem", "vmf_em", "spherical_kmeans", "kmeans"])
def test_scaling_the_embeddings_gives_the_same_clusters(method):
    x, _ = imbalanced_blobs(seed=3)
    fit = {
        "gem": lambda e: fit_gem(e, 4, 50.0, num_iters=15),
        "vmf_em": lambda e: fit_vmf_em(e, 4, num_iters=15),
        "spherical_kmeans": lambda e: spherical_kmeans(e, 4),
        "kmeans": lambda e: kmeans(e, 4),
    }[method]
    a, b = fit(x), fit(x * 37.5)
    assert torch.equal(a.labels, b.labels)
    assert torch.allclose(a.responsibilities, b.responsibilities, atol=1e-8)


def test_clusterings_recover_well_separated_blobs():
    x, labels = imbalanced_blobs(sizes=(150, 100, 75, 50), spread=0.1)
    # k-means variants keep the best of 3 restarts (a single k-means++ draw can merge two blobs)
    fits = (kmeans(x, 4, num_init=3), spherical_kmeans(x, 4, num_init=3), fit_vmf_em(x, 4), fit_gem(x, 4, 10.0))
    for result in fits:
        assert normalized_mutual_info(labels, result.labels) > 0.95


def test_gem_is_more_balanced_than_vmf_em_when_one_topic_dominates():
    x, _ = imbalanced_blobs(sizes=(600, 50, 30, 20), spread=0.45, seed=4)
    vanilla = fit_vmf_em(x, 6, seed=0)
    gem = fit_gem(x, 6, 5000.0, seed=0)
    assert mass_entropy(gem.labels, 6) > mass_entropy(vanilla.labels, 6)


def test_nmi_known_values():
    a = torch.tensor([0, 0, 1, 1])
    assert normalized_mutual_info(a, torch.tensor([1, 1, 0, 0])) == pytest.approx(1.0)
    assert normalized_mutual_info(a, torch.tensor([0, 1, 0, 1])) == pytest.approx(0.0, abs=1e-12)


def test_gis_top_members_and_centrality():
    x, _ = imbalanced_blobs(seed=5)
    result = fit_gem(x, 4, 10.0, num_iters=20)
    scores = geometric_influence_score(x, result)
    assert scores.shape == (len(x),) and torch.isfinite(scores).all()
    # at equal responsibility and density, the point closer to the centre scores higher
    means = torch.eye(3, dtype=torch.float64)[:2]
    pts = torch.tensor([[1.0, 0.1, 0.0], [1.0, 0.5, 0.0], [0.0, 1.0, 0.1], [0.1, 1.0, 0.0]], dtype=torch.float64)
    gamma = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    toy = ClusteringResult(gamma, means, kappa=torch.tensor([5.0, 5.0], dtype=torch.float64))
    gis = geometric_influence_score(pts, toy, beta=0.0)
    assert gis[0] > gis[1]


def test_bad_inputs_get_clear_errors():
    x, _ = imbalanced_blobs(sizes=(10, 10))
    zero = x.clone()
    zero[3] = 0
    with pytest.raises(DataError, match="zero norm.*3"):
        fit_gem(zero, 2, 1.0)
    nan = x.clone()
    nan[5, 0] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        kmeans(nan, 2)
    with pytest.raises(ConfigError, match="num_clusters=30 > the 20 points"):
        fit_gem(x, 30, 1.0)
    with pytest.raises(ConfigError, match="lam"):
        fit_gem(x, 2, -1.0)
    with pytest.raises(ConfigError, match="kappa"):
        fit_gem(x, 2, 1.0, kappa="huge")
