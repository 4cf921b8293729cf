"""Partitioners: equal mass (X-Guard) vs LSH on an anisotropic Gaussian, whitening, scale invariance, margins,
save/load, and the errors a researcher sees (inference.md 4(e))."""

from __future__ import annotations

import json

import pytest
import torch
from wm_helpers import anisotropic_gaussian, corpus_embeddings, fitted, occupancy_entropy

from zoo.errors import CheckpointNotFoundError, ConfigError, DataError
from zoo.watermark import (
    BalancedPartitioner,
    KMeansPartitioner,
    LSHPartitioner,
    Whitener,
    equal_mass_offsets,
    load_partitioner,
)
from zoo.watermark.partition import normalize_rows
from zoo.watermark.xguard import balanced_targets

R = 8


@pytest.fixture(scope="module")
def gaussian_fit_and_heldout() -> tuple[torch.Tensor, torch.Tensor]:
    return anisotropic_gaussian(4000, seed=0), anisotropic_gaussian(4000, seed=1)


def test_balanced_partition_equal_mass_where_lsh_is_unbalanced(gaussian_fit_and_heldout):
    fit, held = gaussian_fit_and_heldout
    lsh = LSHPartitioner(R, seed=0).fit(fit)
    balanced = BalancedPartitioner(R, seed=0).fit(fit)

    counts = torch.bincount(balanced.assign(fit), minlength=R)
    assert (counts - len(fit) / R).abs().max() <= 1, counts.tolist()
    assert occupancy_entropy(balanced.assign(held), R) >= 0.97
    # the same data through LSH: visibly unbalanced (hyperplanes through the origin, data in a cone)
    assert occupancy_entropy(lsh.assign(held), R) < 0.9
    # and without the equal-mass offsets the product k-means cells are not equal either
    plain = BalancedPartitioner(R, seed=0, mass_balance=0.0).fit(fit)
    plain_counts = torch.bincount(plain.assign(fit), minlength=R)
    assert (plain_counts - len(fit) / R).abs().max() > 20


@pytest.mark.parametrize("num_regions", [4, 9, 16])
def test_balanced_partition_other_region_counts(num_regions, gaussian_fit_and_heldout):
    fit, held = gaussian_fit_and_heldout
    partition = BalancedPartitioner(num_regions, seed=3).fit(fit[:2000])
    regions = partition.assign(held)
    assert regions.dtype == torch.long and int(regions.min()) >= 0 and int(regions.max()) < num_regions
    counts = torch.bincount(partition.assign(fit[:2000]), minlength=num_regions)
    assert (counts - 2000 / num_regions).abs().max() <= 2, counts.tolist()
    assert occupancy_entropy(regions, num_regions) >= 0.97


