"""The post-hoc quantizers (NanoQuant, sign, OneBit) on a model exported by a QLoRA run.

``+preset=qlora`` exports the adapters merged into the 4-bit weights with the ``quantization_config``, so the export
loads as a bitsandbytes model whatever ``quant`` the next run names. ``quant=nanoquant|sign|onebit`` then receives
``Linear4bit`` layers: the quantizers dequantize them first and approximate the weights the 4-bit model computes
with (a QLoRA-trained model compressed to ~1 bit per weight)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

bnb = pytest.importorskip("bitsandbytes")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ARCH = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
LINEARS_PER_LAYER = 7


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def qlora_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny QLoRA model (NF4 base, LoRA with non-zero B) exported as a QLoRA run exports it (adapters merged into
    the 4-bit weights, ``save_pretrained``)."""
    from zoo.backbones.tiny import TinyBackbone
    from zoo.lora import merged_copy
    from zoo.quant.bnb import BnbQuantizer

    backbone = TinyBackbone(**ARCH, lora=LORA)
    model = backbone.build_model(BnbQuantizer("nf4", device_map="cpu"))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    directory = tmp_path_factory.mktemp("qlora_export")
    merged_copy(model).save_pretrained(directory, safe_serialization=True)
    backbone.tokenizer.save_pretrained(directory)
    return directory


def _dequantized_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The fp32 weights the exported 4-bit model computes with, per decoder-layer linear."""
    from zoo.backbones.tiny import TinyBackbone

    model = TinyBackbone(**ARCH, init_from=str(directory)).build_model()
    layers = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert len(layers) == ARCH["num_hidden_layers"] * LINEARS_PER_LAYER  # the export loads quantized by itself
    return {n: bnb.functional.dequantize_4bit(m.weight.data, m.weight.quant_state).float() for n, m in layers.items()}


def test_sign_quantizes_the_dequantized_weights_of_a_qlora_export(qlora_export: Path):
    from zoo.backbones.tiny import TinyBackbone
    from zoo.quant.baselines import SignBinaryLinear
    from zoo.quant.nanoquant_quantizer import SignQuantizer

    expected = _dequantized_weights(qlora_export)
    model = TinyBackbone(**ARCH, init_from=str(qlora_export)).build_model(SignQuantizer())
    assert not any(isinstance(m, bnb.nn.Linear4bit | bnb.nn.Linear8bitLt) for m in model.modules())
    assert getattr(model.config, "quantization_config", None) is None  # a save_pretrained would not claim 4-bit
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SignBinaryLinear)}
    assert set(layers) == set(expected)
    for name, layer in layers.items():
        weight = expected[name]
        assert torch.equal(layer.signs(), torch.where(weight >= 0, 1.0, -1.0)), name
        torch.testing.assert_close(layer.alpha.float(), weight.abs().mean(1).half().float())


def test_nanoquant_quantizes_a_qlora_export(qlora_export: Path):
    from zoo.backbones.tiny import TinyBackbone
    from zoo.quant.nanoquant import model_bits_per_weight, quantized_layers
    from zoo.quant.nanoquant_quantizer import NanoQuantQuantizer

    calib = torch.randint(4, 40, (4, 16), generator=torch.Generator().manual_seed(0))
    quantizer = NanoQuantQuantizer(
        bits=1.0,
        rank_multiple=8,
        block_reconstruction=False,
        model_reconstruction=False,
        admm={"outer_iters": 5},
        calib_input_ids=calib,
    )
    model = TinyBackbone(**ARCH, init_from=str(qlora_export)).build_model(quantizer)
    assert len(quantized_layers(model)) == ARCH["num_hidden_layers"] * LINEARS_PER_LAYER
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
    assert model_bits_per_weight(model) <= 1.0
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=calib).logits).all()


def test_dequantize_leaves_the_cpu_inference_layout(qlora_export: Path):
    """A 4-bit model evaluated before it is dequantized (bitsandbytes re-packs its layers for its CPU kernel on the
    first eval forward where the CPU supports it) dequantizes to the same weights."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    from zoo.backbones.tiny import TinyBackbone
    from zoo.quant.bnb import dequantize_bnb_layers

    expected = _dequantized_weights(qlora_export)
    model = TinyBackbone(**ARCH, init_from=str(qlora_export)).build_model()
    for layer in model.modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            layer.weight.data, layer.weight.quant_state = _convert_weight_packed_for_cpu(
                layer.weight.data, layer.weight.quant_state
            )
    model = dequantize_bnb_layers(model)
    for name, weight in expected.items():
        layer = model.get_submodule(name)
        assert type(layer) is nn.Linear
        torch.testing.assert_close(layer.weight, weight, atol=1e-2, rtol=0)
