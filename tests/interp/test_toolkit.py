"""The hook toolkit on the tiny backbone and HF Llama/Qwen2/Mistral/GPT-2 models saved locally.

Pins: identity hooks (alpha = 0, scales 1.0, closed gate) give bit-identical logits; hooks leave nothing behind
after the context (also after an exception); with the KV cache, steered / head-scaled greedy decoding equals an
uncached re-forward at every step, the first generated token included (zoo ``generate`` and HF ``generate``);
head scaling changes only the selected slice; the activation cache sees what the model computes; bad indices
and widths fail at construction, before any forward pass.
"""

from __future__ import annotations

import pytest
import torch
from interp_models import (
    ARCHITECTURES,
    HEADS,
    KV_HEADS,
    LAYERS,
    WIDTH,
    build_model,
    record_step_logits,
    saved_and_loaded,
    single_thread,  # noqa: F401  (autouse fixture)
    uncached_greedy_check,
)
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation import generate
from zoo.interp import (
    ActivationCache,
    HeadPatcher,
    HeadScaler,
    ResidualSteerer,
    collect_activations,
    model_layout,
    register_architecture,
)
from zoo.interp import architectures as arch_registry
from zoo.interp.hooks import forward_left_padded
from zoo.protocols import SamplingParams

PROMPTS = ["7+8=", "rev abcd="]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Every architecture through the HF path (save_pretrained -> from_pretrained, local files only)."""
    return {a: saved_and_loaded(a, tmp_path_factory.mktemp(a)) for a in ARCHITECTURES}


@pytest.fixture(scope="module")
def batch(tok):
    return encode_prompts(tok, PROMPTS)


def logits_of(model, batch):
    with torch.no_grad():
        return forward_left_padded(model, *batch)


def direction(seed=0):
    return torch.randn(WIDTH, generator=torch.Generator().manual_seed(seed))


def no_hooks_left(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# -- registry ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_layout_resolves_every_registered_architecture(models, arch):
    layout = model_layout(models[arch])
    assert (layout.num_layers, layout.num_heads, layout.hidden_size) == (LAYERS, HEADS, WIDTH)
    assert layout.head_dim == WIDTH // HEADS
    # The projection's input is n_heads * d_head wide (query heads, also under GQA).
    proj = layout.attn_out_projs[0]
    weight = proj.weight
    in_features = weight.shape[1] if isinstance(proj, torch.nn.Linear) else weight.shape[0]  # GPT-2 Conv1D: [in, out]
    assert in_features == HEADS * layout.head_dim


def test_tiny_backbone_has_gqa_and_peft_wrappers_resolve():
    model = build_model("llama")
    assert model.config.num_key_value_heads == KV_HEADS < HEADS
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert model_layout(wrapped).layers is model_layout(model).layers


def test_unknown_architecture_names_the_supported_ones_and_how_to_register(monkeypatch):
    class Odd(torch.nn.Module):
        config = type("Cfg", (), {"model_type": "oddformer"})()

    with pytest.raises(ConfigError) as err:
        model_layout(Odd())
    message = str(err.value)
    assert "oddformer" in message
    assert all(name in message for name in ARCHITECTURES)
    assert "register_architecture" in message

    # Registering an alias of GPT-2's paths makes a renamed GPT-2 usable.
    monkeypatch.setattr(arch_registry, "_REGISTRY", dict(arch_registry._REGISTRY))
    tok = build_char_tokenizer()
    config = GPT2Config(n_embd=WIDTH, n_layer=2, n_head=HEADS, vocab_size=len(tok))
    model = GPT2LMHeadModel(config)
    model.config.model_type = "my-gpt"
    with pytest.raises(ConfigError, match="my-gpt"):
        model_layout(model)
    register_architecture("my-gpt", layers="transformer.h", attn_out_proj="attn.c_proj")
    assert model_layout(model).num_layers == 2
    with pytest.raises(ConfigError, match="already registered"):
        register_architecture("my-gpt", layers="transformer.h", attn_out_proj="attn.c_proj")
    register_architecture("wrong-path", layers="model.blocks", attn_out_proj="attn.c_proj")
    model.config.model_type = "wrong-path"
    with pytest.raises(ConfigError, match="model.blocks"):
        model_layout(model)


# -- bad input: clear errors at construction, before any forward ---------------------------------------------------


def test_bad_indices_and_widths_fail_before_any_forward(models):
    model = models["llama"]
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ConfigError, match=r"layer=3 is out of range.*0\.\.2"):
            ResidualSteerer(model, 3, direction(), 1.0)
        with pytest.raises(ConfigError, match="out of range"):
            ActivationCache(model, [0, -1])
        with pytest.raises(ConfigError, match=r"head index out of range.*4 attention \(query\) heads"):
            HeadScaler(model, {(0, 4): 2.0})
        with pytest.raises(ConfigError, match="layer=5 is out of range"):
            HeadScaler(model, {(5, 0): 2.0})
        with pytest.raises(ConfigError, match=r"shape \[31\].*32 wide"):
            ResidualSteerer(model, 0, torch.zeros(31), 1.0)
        with pytest.raises(ConfigError, match="shape"):
            ResidualSteerer(model, 0, torch.zeros(2, WIDTH), 1.0)
        with pytest.raises(ConfigError, match="finite"):
            ResidualSteerer(model, 0, direction(), float("nan"))
        with pytest.raises(ConfigError, match="finite"):
            HeadScaler(model, {(0, 0): float("inf")})
        with pytest.raises(ConfigError, match="repeats"):
            ActivationCache(model, [1, 1])
        with pytest.raises(ConfigError, match=r"\[batch, 8\]"):
            HeadPatcher(model, {(0, 0): torch.zeros(2, 9)})
    finally:
        handle.remove()
    assert calls == []


# -- identity hooks and clean exit --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_alpha_zero_and_unit_scales_are_bit_identical(models, batch, arch):
    model = models[arch]
    base = logits_of(model, batch)
    with ResidualSteerer(model, 1, direction(), 0.0):
        steered0 = logits_of(model, batch)
    every_head = {(layer, head): 1.0 for layer in range(LAYERS) for head in range(HEADS)}
    with HeadScaler(model, every_head):
        scaled1 = logits_of(model, batch)
    with HeadScaler(model, {(0, 1): 3.0, (2, 0): 0.0}, gate=lambda layer: 0.0):
        gated_shut = logits_of(model, batch)
    assert torch.equal(steered0, base)
    assert torch.equal(scaled1, base)
    assert torch.equal(gated_shut, base)
    # ... while non-identity settings do change the logits (the hooks are live).
    with ResidualSteerer(model, 1, direction(), 2.0):
        assert not torch.allclose(logits_of(model, batch), base)
    with HeadScaler(model, {(0, 1): 3.0}):
        assert not torch.allclose(logits_of(model, batch), base)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_outputs_are_restored_after_exit_also_after_an_exception(models, batch, arch):
    model = models[arch]
    base = logits_of(model, batch)
    steerer = ResidualSteerer(model, 0, direction(), 5.0)
    scaler = HeadScaler(model, {(1, 2): 0.0}, gate=lambda layer: torch.ones(len(PROMPTS)))
    cache = ActivationCache(model, [0, 2], site="heads")
    with steerer, scaler, cache:
        assert steerer.active and not no_hooks_left(model)
        assert not torch.equal(logits_of(model, batch), base)
    assert not steerer.active and no_hooks_left(model)
    assert torch.equal(logits_of(model, batch), base)
    with pytest.raises(RuntimeError, match="boom"), steerer:
        raise RuntimeError("boom")
    assert no_hooks_left(model)
    assert torch.equal(logits_of(model, batch), base)
    with steerer, pytest.raises(RuntimeError, match="already active"):  # re-entry while active is refused
        steerer.__enter__()
    assert no_hooks_left(model)


# -- every cached decode step -------------------------------------------------------------------------------------


def hooks_under_test(model, kind):
    if kind == "steer":
        return ResidualSteerer(model, 1, direction(1), 3.0)
    return HeadScaler(model, {(0, 0): 4.0, (1, 3): 0.0, (2, 1): -2.0})


@pytest.mark.parametrize("kind", ["steer", "scale"])
def test_zoo_generate_with_hooks_equals_uncached_reforward_every_step(models, batch, tok, kind):
    model = models["llama"]
    ids, mask = batch
    params = SamplingParams(max_new_tokens=10)
    plain = generate(model, tok, ids, mask, params)
    step_logits, record = record_step_logits(model)
    try:
        with hooks_under_test(model, kind):
            hooked = generate(model, tok, ids, mask, params)
    finally:
        record.remove()
    assert not torch.equal(hooked.completion_ids, plain.completion_ids), "the hook must change the greedy text"
    assert len(set(hooked.completion_ids[0].tolist())) > 1
    with hooks_under_test(model, kind):
        uncached_greedy_check(model, ids, mask, hooked.completion_ids, step_logits, hooked.completion_mask)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("kind", ["steer", "scale"])
def test_hf_generate_with_hooks_equals_uncached_reforward_every_step(models, batch, tok, arch, kind):
    model = models[arch]
    ids, mask = batch
    options = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tok.pad_token_id, "eos_token_id": None}
    with torch.no_grad():
        plain = model.generate(input_ids=ids, attention_mask=mask, **options)
        with hooks_under_test(model, kind):
            out = model.generate(
                input_ids=ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True, **options
            )
    completion = out.sequences[:, ids.shape[1] :]
    assert completion.shape[1] == 8
    assert not torch.equal(out.sequences, plain)
    with hooks_under_test(model, kind):
        uncached_greedy_check(model, ids, mask, completion, [lg.float() for lg in out.logits])


# -- head scaling touches only its slice ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_head_scaling_changes_only_the_selected_slice(models, batch, arch):
    model = models[arch]
    d = model_layout(model).head_dim
    with ActivationCache(model, [0, 1, 2], site="heads") as base:
        logits_of(model, batch)
    with HeadScaler(model, {(1, 3): 2.5}), ActivationCache(model, [0, 1, 2], site="heads") as scaled:
        logits_of(model, batch)
    assert torch.equal(scaled[0], base[0])  # an earlier layer is untouched
    assert torch.equal(scaled[1][:, :, :3], base[1][:, :, :3])  # other heads of the layer: byte-equal
    assert torch.equal(scaled[1][:, :, 3], base[1][:, :, 3] * 2.5)  # the selected query head (3 >= KV heads)
    assert scaled[1].shape[-2:] == (HEADS, d)
    assert not torch.equal(scaled[2], base[2])  # downstream layers see the change


def test_gate_values_per_row_and_per_position(models, batch):
    model = models["llama"]
    scales = {(0, 2): 3.0, (2, 0): 0.5}
    base = logits_of(model, batch)
    with HeadScaler(model, scales):
        full = logits_of(model, batch)
    with HeadScaler(model, scales, gate=lambda layer: torch.tensor([0.0, 1.0])):
        per_row = logits_of(model, batch)
    assert torch.equal(per_row[0], base[0])
    assert torch.equal(per_row[1], full[1])
    seen = []

    def gate(layer):
        seen.append(layer)
        return 0.5

    with HeadScaler(model, scales, gate=gate):
        half = logits_of(model, batch)
    with HeadScaler(model, {(0, 2): 2.0, (2, 0): 0.75}):  # 1 + (s - 1) * 0.5
        expected = logits_of(model, batch)
    torch.testing.assert_close(half, expected, atol=1e-5, rtol=0)
    assert seen == [0, 2]
    with HeadScaler(model, scales, gate=lambda layer: torch.zeros(3)), pytest.raises(ConfigError, match=r"gate\(0\)"):
        logits_of(model, batch)


def test_head_patcher_overwrites_one_slice_at_one_position(models, batch):
    model = models["llama"]
    d = model_layout(model).head_dim
    values = torch.full((len(PROMPTS), d), 7.0)
    with ActivationCache(model, [1], site="heads") as base:
        logits_of(model, batch)
    with HeadPatcher(model, {(1, 2): values}), ActivationCache(model, [1], site="heads") as patched:
        logits_of(model, batch)
    assert torch.equal(patched[1][:, -1, 2], values)
    assert torch.equal(patched[1][:, :-1], base[1][:, :-1])
    assert torch.equal(patched[1][:, -1, [0, 1, 3]], base[1][:, -1, [0, 1, 3]])


# -- activation cache ----------------------------------------------------------------------------------------------


def test_residual_cache_matches_hidden_states_and_generation_steps(models, batch, tok):
    model = models["llama"]
    ids, mask = batch
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    with ActivationCache(model, [0, 1]) as cache, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert torch.equal(cache[0], hidden[1])  # hidden_states[l + 1] is the output of layer l (not the last one)
    assert torch.equal(cache[1], hidden[2])

    # During cached generation: the prefill then one chunk per decode step, equal to a full re-forward.
    steerer = ResidualSteerer(model, 0, direction(2), 2.0)
    with steerer, ActivationCache(model, [1]) as cache:
        result = generate(model, tok, ids, mask, SamplingParams(max_new_tokens=5))
    sizes = [c.shape[1] for c in cache.chunks(1)]
    fed = len(sizes) - 1
    assert sizes == [ids.shape[1]] + [1] * fed and fed >= 4
    full_ids = torch.cat([ids, result.completion_ids[:, :fed]], 1)
    full_mask = torch.cat([mask, result.completion_mask[:, :fed]], 1)
    with steerer, ActivationCache(model, [1]) as ref, torch.no_grad():
        forward_left_padded(model, full_ids, full_mask)
    torch.testing.assert_close(cache[1], ref[1], atol=1e-5, rtol=0)


def test_cache_is_cleared_on_reentry_and_collect_activations_matches_single_prompts(models, tok, batch):
    model = models["gpt2"]
    cache = ActivationCache(model, [2])
    with cache:
        logits_of(model, batch)
        logits_of(model, batch)
    assert len(cache.chunks(2)) == 2
    with cache:
        logits_of(model, batch)
    assert len(cache.chunks(2)) == 1
    with pytest.raises(KeyError, match="not cached"):
        cache.chunks(0)

    prompts = ["a", "hello world", "1+1="]
    acts = collect_activations(model, tok, prompts, [0, 2], batch_size=2)
    heads = collect_activations(model, tok, prompts, [1], site="heads")
    assert acts[2].shape == (3, WIDTH) and heads[1].shape == (3, HEADS, WIDTH // HEADS)
    for i, prompt in enumerate(prompts):  # left padding must not change a prompt's last-token activation
        single = encode_prompts(tok, [prompt])
        with ActivationCache(model, [2]) as one:
            logits_of(model, single)
        torch.testing.assert_close(acts[2][i], one[2][0, -1], atol=1e-5, rtol=0)


def test_hooks_work_on_a_4bit_bitsandbytes_backbone():
    from zoo.backbones import TinyBackbone
    from zoo.quant.bnb import BnbQuantizer

    backbone = TinyBackbone(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
    model = backbone.build_model(BnbQuantizer("nf4")).eval()
    layout = model_layout(model)
    assert type(layout.attn_out_projs[0]).__name__ == "Linear4bit"
    batch = encode_prompts(backbone.tokenizer, PROMPTS)
    base = logits_of(model, batch)
    with HeadScaler(model, {(0, 1): 1.0}), ResidualSteerer(model, 0, torch.ones(64), 0.0):
        assert torch.equal(logits_of(model, batch), base)
    with ActivationCache(model, [0], site="heads") as before:
        logits_of(model, batch)
    with HeadScaler(model, {(0, 1): 2.0}), ActivationCache(model, [0], site="heads") as after:
        assert not torch.equal(logits_of(model, batch), base)
    assert torch.equal(after[0][:, :, 1], 2 * before[0][:, :, 1])
    assert torch.equal(after[0][:, :, [0, 2, 3]], before[0][:, :, [0, 2, 3]])
