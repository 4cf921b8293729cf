"""Clustering on the unit sphere: k-means, spherical k-means, vMF-EM and GEM (vMF buckets with a balance term).

Paper: "GEM: Geometric Entropy Mixing" (arXiv 2605.26121); notes ``multimodal_quant_data.md`` §2. Equation -> function:

- vMF density ``f(x | mu_k, kappa_k) = C_d(kappa_k) exp(kappa_k mu_k^T x)`` -> :func:`vmf_scores`
  (``log C_d`` by :func:`zoo.mixing.vmf.vmf_log_normalizer`)
- Eq. 3, the GEM objective averaged over the N points,
  ``F = (1/N) sum_i [sum_k g_ik (log a_k + log f_ik) + H(g_i)] - (lam/2) ||pi(G) - u||^2``,
  ``a_k = 1/K`` fixed, ``pi_k = (1/N) sum_i g_ik``, ``u = 1/K`` -> :func:`gem_objective`
- MM E-step: quadratic minoriser of the balance term at ``pi^t`` plus Jensen over the points gives per point
  ``max_g sum_k g_k (s_ik - lam (pi^t_k - 1/K)) + H(g) - (lam/2) ||g - g_i^t||^2``, solved by mirror (exponentiated
  gradient) ascent with per-point acceptance -> :func:`gem_e_step`
- M-step ``mu_k = r_k / ||r_k||``, ``kappa_k ~= (R d - R^3)/(1 - R^2)`` (Banerjee) -> :func:`vmf_m_step`
- the full fit -> :func:`fit_gem`; vanilla vMF-EM with learned mixing weights -> :func:`fit_vmf_em`;
  baselines -> :func:`kmeans` (scikit-learn's ``KMeans``), :func:`spherical_kmeans`
- bucket balance: mass entropy and largest share -> :func:`mass_entropy`, :func:`max_share`; agreement with true
  labels -> :func:`normalized_mutual_info`

Every fit L2-normalises the embeddings first (so scaling them by ``c > 0`` changes nothing) and is seeded (k-means++
initialisation). Precision of the vMF fits (:class:`UnitRows`):

- float32 where the objective allows: the ``[N, d]`` embeddings stay in the precision they come in (float32 from an
  encoder; no copy of the matrix), and the products with them -- the cosines ``mu_k^T x_i`` of the scores, the
  per-block resultants ``r_k`` of the M-step -- are taken in that precision. A float32 cosine is off by ``~1e-7``, the
  order by which the float32 rounding of the embeddings already moves it, so Eq. 3 is known no better than that;
  ``kappa`` multiplies both alike. Float64 embeddings get float64 products (then the fit matches a float64 reference
  to rounding).
- float64 where it does not: the norms ``||x_i||`` and the sums over the N points (the resultants add per-block
  products in float64; ``kappa`` depends on ``1 - R^2`` and would amplify a float32 sum over 1e5 points); the scores,
  responsibilities and the whole ``[N, K]`` E-step, whose acceptance test compares surrogate values whose increments
  near the optimum are far below float32 resolution; the objective.

Plain torch, no Lightning (scikit-learn for :func:`kmeans`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from zoo.errors import ConfigError, DataError
from zoo.mixing.vmf import banerjee_kappa, vmf_log_normalizer

KAPPA_MODES = ("banerjee", "shared")


@dataclass
class ClusteringResult:
    """A fitted clustering of N points into K clusters.

    Attributes:
        responsibilities: ``[N, K]`` soft assignments, rows on the simplex (one-hot for the k-means variants).
        means: ``[K, d]`` cluster centres (unit norm for the spherical methods; Euclidean centroids for k-means).
        objective: the objective after each iteration (GEM/vMF-EM: Eq. 3 averaged over N; k-means: minus the mean
            squared distance; spherical k-means: the mean cosine to the assigned centre).
        kappa: ``[K]`` vMF concentrations (``None`` for the k-means variants).
        weights: ``[K]`` mixing weights of the model (``1/K`` for GEM; learned for vMF-EM; ``None`` for k-means).
    """

    responsibilities: Tensor
    means: Tensor
    objective: list[float] = field(default_factory=list)
    kappa: Tensor | None = None
    weights: Tensor | None = None

    @property
    def labels(self) -> Tensor:
        """``[N]`` hard labels, the arg-max of each responsibility row."""
        return self.responsibilities.argmax(dim=1)

    @property
    def masses(self) -> Tensor:
        """``[K]`` empirical soft mass ``pi_k = (1/N) sum_i g_ik``."""
        return self.responsibilities.mean(dim=0)


# -- input checks and initialisation -----------------------------------------------------------------------------
BLOCK_ROWS = 1024
"""Rows per block of the sums over the points and of the E-step (a block of ``[K, 1024]`` float64 stays in cache)."""


@dataclass
class UnitRows:
    """The unit rows ``x_i / ||x_i||`` of ``[N, d]`` embeddings without a float64 copy of the matrix.

    ``rows`` keeps the embeddings as given (float32 or float64; other types are stored as float32) and
    ``inverse_norms`` ``[N]`` (float64) the ``1 / ||x_i||`` computed in float64. Products with the rows are taken in
    the rows' own precision and scaled by ``1 / ||x_i||`` in float64; sums over the N points add per-block products
    (:data:`BLOCK_ROWS` rows) in float64, so no rounding accumulates over N. Build with :func:`unit_rows`.
    """

    rows: Tensor
    inverse_norms: Tensor

    def __len__(self) -> int:
        return self.rows.shape[0]

    @property
    def shape(self) -> torch.Size:
        """``(N, d)``."""
        return self.rows.shape

    def unit(self, indices: Tensor) -> Tensor:
        """``[m, d]`` float64 unit rows at ``indices``."""
        return self.rows[indices].to(torch.float64) * self.inverse_norms[indices].unsqueeze(1)

    def dense(self) -> Tensor:
        """``[N, d]`` float64 unit rows (a copy of the whole matrix)."""
        return self.rows.to(torch.float64) * self.inverse_norms.unsqueeze(1)

    def cosines(self, directions: Tensor) -> Tensor:
        """``[N, K]`` float64 ``x_i^T mu_k / ||x_i||`` for ``[K, d]`` ``directions`` (a sum over d in the rows'
        precision)."""
        products = self.rows @ directions.to(self.rows.dtype).T
        return products.to(torch.float64).mul_(self.inverse_norms.unsqueeze(1))

    def weighted_sums(self, weights: Tensor) -> Tensor:
        """``[K, d]`` float64 ``sum_i w_ik x_i / ||x_i||`` for ``[N, K]`` ``weights`` (block products in the rows'
        precision, added in float64)."""
        out = torch.zeros(weights.shape[1], self.shape[1], dtype=torch.float64)
        for start in range(0, len(self), BLOCK_ROWS):
            block = slice(start, start + BLOCK_ROWS)
            scaled = (weights[block] * self.inverse_norms[block].unsqueeze(1)).to(self.rows.dtype)
            out += (scaled.T @ self.rows[block]).to(torch.float64)
        return out


def unit_rows(embeddings: Tensor) -> UnitRows:
    """Check ``[N, d]`` embeddings and wrap them as :class:`UnitRows` (one pass over the matrix).

    Raises:
        DataError: a non-finite value or a zero-norm row (naming the first rows), or not a 2-D tensor.
    """
    x = torch.as_tensor(embeddings).detach()
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] < 2:
        raise DataError(f"embeddings must be a [N, d] tensor with N >= 1 and d >= 2, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float32)
    norms = torch.cat([x[i : i + BLOCK_ROWS].to(torch.float64).norm(dim=1) for i in range(0, len(x), BLOCK_ROWS)])
    suspect = (~torch.isfinite(norms)).nonzero().flatten()
    if len(suspect):  # NaN or inf in the row, or (float64 input beyond 1e154) a sum of squares that overflows
        bad = suspect[(~torch.isfinite(x[suspect])).any(dim=1)]
        if len(bad):
            raise DataError(f"embeddings: {len(bad)} rows hold NaN or inf (first rows {bad[:5].tolist()})")
        big = x[suspect].to(torch.float64)
        scale = big.abs().amax(dim=1, keepdim=True)
        norms[suspect] = (big / scale).norm(dim=1) * scale.squeeze(1)
    zero = (norms <= 1e-12).nonzero().flatten()
    if len(zero):
        raise DataError(
            f"embeddings: {len(zero)} rows have zero norm (first rows {zero[:5].tolist()}): a zero vector has no "
            "direction on the sphere; drop these rows (empty documents?) or embed them with another encoder"
        )
    return UnitRows(x, 1.0 / norms)


def normalize_rows(embeddings: Tensor) -> Tensor:
    """``[N, d]`` embeddings -> float64 unit rows (checked as in :func:`unit_rows`).

    Raises:
        DataError: a non-finite value or a zero-norm row (naming the first rows), or not a 2-D tensor.
    """
    return unit_rows(embeddings).dense()


def check_num_clusters(num_points: int, num_clusters: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= num_clusters <= num_points``."""
    if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
        raise ConfigError(f"num_clusters must be a whole number >= 1, got {num_clusters!r}")
    if num_clusters > num_points:
        raise ConfigError(f"num_clusters={num_clusters} > the {num_points} points to cluster; use fewer clusters")


