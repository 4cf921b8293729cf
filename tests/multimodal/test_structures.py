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
from zoo.errors import ConfigError, DataError
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


# -- counted motifs: ring / triad counts and the triad-ring relation (answers independent of size) -------------------

COUNTED = StructureTaskConfig(
    min_atoms=40,
    max_atoms=60,
    max_rings=3,
    max_triads=3,
    contact_prob=0.5,
    question_kinds=("ring_count", "triad_count", "contact"),
)


def _bond_facts(s):
    """Ring atoms (ring bonds are 1.4 Å, every other bond 1.5 Å), N-P-S middles by brute force, and contact."""
    d = torch.cdist(s.pos.double(), s.pos.double())
    adj = torch.zeros(s.num_atoms, s.num_atoms, dtype=torch.bool)
    adj[s.bonds[0], s.bonds[1]] = True
    ring_bond = adj & (d < 1.45)
    ring_atoms = ring_bond.any(1)
    n, p, sulphur = (ELEMENT_INDEX[e] for e in ("N", "P", "S"))
    t = s.atom_types
    triad_atoms = torch.zeros(s.num_atoms, dtype=torch.bool)
    middles = 0
    for mid in range(s.num_atoms):
        nb = adj[mid]
        if t[mid] == p and (nb & (t == n)).any() and (nb & (t == sulphur)).any():
            middles += 1
            triad_atoms[mid] = True
            triad_atoms |= nb & ((t == n) | (t == sulphur))
    contact = bool((adj & triad_atoms[:, None] & ring_atoms[None, :]).any())
    return int(ring_atoms.sum()) // 6, middles, contact


@pytest.fixture(scope="module")
def counted():
    return make_structure_samples(45, seed=11, config=COUNTED)


def test_counted_motif_answers_match_the_bond_graph(counted):
    assert {s.kind for s in counted} == {"ring_count", "triad_count", "contact"}
    for s in counted:
        rings, triads, contact = _bond_facts(s)
        assert s.bonds.shape[1] // 2 == s.num_atoms - 1 + rings  # the rings are the bond graph's only cycles
        assert rings == s.meta["n_rings"] <= COUNTED.max_rings
        assert triads == s.meta["n_triads"] >= s.meta["triad_inserted"]
        expected = {"ring_count": str(rings), "triad_count": str(triads), "contact": "yes" if contact else "no"}
        assert s.answer == expected[s.kind], s.sample_id


def test_counted_motifs_do_not_depend_on_size():
    small = make_structure_samples(40, seed=2, config=dataclasses.replace(COUNTED, min_atoms=40, max_atoms=40))
    large = make_structure_samples(10, seed=2, config=dataclasses.replace(COUNTED, min_atoms=150, max_atoms=150))
    for group in (small, large):
        assert {s.meta["n_rings"] for s in group} == set(range(COUNTED.max_rings + 1))
        assert max(s.meta["triad_inserted"] for s in group) == COUNTED.max_triads


def test_contact_prob_controls_the_relation():
    def contacts(prob):
        cfg = dataclasses.replace(COUNTED, contact_prob=prob, question_kinds=("contact",))
        both = [s for s in make_structure_samples(30, seed=5, config=cfg) if s.meta["n_rings"] and s.meta["n_triads"]]
        assert len(both) >= 10
        return [s.answer == "yes" for s in both]

    assert all(contacts(1.0))
    assert sum(contacts(0.0)) <= 2  # kept apart in the build order (a stuck walk may still branch onto a ring)


def test_counted_kinds_need_motif_counts():
    with pytest.raises(ConfigError, match="max_rings"):
        StructureTaskConfig(question_kinds=("ring_count",))
    with pytest.raises(ConfigError, match="both"):
        StructureTaskConfig(max_rings=2)
    with pytest.raises(ConfigError, match="contact_prob"):
        StructureTaskConfig(max_rings=2, max_triads=2, contact_prob=1.5)


def test_split_task_gives_a_size_extrapolation_split():
    from zoo.datamodules.structures import StructureTaskSource

    source = StructureTaskSource(
        num_train=6, num_val=6, num_test=2, seed=0, task={"min_atoms": 10, "max_atoms": 20},
        split_task={"val": {"min_atoms": 21, "max_atoms": 40}},
    )  # fmt: skip
    assert all(10 <= r["sample"].num_atoms <= 20 for r in source.rows("train"))
    assert all(21 <= r["sample"].num_atoms <= 40 for r in source.rows("val"))
    assert all(10 <= r["sample"].num_atoms <= 20 for r in source.rows("test"))
    with pytest.raises(ConfigError, match="unknown split"):
        StructureTaskSource(split_task={"eval": {}})
    with pytest.raises(ConfigError, match="task"):
        StructureTaskSource(split_task={"val": {"max_atom": 3}})