def test_whitening_gives_identity_covariance(gaussian_fit_and_heldout):
    fit, _ = gaussian_fit_and_heldout
    x = normalize_rows(fit)
    z = Whitener(10).fit(x).transform(x)
    cov = torch.cov(z.T)
    assert z.shape == (len(fit), 10)
    assert torch.allclose(z.mean(0), torch.zeros(10, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(cov, torch.eye(10, dtype=torch.float64), atol=1e-4)
    # the input is far from isotropic, so this is the whitening at work
    raw = torch.linalg.eigvalsh(torch.cov(x.T))
    assert float(raw[-1] / raw[-10]) > 10
    # the partition's own whitener: the same on its fit data
    partition = BalancedPartitioner(R, seed=0).fit(fit)
    z_part = partition.whitener.transform(x)
    assert torch.allclose(torch.cov(z_part.T), torch.eye(partition.feature_dim, dtype=torch.float64), atol=1e-4)


@pytest.mark.parametrize("kind", ["lsh", "kmeans", "balanced"])
def test_region_ids_invariant_to_positive_scaling(kind):
    partition, embeddings = fitted(kind), corpus_embeddings()
    regions, margins = partition.assign_with_margin(embeddings)
    assert len(set(regions.tolist())) > 2  # nontrivial assignments
    for scale in (1e-3, 0.5, 7.0, 1e4):
        scaled_regions, scaled_margins = partition.assign_with_margin(embeddings * scale)
        assert torch.equal(scaled_regions, regions)
        assert torch.allclose(scaled_margins, margins, atol=1e-6)  # float32 inputs: x * scale is rounded
    # a negative scale is not a positive rescaling: LSH regions flip every bit
    if kind == "lsh":
        assert torch.equal(partition.assign(-embeddings), (R - 1) - regions)


def test_lsh_regions_and_margin_by_hand():
    partition = LSHPartitioner(4, seed=0).fit(torch.randn(16, 3))
    partition.normals = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    x = torch.tensor([[3.0, 4.0, 0.0], [-1.0, 1.0, 0.0], [1.0, -2.0, 2.0]])
    regions, margins = partition.assign_with_margin(x)
    assert regions.tolist() == [1 + 2, 0 + 2, 1 + 0]
    expected = [min(3, 4) / 5, 1 / 2**0.5, 1 / 3]
    assert torch.allclose(margins, torch.tensor(expected, dtype=torch.float64))


def test_kmeans_region_is_nearest_centroid_and_margin_is_cosine_gap():
    partition = fitted("kmeans")
    x = normalize_rows(corpus_embeddings()[:50])
    cos = x @ partition.centroids.T
    regions, margins = partition.assign_with_margin(corpus_embeddings()[:50])
    assert torch.equal(regions, cos.argmax(1))
    top2 = cos.sort(dim=1, descending=True).values[:, :2]
    assert torch.allclose(margins, top2[:, 0] - top2[:, 1])


def test_balanced_margin_is_distance_to_cell_boundary():
    partition = fitted("balanced")
    z = partition.features(normalize_rows(corpus_embeddings()[:40]))
    regions, margins = partition.cells(z)
    g = torch.Generator().manual_seed(0)
    for i in range(len(z)):
        # every point strictly inside the ball of radius `margin` keeps the region
        directions = torch.randn(64, z.shape[1], generator=g, dtype=torch.float64)
        ball = z[i] + 0.999 * margins[i] * directions / directions.norm(dim=1, keepdim=True)
        assert bool((partition.cells(ball)[0] == regions[i]).all())
        # and some point just outside it (towards the nearest boundary) is in another region
        others = [r for r in range(R) if r != int(regions[i])]
        outside = []
        for r in others:
            normal = partition.centroids[r] - partition.centroids[regions[i]]
            outside.append(z[i] + 1.001 * margins[i] * normal / normal.norm())
        assert bool((partition.cells(torch.stack(outside))[0] != regions[i]).any())


def test_equal_mass_offsets_balance_arbitrary_costs():
    g = torch.Generator().manual_seed(5)
    cost = torch.rand(997, 6, generator=g, dtype=torch.float64) ** 3 + torch.linspace(0, 0.5, 6, dtype=torch.float64)
    targets = balanced_targets(997, 6)
    assert int(targets.sum()) == 997 and int(targets.max() - targets.min()) == 1
    offsets = equal_mass_offsets(cost, targets)
    counts = torch.bincount((cost - offsets).argmin(1), minlength=6)
    assert (counts - targets).abs().max() <= 1, counts.tolist()
    assert torch.bincount(cost.argmin(1), minlength=6).min() < 100  # unbalanced without the offsets


@pytest.mark.parametrize("kind", ["lsh", "kmeans", "balanced"])
def test_save_load_round_trip(kind, tmp_path):
    partition, embeddings = fitted(kind), corpus_embeddings()
    path = partition.save(tmp_path / f"{kind}_part", encoder="hashing:128")
    assert path.suffix == ".safetensors" and path.with_suffix(".json").is_file()
    loaded, encoder = load_partitioner(tmp_path / f"{kind}_part.safetensors")
    assert encoder == "hashing:128" and type(loaded) is type(partition)
    assert loaded.settings() == partition.settings()
    r0, m0 = partition.assign_with_margin(embeddings)
    r1, m1 = loaded.assign_with_margin(embeddings)
    assert torch.equal(r0, r1) and torch.allclose(m0, m1)


def test_fit_is_deterministic_given_seed():
    embeddings = corpus_embeddings()
    a = BalancedPartitioner(R, seed=4).fit(embeddings).assign(embeddings)
    b = BalancedPartitioner(R, seed=4).fit(embeddings).assign(embeddings)
    torch.manual_seed(123)  # the global RNG plays no part
    c = BalancedPartitioner(R, seed=4).fit(embeddings).assign(embeddings)
    assert torch.equal(a, b) and torch.equal(a, c)
    lsh_a = LSHPartitioner(R, seed=0).fit(embeddings).assign(embeddings)
    lsh_b = LSHPartitioner(R, seed=1).fit(embeddings).assign(embeddings)
    assert not torch.equal(lsh_a, lsh_b)


def test_dimension_mismatch_is_one_clear_error():
    with pytest.raises(ConfigError, match="fit on 128-dim embeddings but got 64-dim"):
        fitted("balanced").assign(torch.randn(3, 64))


def test_bad_inputs_and_settings():
    with pytest.raises(ConfigError, match="2\\^bits"):
        LSHPartitioner(6)
    with pytest.raises(ConfigError, match="K\\^2"):
        BalancedPartitioner(8, num_subspaces=2)
    with pytest.raises(ConfigError, match="num_regions must be an integer >= 2"):
        KMeansPartitioner(1)
    with pytest.raises(ConfigError, match="mass_balance"):
        BalancedPartitioner(8, mass_balance=1.5)
    with pytest.raises(ConfigError, match="not fitted"):
        BalancedPartitioner(8).assign(torch.randn(2, 4))
    with pytest.raises(DataError, match="at least 16 embeddings"):
        BalancedPartitioner(8).fit(torch.randn(10, 32))
    with pytest.raises(DataError, match="zero norm"):
        LSHPartitioner(8).fit(torch.cat([torch.randn(20, 4), torch.zeros(1, 4)]))
    with pytest.raises(DataError, match="lower subspace_dim"):
        BalancedPartitioner(8, subspace_dim=4).fit(torch.randn(50, 8))
    with pytest.raises(DataError, match="NaN"):
        LSHPartitioner(8).fit(torch.full((20, 4), float("nan")))
    assert BalancedPartitioner(8).num_subspaces == 3 and BalancedPartitioner(8).codewords == 2
    assert BalancedPartitioner(9).codewords == 3 and BalancedPartitioner(7).num_subspaces == 1


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="missing.safetensors"):
        load_partitioner(tmp_path / "missing")
    path = fitted("balanced").save(tmp_path / "part")
    record = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**record, "kind": "voronoi"}))
    with pytest.raises(DataError, match="unknown partition kind 'voronoi'"):
        load_partitioner(path)
    path.with_suffix(".json").write_text(json.dumps({**record, "dim": 64}))
    with pytest.raises(DataError, match="whitener_mean"):
        load_partitioner(path)
