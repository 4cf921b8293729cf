"""The sign and OneBit baseline layers (:mod:`zoo.quant.baselines`) keep the unpacking's bit shifts on the layer: a
non-persistent buffer that ``.to`` moves once, so no forward copies the host constant to the layer's device (DESIGN
"Scale"; NanoQuant's own layer: ``tests/quant/test_nanoquant.py``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo.quant.baselines import quantize_onebit, quantize_sign
from zoo.quant.nanoquant import packing


def random_linear(d_in: int = 20, d_out: int = 12) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(d_in, d_out, bias=True)


@pytest.fixture
def host_shift_copies(monkeypatch):
    """The calls that copy the host constant of the bit shifts (``packing._SHIFTS.to(...)``)."""
    copies = []
    original = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        if self is packing._SHIFTS:
            copies.append(args or kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    return copies


@pytest.mark.parametrize("quantize", [quantize_sign, quantize_onebit], ids=["sign", "onebit"])
def test_forward_reads_the_layers_own_shifts_and_copies_no_host_constant(quantize, host_shift_copies):
    linear = random_linear()
    layer = quantize(linear, scale_dtype=torch.float32)
    assert "bit_shifts" not in layer.state_dict()
    assert layer.bit_shifts.device == layer.sign_packed.device
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = layer(x)
        layer._cache = None  # unpack again (what a move or a new dtype does)
        again = layer(x.double())
    assert host_shift_copies == []
    # the layer computes what its dense weight does: x W^T + b, W = its dequantized matrix
    torch.testing.assert_close(out, x @ layer.dequantize().T + linear.bias.detach())
    torch.testing.assert_close(again, out.double())


@pytest.mark.parametrize("quantize", [quantize_sign, quantize_onebit], ids=["sign", "onebit"])
def test_the_shifts_move_with_the_layer_and_keep_their_dtype(quantize):
    layer = quantize(random_linear(), scale_dtype=torch.float32)
    assert layer.to(torch.float64).bit_shifts.dtype == torch.uint8  # a dtype cast leaves the integer buffer
    moved = layer.to("meta")
    assert moved.bit_shifts.device.type == "meta" and moved.bit_shifts.dtype == torch.uint8
