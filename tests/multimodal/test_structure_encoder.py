"""EGNN structure encoder: E(3) invariance, permutation equivariance, masked pretraining loss."""

from __future__ import annotations

import pytest
import torch

from zoo.data.structures import collate_structures, make_structure_samples
from zoo.multimodal.structure_encoder import (
    StructureEncoder,
    StructurePretrainHeads,
    distance_to_bin,
    structure_pretraining_loss,
    to_dense_batch,
)


def random_orthogonal(seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=dtype))
    return q * torch.sign(torch.diagonal(r))  # may include a reflection: E(3), not only SE(3)


@pytest.fixture(scope="module")
def batch():
    return collate_structures(make_structure_samples(6, seed=11, config=None)[:3])


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return StructureEncoder(num_types=5, hidden=32, num_layers=3, num_rbf=16, rbf_cutoff=6.0).double().eval()


def test_invariant_embeddings_equivariant_coordinates(batch, encoder):
    pos = batch.pos.double()
    rot, shift = random_orthogonal(0), torch.tensor([3.0, -7.0, 11.0], dtype=torch.float64)
    out = encoder(batch.atom_types, pos, batch.edge_index)
    moved = encoder(batch.atom_types, pos @ rot.T + shift, batch.edge_index)
    torch.testing.assert_close(moved.node_emb, out.node_emb, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(moved.pos, out.pos @ rot.T + shift, atol=1e-9, rtol=1e-9)
    assert not torch.allclose(out.pos, pos)  # coordinate updates are on


def test_permutation_equivariant(batch, encoder):
    n = batch.atom_types.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    inv = torch.argsort(perm)
    out = encoder(batch.atom_types, batch.pos.double(), batch.edge_index)
    outp = encoder(batch.atom_types[perm], batch.pos.double()[perm], inv[batch.edge_index])
    torch.testing.assert_close(outp.node_emb, out.node_emb[perm], atol=1e-9, rtol=1e-9)


def test_to_dense_batch_unsorted():
    x = torch.arange(5.0)[:, None]
    dense, mask = to_dense_batch(x, torch.tensor([1, 0, 1, 1, 0]))
    assert dense[..., 0].tolist() == [[1.0, 4.0, 0.0], [0.0, 2.0, 3.0]]
    assert mask.tolist() == [[True, True, False], [True, True, True]]


def test_distance_bins():
    d = torch.tensor([0.0, 0.31, 0.32, 19.9, 25.0])
    assert distance_to_bin(d, num_bins=64, dist_max=20.0).tolist() == [0, 0, 1, 63, 63]


def test_pretraining_loss_masks_inputs_and_learns(batch):
    torch.manual_seed(0)
    enc = StructureEncoder(hidden=32, num_layers=2, num_rbf=16, rbf_cutoff=6.0)
    heads = StructurePretrainHeads(32, num_types=5, num_dist_bins=8)
    args = (batch.atom_types, batch.pos, batch.edge_index)
    kw = {"dist_max": 4.0, "atom_mask_prob": 0.3, "edge_mask_prob": 0.3}
    out = structure_pretraining_loss(enc, heads, *args, generator=torch.Generator().manual_seed(0), **kw)
    assert set(out) == {"loss", "type_loss", "dist_loss", "type_acc", "dist_acc"}
    assert torch.isfinite(out["loss"])
    assert out["type_loss"] > 0
    assert out["dist_loss"] > 0
    out["loss"].backward()
    assert enc.embed.weight.grad.abs().sum() > 0
    assert heads.dist_head[0].weight.grad.abs().sum() > 0
    # the masked atoms' true types never reach the encoder: changing them leaves the loss's embeddings unchanged
    g = torch.Generator().manual_seed(5)
    atom_mask = torch.rand(batch.atom_types.shape[0], generator=g) < 0.3
    changed = torch.where(atom_mask, (batch.atom_types + 1) % 5, batch.atom_types)
    seed_a = structure_pretraining_loss(enc, heads, *args, generator=torch.Generator().manual_seed(5), **kw)
    seed_b = structure_pretraining_loss(
        enc, heads, changed, batch.pos, batch.edge_index, generator=torch.Generator().manual_seed(5), **kw
    )
    assert torch.equal(seed_a["dist_loss"], seed_b["dist_loss"])  # depends on embeddings of unmasked inputs only
    # a few optimisation steps on a fixed batch lower the loss
    opt = torch.optim.Adam([*enc.parameters(), *heads.parameters()], lr=3e-3)
    losses = []
    for step in range(12):
        opt.zero_grad()
        loss = structure_pretraining_loss(enc, heads, *args, generator=torch.Generator().manual_seed(step % 3), **kw)
        loss["loss"].backward()
        opt.step()
        losses.append(loss["loss"].item())
    assert sum(losses[-3:]) < sum(losses[:3])