def kmeans_plus_plus(x: UnitRows, num_clusters: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding on the sphere (Arthur & Vassilvitskii 2007): ``[K]`` indices of ``x`` drawn with
    probability proportional to ``D(x)^2 = ||x - c||^2 / 2 = 1 - cos(x, c)`` for the nearest centre ``c`` chosen so
    far (a chosen point is never drawn again)."""
    n = len(x)
    first = int(torch.randint(n, (1,), generator=generator))
    chosen = [first]
    closest = 1 - x.cosines(x.unit(torch.tensor([first])))[:, 0]
    for _ in range(1, num_clusters):
        weights = closest.clamp_min(0)
        weights[chosen] = 0
        if float(weights.sum()) <= 0:  # every point sits on a centre: pick any point not chosen yet
            weights = torch.ones(n, dtype=torch.float64)
            weights[chosen] = 0
        index = int(torch.multinomial(weights, 1, generator=generator))
        chosen.append(index)
        closest = torch.minimum(closest, 1 - x.cosines(x.unit(torch.tensor([index])))[:, 0])
    return torch.tensor(chosen)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def _one_hot(labels: Tensor, num_clusters: int) -> Tensor:
    return torch.nn.functional.one_hot(labels, num_clusters).to(torch.float64)


def _refill_empty(centres: Tensor, x: Tensor, labels: Tensor, cost: Tensor) -> Tensor:
    """Move the centre of each empty cluster to the point that is worst served (largest ``cost``)."""
    counts = torch.bincount(labels, minlength=centres.shape[0])
    for k in (counts == 0).nonzero().flatten().tolist():
        worst = int(cost.argmax())
        centres[k] = x[worst]
        cost[worst] = -math.inf
    return centres


# -- k-means baselines -------------------------------------------------------------------------------------------
def kmeans(
    embeddings: Tensor,
    num_clusters: int,
    num_iters: int = 50,
    seed: int = 0,
    normalize: bool = True,
    num_init: int = 1,
) -> ClusteringResult:
    """Euclidean k-means (the paper's "K-means" bucketing): scikit-learn's ``KMeans`` (Lloyd, k-means++ seeding).

    Args:
        embeddings: ``[N, d]``.
        num_clusters: ``K <= N``.
        num_iters: at most this many Lloyd iterations (``max_iter``; ``tol=0``: it stops early only when the
            assignment no longer changes).
        seed: ``random_state`` of the k-means++ draws.
        normalize: L2-normalise the rows first (as for every bucketing here; ``False`` = raw Euclidean k-means).
        num_init: restarts (``n_init``); the one with the smallest inertia is kept.

    Returns:
        :class:`ClusteringResult` with one-hot responsibilities, centroid ``means`` (not unit norm) and ``objective``
        holding one value, minus the final mean squared distance (scikit-learn does not report the iterations).

    Raises:
        ConfigError: scikit-learn missing, ``K > N``, ``num_init < 1``. DataError: zero-norm or non-finite rows.
    """
    try:
        from sklearn.cluster import KMeans
    except ImportError as err:  # pragma: no cover - installed with the mixing extra
        raise ConfigError("the kmeans bucketing needs scikit-learn: pip install 'paperzoo[mixing]'") from err
    if normalize:
        x = normalize_rows(embeddings)
    else:
        x = torch.as_tensor(embeddings).detach().to(torch.float64)
    check_num_clusters(x.shape[0], num_clusters)
    if num_init < 1:
        raise ConfigError(f"num_init must be >= 1, got {num_init}")
    fit = KMeans(num_clusters, init="k-means++", n_init=num_init, max_iter=num_iters, tol=0.0, random_state=seed)
    fit.fit(x.numpy())
    labels = torch.from_numpy(fit.labels_).long()
    means = torch.from_numpy(fit.cluster_centers_).to(torch.float64)
    return ClusteringResult(_one_hot(labels, num_clusters), means, [-float(fit.inertia_) / x.shape[0]])


def _best_of(num_init: int, seed: int, fit: Callable[[int], ClusteringResult]) -> ClusteringResult:
    if num_init < 1:
        raise ConfigError(f"num_init must be >= 1, got {num_init}")
    return max((fit(seed + i) for i in range(num_init)), key=lambda r: r.objective[-1])


def spherical_kmeans(
    embeddings: Tensor, num_clusters: int, num_iters: int = 50, seed: int = 0, num_init: int = 1
) -> ClusteringResult:
    """Spherical k-means (Dhillon & Modha 2001): assign by cosine, centre = normalised sum of the members.

    Same arguments as :func:`kmeans` (restarts use seeds ``seed .. seed + num_init - 1``; the one with the best final
    objective is kept); ``means`` are unit norm; ``objective`` is the mean cosine to the centre after each iteration.
    """
    rows = unit_rows(embeddings)
    check_num_clusters(len(rows), num_clusters)
    x = rows.dense()
    return _best_of(num_init, seed, lambda s: _spherical_lloyd(rows, x, num_clusters, num_iters, s))


def _spherical_lloyd(rows: UnitRows, x: Tensor, num_clusters: int, num_iters: int, seed: int) -> ClusteringResult:
    centres = x[kmeans_plus_plus(rows, num_clusters, _generator(seed))].clone()
    labels, objective = None, []
    for _ in range(num_iters):
        similarity = x @ centres.T
        best, new_labels = similarity.max(dim=1)
        objective.append(float(best.mean()))
        if labels is not None and torch.equal(new_labels, labels):
            break
        labels = new_labels
        sums = torch.zeros_like(centres).index_add_(0, labels, x)
        norms = sums.norm(dim=1, keepdim=True)
        centres = torch.where(norms > 1e-12, sums / norms.clamp_min(1e-12), centres)
        centres = _refill_empty(centres, x, labels, -best.clone())
    labels = (x @ centres.T).argmax(dim=1)
    return ClusteringResult(_one_hot(labels, num_clusters), centres, objective)


# -- vMF mixtures: vMF-EM and GEM ----------------------------------------------------------------------------------
def vmf_scores(x: UnitRows | Tensor, means: Tensor, kappa: Tensor, log_weights: Tensor) -> Tensor:
    """``s_ik = log a_k + log C_d(kappa_k) + kappa_k mu_k^T x_i``.

    Shapes: ``x [N, d]`` unit rows (a tensor, or :class:`UnitRows`), ``means [K, d]``, ``kappa [K]``,
    ``log_weights [K]`` -> ``[N, K]``.
    """
    cosines = x.cosines(means) if isinstance(x, UnitRows) else x @ means.T
    return log_weights + vmf_log_normalizer(x.shape[1], kappa) + kappa * cosines


def gem_objective(scores: Tensor, gamma: Tensor, lam: float) -> float:
    """Eq. 3 averaged over the points: ``mean_i [sum_k g_ik s_ik + H(g_i)] - (lam/2) ||pi - u||^2`` (``0 log 0``
    is 0)."""
    n, k = gamma.shape
    balance = 0.5 * lam * float(((gamma.mean(dim=0) - 1.0 / k) ** 2).sum())
    fit = torch.vdot(gamma.reshape(-1), scores.reshape(-1)) - torch.xlogy(gamma, gamma).sum()
    return float(fit) / n - balance


def _surrogate(gamma: Tensor, log_gamma: Tensor, linear: Tensor, anchor: Tensor, lam: float) -> Tensor:
    """Per-point MM surrogate ``sum_k g_k a_k + H(g) - (lam/2) ||g - g^t||^2``, ``H`` from ``log g``.

    Layout ``[K, B]`` (a column per point) -> ``[B]``."""
    return (gamma * (linear - log_gamma)).sum(dim=0) - 0.5 * lam * (gamma - anchor).pow(2).sum(dim=0)


def _mirror_step(
    log_current: Tensor, target: Tensor, eta: Tensor, linear: Tensor, anchor: Tensor, lam: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``log g <- (1 - eta) log g + eta * target - logsumexp(...)`` on ``[K, B]`` columns: the proposal, its log and
    its surrogate.

    ``log g`` is floored at ``log 1e-300`` (probabilities below ``1e-300`` count as ``1e-300``, the floor the entropy
    and the step's ``log g`` always had), which also keeps ``exp`` off its slow underflow path."""
    log_proposal = torch.log_softmax(torch.lerp(log_current, target, eta), dim=0).clamp_min_(_LOG_FLOOR)
    proposal = log_proposal.exp()
    return proposal, log_proposal, _surrogate(proposal, log_proposal, linear, anchor, lam)


def _no_decrease(new_value: Tensor, value: Tensor) -> Tensor:
    # rounding slack: at the optimum a step changes the value by float noise only
    return new_value >= value - 1e-12 * (1 + value.abs())


_MAX_HALVINGS = 30
"""Step-size halvings a point may try per mirror step before it keeps its value."""
_LOG_FLOOR = math.log(1e-300)


def _mirror_ascent(linear: Tensor, anchor: Tensor, lam: float, num_mirror_steps: int) -> Tensor:
    """The mirror ascent of :func:`gem_e_step` on a block of points laid out ``[K, B]``, a column per point (each
    point is its own problem; the softmax over the K entries of a column runs vectorised across the points)."""
    current, log_current = anchor, torch.log(anchor)  # anchor >= ~1e-300: a finite log
    value = _surrogate(current, log_current, linear, anchor, lam)
    # first step size: 1 (the exact E-step when lam = 0), smaller as the prox term's curvature lam grows
    eta = torch.full((1, anchor.shape[1]), min(1.0, 4.0 / (1.0 + lam)), dtype=anchor.dtype)
    anchored = linear + lam * anchor
    for _ in range(num_mirror_steps):
        target = torch.add(anchored, current, alpha=-lam)  # a_i - lam (g - g^t_i)
        proposal, log_proposal, new_value = _mirror_step(log_current, target, eta, linear, anchor, lam)
        accept = _no_decrease(new_value, value)
        if bool(accept.all()):
            current, log_current, value = proposal, log_proposal, new_value
            continue
        refused = (~accept).nonzero().flatten()
        for _retry in range(_MAX_HALVINGS - 1):  # batched acceptance: only the refused points are retried
            if not len(refused):
                break
            eta[:, refused] /= 2
            pending = (log_current, target, eta, linear, anchor)
            step, log_step, step_value = _mirror_step(*(t[:, refused] for t in pending), lam)
            ok = _no_decrease(step_value, value[refused])
            kept = refused[ok]
            proposal[:, kept], log_proposal[:, kept], new_value[kept] = step[:, ok], log_step[:, ok], step_value[ok]
            accept[kept] = True
            refused = refused[~ok]
        eta[:, refused] /= 2  # refused at every step size: the point keeps its value and the smaller step
        current = torch.where(accept, proposal, current)
        log_current = torch.where(accept, log_proposal, log_current)
        value = torch.where(accept, new_value, value)
    return current


def gem_e_step(scores: Tensor, gamma: Tensor, lam: float, num_mirror_steps: int = 5) -> Tensor:
    """One MM E-step of GEM: maximise the per-point surrogate by mirror ascent from ``gamma`` (= ``g^t``).

    The linear coefficients are ``a_ik = s_ik - lam (pi^t_k - 1/K)``; a mirror step of size ``eta`` is
    ``log g <- (1 - eta) log g + eta (a_i - lam (g - g^t_i)) + const`` (exponentiated gradient on the simplex),
    starting from ``eta = min(1, 4 / (1 + lam))``. A step is kept for a point only where its surrogate does not
    decrease; otherwise that point's step is halved (up to 30 times; a point whose step is still refused keeps its
    value), so the surrogate, hence Eq. 3, never decreases beyond float rounding (the minoriser is tight at ``g^t``).
    With ``lam = 0`` the first full step (``eta = 1``) is the exact E-step ``softmax(s_i)``.

    Cost: the points are independent once ``pi^t`` is known, so they run in blocks of :data:`BLOCK_ROWS` points that
    stay in cache, laid out a column per point (the softmax over K then runs vectorised across the points); each step
    carries ``log g`` (one ``log_softmax`` and one ``exp`` per step, the entropy read off ``log g``), and only the
    points whose step was refused are retried. All in float64 (the acceptance test compares surrogate values whose
    increments near the optimum are far below float32 resolution).

    Args:
        scores: ``[N, K]`` vMF log scores :func:`vmf_scores`.
        gamma: ``[N, K]`` current responsibilities ``g^t`` (rows on the simplex).
        lam: balance strength ``>= 0`` (logit scale: the objective is averaged over N).
        num_mirror_steps: mirror-ascent iterations.

    Returns:
        ``[N, K]`` new responsibilities, rows on the simplex.
    """
    k = gamma.shape[1]
    anchor = gamma.clamp_min(1e-300)
    anchor = anchor / anchor.sum(dim=1, keepdim=True)
    linear = scores - lam * (anchor.mean(dim=0) - 1.0 / k)
    out = torch.empty_like(anchor)
    for start in range(0, anchor.shape[0], BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        columns = _mirror_ascent(linear[block].T.contiguous(), anchor[block].T.contiguous(), lam, num_mirror_steps)
        out[block] = columns.T
    return out


def vmf_m_step(x: UnitRows, gamma: Tensor, kappa_mode: str | float, max_kappa: float = 1e5) -> tuple[Tensor, Tensor]:
    """Closed-form M-step: ``mu_k = r_k / ||r_k||`` with ``r_k = sum_i g_ik x_i``, and the concentrations.

    Args:
        x: the unit rows (:func:`unit_rows`).
        gamma: ``[N, K]`` responsibilities.
        kappa_mode: ``banerjee`` (one kappa per cluster, Banerjee's approximation of its mean resultant length),
            ``shared`` (one kappa for all clusters from the pooled resultant length; ``log C_d`` then cancels in the
            responsibilities) or a number (kappa fixed: the mode in which the MM objective is provably monotone).

    Returns:
        ``(means [K, d], kappa [K])``.
    """
    resultant = x.weighted_sums(gamma)
    lengths = resultant.norm(dim=1)
    mass = gamma.sum(dim=0)
    means = resultant / lengths.clamp_min(1e-300).unsqueeze(1)
    empty = lengths <= 1e-12
    if bool(empty.any()):  # a cluster with no mass keeps a random direction of the data
        means[empty] = x.unit(torch.arange(int(empty.sum())) % len(x))
    k, dim = gamma.shape[1], x.shape[1]
    if isinstance(kappa_mode, str):
        if kappa_mode == "banerjee":
            kappa = banerjee_kappa(lengths / mass.clamp_min(1e-300), dim, max_kappa)
        elif kappa_mode == "shared":
            kappa = banerjee_kappa(lengths.sum() / mass.sum(), dim, max_kappa).expand(k).clone()
        else:
            raise ConfigError(f"kappa must be one of {KAPPA_MODES} or a positive number, got {kappa_mode!r}")
    else:
        kappa = torch.full((k,), float(kappa_mode), dtype=torch.float64)
    return means, kappa


def _check_kappa(kappa: str | float) -> str | float:
    if isinstance(kappa, str):
        try:
            kappa = float(kappa)
        except ValueError:
            if kappa not in KAPPA_MODES:
                raise ConfigError(f"kappa must be one of {KAPPA_MODES} or a positive number, got {kappa!r}") from None
            return kappa
    if isinstance(kappa, bool) or not math.isfinite(float(kappa)) or float(kappa) <= 0:
        raise ConfigError(f"kappa must be one of {KAPPA_MODES} or a positive number, got {kappa!r}")
    return float(kappa)


def _fit_vmf_mixture(
    embeddings: Tensor,
    num_clusters: int,
    lam: float,
    num_iters: int,
    seed: int,
    learn_weights: bool,
    kappa: str | float,
    num_mirror_steps: int,
    tol: float,
    init_kappa: float,
) -> ClusteringResult:
    x = unit_rows(embeddings)
    check_num_clusters(len(x), num_clusters)
    if not math.isfinite(lam) or lam < 0:
        raise ConfigError(f"lam must be a finite number >= 0, got {lam!r}")
    kappa_mode = _check_kappa(kappa)
    means = x.unit(kmeans_plus_plus(x, num_clusters, _generator(seed)))
    kappa_now = torch.full(
        (num_clusters,), float(kappa_mode) if isinstance(kappa_mode, float) else init_kappa, dtype=torch.float64
    )
    log_weights = torch.full((num_clusters,), -math.log(num_clusters), dtype=torch.float64)
    scores = vmf_scores(x, means, kappa_now, log_weights)
    gamma = torch.softmax(scores, dim=1)
    objective: list[float] = []
    for _ in range(num_iters):
        if learn_weights:  # classical EM: exact E-step, mixing weights re-estimated
            gamma = torch.softmax(scores, dim=1)
        else:
            gamma = gem_e_step(scores, gamma, lam, num_mirror_steps)
        means, kappa_now = vmf_m_step(x, gamma, kappa_mode)
        if learn_weights:
            log_weights = torch.log(gamma.mean(dim=0).clamp_min(1e-300))
        # the scores of the new parameters: Eq. 3 of this iteration, and the next E-step's input
        scores = vmf_scores(x, means, kappa_now, log_weights)
        objective.append(gem_objective(scores, gamma, lam))
        if len(objective) > 1 and abs(objective[-1] - objective[-2]) <= tol * max(1.0, abs(objective[-2])):
            break
    return ClusteringResult(gamma, means, objective, kappa_now, log_weights.exp())


def fit_gem(
    embeddings: Tensor,
    num_clusters: int,
    lam: float,
    num_iters: int = 50,
    seed: int = 0,
    *,
    kappa: str | float = "banerjee",
    num_mirror_steps: int = 5,
    tol: float = 1e-5,
    init_kappa: float = 10.0,
) -> ClusteringResult:
    """GEM: a vMF mixture with the prior fixed to uniform and a penalty on the soft masses' distance from uniform.

    Maximises Eq. 3 averaged over the N points (so ``lam`` is on the logit scale; the paper's ``lam = 5000`` drives
    the soft masses to uniform) by minorise-maximise: the E-step :func:`gem_e_step` (mirror ascent on each point's
    concave surrogate), the M-step :func:`vmf_m_step`. The objective never decreases with ``kappa`` fixed (a number);
    the Banerjee update of ``kappa`` is an approximation and may break exact monotonicity (notes §2f).

    Args:
        embeddings: ``[N, d]`` document embeddings (normalised here; rows must be non-zero and finite).
        num_clusters: ``K <= N`` (the paper uses 24).
        lam: balance strength ``>= 0``; ``0`` is a vMF mixture with a fixed uniform prior.
        num_iters: MM iterations (stops earlier when the objective changes by less than ``tol`` relatively).
        seed: seed of the k-means++ initialisation of the means.
        kappa: ``banerjee`` (paper), ``shared`` or a fixed positive number (see :func:`vmf_m_step`).
        num_mirror_steps: mirror-ascent steps per E-step (unofficial config: 5).
        tol: relative tolerance of the early stop (unofficial config: 1e-5).
        init_kappa: concentration of the first E-step when ``kappa`` is learned.

    Returns:
        :class:`ClusteringResult`: ``responsibilities [N, K]`` (rows on the simplex), ``means [K, d]`` (unit norm),
        ``objective`` (one value per iteration), ``kappa [K]``, ``weights`` (``1/K``).

    Raises:
        DataError: zero-norm or non-finite embeddings. ConfigError: ``K > N``, a negative ``lam``, a bad ``kappa``.
    """
    return _fit_vmf_mixture(
        embeddings, num_clusters, float(lam), num_iters, seed, False, kappa, num_mirror_steps, tol, init_kappa
    )


def fit_vmf_em(
    embeddings: Tensor,
    num_clusters: int,
    num_iters: int = 50,
    seed: int = 0,
    *,
    kappa: str | float = "banerjee",
    tol: float = 1e-5,
    init_kappa: float = 10.0,
) -> ClusteringResult:
    """Vanilla vMF-EM (Banerjee et al. 2005) with learned mixing weights: exact E-step ``softmax(s_i)``,
    ``a_k = pi_k``; the "rich get richer" baseline GEM decouples (the paper's "vanilla vMF" ablation).

    Arguments as in :func:`fit_gem` (no ``lam``); ``weights`` holds the learned mixing weights.
    """
    return _fit_vmf_mixture(embeddings, num_clusters, 0.0, num_iters, seed, True, kappa, 0, tol, init_kappa)


# -- balance and agreement metrics ---------------------------------------------------------------------------------
def mass_entropy(assignments: Tensor, num_clusters: int | None = None) -> float:
    """Entropy (nats) of the cluster masses: from ``[N, K]`` responsibilities (soft mass) or ``[N]`` hard labels.

    The maximum is ``log K``, reached when every cluster holds ``N/K``.
    """
    masses = _masses(assignments, num_clusters)
    return float(-(masses * torch.log(masses.clamp_min(1e-300))).sum())


def max_share(assignments: Tensor, num_clusters: int | None = None) -> float:
    """The largest cluster's share of the points (soft mass for ``[N, K]``, counts for ``[N]`` labels)."""
    return float(_masses(assignments, num_clusters).max())


def _masses(assignments: Tensor, num_clusters: int | None) -> Tensor:
    a = torch.as_tensor(assignments)
    if a.ndim == 2:
        return a.to(torch.float64).mean(dim=0)
    counts = torch.bincount(a.long(), minlength=num_clusters or 0).to(torch.float64)
    return counts / counts.sum()


def normalized_mutual_info(labels_true: Tensor, labels_pred: Tensor) -> float:
    """NMI with the arithmetic-mean normalisation ``I(U; V) / ((H(U) + H(V)) / 2)`` (scikit-learn's default).

    ``[N]`` integer labels each; 1.0 for identical partitions up to renaming; 1.0 when both are a single cluster.
    """
    u = torch.as_tensor(labels_true).long()
    v = torch.as_tensor(labels_pred).long()
    if u.shape != v.shape or u.ndim != 1:
        raise ValueError(f"labels must be two [N] tensors of one shape, got {tuple(u.shape)} and {tuple(v.shape)}")
    _, u = torch.unique(u, return_inverse=True)
    _, v = torch.unique(v, return_inverse=True)
    joint = torch.zeros(int(u.max()) + 1, int(v.max()) + 1, dtype=torch.float64)
    joint.index_put_((u, v), torch.ones(len(u), dtype=torch.float64), accumulate=True)
    joint /= joint.sum()
    pu, pv = joint.sum(dim=1), joint.sum(dim=0)
    nz = joint > 0
    mutual = float((joint[nz] * torch.log(joint[nz] / (pu[:, None] * pv[None, :])[nz])).sum())
    hu = float(-(pu * torch.log(pu)).sum())
    hv = float(-(pv * torch.log(pv)).sum())
    if hu == 0 and hv == 0:
        return 1.0
    return max(0.0, mutual / ((hu + hv) / 2))
