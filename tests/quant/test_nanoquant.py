"""Invariants of the NanoQuant core (notes 1(e)): budget, factored forward, STE, ADMM, calibration stats."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.quant.nanoquant import (
    LinearStats,
    NanoQuantLinear,
    admm_factorize,
    bits_for_rank,
    hard_sign,
    naive_sign_svd_factorize,
    preconditioner,
    quantize_linear,
    rank_for_bits,
    shrink,
    ste_sign,
    unpack_signs,
    weighted_error,
)


def structured_matrix(a=128, b=256, seed=0):
    """Low-rank signal plus heavy-tailed noise (the notes' structured fixture)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(a, 8, generator=g) @ torch.randn(8, b, generator=g) * 0.5
    t = torch.randn(a, b, generator=g) / torch.rand(a, b, generator=g).clamp_min(0.05).sqrt()  # heavy tail
    return low + 0.1 * t


# ------------------------------------------------------------------ budget
def test_rank_for_bits_paper_example():
    assert rank_for_bits(4096, 4096, 1.0) == 2016
    assert bits_for_rank(4096, 4096, 2016) == pytest.approx(0.9921875)  # (2016 + 16) * 8192 / 4096^2


def test_rank_for_bits_formula_and_flooring():
    # r = floor((bits ab/(a+b) - 16) / m) m
    assert rank_for_bits(4096, 11008, 0.55) == int((0.55 * 4096 * 11008 / (4096 + 11008) - 16) // 32) * 32
    assert rank_for_bits(256, 512, 1.0, rank_multiple=1) == int(256 * 512 / 768 - 16)
    assert rank_for_bits(64, 64, 10.0, rank_multiple=8) == 64  # clamped to min(a, b)
    # with s_mid: r = (bits ab - 16(a+b)) / (a+b+16)
    r = rank_for_bits(4096, 4096, 1.0, mid_scale=True, rank_multiple=1)
    assert r == int((4096 * 4096 - 16 * 8192) / (8192 + 16))
    assert bits_for_rank(4096, 4096, r, mid_scale=True) <= 1.0 < bits_for_rank(4096, 4096, r + 1, mid_scale=True)


@pytest.mark.parametrize(("a", "b"), [(256, 512), (4096, 4096), (96, 200)])
def test_bpw_below_one_iff_rank_below_threshold(a, b):
    thr = a * b / (a + b) - 16
    for r in range(1, min(a, b) + 1, 7):
        assert (bits_for_rank(a, b, r) < 1) == (r < thr)


def test_rank_raised_to_multiple_warns():
    with pytest.warns(UserWarning, match="0.75"):
        assert rank_for_bits(128, 128, 0.55) == 32  # notes: a 128x128 layer cannot go below 0.75 bpw at m=32


def test_bad_bit_target_names_layer_and_minimum():
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj") as e:
        rank_for_bits(128, 128, 0.2, layer_name="model.layers.0.mlp.up_proj")
    msg = str(e.value)
    assert "d_out=128, d_in=128" in msg
    assert "0.7500" in msg  # minimum achievable bpw (rank 32)
    assert "0.2500" in msg  # scale-only floor


def test_stored_bpw_equals_formula():
    lin = nn.Linear(256, 128, bias=False)
    for r, mid in [(24, False), (40, True)]:
        q = quantize_linear(lin, 1.0, rank=r, mid_scale=mid, outer_iters=2)
        assert q.bits_per_weight() == pytest.approx(bits_for_rank(128, 256, r, mid_scale=mid))
    # padding bits are counted: rank 21 packs into 3 bytes per row of U
    q = quantize_linear(lin, 1.0, rank=21, outer_iters=2)
    assert q.stored_bits() == 128 * 3 * 8 + 21 * 32 * 8 + 16 * (128 + 256)


# ------------------------------------------------------------------ layer
@pytest.mark.parametrize(("mid", "bias"), [(False, False), (True, True)])
def test_factored_forward_equals_dense_product(mid, bias):
    torch.manual_seed(0)
    lin = nn.Linear(40, 24, bias=bias)
    q = quantize_linear(lin, 1.0, rank=12, mid_scale=mid, outer_iters=5)
    U = unpack_signs(q.u_packed, 12)
    V = unpack_signs(q.v_packed, 40)
    mid_s = q.s_mid.float() if mid else torch.ones(12)
    W = torch.diag(q.s_post.float()) @ U @ torch.diag(mid_s) @ V @ torch.diag(q.s_pre.float())
    x = torch.randn(3, 5, 40)
    ref = F.linear(x, W, lin.bias if bias else None)
    torch.testing.assert_close(q(x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q.dequantize(), W, atol=1e-6, rtol=1e-6)


def test_forward_does_not_use_dense_weight(monkeypatch):
    q = quantize_linear(nn.Linear(32, 16), 1.0, rank=8, outer_iters=2)
    expected = F.linear(torch.ones(2, 32), q.dequantize(), q.bias)
    monkeypatch.setattr(q, "dequantize", lambda *a, **k: (_ for _ in ()).throw(AssertionError("dense W formed")))
    torch.testing.assert_close(q(torch.ones(2, 32)), expected, atol=1e-5, rtol=1e-5)


def test_finalize_gives_exact_signs_of_latents():
    q = quantize_linear(nn.Linear(24, 16), 1.0, rank=8, outer_iters=3, latent=True)
    assert q.is_latent
    with torch.no_grad():
        q.u_latent.add_(torch.randn_like(q.u_latent))
        q.v_latent.mul_(-1)
        q.u_latent[0, 0] = 0.0
    u_ref, v_ref = hard_sign(q.u_latent.detach()), hard_sign(q.v_latent.detach())
    q.finalize()
    assert not q.is_latent
    U, V = q.binary_factors()
    assert torch.equal(U, u_ref)
    assert torch.equal(V, v_ref)
    assert set(U.unique().tolist()) <= {-1.0, 1.0}
    assert set(V.unique().tolist()) <= {-1.0, 1.0}
    assert U[0, 0] == 1.0  # sign(0) = +1
    assert q.s_pre.dtype == torch.float16


def test_ste_identity_gradient_and_sign_of_zero():
    x = torch.tensor([-0.3, 0.0, 2.0], requires_grad=True)
    y = ste_sign(x)
    assert y.tolist() == [-1.0, 1.0, 1.0]
    w = torch.tensor([1.0, 2.0, 3.0])
    (y * w).sum().backward()
    assert torch.equal(x.grad, w)  # d loss / d latent == d loss / d binarized weight


# ------------------------------------------------------------------ ADMM
def test_admm_beats_naive_sign_of_svd_at_equal_rank():
    for seed in (0, 1):
        W = structured_matrix(seed=seed)
        admm = admm_factorize(W, 32, outer_iters=80, seed=seed)
        naive = naive_sign_svd_factorize(W, 32)
        assert admm.weighted_error < 0.5 * naive.weighted_error
        assert torch.equal(admm.U.abs(), torch.ones_like(admm.U))


def test_admm_error_decreases_with_rank_and_matches_identity_stats():
    W = structured_matrix()
    errs = [admm_factorize(W, r, outer_iters=60).weighted_error for r in (8, 16, 32, 64)]
    assert all(e2 < e1 for e1, e2 in zip(errs, errs[1:]))
    f = admm_factorize(W, 16, outer_iters=60)
    plain = float((W - f.dense()).square().sum() / W.square().sum())
    assert f.weighted_error == pytest.approx(plain, rel=1e-5)  # identity preconditioner = Frobenius
    lin = nn.Linear(256, 128, bias=False)
    lin.weight.data = W
    ones = LinearStats(torch.ones(256), torch.ones(128))
    a = quantize_linear(lin, 1.0, ones, rank=16, outer_iters=20)
    b = quantize_linear(lin, 1.0, None, rank=16, outer_iters=20)
    assert torch.equal(a.u_packed, b.u_packed)
    assert torch.equal(a.s_pre, b.s_pre)


def test_importance_weighting_lowers_weighted_error():
    total_w, total_u = 0.0, 0.0
    for seed in range(3):
        W = structured_matrix(seed=seed)
        g = torch.Generator().manual_seed(seed)
        i_norm = torch.full((256,), 0.05)
        i_norm[torch.randperm(256, generator=g)[:32]] = 20.0  # a few dominant input channels
        d_o, d_i = preconditioner(LinearStats(i_norm, torch.ones(128)), 128, 256)
        fw = admm_factorize(W, 16, d_out=d_o, d_in=d_i, outer_iters=60, seed=seed)
        fu = admm_factorize(W, 16, outer_iters=60, seed=seed)
        total_w += weighted_error(W, fw.dense(), d_o, d_i)
        total_u += weighted_error(W, fu.dense(), d_o, d_i)
    assert total_w < total_u


# ------------------------------------------------------------------ calibration
def test_shrink_and_preconditioner_normalization():
    h = torch.tensor([1.0, 3.0])
    assert shrink(h, 0.2).tolist() == pytest.approx([0.8 * 1 + 0.2 * 2, 0.8 * 3 + 0.2 * 2])
    assert shrink(h, 1.0).tolist() == pytest.approx([2.0, 2.0])
    d_o, d_i = preconditioner(LinearStats(torch.tensor([1e-8, 3e-8]), torch.tensor([2e-9, 2e-9, 2e-9])), 3, 2)
    assert d_i.square().mean().item() == pytest.approx(1.0)
    assert d_o.tolist() == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="do not match"):
        preconditioner(LinearStats(torch.ones(5), torch.ones(3)), 3, 2)


def test_quantize_linear_without_stats_is_identity_preconditioned():
    lin = nn.Linear(64, 32, bias=True)
    q = quantize_linear(lin, 2.0, rank_multiple=8, outer_iters=10)
    assert isinstance(q, NanoQuantLinear)
    assert q.rank == rank_for_bits(32, 64, 2.0, 8)
    torch.testing.assert_close(q.bias, lin.bias)


def _random_layer(d_out=300, d_in=260, r=72, mid=True, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    return NanoQuantLinear.from_factors(
        torch.randn(d_out, r, generator=g),
        torch.randn(r, d_in, generator=g),
        torch.rand(d_in, generator=g) + 0.5,
        torch.rand(d_out, generator=g) + 0.5,
        s_mid=torch.rand(r, generator=g) + 0.5 if mid else None,
        bias=torch.randn(d_out, generator=g) if bias else None,
    )


@pytest.mark.parametrize(("mid", "bias", "chunk"), [(True, True, 16), (False, False, 7), (True, False, 1000)])
def test_chunked_forward_equals_cached_forward(mid, bias, chunk):
    """Sizes that are neither multiples of 8 nor of the chunk: same outputs as the cached +-1 factors, no cache."""
    lay = _random_layer(mid=mid, bias=bias)
    x = torch.randn(3, 5, 260, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cached = lay(x)
        lay.set_forward("chunked", chunk)
        assert lay._cache is None  # switching drops the cached factors
        chunked = lay(x)
    torch.testing.assert_close(chunked, cached, rtol=1e-4, atol=1e-3)  # outputs ~ 1e2: summation order only
    assert lay._cache is None
    torch.testing.assert_close(chunked, F.linear(x, lay.dequantize(), lay.bias), rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="forward mode"):
        lay.set_forward("packed")


def test_chunked_forward_allocates_a_bounded_workspace():
    """The profiler's per-op allocations: the cached forward materialises a whole +-1 factor (``d_out x r`` fp32);
    the chunked one never allocates more than one chunk of a factor (or the input/output activations)."""
    from torch.profiler import ProfilerActivity, profile

    d_out, d_in, r, chunk = 300, 260, 72, 8
    lay = _random_layer(d_out, d_in, r)
    x = torch.randn(1, 2, d_in)

    def largest_allocation() -> int:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            lay(x)
        return max(e.cpu_memory_usage for e in prof.events())

    lay._cache = None
    full_factor = min(d_out * r, r * d_in) * 4
    assert largest_allocation() >= full_factor  # cached: unpacks a whole factor
    lay.set_forward("chunked", chunk)
    activations = 2 * max(d_in, d_out) * 4
    workspace = chunk * 8 * ((max(d_in, r) + 7) // 8) * 4
    assert largest_allocation() <= max(workspace, activations) < full_factor


def test_unpacking_shifts_move_with_the_layer_not_per_call(monkeypatch):
    """The bit shifts live on the layer (a non-persistent buffer moved by ``.to`` once): no forward (cached or
    chunked) copies the host constant to the layer's device; the state dict is unchanged (DESIGN "Scale")."""
    from zoo.quant.nanoquant import packing

    lay = _random_layer(mid=True, bias=True)
    assert "bit_shifts" not in lay.state_dict() and lay.bit_shifts.device == lay.u_packed.device
    copies = []
    original = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if self is packing._SHIFTS:
            copies.append(args or kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    x = torch.randn(2, 3, 260, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cached = lay(x)
        lay.set_forward("chunked", 16)
        chunked = lay(x)
    assert copies == []
    torch.testing.assert_close(chunked, cached, rtol=1e-4, atol=1e-3)


def test_quantizer_selects_the_run_time_forward():
    from transformers import LlamaConfig, LlamaForCausalLM

    from zoo.errors import ConfigError
    from zoo.quant.nanoquant_quantizer import NanoQuantQuantizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = model(input_ids=ids).logits
    quantizer = NanoQuantQuantizer(
        bits=1.0,
        rank_multiple=8,
        block_reconstruction=False,
        model_reconstruction=False,
        admm={"outer_iters": 5},
        calib_input_ids=ids,
        forward="chunked",
        chunk_size=16,
    )
    quantizer.apply(model)
    layers = [m for m in model.modules() if isinstance(m, NanoQuantLinear)]
    assert len(layers) == 7 and all(m.forward_mode == "chunked" and m.chunk_size == 16 for m in layers)
    with torch.no_grad():
        chunked = model(input_ids=ids).logits
        assert all(m._cache is None for m in layers)
        for m in layers:
            m.set_forward("cached")
        torch.testing.assert_close(model(input_ids=ids).logits, chunked, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(chunked, dense, atol=1e-3)  # it is the quantized model
    with pytest.raises(ConfigError, match="quant.forward"):
        NanoQuantQuantizer(forward="lut")
