"""measured_bits_per_weight and the QuantizationReport callback: the stored bits of whatever quantized the model,
logged with the evaluation metrics (app and plain Lightning)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from zoo.callbacks import QuantizationReport
from zoo.errors import ConfigError
from zoo.quant.base import measured_bits_per_weight

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = [
    "backbone.hidden_size=64",
    "backbone.intermediate_size=128",
    "backbone.num_hidden_layers=2",
    "datamodule.source.num_train=16",
    "datamodule.source.num_val=8",
    "datamodule.eval_batch_size=8",
    "module.generation.max_new_tokens=4",
    "logger=none",
    "callbacks=none",
    "+callbacks.quant_report._target_=zoo.callbacks.QuantizationReport",
    "stage=validate",
]


def llama(dtype=torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4)  # fmt: skip
    return LlamaForCausalLM(cfg).to(dtype)


@pytest.mark.parametrize(("dtype", "bits"), [(torch.float32, 32.0), (torch.bfloat16, 16.0)])
def test_full_precision_counts_the_storage_bits_of_the_linears(dtype, bits):
    assert measured_bits_per_weight(llama(dtype)) == bits
    with pytest.raises(ValueError, match="no linear layers"):
        measured_bits_per_weight(nn.Sequential(nn.ReLU()))


def test_binary_layers_are_measured_from_their_packed_storage():
    from zoo.quant.baselines import quantize_sign
    from zoo.quant.nanoquant import replace_linears

    model = llama()
    replace_linears(model, quantize_sign, None)
    # sign: 1 bit per weight + one fp16 scale per output row; q/k/v/o: 64x64, gate/up: 128x64, down: 64x128
    shapes = [(64, 64)] * 4 + [(128, 64)] * 2 + [(64, 128)]
    bits = sum(o * i + 16 * o for o, i in shapes)
    assert measured_bits_per_weight(model) == pytest.approx(bits / sum(o * i for o, i in shapes))


def test_a_new_quantizer_format_is_measured_without_touching_the_base():
    """The base knows no format: a quantizer class that recognises its (third-party-like) layers is asked for their
    stored bits, and only the layers it recognises count."""
    from zoo.quant.base import Quantizer, layer_stored_bits

    class TernaryLinear(nn.Linear):  # stands for a library's layer that cannot report its own bits
        pass

    class TernaryQuantizer(Quantizer):
        name = "ternary"

        @classmethod
        def layer_bits(cls, layer):
            # 2 bits per weight + one 16-bit scale per output row
            if isinstance(layer, TernaryLinear):
                return 2 * layer.weight.numel() + 16 * layer.out_features, layer.weight.numel()
            return None

    model = nn.Sequential(TernaryLinear(8, 4), nn.ReLU(), TernaryLinear(4, 2), nn.Linear(2, 2))
    assert layer_stored_bits(model[0]) == (2 * 32 + 16 * 4, 32)
    assert layer_stored_bits(model[3]) is None
    assert measured_bits_per_weight(model) == pytest.approx((2 * 40 + 16 * 6) / 40)


@pytest.mark.parametrize(("quant", "lo", "hi"), [("none", 32.0, 32.0), ("bnb_nf4", 4.1, 4.3), ("sign", 1.0, 1.3)])
def test_the_app_logs_measured_bits_per_weight(train_cfg, quant, lo, hi):
    from zoo.cli.train import run

    metrics = run(train_cfg([*SMALL, f"quant={quant}"]))
    assert lo <= metrics["quant/bits_per_weight"] <= hi
    assert "quant/kl_after_distill" not in metrics


class Wrapper(pl.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def validation_step(self, batch, batch_idx):
        return None


class NoModel(pl.LightningModule):
    def validation_step(self, batch, batch_idx):
        return None


def test_plain_lightning_and_bad_settings(tmp_path):
    cb = QuantizationReport(stages=["validate"])
    trainer = pl.Trainer(accelerator="cpu", callbacks=[cb], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    metrics = trainer.validate(Wrapper(llama(torch.bfloat16)), [torch.zeros(1)], verbose=False)[0]
    assert metrics["quant/bits_per_weight"] == 16.0
    with pytest.raises(ConfigError, match="stages"):
        QuantizationReport(stages=["fit"])
    with pytest.raises(ConfigError, match="needs a module with .model"):
        trainer.validate(NoModel(), [torch.zeros(1)], verbose=False)
