"""Directions and probes: diff-of-means recovers a planted feature, probe AUROC is chance on shuffled labels and
high on real ones, fits are deterministic, AUROC matches a hand computation, bad inputs fail clearly."""

from __future__ import annotations

import pytest
import torch
from interp_models import single_thread  # noqa: F401  (autouse fixture)

from zoo.errors import ConfigError, DataError
from zoo.interp import LinearProbe, auroc, cosine, diff_of_means


def planted(n_pos=2000, n_neg=1000, d=64, strength=6.0, seed=0):
    """Gaussian activations with a common offset; the positive class is shifted along a unit ``feature``."""
    g = torch.Generator().manual_seed(seed)
    feature = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    offset = 5 * torch.randn(d, generator=g)
    pos = torch.randn(n_pos, d, generator=g) + offset + strength * feature
    neg = torch.randn(n_neg, d, generator=g) + offset
    return pos, neg, feature


def test_diff_of_means_hand_value_and_planted_feature():
    v = diff_of_means(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0.0, 1.0]]))
    assert torch.equal(v, torch.tensor([2.0, 2.0]))
    pos, neg, feature = planted()
    assert cosine(diff_of_means(pos, neg), feature) > 0.99


def test_probe_auroc_is_high_on_labels_and_chance_on_shuffled_labels():
    pos, neg, feature = planted(n_pos=1000, n_neg=1000, d=32, strength=3.0)
    x = torch.cat([pos, neg])
    y = torch.cat([torch.ones(1000), torch.zeros(1000)]).long()
    order = torch.randperm(2000, generator=torch.Generator().manual_seed(1))
    x, y = x[order], y[order]
    train, test = slice(0, 1000), slice(1000, 2000)
    probe = LinearProbe().fit(x[train], y[train])
    assert probe.auroc(x[test], y[test]) > 0.9
    assert cosine(probe.direction, feature) > 0.9
    shuffled = y[train][torch.randperm(1000, generator=torch.Generator().manual_seed(2))]
    chance = LinearProbe().fit(x[train], shuffled)
    assert abs(chance.auroc(x[test], y[test]) - 0.5) < 0.07


def test_fits_are_deterministic_across_runs():
    pos, neg, _ = planted(d=16)
    x = torch.cat([pos, neg])
    y = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).long()
    torch.manual_seed(0)
    a = LinearProbe().fit(x, y)
    torch.manual_seed(999)
    torch.rand(100)
    b = LinearProbe().fit(x, y)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert torch.equal(diff_of_means(pos, neg), diff_of_means(pos, neg))


def test_multiclass_probe_separates_clusters():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 8, generator=g) * 4
    y = torch.arange(400) % 4
    x = centers[y] + torch.randn(400, 8, generator=g)
    probe = LinearProbe(num_classes=4).fit(x, y)
    assert probe.accuracy(x, y) > 0.95
    assert torch.allclose(probe.predict_proba(x).sum(-1), torch.ones(400))
    with pytest.raises(ConfigError, match="binary"):
        probe.direction  # noqa: B018


def test_auroc_hand_value_and_errors():
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    with pytest.raises(DataError, match="both classes"):
        auroc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))
    with pytest.raises(DataError, match="0/1"):
        auroc(torch.tensor([0.1, 0.2]), torch.tensor([0, 2]))


def test_bad_probe_inputs():
    with pytest.raises(RuntimeError, match="not fitted"):
        LinearProbe().logits(torch.zeros(2, 3))
    with pytest.raises(DataError, match=r"labels must lie in \[0, 2\)"):
        LinearProbe().fit(torch.zeros(3, 2), torch.tensor([0, 1, 2]))
    with pytest.raises(DataError, match="3 rows but y has 2"):
        LinearProbe().fit(torch.zeros(3, 2), torch.tensor([0, 1]))
    probe = LinearProbe().fit(torch.randn(10, 4), torch.arange(10) % 2)
    with pytest.raises(DataError, match="width 5"):
        probe.score(torch.zeros(2, 5))
    with pytest.raises(DataError, match="widths differ"):
        diff_of_means(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="l2"):
        LinearProbe(l2=0.0)
