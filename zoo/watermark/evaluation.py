"""Evaluation of sentence watermarks: calibration per key, cell occupancy and TPR at a fixed FPR.

Why per key: a human sentence after one in region ``a`` is green under key ``k`` with probability
``p_k = sum_{a, b} P(a, b) [b in G_k(a)]`` (``P(a, b)``: how often human text moves from region ``a`` to ``b``).
The z-test assumes ``p_k = gamma``; that holds for every key only when regions (and transitions) have equal mass,
otherwise ``p_k`` spreads over keys and so does the false-positive rate of the fixed threshold (research notes
``inference.md`` section 4, measured table).

* :func:`occupancy_entropy` -- entropy of the region histogram over ``log R`` (1 = equal mass);
* :func:`transition_counts` -- ``C[a, b]``: consecutive human sentences in regions ``a`` then ``b``;
* :func:`green_probability_per_key` -- ``p_k`` for many keys from ``C``;
* :func:`false_positive_rate` -- ``P(z > threshold)`` for a text of ``n`` scored sentences each green with
  probability ``p``: the binomial tail, an **approximation** that assumes independent sentences (consecutive
  sentences of a human text are not: same topic, nearby regions);
* :func:`z_scores_per_key` -- the z of every human text under every key, from its regions (no re-encoding);
* :func:`empirical_fpr` -- the FPR **measured** on negative (human) texts: the fraction flagged at a threshold;
* :func:`empirical_threshold` -- the smallest threshold whose measured FPR on negative texts is at most ``fpr``
  (1%: the threshold a deployment calibrated on human text would use);
* :func:`tpr_at_fpr` -- the detection rate at that threshold;
* :func:`human_texts` -- unwatermarked texts: one-topic or multi-topic grammar texts, real sentences of the Python
  docs, or a text/JSONL corpus;
* :func:`split_negatives` -- a seeded split of negative texts into a calibration part (it chooses the threshold)
  and a reported part (where the FPR at that threshold is measured).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from zoo.errors import ConfigError, DataError
from zoo.text.human import python_docs_texts
from zoo.text.topics import TopicGrammar
from zoo.watermark.green import check_gamma, green_regions


def occupancy_entropy(regions: torch.Tensor, num_regions: int) -> float:
    """Entropy of the histogram of ``regions`` ``[N]`` divided by ``log R`` (1 = every region equally used)."""
    regions = torch.as_tensor(regions, dtype=torch.long).flatten()
    if regions.numel() == 0:
        raise DataError("occupancy entropy of no regions is undefined")
    p = torch.bincount(regions, minlength=num_regions).double() / regions.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum() / math.log(num_regions))


def transition_counts(texts_regions: Sequence[Sequence[int]], num_regions: int) -> torch.Tensor:
    """``[R, R]`` float64 counts of consecutive sentence pairs (previous region, region) over texts."""
    counts = torch.zeros(num_regions, num_regions, dtype=torch.float64)
    for regions in texts_regions:
        for previous, region in zip(regions, regions[1:]):
            counts[int(previous), int(region)] += 1
    return counts


def green_probability_per_key(counts: torch.Tensor, keys: Sequence[int], gamma: float) -> torch.Tensor:
    """``p_k`` ``[K]`` (float64): the fraction of the counted transitions ``a -> b`` with ``b in G_k(a)``."""
    total = float(counts.sum())
    if total == 0:
        raise DataError("no sentence transitions to estimate green probabilities from (texts need >= 2 sentences)")
    num_regions = counts.shape[0]
    out = torch.empty(len(keys), dtype=torch.float64)
    for i, key in enumerate(keys):
        mask = torch.zeros(num_regions, num_regions, dtype=torch.bool)
        for previous in range(num_regions):
            mask[previous, green_regions(int(key), previous, num_regions, gamma)] = True
        out[i] = float(counts[mask].sum()) / total
    return out


def false_positive_rate(p: float, num_scored: int, gamma: float, threshold: float) -> float:
    """``P(z > threshold)`` when each of ``num_scored`` sentences is green with probability ``p`` (binomial tail),
    ``z = (n_g - gamma n) / sqrt(n gamma (1 - gamma))``; 0.0 when even ``n_g = n`` stays at or below the threshold.

    An approximation: it treats a text's sentences as independent draws. The rate measured on human texts is
    :func:`empirical_fpr` (of :func:`z_scores_per_key` per key)."""
    gamma = check_gamma(gamma)
    if num_scored < 1:
        raise ConfigError(f"num_scored must be >= 1, got {num_scored}")
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"p must be a probability, got {p}")
    cut = gamma * num_scored + threshold * math.sqrt(num_scored * gamma * (1.0 - gamma))
    # a float also when no count can pass the threshold (too few scored sentences): the FPR is then 0.0
    return math.fsum(
        math.comb(num_scored, g) * p**g * (1.0 - p) ** (num_scored - g)
        for g in range(num_scored + 1)
        if g > cut + 1e-12
    )


def z_scores_per_key(
    texts_regions: Sequence[Sequence[int]], num_regions: int, keys: Sequence[int], gamma: float
) -> torch.Tensor:
    """``[K, N]`` float64: the z of each text (its sentences' regions, sentence 1 not scored as in
    :func:`~zoo.watermark.detect.detect` without the prompt) under each key; NaN for a text with fewer than two
    sentences. Regions do not depend on the key, so no text is encoded again."""
    gamma = check_gamma(gamma)
    out = torch.full((len(keys), len(texts_regions)), math.nan, dtype=torch.float64)
    for i, key in enumerate(keys):
        green = {a: set(green_regions(int(key), a, num_regions, gamma).tolist()) for a in range(num_regions)}
        for j, regions in enumerate(texts_regions):
            n = len(regions) - 1
            if n >= 1:
                hits = sum(int(b) in green[int(a)] for a, b in zip(regions, regions[1:]))
                out[i, j] = (hits - gamma * n) / math.sqrt(n * gamma * (1.0 - gamma))
    return out


def _defined(scores: Sequence[float | None]) -> list[float]:
    return [float(x) for x in scores if x is not None and math.isfinite(float(x))]


def empirical_fpr(negative: Sequence[float | None], threshold: float) -> float:
    """The false-positive rate measured on negative (human) texts: the fraction of them with ``score > threshold``
    (undefined scores, None/NaN, count as not flagged)."""
    if not negative:
        raise DataError("empirical_fpr needs at least one negative score")
    return sum(1 for x in _defined(negative) if x > threshold) / len(negative)


def empirical_threshold(negative: Sequence[float | None], fpr: float = 0.01) -> float:
    """The smallest threshold that flags (``score > threshold``) at most ``floor(fpr * n)`` of the ``n`` defined
    negative scores: a defined negative score, so ``empirical_fpr(negative, threshold) <= fpr``."""
    if not 0.0 <= fpr < 1.0:
        raise ConfigError(f"fpr must be in [0, 1), got {fpr}")
    neg = sorted(_defined(negative))
    if not neg:
        raise DataError("an empirical threshold needs at least one defined negative score")
    allowed = math.floor(fpr * len(neg))  # negatives that may be flagged
    return neg[len(neg) - 1 - allowed]


def tpr_at_fpr(positive: Sequence[float], negative: Sequence[float], fpr: float = 0.01) -> tuple[float, float]:
    """Detection rate of ``positive`` scores at :func:`empirical_threshold` of the ``negative`` scores (``score >
    threshold`` is flagged); returns ``(tpr, threshold)``. Undefined scores (None/NaN) count as not flagged."""
    threshold = empirical_threshold(negative, fpr)
    hits = sum(1 for x in positive if x is not None and math.isfinite(x) and x > threshold)
    return hits / len(positive) if positive else float("nan"), threshold


HUMAN_CORPORA = ("topics", "topics_mixed", "python_docs")


def human_texts(corpus: str = "topics", texts: int = 200, sentences: int = 20, seed: int = 12345) -> list[str]:
    """Unwatermarked texts of ``sentences`` sentences each.

    ``corpus``: ``topics`` -- one-topic texts of the grammar (:meth:`~zoo.text.topics.TopicGrammar.text`, seeds
    ``seed + i``; they stay in the few regions of their topic); ``topics_mixed`` -- grammar texts whose every
    sentence is on a uniformly drawn topic (:meth:`~zoo.text.topics.TopicGrammar.mixed_text`: they align with no
    partition); ``python_docs`` -- real human sentences, consecutive prose of the Python Language Reference that
    ships with Python (:func:`zoo.text.human.python_docs_texts`); a ``.txt`` / ``.jsonl`` corpus is cut into
    consecutive groups of ``sentences`` sentences."""
    if texts < 1 or sentences < 2:
        raise ConfigError(f"human texts need texts >= 1 and sentences >= 2, got {texts} and {sentences}")
    if corpus in ("topics", "topics_mixed"):
        grammar = TopicGrammar()
        write = grammar.text if corpus == "topics" else grammar.mixed_text
        return [write(sentences, seed=seed + i) for i in range(texts)]
    if corpus == "python_docs":
        return python_docs_texts(texts, sentences, seed)
    from zoo.watermark.fitting import domain_corpus

    pool = domain_corpus(corpus, texts * sentences, seed)
    if len(pool) < texts * sentences:
        raise DataError(f"corpus {corpus!r} has {len(pool)} sentences, fewer than {texts} texts x {sentences}")
    return [" ".join(pool[i * sentences : (i + 1) * sentences]) for i in range(texts)]


def split_negatives(count: int, calibration: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices ``0 .. count - 1`` split at random (seeded) into ``(calibration, reported)``: ``round(calibration *
    count)`` texts choose the threshold, the others measure its FPR, so the reported FPR is out of sample.
    ``calibration = 0`` keeps every text in both roles (the threshold is then chosen on the reported texts)."""
    if not 0.0 <= calibration < 1.0:
        raise ConfigError(f"the calibration fraction must be in [0, 1), got {calibration}")
    if calibration == 0.0:
        return list(range(count)), list(range(count))
    size = round(calibration * count)
    if size < 1 or size >= count:
        raise ConfigError(
            f"a calibration fraction of {calibration} of {count} negative texts leaves no text on one side"
        )
    order = list(range(count))
    random.Random(f"negatives:{seed}").shuffle(order)
    return sorted(order[:size]), sorted(order[size:])


__all__ = [
    "HUMAN_CORPORA",
    "empirical_fpr",
    "empirical_threshold",
    "false_positive_rate",
    "green_probability_per_key",
    "human_texts",
    "occupancy_entropy",
    "split_negatives",
    "tpr_at_fpr",
    "transition_counts",
    "z_scores_per_key",
]
