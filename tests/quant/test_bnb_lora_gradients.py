"""QLoRA gradients are those of the dequantized model: LoRA on the zoo's ``quant=bnb_nf4`` tiny backbone against the
same LoRA on a copy whose base layers hold the dequantized NF4 weights (fp32 ``nn.Linear``), for 1x1, 1xn and nxm
inputs, on a fresh model, after no-grad evaluation forwards (validation, generation) and with layers that
bitsandbytes had already re-packed into its CPU inference layout (whose ``gemv_4bit`` kernel has no backward)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

bnb = pytest.importorskip("bitsandbytes")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
SHAPES = [(1, 1), (1, 9), (3, 12)]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _qlora_model() -> nn.Module:
    from zoo.backbones.tiny import TinyBackbone
    from zoo.quant.bnb import BnbQuantizer

    backbone = TinyBackbone(hidden_size=64, intermediate_size=128, num_hidden_layers=2, lora=LORA)
    model = backbone.build_model(BnbQuantizer("nf4", device_map="cpu"))
    # LoRA's B starts at zero; a non-zero B makes every adapter's gradient (A's too) depend on the base layers
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _dequantized_copy(model: nn.Module) -> nn.Module:
    """``model`` with every bitsandbytes ``Linear4bit`` replaced by an fp32 ``nn.Linear`` of its dequantized weight."""
    ref = copy.deepcopy(model)
    for parent in list(ref.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                w = child.weight
                linear = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                linear.weight = nn.Parameter(bnb.functional.dequantize_4bit(w.data, w.quant_state).float(), False)
                if child.bias is not None:
                    linear.bias = nn.Parameter(child.bias.detach().float().clone(), False)
                setattr(parent, name, linear)
    assert not any(isinstance(m, bnb.nn.Linear4bit) for m in ref.modules())
    return ref


def _lora_grads(model: nn.Module, ids: torch.Tensor, projection: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of the adapters for ``<logits, projection>`` (a loss with a term at every position, 1x1 included)."""
    model.train()
    model.zero_grad(set_to_none=True)
    (model(input_ids=ids).logits.float() * projection).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(n for n, g in grads.items() if g is None)
    assert not missing, f"adapters without a gradient: {missing}"
    return {n: g.detach().clone() for n, g in grads.items()}


def _assert_same_gradients(model: nn.Module, ref: nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        ids = torch.randint(10, 90, shape, generator=gen)
        projection = torch.randn(*shape, model.config.vocab_size, generator=gen)
        got, want = _lora_grads(model, ids, projection), _lora_grads(ref, ids, projection)
        assert got.keys() == want.keys() and len(got) == 12
        flat_got = torch.cat([got[n].flatten() for n in want])
        flat_want = torch.cat([want[n].flatten() for n in want])
        # (1x1: q_proj's adapters get an exactly-zero gradient -- a softmax over one key does not depend on the query --
        # so the comparison is relative to the norm of all adapter gradients, not per tensor)
        err = (flat_got - flat_want).norm() / flat_want.norm()
        assert flat_want.norm() > 0 and err < 1e-4, f"input {shape}: LoRA gradients off by {err:.2e} (relative)"


def test_qlora_gradients_match_dequantized_model_fresh_and_after_evaluation():
    model = _qlora_model()
    ref = _dequantized_copy(model)
    _assert_same_gradients(model, ref)
    # a validation / generation pass (eval mode, no gradient, single rows included) must not change what training
    # computes afterwards: bitsandbytes would re-pack the weights for its CPU inference kernel at this point
    model.eval()
    with torch.no_grad():
        for shape in SHAPES:
            model(input_ids=torch.full(shape, 20))
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in _layers(model))
    _assert_same_gradients(model, ref)


def test_qlora_gradients_through_layers_packed_for_cpu_inference():
    """A layer that reaches a training forward in bitsandbytes' CPU inference layout (re-packed by an evaluation
    before the zoo prepared it, e.g. by the user's own code) trains through the differentiable matmul again."""
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    model = _qlora_model()
    layers = _layers(model)
    for layer in layers:  # what Linear4bit.forward does in eval mode on a CPU with AVX512-BF16 (any row count)
        layer.weight.data, layer.weight.quant_state = _convert_weight_packed_for_cpu(
            layer.weight.data, layer.weight.quant_state
        )
    model.eval()
    with torch.no_grad():  # inference keeps bitsandbytes' layout and kernel
        model(input_ids=torch.full((1, 1), 20))
    assert all(layer.weight.quant_state.packing_format_for_cpu for layer in layers)
    # the first forward with gradients leaves the inference layout; the copy holds the weights it then computes with
    model.train()
    model(input_ids=torch.full((1, 2), 20)).logits.sum().backward()
    assert not any(layer.weight.quant_state.packing_format_for_cpu for layer in layers)
    _assert_same_gradients(model, _dequantized_copy(model))


def _layers(model: nn.Module) -> list[nn.Module]:
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers
    return layers
