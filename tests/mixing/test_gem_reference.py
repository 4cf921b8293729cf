"""GEM's fit against the paper's equations written out point by point; its memory; the scikit-learn k-means baseline.

The reference below is Eq. 3 of GEM (arXiv 2605.26121) and its MM updates (notes ``multimodal_quant_data.md`` §2a)
in plain numpy, one point at a time: the scores ``s_ik = log(1/K) + log C_d(kappa_k) + kappa_k mu_k^T x_i``, the
per-point surrogate ``sum_k g_k (s_ik - lam (pi^t_k - 1/K)) + H(g) - (lam/2) ||g - g^t_i||^2`` climbed by
exponentiated-gradient steps that are kept only where the surrogate does not decrease (halving the step otherwise,
as :func:`zoo.mixing.clustering.gem_e_step` documents), and the closed-form M-step with Banerjee's kappa.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from zoo.errors import DataError
from zoo.mixing import clustering, fit_gem, kmeans, vmf_log_normalizer
from zoo.mixing.clustering import kmeans_plus_plus, unit_rows


def blobs(sizes=(60, 35, 15, 10), dim=8, spread=0.4, seed=0) -> torch.Tensor:
    """float32 points around random directions (an encoder's output type)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(len(sizes), dim, generator=g), dim=1)
    return torch.cat([centres[i] + spread * torch.randn(n, dim, generator=g) for i, n in enumerate(sizes)])


class PaperGEM:
    """Eq. 3 and its MM updates, one point at a time (float64 numpy)."""

    def __init__(self, x: np.ndarray, lam: float, num_mirror_steps: int = 5):
        self.x, self.lam, self.steps = x, lam, num_mirror_steps
        self.n, self.d = x.shape
        self.refused = 0  # mirror steps refused at least once (the retries of the batched acceptance)

    def scores(self, means: np.ndarray, kappa: np.ndarray) -> np.ndarray:
        k = len(kappa)
        log_c = vmf_log_normalizer(self.d, torch.from_numpy(kappa)).numpy()
        return np.array([[math.log(1 / k) + log_c[j] + kappa[j] * means[j] @ xi for j in range(k)] for xi in self.x])

    def e_step(self, s: np.ndarray, g_t: np.ndarray) -> np.ndarray:
        k = s.shape[1]
        pi_t = g_t.mean(axis=0)
        out = np.empty_like(g_t)
        for i in range(self.n):
            a = s[i] - self.lam * (pi_t - 1 / k)
            anchor = g_t[i]

            def surrogate(g, a=a, anchor=anchor):
                return g @ a - g @ np.log(np.maximum(g, 1e-300)) - self.lam / 2 * ((g - anchor) ** 2).sum()

            g, eta = anchor, min(1.0, 4.0 / (1.0 + self.lam))
            for _ in range(self.steps):
                gradient_target = a - self.lam * (g - anchor)
                for attempt in range(30):
                    logits = (1 - eta) * np.log(np.maximum(g, 1e-300)) + eta * gradient_target
                    proposal = np.exp(logits - logits.max())
                    proposal /= proposal.sum()
                    value = surrogate(g)
                    if surrogate(proposal) >= value - 1e-12 * (1 + abs(value)):
                        g = proposal
                        break
                    self.refused += attempt == 0
                    eta /= 2
            out[i] = g
        return out

    def m_step(self, gamma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = gamma.T @ self.x
        length = np.linalg.norm(r, axis=1)
        r_bar = length / gamma.sum(axis=0)
        return r / length[:, None], (r_bar * self.d - r_bar**3) / (1 - r_bar**2)

    def objective(self, s: np.ndarray, gamma: np.ndarray) -> float:
        k = s.shape[1]
        entropy = -(gamma * np.log(np.maximum(gamma, 1e-300))).sum(axis=1)
        return float(
            ((gamma * s).sum(axis=1) + entropy).mean() - self.lam / 2 * ((gamma.mean(axis=0) - 1 / k) ** 2).sum()
        )

    def fit(self, means: np.ndarray, num_iters: int, init_kappa: float = 10.0):
        kappa = np.full(len(means), init_kappa)
        s = self.scores(means, kappa)
        gamma = np.exp(s - s.max(axis=1, keepdims=True))
        gamma /= gamma.sum(axis=1, keepdims=True)
        objective = []
        for _ in range(num_iters):
            gamma = self.e_step(s, gamma)
            means, kappa = self.m_step(gamma)
            s = self.scores(means, kappa)
            objective.append(self.objective(s, gamma))
        return gamma, means, kappa, objective


# float64 embeddings: float64 products, the fit is the equations to rounding; float32 embeddings (an encoder's): the
# products with them are float32, so the fit agrees to float32 rounding of the cosines
TOLERANCES = {
    torch.float64: {"objective": 1e-9, "gamma": 1e-9, "kappa": 1e-9},
    torch.float32: {"objective": 1e-6, "gamma": 1e-5, "kappa": 1e-5},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lam", [3.0, 5000.0])
def test_fit_gem_follows_the_paper_equations_point_by_point(monkeypatch, lam, dtype):
    # blocks of 32 points so that the 120 points run as several blocks (and a ragged last one)
    monkeypatch.setattr(clustering, "BLOCK_ROWS", 32)
    e = blobs().to(dtype)
    x = e.double() / e.double().norm(dim=1, keepdim=True)
    start = x[kmeans_plus_plus(unit_rows(e), 4, torch.Generator().manual_seed(0))].numpy()
    paper = PaperGEM(x.numpy(), lam)
    gamma, means, kappa, objective = paper.fit(start, num_iters=5)
    fit = fit_gem(e, 4, lam, num_iters=5, seed=0, tol=0.0)
    tolerance = TOLERANCES[dtype]
    assert fit.objective == pytest.approx(objective, rel=tolerance["objective"])
    assert np.allclose(fit.responsibilities.numpy(), gamma, rtol=0, atol=tolerance["gamma"])
    assert np.allclose(fit.means.numpy(), means, rtol=0, atol=tolerance["gamma"])
    assert np.allclose(fit.kappa.numpy(), kappa, rtol=tolerance["kappa"], atol=0)
    assert torch.equal(fit.labels, torch.from_numpy(gamma.argmax(axis=1)))
    if lam == 3.0:  # a step 4x the safe one: some points refuse it, so the retries of refused points run
        assert paper.refused > 0


def test_the_fit_makes_no_copy_of_the_embedding_matrix():
    # the [N, d] embeddings are read block by block: the largest buffer of the fit is N x K or one float64 block,
    # not a copy of the matrix (a float64 copy is 8 N d bytes; even a float32 one would be 4 N d)
    n, d, k = 4000, 64, 2
    e = torch.randn(n, d)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fit_gem(e, k, 10.0, num_iters=1)
    largest = max(event.self_cpu_memory_usage for event in prof.events())
    assert largest <= max(n * k, clustering.BLOCK_ROWS * d) * 8 < n * d * 4


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_unit_rows_products_match_a_float64_normalised_copy(dtype, atol):
    g = torch.Generator().manual_seed(1)
    e = (torch.randn(2500, 12, generator=g) * torch.rand(2500, 1, generator=g) * 50).to(dtype)  # varied norms
    rows = unit_rows(e)
    dense = e.double() / e.double().norm(dim=1, keepdim=True)
    directions = torch.nn.functional.normalize(torch.randn(5, 12, generator=g, dtype=torch.float64), dim=1)
    weights = torch.rand(2500, 5, generator=g, dtype=torch.float64)
    assert rows.rows.data_ptr() == e.data_ptr()  # kept as given, no copy
    assert torch.allclose(rows.cosines(directions), dense @ directions.T, rtol=0, atol=atol)
    # a sum over 2500 unit rows (three blocks): its error is rounding relative to sum_i w_ik, the size of its terms
    error = (rows.weighted_sums(weights) - weights.T @ dense).abs().max()
    assert error <= atol / 10 * weights.sum(dim=0).max()
    # float64 rows whose sum of squares overflows are finite data with a direction, not "inf"
    huge = torch.tensor([[3e200, 4e200], [1.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(unit_rows(huge).dense(), torch.tensor([[0.6, 0.8], [1.0, 0.0]], dtype=torch.float64))
    bad = e.clone()
    bad[7, 3] = float("inf")
    with pytest.raises(DataError, match=r"1 rows hold NaN or inf \(first rows \[7\]\)"):
        unit_rows(bad)


def test_kmeans_baseline_is_scikit_learns_kmeans():
    sklearn_cluster = pytest.importorskip("sklearn.cluster")
    e = blobs(seed=2)
    x = (e.double() / e.double().norm(dim=1, keepdim=True)).numpy()
    reference = sklearn_cluster.KMeans(4, n_init=2, max_iter=30, tol=0.0, random_state=5).fit(x)
    ours = kmeans(e, 4, num_iters=30, seed=5, num_init=2)
    assert torch.equal(ours.labels, torch.from_numpy(reference.labels_).long())
    assert np.allclose(ours.means.numpy(), reference.cluster_centers_)
    assert ours.objective == pytest.approx([-reference.inertia_ / len(x)])
