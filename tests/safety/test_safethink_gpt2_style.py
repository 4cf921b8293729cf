"""SafeThink on a GPT-2 style model: a tokenizer without a pad token and learned absolute positions (a short
context), built here from tokenizers/transformers. The model is random; the scorers are scripted functions (test
doubles for a safety reward model): the checks concern padding and the context length, not the text."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from zoo.errors import ConfigError
from zoo.generation.decoders import generate_text
from zoo.generation.stepwise import StepwiseDecoder
from zoo.protocols import SamplingParams
from zoo.safety import DEFAULT_HOOK_LOOKAHEAD, safethink_generate

from conftest import char_tokenizer

torch.set_num_threads(1)
PROMPTS = ["JB q1=", "a longer prompt 22=", "x="]
EVERY_CHAR = [chr(i) for i in range(32, 127)]


def char_tokenizer_without_pad():
    return char_tokenizer(pad=False)


def gpt2(tokenizer, positions: int) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=positions, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config).eval()


def never_unsafe(prompts, traces):
    return [1.0] * len(traces)


def always_unsafe(prompts, traces):
    return [0.0] * len(traces)


def test_a_tokenizer_without_pad_token_pads_with_eos(caplog):
    tok = char_tokenizer_without_pad()
    assert tok.pad_token is None
    model = gpt2(tok, positions=128)
    params = SamplingParams(max_new_tokens=12, do_sample=True)
    with caplog.at_level(logging.INFO, logger="zoo.encoding"):
        out = safethink_generate(
            model,
            tok,
            PROMPTS,
            never_unsafe,
            max_steps_monitored=None,
            params=params,
            generator=torch.Generator().manual_seed(0),
            decoder=StepwiseDecoder(step_delimiters=EVERY_CHAR, hook_lookahead=DEFAULT_HOOK_LOOKAHEAD),
        )
    assert "no pad token" in caplog.text
    plain = generate_text(model, tok, PROMPTS, params, torch.Generator().manual_seed(0))
    assert out.scorer_calls > 0
    assert out.texts == plain.texts  # rows of different prompt lengths, padded with EOS and masked out
    assert torch.equal(out.generation.completion_ids, plain.completion_ids)


def test_injected_prefix_tokens_count_in_the_context_check():
    """7-token prompts (BOS + 6) + 20 new tokens fit 40 positions, but not with two 18-token prefixes."""
    tok = char_tokenizer_without_pad()
    model = gpt2(tok, positions=40)
    kwargs = {
        "params": SamplingParams(max_new_tokens=20, do_sample=True),
        "generator": torch.Generator().manual_seed(0),
        "decoder": StepwiseDecoder(step_delimiters=EVERY_CHAR, hook_lookahead=DEFAULT_HOOK_LOOKAHEAD),
    }
    prompts = ["JB q1=", "q2=123"]
    plain = safethink_generate(model, tok, prompts, always_unsafe, max_steps_monitored=0, **kwargs)
    assert len(plain.texts) == 2  # without injections (m = 0) it fits
    # m = 2 prefixes of 18 tokens, and one steering of the answer (max_answer_interventions=1), checked first
    with pytest.raises(ConfigError, match="up to 54 tokens injected"):
        safethink_generate(model, tok, prompts, always_unsafe, max_steps_monitored=2, **kwargs)
    with pytest.raises(ConfigError, match="up to 36 tokens injected"):  # the reasoning's two alone
        safethink_generate(model, tok, prompts, always_unsafe, max_steps_monitored=2, monitor_answer=False, **kwargs)
    # with every step monitored the number of injections is not known in advance: refused when they run out
    with pytest.raises(ConfigError, match="exceed the model context \\(40 positions\\)"):
        safethink_generate(model, tok, prompts, always_unsafe, max_steps_monitored=None, **kwargs)


def test_lookahead_discards_grow_the_cache_past_the_positions_and_keep_what_no_lookahead_keeps():
    """Learned positions (48): 7-token prompts + 20 new tokens + one 18-token prefix (m = 1, the answer not steered)
    fit. With
    ``hook_lookahead=20`` the violating first step waits until the row's budget runs out, the action discards the 19
    tokens sampled after it and the row decodes them again, so the KV cache holds more columns than the model has
    positions; positions come from the running mask, and greedy decoding keeps exactly what L = 0 keeps."""
    tok = char_tokenizer_without_pad()
    model = gpt2(tok, positions=48)
    prompts = ["JB q1=", "q2=123"]
    params = SamplingParams(max_new_tokens=20, do_sample=False)
    out = {
        lookahead: safethink_generate(
            model,
            tok,
            prompts,
            always_unsafe,
            max_steps_monitored=1,
            max_answer_interventions=0,
            params=params,
            decoder=StepwiseDecoder(step_delimiters=EVERY_CHAR, hook_lookahead=lookahead),
        )
        for lookahead in (0, 20)
    }
    assert out[0].num_interventions == [1, 1]
    assert out[20].texts == out[0].texts
    assert torch.equal(out[20].generation.completion_ids, out[0].generation.completion_ids)
    assert out[20].added_tokens == out[0].added_tokens
    fed = [7 + s + a for s, a in zip(out[20].generation.sampled_tokens, out[20].added_tokens)]
    assert min(fed) > 48, fed  # the cache outgrew the learned positions
