import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.quant.baselines import OneBitLinear, SignBinaryLinear, quantize_onebit, quantize_sign
from zoo.quant.nanoquant import LinearStats, model_bits_per_weight, quantize_linear, replace_linears


def scaled_sign_matrix(a=48, b=80, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(a, generator=g) * 2 + 0.1
    cols = torch.rand(b, generator=g) * 2 + 0.1
    return torch.outer(rows, cols) * torch.randn(a, b, generator=g).sign() * (1 + 0.1 * torch.rand(a, b, generator=g))


@pytest.mark.parametrize("fn", [quantize_sign, quantize_onebit])
def test_forward_matches_dequantized_and_bpw(fn):
    lin = nn.Linear(80, 48, bias=True)
    q = fn(lin)
    x = torch.randn(4, 80)
    torch.testing.assert_close(q(x), F.linear(x, q.dequantize(), lin.bias), atol=1e-5, rtol=1e-5)
    assert torch.equal(q.signs(), torch.where(lin.weight >= 0, 1.0, -1.0))
    expected = 1 + 16 / 80 if isinstance(q, SignBinaryLinear) else 1 + 16 * (48 + 80) / (48 * 80)
    assert q.bits_per_weight() == pytest.approx(expected)


def test_onebit_svid_beats_row_scale_on_rank1_magnitudes():
    lin = nn.Linear(80, 48, bias=False)
    lin.weight.data = scaled_sign_matrix()
    W = lin.weight.detach()
    e_sign = (W - quantize_sign(lin).dequantize()).square().sum()
    e_one = (W - quantize_onebit(lin).dequantize()).square().sum()
    assert e_one < 0.5 * e_sign
    # row scale is the L2-optimal per-row scale for the sign pattern
    q = quantize_sign(lin)
    torch.testing.assert_close(q.alpha.float(), W.abs().mean(1).half().float())


def test_nanoquant_beats_baselines_at_about_one_bit():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(128, 8, generator=g) @ torch.randn(8, 256, generator=g) + 0.1 * torch.randn(128, 256, generator=g)
    lin = nn.Linear(256, 128, bias=False)
    lin.weight.data = W
    nq = quantize_linear(lin, 1.0, rank_multiple=8, outer_iters=60)
    errs = {
        k: float((W - q.dequantize().detach()).square().sum() / W.square().sum())
        for k, q in {"nq": nq, "sign": quantize_sign(lin), "onebit": quantize_onebit(lin)}.items()
    }
    assert nq.bits_per_weight() <= 1.0
    assert errs["nq"] < errs["onebit"]
    assert errs["nq"] < errs["sign"]


def test_stats_weighting_and_bits_check():
    lin = nn.Linear(16, 4, bias=False)
    c = torch.ones(16)
    c[:4] = 100.0
    q = quantize_sign(lin, stats=LinearStats(c, torch.ones(4)))
    W = lin.weight.detach().abs()
    torch.testing.assert_close(q.alpha.float(), ((W * c).sum(1) / c.sum()).half().float())
    with pytest.raises(ValueError, match="below"):
        quantize_sign(lin, bits=1.0)


def test_replace_linears_for_baselines():
    model = nn.Sequential()
    model.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 16))])
    new = replace_linears(model, quantize_onebit, layer_filter=lambda n, m: isinstance(m, nn.Linear))
    assert len(new) == 2
    assert all(isinstance(m, OneBitLinear) for m in new.values())
    assert model_bits_per_weight(model) == pytest.approx(1 + 16 * 24 / 128)
