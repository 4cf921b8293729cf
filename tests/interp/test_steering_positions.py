"""ResidualSteerer's positions (``all | prompt | generated | from_step:k``), padding never steered, and its shift
moved to the layer once (DESIGN "Scale": hooks move their buffers once).

Each test reads, per forward call, the coefficient ``c_t`` with ``h_steered(t) = h(t) + c_t * alpha * v`` at the
steered layer (the layer output before the steerer vs after it), and compares it with the positions the option
names, worked out by hand from the call's attention mask.
"""

from __future__ import annotations

import pytest
import torch
from interp_models import WIDTH, build_model, single_thread  # noqa: F401  (autouse fixture)
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation import generate
from zoo.generation.sampling import cache_kwarg_name
from zoo.interp import HeadScaler, ResidualSteerer
from zoo.protocols import SamplingParams

LAYER, ALPHA = 1, 2.5
VECTOR = torch.randn(WIDTH, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_model("llama")


@pytest.fixture(scope="module")
def batch(tok):
    ids, mask = encode_prompts(tok, ["7+8=", "rev abcdef="])  # row 0 is left-padded
    assert (mask[0] == 0).any() and mask[1].all()
    return ids, mask


def coefficients(model, steerer, calls):
    """Run ``calls`` (a function of the model) with the steerer; per forward call the ``[B, T]`` coefficients."""
    layer = model.model.layers[LAYER]
    raw, steered = [], []
    before = layer.register_forward_hook(lambda m, a, out: raw.append(out[0] if isinstance(out, tuple) else out))
    try:
        with steerer:
            after = layer.register_forward_hook(
                lambda m, a, out: steered.append(out[0] if isinstance(out, tuple) else out)
            )
            try:
                with torch.no_grad():
                    calls(model)
            finally:
                after.remove()
    finally:
        before.remove()
    shift = ALPHA * VECTOR
    return [((s - r).float() @ shift / (shift @ shift)) for r, s in zip(raw, steered)]


def decode(model, ids, mask, steps=4, masked_step=None):
    """A prefill then ``steps`` one-token calls with a growing 2-D mask (as the zoo's decoders and HF generate feed
    the model); at ``masked_step`` row 0 feeds a padding token (mask 0), as a finished or retracted row does."""
    cache = {cache_kwarg_name(model): DynamicCache()}
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, **cache)
    full = mask
    for step in range(steps):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        new = torch.ones_like(token)
        if step == masked_step:
            new[0] = 0
        full = torch.cat([full, new], dim=1)
        positions = (full.cumsum(-1) - 1).clamp(min=0)[:, -1:]
        out = model(input_ids=token, attention_mask=full, position_ids=positions, use_cache=True, **cache)
    return full


def expected(mask_after, prompt_width, kind, k=0):
    """Per call, the positions ``kind`` steers (from the final 2-D mask: prompt columns, then one per step)."""
    steps = range(prompt_width, mask_after.shape[1])
    calls = [mask_after[:, :prompt_width]] + [mask_after[:, c : c + 1] for c in steps]
    out, generated = [], torch.zeros(mask_after.shape[0], dtype=torch.long)
    for number, m in enumerate(calls):
        real = m.float()
        if kind == "all":
            out.append(real)
        elif kind == "prompt":
            out.append(real if number == 0 else torch.zeros_like(real))
        elif number == 0:
            out.append(torch.zeros_like(real))
        else:
            out.append(real * (generated >= k).float()[:, None])
            generated = generated + m[:, 0].long()
    return out


@pytest.mark.parametrize(
    ("positions", "kind", "k"),
    [("all", "all", 0), ("prompt", "prompt", 0), ("generated", "generated", 0), ("from_step:2", "generated", 2)],
)
def test_each_positions_option_steers_exactly_its_positions_and_never_padding(model, batch, positions, kind, k):
    ids, mask = batch
    full = {}

    def run(m):
        full["mask"] = decode(m, ids, mask, steps=4, masked_step=1)

    got = coefficients(model, ResidualSteerer(model, LAYER, VECTOR, ALPHA, positions=positions), run)
    want = expected(full["mask"], ids.shape[1], kind, k)
    assert len(got) == len(want) == 5
    for call, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0, msg=f"call {call} of {positions}")
    assert got[0][0, 0].abs() < 1e-6  # the left-pad position of row 0 is never steered


def test_a_full_forward_without_cache_is_the_prompt(model, batch):
    """One uncached forward: ``prompt`` and ``all`` steer its non-padding positions, ``generated`` none."""
    ids, mask = batch
    for positions, on in (("all", True), ("prompt", True), ("generated", False), ("from_step:0", False)):
        (got,) = coefficients(
            model,
            ResidualSteerer(model, LAYER, VECTOR, ALPHA, positions=positions),
            lambda m: m(input_ids=ids, attention_mask=mask),
        )
        torch.testing.assert_close(got, mask.float() * on, atol=1e-4, rtol=0)


def test_positions_through_the_zoo_decoder_and_a_peft_wrapper(model, tok, batch):
    """``generated`` leaves the first generated token as unsteered decoding samples it (it is read from the prompt's
    last position) and changes later ones; the pre-hook also fires under a PEFT wrapper (which calls the language
    model's forward directly)."""
    ids, mask = batch
    params = SamplingParams(max_new_tokens=8)
    wrapped = get_peft_model(build_model("llama"), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=True))
    for net in (model, wrapped):
        plain = generate(net, tok, ids, mask, params).completion_ids
        with ResidualSteerer(net, LAYER, VECTOR, 40.0, positions="generated"):
            late = generate(net, tok, ids, mask, params).completion_ids
        with ResidualSteerer(net, LAYER, VECTOR, 40.0, positions="prompt"):
            early = generate(net, tok, ids, mask, params).completion_ids
        assert torch.equal(late[:, 0], plain[:, 0])
        assert not torch.equal(late, plain)
        assert not torch.equal(early[:, 0], plain[:, 0])


def test_bad_positions_are_refused_naming_the_choices(model):
    for bad in ("middle", "from_step:", "from_step:-1", "from_step:x"):
        with pytest.raises(ConfigError, match="all, prompt, generated, from_step"):
            ResidualSteerer(model, LAYER, VECTOR, ALPHA, positions=bad)


def test_hook_tensors_move_to_the_layer_once_not_at_every_call(monkeypatch):
    """bf16 model: the steering shift and the head scales are cast/moved when the hooks attach; no forward copies
    them again (on an accelerator each such ``.to`` is a host-to-device copy per layer per decoded token)."""
    model = build_model("llama").to(torch.bfloat16)
    ids = torch.randint(3, 20, (2, 6), generator=torch.Generator().manual_seed(0))
    steerer = ResidualSteerer(model, LAYER, VECTOR, ALPHA)
    scaler = HeadScaler(model, {(0, 1): 3.0})
    ours = (VECTOR, *scaler.deltas.values())
    calls = []
    original = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.dim() == 1 and self.shape[0] == WIDTH and (out is not self or any(self is t for t in ours)):
            calls.append(tuple(self.shape))
        return out

    with steerer, scaler:
        assert steerer._shift.dtype == torch.bfloat16
        monkeypatch.setattr(torch.Tensor, "to", counting_to)
        with torch.no_grad():
            for _ in range(3):
                model(input_ids=ids)
        monkeypatch.undo()
    assert calls == []
