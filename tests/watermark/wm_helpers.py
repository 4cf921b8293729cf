"""Helpers of the sentence-watermark tests: data, the hashing encoder, fitted partitions (built once per session).

Kept out of a ``conftest.py`` so the ``from conftest import ...`` of the other test folders stays unambiguous.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from zoo.data.topic_sentences import TopicGrammar
from zoo.watermark import BalancedPartitioner, HashingEncoder, KMeansPartitioner, LSHPartitioner, Partitioner

# small tensors: one intra-op thread avoids thread spinning on a shared machine (tens of times faster here)
torch.set_num_threads(1)

GRAMMAR = TopicGrammar()
ENCODER = HashingEncoder(128)
NUM_REGIONS = 8


def occupancy_entropy(regions: torch.Tensor, num_regions: int) -> float:
    """Entropy of the region histogram divided by ``log R`` (1 = perfectly even)."""
    p = torch.bincount(regions, minlength=num_regions).double() / regions.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum() / math.log(num_regions))


def anisotropic_gaussian(n: int, seed: int, dim: int = 24) -> torch.Tensor:
    """Points in a narrow cone, like sentence embeddings: a large common mean, variances decaying 100x."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -2, dim, dtype=torch.float64)
    mean = torch.zeros(dim, dtype=torch.float64)
    mean[:3] = torch.tensor([1.0, 0.6, -0.4], dtype=torch.float64)
    return (mean + torch.randn(n, dim, generator=g, dtype=torch.float64) * scales).float()


@cache
def corpus_embeddings() -> torch.Tensor:
    """Hashing embeddings ``[1200, 128]`` of a grammar corpus (seed 0)."""
    return ENCODER.encode(GRAMMAR.corpus(1200, seed=0))


@cache
def fitted(kind: str) -> Partitioner:
    """A fitted 8-region partition of each kind (``lsh``, ``kmeans``, ``balanced``) on :func:`corpus_embeddings`."""
    builders = {"lsh": LSHPartitioner, "kmeans": KMeansPartitioner, "balanced": BalancedPartitioner}
    return builders[kind](NUM_REGIONS, seed=1).fit(corpus_embeddings())
