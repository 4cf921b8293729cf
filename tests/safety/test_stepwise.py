"""Step-wise generation loop (zoo.generation.stepwise) on a tiny random Llama.

The model is random (no training needed): the invariants are about the decoding machinery, not the text.
Frequent characters serve as step delimiters so that random text has many steps.
"""

from __future__ import annotations

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.datamodules.base import encode_prompt, pad_sequences
from zoo.generation.sampling import SamplingParams, generate
from zoo.generation.stepwise import StepAction, stepwise_generate

torch.set_num_threads(1)
DELIMS = list("aeiou ")
PROMPTS = ["abc", "hello there", "x", "JB add 123="]


@pytest.fixture(scope="module")
def lm():
    bb = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, seed=3
    )
    model = bb.build_model().eval()
    tok = bb.tokenizer
    enc = [encode_prompt(tok, p) for p in PROMPTS]
    ids = pad_sequences(enc, tok.pad_token_id, "left")
    mask = pad_sequences([[1] * len(e) for e in enc], 0, "left")
    return model, tok, ids, mask, enc


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("lookahead", [0, 3])
@pytest.mark.parametrize("do_sample", [False, True])
def test_no_op_hook_is_token_identical_to_generate(lm, do_sample, lookahead):
    model, tok, ids, mask, _ = lm
    params = SamplingParams(max_new_tokens=40, do_sample=do_sample)
    plain = generate(model, tok, ids, mask, params, _gen())
    calls = []
    step = stepwise_generate(
        model, tok, ids, mask, lambda ev: calls.append(ev) or {}, params, DELIMS, _gen(), hook_lookahead=lookahead
    )
    assert torch.equal(plain.completion_ids, step.completion_ids)
    assert torch.equal(plain.completion_mask, step.completion_mask)
    assert plain.texts == step.texts
    assert torch.allclose(plain.logprobs, step.logprobs, atol=1e-5)
    assert calls, "the hook must have been called at step closes"
    assert sum(step.steps_closed) == sum(len(ev) for ev in calls)
    assert all(len({e.row for e in ev}) == len(ev) for ev in calls)  # one event per row per call
    for ev in calls:  # each event's trace is the row's completion up to that step
        for e in ev:
            assert step.texts[e.row].startswith(e.trace)


def test_lookahead_hands_the_hook_fewer_larger_batches(lm):
    model, tok, ids, mask, _ = lm
    params = SamplingParams(max_new_tokens=40, do_sample=True)
    sizes = {}
    for lookahead in (0, 4):
        calls = []
        stepwise_generate(
            model,
            tok,
            ids,
            mask,
            lambda ev, calls=calls: calls.append(len(ev)) or {},
            params,
            DELIMS,
            _gen(),
            hook_lookahead=lookahead,
        )
        sizes[lookahead] = calls
    assert sum(sizes[0]) == sum(sizes[4])  # the same steps reach the hook
    assert len(sizes[4]) < len(sizes[0])


@pytest.mark.parametrize("lookahead", [0, 3])
def test_cached_continuation_equals_fresh_forward_after_injection_and_rollback(lm, lookahead):
    """Log-probs of every sampled token (after injections and rolled-back steps) == a fresh full forward; with a
    lookahead the tokens sampled after an acted-on step are discarded first."""
    model, tok, ids, mask, enc = lm
    inject = tok("XYZ", add_special_tokens=False)["input_ids"]

    def hook(events):
        acts = {}
        for e in events:
            if e.row in (0, 2) and e.step_index == 1:
                acts[e.row] = StepAction(append_ids=inject)
            elif e.row in (0, 3) and e.step_index == 2 and e.attempt == 0:
                acts[e.row] = StepAction(append_ids=inject, rollback=True)
            elif e.row == 1 and e.step_index == 1 and e.attempt == 0:
                acts[e.row] = StepAction(rollback=True)  # bare resample
        return acts

    out = stepwise_generate(
        model,
        tok,
        ids,
        mask,
        hook,
        SamplingParams(max_new_tokens=48, do_sample=True),
        DELIMS,
        _gen(1),
        hook_lookahead=lookahead,
    )
    assert any(out.discarded), "the test must exercise a rollback"
    assert sum(out.added_tokens) > 0, "the test must exercise an injection"
    for i in range(len(PROMPTS)):
        n = int(out.completion_mask[i].sum())
        full = torch.tensor(enc[i] + out.completion_ids[i, :n].tolist())[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits.float(), -1)[0]
        p = len(enc[i])
        ref = logp[p - 1 : p - 1 + n].gather(-1, full[0, p:, None]).squeeze(-1)
        sampled = out.injected_mask[i, :n] == 0
        torch.testing.assert_close(out.logprobs[i, :n][sampled], ref[sampled], atol=1e-4, rtol=0)


@pytest.mark.parametrize("lookahead", [0, 3])
def test_only_the_row_the_hook_acts_on_changes(lm, lookahead):
    model, tok, ids, mask, _ = lm
    params = SamplingParams(max_new_tokens=40, do_sample=True)
    plain = generate(model, tok, ids, mask, params, _gen(2))
    inject = tok("!!", add_special_tokens=False)["input_ids"]
    target: list[int] = []

    def hook(events):
        if not target:
            target.append(events[0].row)  # the first row that closes a step
        return {e.row: StepAction(inject) for e in events if e.row == target[0]}

    out = stepwise_generate(model, tok, ids, mask, hook, params, DELIMS, _gen(2), hook_lookahead=lookahead)
    t = target[0]
    assert out.texts[t] != plain.texts[t]
    assert [x for i, x in enumerate(out.texts) if i != t] == [x for i, x in enumerate(plain.texts) if i != t]


def test_delimiter_that_never_appears_terminates_and_is_reported(lm):
    model, tok, ids, mask, _ = lm
    with pytest.warns(RuntimeWarning, match="never appeared"):
        out = stepwise_generate(model, tok, ids, mask, lambda ev: {}, SamplingParams(max_new_tokens=12), "~#~#~")
    unfinished = [i for i in range(len(PROMPTS)) if not bool(out.finished[i])]
    assert unfinished
    for i in unfinished:
        assert out.steps_closed[i] == 0
        assert out.open_step[i]
        assert out.sampled_tokens[i] == 12


def test_hook_acting_on_a_row_that_closed_no_step_is_an_error(lm):
    model, tok, ids, mask, _ = lm
    with pytest.raises(ValueError, match="closed no step"):
        stepwise_generate(
            model, tok, ids, mask, lambda ev: {99: StepAction()}, SamplingParams(max_new_tokens=30), DELIMS
        )


def test_bad_delimiters_rejected(lm):
    model, tok, ids, mask, _ = lm
    with pytest.raises(ValueError, match="non-empty"):
        stepwise_generate(model, tok, ids, mask, None, SamplingParams(max_new_tokens=4), [""])
