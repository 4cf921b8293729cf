"""Bucket a corpus: cluster its embeddings with one of the four arms, select GIS pseudo-labels, label with a student.

The pipeline of GEM (arXiv 2605.26121, notes §2a) around the clustering cores, shared by ``+method=gem`` and the demo:

1. :func:`cluster` -- ``kmeans`` | ``spherical_kmeans`` | ``vmf_em`` | ``gem`` on the (normalised) embeddings;
2. :func:`student_labelling` -- GIS-selected, cluster-balanced pseudo-labels (top ``seed_fraction`` of the corpus)
   train a linear bag-of-words student that labels every document in linear time (for the k-means arms, whose fits
   have no vMF density, the score is the cosine to the centre);
3. :func:`bucket_metrics` -- mass entropy, largest share, NMI against the true labels (when known), student accuracy
   against the clustering's own labels on the documents it was not trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zoo.errors import ConfigError
from zoo.mixing.clustering import (
    ClusteringResult,
    fit_gem,
    fit_vmf_em,
    kmeans,
    mass_entropy,
    max_share,
    normalize_rows,
    normalized_mutual_info,
    spherical_kmeans,
)
from zoo.mixing.gis import bag_of_words, geometric_influence_score, select_pseudo_labels, train_student

CLUSTERERS = ("kmeans", "spherical_kmeans", "vmf_em", "gem")


def cluster(
    embeddings: Tensor,
    method: str,
    num_clusters: int,
    *,
    lam: float = 5000.0,
    num_iters: int = 50,
    seed: int = 0,
    kappa: str | float = "banerjee",
    num_init: int = 1,
) -> ClusteringResult:
    """Fit one bucketing arm (``lam`` and ``kappa`` apply to ``gem``; ``kappa`` also to ``vmf_em``; ``num_init``
    restarts to the k-means arms)."""
    if method == "kmeans":
        return kmeans(embeddings, num_clusters, num_iters, seed, num_init=num_init)
    if method == "spherical_kmeans":
        return spherical_kmeans(embeddings, num_clusters, num_iters, seed, num_init=num_init)
    if method == "vmf_em":
        return fit_vmf_em(embeddings, num_clusters, num_iters, seed, kappa=kappa)
    if method == "gem":
        return fit_gem(embeddings, num_clusters, lam, num_iters, seed, kappa=kappa)
    raise ConfigError(f"clustering method must be one of {CLUSTERERS}, got {method!r}")


def influence_scores(embeddings: Tensor, result: ClusteringResult, beta: float = 0.5) -> Tensor:
    """GIS for vMF fits; the cosine to the assigned centre for the k-means arms (no density to score with)."""
    if result.kappa is not None:
        return geometric_influence_score(embeddings, result, beta=beta)
    x = normalize_rows(embeddings)
    centres = torch.nn.functional.normalize(result.means.to(torch.float64), dim=1)
    return (x * centres[result.labels]).sum(dim=1)


@dataclass
class StudentOutcome:
    """Labels of the whole corpus from the student, and which rows were its pseudo-labelled training set."""

    labels: Tensor
    seed_indices: Tensor
    accuracy: float


def student_labelling(
    texts: Sequence[str],
    embeddings: Tensor,
    result: ClusteringResult,
    seed_fraction: float = 0.1,
    features_dim: int = 4096,
    epochs: int = 100,
    seed: int = 0,
) -> StudentOutcome:
    """Train the bag-of-words student on the top-GIS ``seed_fraction`` of the corpus (balanced over clusters) and
    label everything; ``accuracy`` = agreement with the clustering's labels on the rows outside the seed set."""
    if not 0 < seed_fraction <= 1:
        raise ConfigError(f"seed_fraction must be in (0, 1], got {seed_fraction}")
    k = result.responsibilities.shape[1]
    per_cluster = max(1, round(seed_fraction * len(texts) / k))
    indices, pseudo = select_pseudo_labels(influence_scores(embeddings, result), result.labels, per_cluster)
    features = bag_of_words(texts, features_dim)
    student = train_student(features[indices], pseudo, k, epochs=epochs, seed=seed)
    labels = student.predict(features)
    rest = torch.ones(len(texts), dtype=torch.bool)
    rest[indices] = False
    accuracy = float((labels[rest] == result.labels[rest]).double().mean()) if bool(rest.any()) else float("nan")
    return StudentOutcome(labels, indices, accuracy)


def bucket_metrics(result: ClusteringResult, true_labels: Sequence[Any] | None = None) -> dict[str, float]:
    """``mass_entropy`` (of the hard buckets, nats), ``mass_entropy_ratio`` (over ``log K``), ``max_share``,
    ``soft_mass_entropy`` and, with ``true_labels``, ``nmi``."""
    k = result.responsibilities.shape[1]
    out = {
        "mass_entropy": mass_entropy(result.labels, k),
        "mass_entropy_ratio": mass_entropy(result.labels, k) / float(torch.log(torch.tensor(float(max(k, 2))))),
        "max_share": max_share(result.labels, k),
        "soft_mass_entropy": mass_entropy(result.responsibilities),
        "iterations": float(len(result.objective)),
    }
    if true_labels is not None:
        names = {name: i for i, name in enumerate(sorted({str(v) for v in true_labels}))}
        truth = torch.tensor([names[str(v)] for v in true_labels])
        out["nmi"] = normalized_mutual_info(truth, result.labels)
    return out
