"""Evaluation helpers (zoo.watermark.evaluation): the binomial false-positive rate, per-key green probabilities
(equal mass calibrates every key, unequal mass does not), occupancy entropy, TPR at a fixed FPR, human texts."""

from __future__ import annotations

import math

import pytest
import torch
from wm_helpers import ENCODER, GRAMMAR, NUM_REGIONS, anisotropic_gaussian, fitted

from zoo.errors import ConfigError, DataError
from zoo.watermark import BalancedPartitioner, LSHPartitioner, WatermarkScheme, detect, split_sentences
from zoo.watermark.evaluation import (
    empirical_fpr,
    empirical_threshold,
    false_positive_rate,
    green_probability_per_key,
    human_texts,
    occupancy_entropy,
    tpr_at_fpr,
    transition_counts,
    z_scores_per_key,
)


def test_false_positive_rate_is_the_binomial_tail_above_the_z_threshold():
    n, gamma, p = 9, 0.25, 0.3
    cut = gamma * n + 3.0 * math.sqrt(n * gamma * (1 - gamma))  # 6.15: z > 3 needs 7 or more green of 9
    expected = sum(math.comb(n, g) * p**g * (1 - p) ** (n - g) for g in range(7, n + 1))
    assert 6 < cut < 7
    assert false_positive_rate(p, n, gamma, 3.0) == pytest.approx(expected, rel=1e-12)
    # more green mass, more false positives; gamma itself gives the nominal tail
    rates = [false_positive_rate(q, 19, 0.25, 3.0) for q in (0.2, 0.25, 0.3, 0.36)]
    assert rates == sorted(rates) and rates[1] < 0.01 < rates[3]
    # two scored sentences cannot reach z > 3 (cut 2.34): the rate is a float 0.0 whatever p, also for p = 1
    assert [false_positive_rate(q, 2, 0.25, 3.0) for q in (0.25, 1.0)] == [0.0, 0.0]
    assert isinstance(false_positive_rate(1.0, 2, 0.25, 3.0), float)
    with pytest.raises(ConfigError, match="num_scored"):
        false_positive_rate(0.2, 0, 0.25, 3.0)


def test_uniform_transitions_calibrate_every_key_and_skewed_ones_do_not():
    keys = range(300)
    uniform = torch.ones(NUM_REGIONS, NUM_REGIONS)
    p = green_probability_per_key(uniform, keys, 0.25)
    assert torch.allclose(p, torch.full_like(p, 0.25))  # each row's green set holds gamma R of R regions
    skewed = torch.zeros(NUM_REGIONS, NUM_REGIONS)
    skewed[:, 0], skewed[:, 1:] = 10.0, 1.0  # region 0 is ten times as likely
    q = green_probability_per_key(skewed, keys, 0.25)
    assert q.std() > 0.05 and abs(q.mean() - 0.25) < 0.03
    with pytest.raises(DataError, match="no sentence transitions"):
        green_probability_per_key(torch.zeros(4, 4), keys, 0.25)


def test_equal_mass_cells_spread_the_per_key_false_positive_rate_less_than_lsh():
    """The reason for X-Guard's partition: on an anisotropic cloud, LSH cells have unequal mass, so the false-positive
    rate at the fixed threshold depends on the key; equal-mass cells keep every key near the nominal rate."""
    fit, held_out = anisotropic_gaussian(2000, seed=0), anisotropic_gaussian(4000, seed=1)
    spreads = {}
    for name, partition in (("lsh", LSHPartitioner(8, seed=0)), ("balanced", BalancedPartitioner(8, seed=0))):
        regions = partition.fit(fit).assign(held_out).view(-1, 20).tolist()  # 200 "texts" of 20 sentences
        p = green_probability_per_key(transition_counts(regions, 8), range(200), 0.25)
        fpr = torch.tensor([false_positive_rate(float(x), 19, 0.25, 3.0) for x in p])
        spreads[name] = (float(p.std()), float(fpr.max()))
    assert spreads["balanced"][0] < 0.5 * spreads["lsh"][0]
    assert spreads["balanced"][1] < spreads["lsh"][1]


def test_occupancy_entropy_and_tpr_at_fpr():
    assert occupancy_entropy(torch.arange(8).repeat(5), 8) == pytest.approx(1.0)
    assert occupancy_entropy(torch.zeros(10, dtype=torch.long), 8) == 0.0
    negative = [float(x) for x in range(100)]  # 1% FPR: the threshold flags only the top negative (99)
    tpr, threshold = tpr_at_fpr([98.5, 98.9, 99.5, 120.0, None], negative, 0.01)
    assert threshold == 98.0 and tpr == pytest.approx(4 / 5)
    assert tpr_at_fpr([50.0], negative, 0.0) == (0.0, 99.0)
    with pytest.raises(DataError):
        tpr_at_fpr([1.0], [None], 0.01)


def test_human_texts_from_the_grammar_and_from_a_file(tmp_path):
    texts = human_texts("topics", texts=5, sentences=4, seed=3)
    assert len(texts) == 5 and all(len(split_sentences(t)) == 4 for t in texts)
    assert texts == human_texts("topics", texts=5, sentences=4, seed=3)
    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(texts))
    assert human_texts(str(corpus), texts=2, sentences=10) == [
        " ".join(split_sentences(" ".join(texts))[:10]),
        " ".join(split_sentences(" ".join(texts))[10:20]),
    ]
    with pytest.raises(DataError, match="fewer than 3 texts"):
        human_texts(str(corpus), texts=3, sentences=10)
    with pytest.raises(ConfigError, match="sentences >= 2"):
        human_texts(sentences=1)


def test_empirical_threshold_flags_at_most_the_fpr_of_constructed_negative_scores():
    negative = [float(i) for i in range(200)]  # 0 .. 199
    t = empirical_threshold(negative, 0.01)  # 1% of 200: two may be flagged, 198 and 199
    assert t == 197.0 and empirical_fpr(negative, t) == 0.01
    assert empirical_fpr(negative, t - 0.5) > 0.01  # the smallest such threshold: any lower one flags more
    assert empirical_threshold(negative, 0.0) == 199.0 and empirical_fpr(negative, 199.0) == 0.0
    # undefined negatives (single-sentence texts) are never flagged but count in the rate's denominator
    assert empirical_fpr([None, math.nan, 5.0, 1.0], 2.0) == 0.25
    assert empirical_threshold([None, 3.0, 1.0, 2.0], 0.5) == 2.0
    with pytest.raises(DataError, match="defined negative"):
        empirical_threshold([None, math.nan])
    with pytest.raises(ConfigError, match="fpr"):
        empirical_threshold(negative, 1.0)


def test_measured_fpr_per_key_from_regions_matches_detection():
    """z_scores_per_key reproduces detect's z for every key from the regions alone; its measured FPR at a threshold
    is the fraction of human texts detected."""
    texts = [" ".join(GRAMMAR.corpus(8, seed=500 + i)) for i in range(12)]
    schemes = {key: WatermarkScheme(ENCODER, fitted("balanced"), key=key, gamma=0.25) for key in (3, 4)}
    results = {key: [detect(t, s) for t in texts] for key, s in schemes.items()}
    regions = [r.regions for r in results[3]]
    z = z_scores_per_key(regions, NUM_REGIONS, [3, 4], 0.25)
    for row, key in enumerate((3, 4)):
        torch.testing.assert_close(z[row], torch.tensor([r.z for r in results[key]], dtype=torch.float64))
        low = float(z[row].median())
        assert empirical_fpr(z[row].tolist(), low) == sum(r.z > low for r in results[key]) / len(texts)
