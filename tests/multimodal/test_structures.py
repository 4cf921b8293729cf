"""Synthetic 3D structure task (Cuttlefish CPU demo data, notes 4(d)): generation, answers, verifier, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from zoo.data.structures import (
    DISTANCE_BIN_LABELS,
    ELEMENT_INDEX,
    ELEMENTS,
    STRUCTURE_TOKEN,
    StructureQADataset,
    StructureTaskConfig,
    collate_structures,
    distance_bin,
    filter_by_atom_limit,
    make_structure_sample,
    make_structure_samples,
    size_bin,
    structure_reward,
    validate_structure_sample,
    verify_structure_answer,
)
from zoo.errors import DataError
from zoo.multimodal.structure_encoder import to_dense_batch


@pytest.fixture(scope="module")
def samples():
    return make_structure_samples(24, seed=3)


def test_deterministic_from_seed_and_index():
    a, b = make_structure_sample(7, 5), make_structure_sample(7, 5)
    assert torch.equal(a.pos, b.pos)
    assert torch.equal(a.atom_types, b.atom_types)
    assert (a.prompt, a.answer, a.sample_id) == (b.prompt, b.answer, "7-5")
    c = make_structure_sample(8, 5)
    assert c.num_atoms != a.num_atoms or not torch.equal(c.pos, a.pos)
    assert StructureQADataset(10, seed=7)[5].prompt == a.prompt


def test_geometry_sizes_and_radius_graph(samples):
    cfg = StructureTaskConfig()
    for s in samples:
        validate_structure_sample(s)
        assert cfg.min_atoms <= s.num_atoms <= cfg.max_atoms
        d = torch.cdist(s.pos.double(), s.pos.double())
        src, dst = s.bonds
        bond_len = d[src, dst]
        assert ((bond_len > 1.39) & (bond_len < 1.51)).all()
        nonbonded = torch.ones_like(d, dtype=torch.bool)
        nonbonded[src, dst] = False
        nonbonded.fill_diagonal_(False)
        assert (d[nonbonded] >= cfg.min_separation - 1e-4).all()  # self-avoiding
        expected = (d <= cfg.radius) & ~torch.eye(s.num_atoms, dtype=torch.bool)
        adj = torch.zeros_like(expected)
        adj[s.edge_index[0], s.edge_index[1]] = True
        assert torch.equal(adj, expected)
        # bond graph = spanning tree + one extra bond per inserted ring (its only cycles)
        assert s.bonds.shape[1] // 2 == s.num_atoms - 1 + s.meta["n_rings"]


def test_extreme_sizes():
    for n in (6, 300):
        s = make_structure_sample(0, 0, StructureTaskConfig(min_atoms=n, max_atoms=n, ring_prob=1.0, triad_prob=1.0))
        assert s.num_atoms == n
        assert s.meta["n_rings"] >= 1
    assert make_structure_sample(0, 1, StructureTaskConfig(min_atoms=40, max_atoms=40, triad_prob=1.0)).meta[
        "has_triad"
    ]


def test_answers_are_exact(samples):
    kinds = {s.kind for s in samples}
    assert kinds == {"count", "ring", "triad", "distance"}
    for s in samples:
        assert s.prompt.count(STRUCTURE_TOKEN) == 1
        if s.kind == "count":
            assert s.answer == str(int((s.atom_types == ELEMENT_INDEX[s.meta["element"]]).sum()))
        elif s.kind == "ring":
            assert s.answer == ("yes" if s.meta["n_rings"] else "no")
        elif s.kind == "distance":
            a, b = (ELEMENT_INDEX[e] for e in s.meta["pair"])
            d = torch.cdist(s.pos[s.atom_types == a].double(), s.pos[s.atom_types == b].double())
            if a == b:
                d.fill_diagonal_(float("inf"))
            assert s.answer == distance_bin(float(d.min()))
            assert s.answer in DISTANCE_BIN_LABELS


def test_bins():
    assert [size_bin(n) for n in (6, 25, 26, 100, 201)] == ["<=25", "<=25", "26-50", "51-100", ">200"]
    assert [distance_bin(x) for x in (1.5, 2.0, 5.0, 9.0)] == ["bonded", "close", "far", "distant"]


def test_verifier_accepts_right_rejects_wrong():
    assert verify_structure_answer("3", "3")
    assert verify_structure_answer("<think>count O</think> Yes.<eos>", "yes")
    assert not verify_structure_answer("4", "3")
    assert not verify_structure_answer("no", "yes")
    assert not verify_structure_answer("", "3")
    assert structure_reward(["p", "p"], ["close", "far"], answer=["close", "close"]) == [1.0, 0.0]


def _bad(sample, **changes):
    return dataclasses.replace(sample, **changes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: {"pos": s.pos.clone().index_fill_(0, torch.tensor([1]), float("nan"))}, "non-finite"),
        (
            lambda s: {
                "atom_types": s.atom_types[:0],
                "pos": s.pos[:0],
                "edge_index": s.edge_index[:, :0],
                "bonds": s.bonds[:, :0],
            },
            "empty",
        ),
        (lambda s: {"pos": s.pos[:-1]}, "coordinates"),
        (lambda s: {"edge_index": s.edge_index + s.num_atoms}, "edge_index"),
        (lambda s: {"edge_index": s.edge_index[0]}, "edge_index"),
        (lambda s: {"atom_types": s.atom_types + len(ELEMENTS)}, "element types"),
        (lambda s: {"prompt": s.prompt.replace(STRUCTURE_TOKEN, "")}, "placeholder"),
        (lambda s: {"prompt": s.prompt + STRUCTURE_TOKEN}, "placeholder"),
    ],
)
def test_bad_input_raises_naming_the_sample(samples, change, message):
    bad = _bad(samples[0], sample_id="mol-42", **change(samples[0]))
    with pytest.raises(DataError, match=message) as err:
        collate_structures([samples[1], bad])
    assert "mol-42" in str(err.value)


def test_atom_limit_rejects_never_truncates(samples):
    limit = 40
    kept, rejected = filter_by_atom_limit(samples, limit)
    assert rejected == sum(s.num_atoms > limit for s in samples) > 0
    assert all(s.num_atoms <= limit for s in kept)
    assert len(kept) + rejected == len(samples)
    big = next(s for s in samples if s.num_atoms > limit)
    with pytest.raises(DataError, match=f"{big.sample_id}.*max_atoms"):
        collate_structures([big], max_atoms=limit)


def test_collate_concatenates_with_offsets(samples):
    batch = collate_structures(samples[:3])
    counts = [s.num_atoms for s in samples[:3]]
    assert batch.num_atoms.tolist() == counts
    assert batch.num_graphs == 3
    assert batch.batch.tolist() == sum(([i] * n for i, n in enumerate(counts)), [])
    assert batch.edge_index.shape[1] == sum(s.edge_index.shape[1] for s in samples[:3])
    # edges never cross structures and map back to the per-sample edges
    assert torch.equal(batch.batch[batch.edge_index[0]], batch.batch[batch.edge_index[1]])
    e1 = batch.edge_index[:, batch.batch[batch.edge_index[0]] == 1] - counts[0]
    assert torch.equal(e1, samples[1].edge_index)
    dense, mask = to_dense_batch(batch.pos, batch.batch)
    assert dense.shape == (3, max(counts), 3)
    assert mask.sum(1).tolist() == counts
    assert torch.equal(dense[1, : counts[1]], samples[1].pos)
