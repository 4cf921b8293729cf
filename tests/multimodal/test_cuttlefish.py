"""Cuttlefish cores: k_g rule, soft assignment, invariances, insertion into a tiny Llama, gate gradient (notes 4(e))."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from zoo.data.structures import collate_structures, make_structure_samples
from zoo.errors import ConfigError, DataError
from zoo.multimodal.cuttlefish import (
    IGNORE_INDEX,
    CuttlefishConnector,
    MeanPoolConnector,
    QueryConnector,
    ScalingAwarePatching,
    insert_structure_tokens,
    instruction_embedding,
    num_patches,
    num_patches_batched,
)
from zoo.multimodal.structure_encoder import StructureEncoder, encode_dense

D, H, PLACEHOLDER = 32, 64, 63


# ---------------------------------------------------------------------------------------------------------- k_g (P3)


@pytest.mark.parametrize(
    ("probs", "rho", "k_max", "expected"),
    [
        ([0.5, 0.3, 0.2], 0.5, 256, 1),
        ([0.5, 0.3, 0.2], 0.6, 256, 2),
        ([0.2, 0.5, 0.3], 0.8, 256, 2),  # sorted before accumulating
        ([0.2, 0.5, 0.3], 0.81, 256, 3),
        ([0.2, 0.5, 0.3], 1.0, 2, 2),  # clipped to k_max
        ([0.4, 0.3, 0.2, 0.1], 0.01, 256, 1),
        ([1.0], 1.0, 256, 1),
    ],
)
def test_num_patches_hand_values(probs, rho, k_max, expected):
    assert num_patches(torch.tensor(probs), rho, k_max) == expected


@pytest.mark.parametrize("rho", [0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
def test_uniform_gives_ceil_rho_n_non_decreasing(rho):
    exact = Fraction(rho).limit_denominator(100)
    ks = []
    for n in range(1, 121):
        k = num_patches(torch.softmax(torch.zeros(n), 0), rho, k_max=256)
        assert k == math.ceil(exact * n), (n, k)
        ks.append(k)
    assert all(a <= b for a, b in zip(ks, ks[1:]))
    assert num_patches(torch.softmax(torch.zeros(3000), 0), 0.1, k_max=256) == 256  # saturates k_max


@pytest.mark.parametrize("n", [2, 7, 300])
def test_dominant_logit_gives_one(n):
    logits = torch.zeros(n)
    logits[n // 2] = 20.0
    assert num_patches(torch.softmax(logits, 0), rho=0.5, k_max=256) == 1


def test_batched_matches_per_structure_and_validates():
    g = torch.Generator().manual_seed(0)
    mask = torch.arange(50)[None] < torch.tensor([[3], [17], [50]])
    probs = torch.softmax(torch.randn(3, 50, generator=g).masked_fill(~mask, float("-inf")), -1)
    ks = num_patches_batched(probs, mask, 0.3, 8)
    assert ks.tolist() == [num_patches(probs[b, mask[b]], 0.3, 8) for b in range(3)]
    with pytest.raises(ConfigError, match="rho"):
        num_patches(probs[0], 0.0, 8)
    with pytest.raises(ConfigError, match="k_max"):
        num_patches(probs[0], 0.5, 0)


# ------------------------------------------------------------------------------------------------ patching (P4, P5)


def _padded(sizes, dim=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = max(sizes)
    mask = torch.arange(n)[None] < torch.tensor(sizes)[:, None]
    x = torch.randn(len(sizes), n, dim, generator=g, dtype=torch.float64) * mask[..., None]
    pos = torch.randn(len(sizes), n, 3, generator=g, dtype=torch.float64) * 3 * mask[..., None]
    return x, pos, mask


def test_assignment_rows_sum_to_one_and_tokens_are_convex():
    torch.manual_seed(0)
    patch = ScalingAwarePatching(D, H, rho=0.3).double()
    x, pos, mask = _padded([5, 40, 13])
    out = patch(x, pos, mask, torch.randn(3, H, dtype=torch.float64))
    rows = out.assignment.sum(-1)
    torch.testing.assert_close(rows[mask], torch.ones_like(rows[mask]))
    assert (rows[~mask] == 0).all()
    assert (out.assignment[~out.patch_mask[:, None, :].expand_as(out.assignment)] == 0).all()
    assert out.num_patches.tolist() == out.patch_mask.sum(1).tolist()
    assert (out.tokens[~out.patch_mask] == 0).all()
    # identical atoms -> every token equals that atom (tokens are convex combinations of atom embeddings)
    same = x[:, :1].expand_as(x).clone() * mask[..., None]
    out = patch(same, pos, mask)
    for b in range(3):
        k = int(out.num_patches[b])
        torch.testing.assert_close(out.tokens[b, :k], same[b, :1].expand(k, -1))


def test_tau_sharpens_assignment_and_r_max_truncates():
    torch.manual_seed(0)
    x, pos, mask = _padded([60])
    soft = ScalingAwarePatching(D, None, rho=0.5, tau=1.0).double()
    hard = ScalingAwarePatching(D, None, rho=0.5, tau=0.1).double()
    hard.load_state_dict(soft.state_dict())
    w_soft, w_hard = soft(x, pos, mask).assignment[0], hard(x, pos, mask).assignment[0]
    assert w_hard.max(-1).values.mean() > w_soft.max(-1).values.mean()
    assert w_hard.max(-1).values.mean() > 0.9  # code's tau = 0.1 on Å distances: nearly Voronoi
    trunc = ScalingAwarePatching(D, None, rho=0.5, r_max=3).double()
    trunc.load_state_dict(soft.state_dict())
    w = trunc(x, pos, mask).assignment[0]
    assert ((w > 0).sum(0) <= 3).all()


def test_k_g_grows_with_size_under_a_uniform_gate():
    torch.manual_seed(0)
    patch = ScalingAwarePatching(D, None, rho=0.1, k_max=16).double()
    torch.nn.init.zeros_(patch.gate.mlp[-1].weight)  # equal logits
    x, pos, mask = _padded([6, 10, 45, 100, 300])
    assert patch(x, pos, mask).num_patches.tolist() == [1, 1, 5, 10, 16]


def test_anchor_gate_gradient():
    torch.manual_seed(0)
    x, pos, mask = _padded([4, 30, 9])
    instr = torch.randn(3, H, dtype=torch.float64)
    ks = []

    def gate_grad(**kw):
        model = CuttlefishConnector(D, H, fusion_dim=D, num_fusion_blocks=1, num_heads=4, **kw).double()
        out = model(x, pos, mask, instr)
        out.tokens.pow(2).sum().backward()
        ks.append(out.num_tokens.tolist())
        grads = [p.grad for p in model.patching.gate.parameters()]
        return sum(0.0 if g is None else g.abs().sum().item() for g in grads)

    assert gate_grad() > 0  # default configuration
    assert gate_grad(rho=0.01) > 0  # k_g = 1 everywhere: only the straight-through path carries gradient
    assert ks[-1] == [1, 1, 1]
    assert gate_grad(rho=0.01, prob_straight_through=False) == 0.0  # ... which the bias alone cannot: it cancels
    assert gate_grad(prob_straight_through=False, rho=0.5) > 0  # paper path: the l_a bias in (P4)
    assert gate_grad(prob_straight_through=False, use_anchor_bias=False) == 0.0  # top-k is discrete


# -------------------------------------------------------------------------------------- invariances through the LLM


@pytest.fixture(scope="module")
def structures():
    return collate_structures(make_structure_samples(8, seed=5)[2:5])


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    enc = StructureEncoder(hidden=D, num_layers=2, num_rbf=16, rbf_cutoff=6.0).double().eval()
    con = CuttlefishConnector(D, H, rho=0.2, fusion_dim=D, num_fusion_blocks=2, num_heads=4).double().eval()
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    llm = LlamaForCausalLM(cfg).double().eval()
    return enc, con, llm


def _text(bsz, t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 60, (bsz, t), generator=g)
    ids[torch.arange(bsz), torch.tensor([1, 4, 0][:bsz])] = PLACEHOLDER
    attn = torch.ones(bsz, t, dtype=torch.long)
    attn[0, -2:] = 0  # right padding in row 0
    labels = ids.masked_fill(torch.arange(t)[None] < 6, IGNORE_INDEX).masked_fill(attn == 0, IGNORE_INDEX)
    return ids, attn, labels


def _run(enc, con, llm, s, pos):
    h, p, mask = encode_dense(enc, s.atom_types, pos, s.edge_index, s.batch, s.num_graphs)
    ids, attn, labels = _text(s.num_graphs)
    emb = llm.get_input_embeddings()(ids)
    out = con(h, p, mask, instruction_embedding(emb, attn, labels))
    ins = insert_structure_tokens(emb, ids, out.tokens, out.token_mask, PLACEHOLDER, attn, labels)
    logits = llm(
        inputs_embeds=ins.inputs_embeds, attention_mask=ins.attention_mask, position_ids=ins.position_ids
    ).logits
    return out, ins, logits, (ids, attn, labels, emb)


def test_rotation_translation_leave_tokens_and_logits_unchanged(structures, models):
    enc, con, llm = models
    pos = structures.pos.double()
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    rot = q * torch.sign(torch.diagonal(r))
    with torch.no_grad():
        a, ins_a, logits_a, _ = _run(enc, con, llm, structures, pos)
        b, ins_b, logits_b, _ = _run(enc, con, llm, structures, pos @ rot.T + torch.tensor([10.0, -4.0, 2.5]))
    assert torch.equal(a.num_tokens, b.num_tokens)
    torch.testing.assert_close(b.tokens, a.tokens, atol=1e-9, rtol=1e-9)
    keep = ins_a.attention_mask.bool()
    torch.testing.assert_close(logits_b[keep], logits_a[keep], atol=1e-8, rtol=1e-8)


def test_insertion_lengths_labels_and_positions(structures, models):
    enc, con, llm = models
    with torch.no_grad():
        out, ins, logits, (ids, attn, labels, emb) = _run(enc, con, llm, structures, structures.pos.double())
    k = out.num_tokens
    assert (k >= 1).all()
    assert len(set(k.tolist())) > 1
    assert ins.attention_mask.sum(1).tolist() == (attn.sum(1) + k).tolist()  # text + k_g
    assert ins.inputs_embeds.shape[1] == ids.shape[1] + int(k.max()) == logits.shape[1]
    for b in range(len(k)):
        kb, at = int(k[b]), int((ids[b] == PLACEHOLDER).nonzero()) + 1
        pos_b = ins.structure_positions[b, :kb]
        assert pos_b.tolist() == list(range(at, at + kb))  # right after the placeholder
        torch.testing.assert_close(ins.inputs_embeds[b, pos_b], out.tokens[b, :kb])
        assert (ins.labels[b, pos_b] == IGNORE_INDEX).all()
        assert (ins.attention_mask[b, pos_b] == 1).all()
        text = torch.ones(ins.inputs_embeds.shape[1], dtype=torch.bool)
        text[pos_b] = False
        text[ids.shape[1] + kb :] = False
        torch.testing.assert_close(ins.inputs_embeds[b, text], emb[b])  # text kept in order
        assert torch.equal(ins.labels[b, text], labels[b])
    assert (ins.labels[ins.attention_mask == 0] == IGNORE_INDEX).all()


def test_left_padding_prepend_and_missing_placeholder():
    emb = torch.randn(2, 5, 4)
    ids = torch.tensor([[0, 0, 7, 63, 8], [5, 63, 6, 7, 8]])
    attn = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    toks, tmask = torch.randn(2, 3, 4), torch.tensor([[True, False, False], [True, True, True]])
    ins = insert_structure_tokens(emb, ids, toks, tmask, 63, attn, padding_side="left")
    assert ins.attention_mask.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]
    assert ins.structure_positions.tolist() == [[6, -1, -1], [2, 3, 4]]
    assert ins.position_ids[0, 4:].tolist() == [0, 1, 2, 3]
    no_ph = ids.clone()
    no_ph[1, 1] = 9
    with pytest.raises(DataError, match="batch row 1"):
        insert_structure_tokens(emb, no_ph, toks, tmask, 63, attn)
    ins = insert_structure_tokens(emb, no_ph, toks, tmask, 63, attn, on_missing="prepend")
    assert ins.structure_positions[1].tolist() == [0, 1, 2]


def test_permuting_atoms_gives_the_same_set_of_tokens(models):
    _, con, _ = models
    x, pos, mask = _padded([25, 12], seed=4)
    instr = torch.randn(2, H, dtype=torch.float64)
    perm = torch.cat([torch.randperm(25, generator=torch.Generator().manual_seed(0))])
    with torch.no_grad():
        a = con(x, pos, mask, instr)
        b = con(x[:, perm], pos[:, perm], mask[:, perm], instr)
    assert torch.equal(a.num_tokens, b.num_tokens)
    for i in range(2):
        k = int(a.num_tokens[i])
        ta, tb = a.tokens[i, :k], b.tokens[i, :k]
        match = torch.cdist(ta, tb).argmin(1)
        assert sorted(match.tolist()) == list(range(k))
        torch.testing.assert_close(tb[match], ta, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("cls", [QueryConnector, MeanPoolConnector])
def test_baselines_share_the_interface(cls):
    torch.manual_seed(0)
    kw = {"num_queries": 8, "fusion_dim": D, "num_heads": 4} if cls is QueryConnector else {}
    con = cls(D, H, **kw).double()
    x, pos, mask = _padded([6, 300, 40])
    out = con(x, pos, mask, None)
    k = 8 if cls is QueryConnector else 1
    assert out.tokens.shape == (3, k, H)
    assert out.num_tokens.tolist() == [k] * 3
    assert out.token_mask.all()
    ids = torch.full((3, 4), 1)
    ids[:, 0] = PLACEHOLDER
    ins = insert_structure_tokens(
        torch.randn(3, 4, H, dtype=torch.float64), ids, out.tokens, out.token_mask, PLACEHOLDER
    )
    assert ins.attention_mask.sum(1).tolist() == [4 + k] * 3


def test_instruction_vector_conditions_the_gate():
    emb = torch.arange(12.0).reshape(1, 4, 3)
    attn, labels = torch.tensor([[1, 1, 1, 0]]), torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 7, IGNORE_INDEX]])
    torch.testing.assert_close(instruction_embedding(emb, attn, labels), emb[:, :2].mean(1))  # prompt, non-pad only
    torch.testing.assert_close(instruction_embedding(emb, attn), emb[:, :3].mean(1))
    torch.manual_seed(0)
    patch = ScalingAwarePatching(D, H).double()
    x, pos, mask = _padded([20])
    a = patch(x, pos, mask, torch.zeros(1, H, dtype=torch.float64)).anchor_logits
    b = patch(x, pos, mask, torch.randn(1, H, dtype=torch.float64)).anchor_logits
    assert not torch.allclose(a, b)


# ------------------------------------------------------------------------------------------ gate controls (issue of
# patch-count collapse): uniform gate, entropy, k against n


def test_uniform_gate_spreads_ceil_rho_n_anchors_and_has_no_gate_gradient():
    from zoo.multimodal.cuttlefish import gate_entropy

    torch.manual_seed(0)
    patch = ScalingAwarePatching(D, H, rho=0.1, k_max=16, gate="uniform").double()
    sizes = [6, 10, 45, 100, 300]
    x, pos, mask = _padded(sizes)
    x.requires_grad_(True)
    out = patch(x, pos, mask, torch.randn(5, H, dtype=torch.float64))
    assert out.num_patches.tolist() == [1, 1, 5, 10, 16]
    for b, (n, k) in enumerate(zip(sizes, out.num_patches.tolist())):
        assert out.anchor_index[b, :k].tolist() == [j * n // k for j in range(k)]  # evenly spaced, all distinct
    torch.testing.assert_close(out.entropy, torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(gate_entropy(out.anchor_probs, mask), out.entropy)
    out.tokens.pow(2).sum().backward()
    assert all(p.grad is None for p in patch.gate.parameters())  # the learned gate is out of the loop
    assert x.grad is not None
    with pytest.raises(ConfigError, match="gate"):
        ScalingAwarePatching(D, H, gate="random")


def test_gate_entropy_and_patch_count_stats_hand_values():
    from zoo.multimodal.cuttlefish import gate_entropy, patch_count_stats

    mask = torch.tensor([[True, True, True, True], [True, True, False, False], [True, False, False, False]])
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(gate_entropy(probs, mask), torch.tensor([1.0, 0.0, 1.0]))
    half = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    torch.testing.assert_close(gate_entropy(half, torch.ones(1, 4, dtype=torch.bool)), torch.tensor([0.5]))
    stats = patch_count_stats(torch.tensor([1, 3, 5]), torch.tensor([10, 30, 50]), rho=0.1)
    assert stats["k_mean"] == pytest.approx(3.0)
    assert stats["k_per_atom"] == pytest.approx(0.1)
    assert stats["k_slope"] == pytest.approx(0.1)
    assert stats["k_vs_uniform"] == pytest.approx(1.0)
    collapsed = patch_count_stats(torch.tensor([1, 1, 1]), torch.tensor([10, 30, 50]), rho=0.1)
    assert collapsed["k_slope"] == pytest.approx(0.0)
    assert collapsed["k_vs_uniform"] == pytest.approx((1 + 1 / 3 + 1 / 5) / 3)
