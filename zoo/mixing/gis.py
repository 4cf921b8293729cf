"""GEM's Geometric Influence Score and the student that labels the full corpus from GIS-selected pseudo-labels.

Paper: "GEM: Geometric Entropy Mixing" (arXiv 2605.26121), notes ``multimodal_quant_data.md`` §2a. GIS combines
assignment confidence, directional centrality and within-cluster local density; the form follows an unofficial
reimplementation [reconstruction]:

    GIS_k(x_i) = log g_ik + log f_k(x_i) + beta log rho_k(x_i),

``f_k`` the vMF density of cluster ``k`` and ``rho_k(x_i)`` the mean cosine of ``x_i`` to its ``M`` nearest
same-cluster neighbours (``beta = 0.5``, ``M = 8``) -> :func:`geometric_influence_score`. The top-GIS documents of
each cluster (a balanced set) are the pseudo-labels -> :func:`select_pseudo_labels`; a linear student on cheap
features labels the whole corpus in time linear in its size (the paper uses FastText; here a multinomial logistic
regression over hashed bag-of-words features, :class:`~zoo.text.encoders.HashingEncoder`) -> :class:`LinearStudent`,
:func:`train_student`. Plain torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from zoo.errors import ConfigError
from zoo.mixing.clustering import ClusteringResult, normalize_rows
from zoo.mixing.vmf import vmf_log_normalizer


def local_density(x: Tensor, labels: Tensor, num_neighbours: int = 8, chunk: int = 4096) -> Tensor:
    """``rho(x_i)``: mean cosine of each unit row to its ``M`` nearest other members of its cluster, ``[N]``.

    A point alone in its cluster gets density 1 (no neighbour contradicts it). Memory ``O(chunk * n_k)``.
    """
    n = x.shape[0]
    density = torch.ones(n, dtype=x.dtype)
    for k in labels.unique().tolist():
        members = (labels == k).nonzero().flatten()
        m = min(num_neighbours, len(members) - 1)
        if m < 1:
            continue
        points = x[members]
        for start in range(0, len(members), chunk):
            sims = points[start : start + chunk] @ points.T
            rows = torch.arange(sims.shape[0])
            sims[rows, rows + start] = -math.inf  # not its own neighbour
            density[members[start : start + chunk]] = sims.topk(m, dim=1).values.mean(dim=1)
    return density


def geometric_influence_score(
    embeddings: Tensor, result: ClusteringResult, beta: float = 0.5, num_neighbours: int = 8
) -> Tensor:
    """``GIS_k(x_i)`` of each point for its own (arg-max) cluster, ``[N]`` (float64).

    Args:
        embeddings: ``[N, d]`` (normalised here).
        result: a vMF fit (:func:`~zoo.mixing.clustering.fit_gem` / ``fit_vmf_em``; needs ``kappa``).
        beta: weight of the local-density term.
        num_neighbours: ``M`` neighbours of the density.
    """
    if result.kappa is None:
        raise ConfigError("geometric_influence_score needs a vMF clustering (fit_gem or fit_vmf_em), not k-means")
    x = normalize_rows(embeddings)
    labels = result.labels
    rows = torch.arange(x.shape[0])
    gamma = result.responsibilities[rows, labels].to(torch.float64)
    kappa = result.kappa.to(torch.float64)[labels]
    cosine = (x * result.means.to(torch.float64)[labels]).sum(dim=1)
    log_f = vmf_log_normalizer(x.shape[1], kappa) + kappa * cosine
    rho = local_density(x, labels, num_neighbours).clamp_min(1e-6)
    return torch.log(gamma.clamp_min(1e-300)) + log_f + beta * torch.log(rho)


def select_pseudo_labels(scores: Tensor, labels: Tensor, per_cluster: int) -> tuple[Tensor, Tensor]:
    """The ``per_cluster`` highest-scoring members of every cluster (fewer where a cluster is smaller).

    Returns:
        ``(indices [M], labels [M])`` of the selected points, cluster by cluster.
    """
    if per_cluster < 1:
        raise ConfigError(f"per_cluster must be >= 1, got {per_cluster}")
    picked = []
    for k in labels.unique().tolist():
        members = (labels == k).nonzero().flatten()
        top = scores[members].topk(min(per_cluster, len(members))).indices
        picked.append(members[top])
    indices = torch.cat(picked)
    return indices, labels[indices]


class LinearStudent(torch.nn.Module):
    """Multinomial logistic regression ``softmax(W f + b)`` over fixed features ``f`` (``[N, F]`` -> ``[N, K]``)."""

    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(num_features, num_classes)

    def forward(self, features: Tensor) -> Tensor:
        """``[N, F]`` features -> ``[N, K]`` logits."""
        return self.linear(features)

    @torch.no_grad()
    def predict(self, features: Tensor, batch_size: int = 65536) -> Tensor:
        """``[N]`` predicted labels, in batches (time linear in N)."""
        out = [self(features[i : i + batch_size].float()).argmax(dim=1) for i in range(0, len(features), batch_size)]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def train_student(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    epochs: int = 100,
    lr: float = 0.1,
    weight_decay: float = 1e-4,
    seed: int = 0,
) -> LinearStudent:
    """Fit a :class:`LinearStudent` on ``[M, F]`` features and ``[M]`` pseudo-labels (full-batch Adam, seeded)."""
    if len(features) != len(labels) or len(features) == 0:
        raise ConfigError(
            f"train_student needs as many labels as feature rows (> 0), got {len(features)}, {len(labels)}"
        )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        student = LinearStudent(features.shape[1], num_classes)
    optimizer = torch.optim.Adam(student.parameters(), lr=lr, weight_decay=weight_decay)
    x, y = features.float(), labels.long()
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(student(x), y)
        loss.backward()
        optimizer.step()
    return student


def bag_of_words(texts: Sequence[str], dim: int = 4096) -> Tensor:
    """Hashed unigram+bigram counts, ``log1p``-scaled and L2-normalised: the student's features (``[N, dim]``)."""
    from zoo.text.encoders import HashingEncoder

    counts = HashingEncoder(dim, bigrams=True).encode(texts).abs()
    features = torch.log1p(counts)
    return features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)
