"""Step-wise generation loop (zoo.generation.stepwise) on a tiny random Llama.

The model is random (no training needed): the invariants are about the decoding machinery, not the text.
Frequent characters serve as step delimiters so that random text has many steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompt, pad_sequences
from zoo.generation.decoders import generate
from zoo.generation.sampling import IncrementalDecoder, decode_completion, decode_completions
from zoo.generation.stepwise import StepAction, StepEvent, StepwiseDecoder, read_traces, stepwise_generate
from zoo.protocols import SamplingParams

torch.set_num_threads(1)
DELIMS = list("aeiou ")
PROMPTS = ["abc", "hello there", "x", "JB add 123="]


def _tiny_lm(**arch):
    """A random 2-layer tiny Llama and the left-padded PROMPTS: ``(model, tok, ids, mask, encoded prompts)``."""
    bb = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, **arch
    )
    model = bb.build_model().eval()
    tok = bb.tokenizer
    enc = [encode_prompt(tok, p) for p in PROMPTS]
    ids = pad_sequences(enc, tok.pad_token_id, "left")
    mask = pad_sequences([[1] * len(e) for e in enc], 0, "left")
    return model, tok, ids, mask, enc


@pytest.fixture(scope="module")
def lm():
    return _tiny_lm(seed=3)


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
    events = [e for ev in calls for e in ev]
    assert sum(step.steps_closed) == sum(e.cut != "end" for e in events)
    # a row whose budget ran out inside a step (no delimiter since the last close) is offered that step at its end
    ended_inside = [e.row for e in events if e.cut == "end" and not plain.finished[e.row]]
    assert sorted(ended_inside) == [i for i, is_open in enumerate(step.open_step) if is_open]
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


@pytest.mark.parametrize(("step_index", "message"), [(None, "without saying which"), (99, "acted on step 99")])
def test_an_action_on_a_row_with_several_steps_in_the_call_must_name_one_of_them(varied_lm, step_index, message):
    model, tok, ids, mask = varied_lm

    class ActsOnEveryRow:
        several_steps_per_row = True

        def __call__(self, events):
            rows = [e.row for e in events]
            return {r: StepAction(step_index=step_index) for r in rows if rows.count(r) > 1}

    decoder = StepwiseDecoder(ActsOnEveryRow(), DELIMS, hook_lookahead=8)
    with pytest.raises(ValueError, match=message):
        decoder(model, tok, ids, mask, params=SamplingParams(max_new_tokens=40))


def test_bad_delimiters_rejected(lm):
    model, tok, ids, mask, _ = lm
    with pytest.raises(ValueError, match="non-empty"):
        stepwise_generate(model, tok, ids, mask, None, SamplingParams(max_new_tokens=4), [""])


@pytest.fixture(scope="module")
def varied_lm():
    """A tiny random Llama with untied output embeddings: its greedy text varies and closes steps at irregular
    distances (with tied random embeddings greedy decoding repeats the last token)."""
    return _tiny_lm(tie_word_embeddings=False, seed=0)[:4]


class ScriptedMonitor:
    """Test double for a step monitor with a safety scorer (a real one needs a trained reward model): it acts on fixed
    ``(row, step_index)`` pairs, first attempt only -- a decision that depends on the event alone, as SafeThink's
    does, so ``hook_lookahead`` must not change what is kept. ``wants`` limits the events to those steps (as
    SafeThink's ``t <= m``), so no other row's step close flushes a waiting one: it waits the whole lookahead, or
    until its row runs out of budget. Records the sampled tokens of every step it rolls back. It leaves the steps a
    row ended inside (``cut == "end"``) alone. With ``several`` it
    takes every waiting step of a row in one call (``several_steps_per_row``), acts on the row's first scripted step
    and ignores the later ones (the action discards them)."""

    def __init__(self, tok, script: dict[tuple[int, int], bool], several: bool = False) -> None:
        self.inject = tok("XYZ", add_special_tokens=False)["input_ids"]
        self.script = script  # (row, step_index) -> rollback?
        self.several_steps_per_row = several
        self.rolled_back = [0] * len(PROMPTS)  # per row, sampled tokens of the steps rolled back
        self.calls = 0
        self.most_steps_of_a_row = 0  # in one call

    def wants(self, row: int, step_index: int, attempt: int) -> bool:
        return attempt == 0 and (row, step_index) in self.script

    def __call__(self, events):
        self.calls += 1
        rows = [e.row for e in events]
        self.most_steps_of_a_row = max(self.most_steps_of_a_row, *(rows.count(r) for r in rows))
        acts = {}
        for e in events:
            rollback = self.script.get((e.row, e.step_index))
            # delimited and length-cut steps only: acting on a row's ``end`` step would drop the EOS that ended it
            # (counted, neither kept nor rolled back), which the budget tests below do not count
            if rollback is None or e.attempt or e.row in acts or e.cut == "end":
                continue
            acts[e.row] = StepAction(append_ids=self.inject, rollback=rollback, step_index=e.step_index)
            if rollback:
                self.rolled_back[e.row] += len(e.ids) - e.step_start  # a step holds sampled tokens only
        return acts


# rows 0 and 3 roll back a step (3 is closed by </think>), rows 1 and 2 keep theirs (closed by </think>) and get the
# injection after it; steps close at 10-16 tokens, so with a long lookahead the actions come at the rows' budgets
# and discard up to 30 tokens each
SCRIPT = {(0, 3): True, (1, 6): False, (2, 2): False, (3, 8): True}


def identity_processor(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return scores


class AllSteps:
    """A monitor without ``wants``: every closed step makes an event."""

    def __init__(self, monitor: ScriptedMonitor) -> None:
        self.monitor = monitor
        self.several_steps_per_row = monitor.several_steps_per_row

    def __call__(self, events):
        return self.monitor(events)


@pytest.mark.parametrize("several", [False, True])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("wants", [True, False])
@pytest.mark.parametrize("max_new_tokens", [40, 24])
def test_lookahead_keeps_exactly_what_no_lookahead_keeps_under_greedy(
    varied_lm, max_new_tokens, wants, compact, several
):
    """Tokens a lookahead action discards (sampled after the acted-on step) do not use up the row's budget, so with
    greedy decoding ``hook_lookahead`` L = 8 and L = max_new_tokens keep exactly the tokens of L = 0 in every row
    (rolled-back steps still count, as at L = 0). Without ``wants`` every step makes an event, and other rows'
    step closes flush waiting steps early (unless the hook takes ``several`` steps of a row per call); with a logits
    processor (``compact=False``) rows that are done stay in the batch instead of leaving it."""
    model, tok, ids, mask = varied_lm
    params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=False)
    outs, monitors = {}, {}
    for lookahead in (0, 8, max_new_tokens):
        monitor = monitors[lookahead] = ScriptedMonitor(tok, SCRIPT, several=several and lookahead > 0)
        hook = monitor if wants else AllSteps(monitor)
        processors = () if compact else (identity_processor,)
        decoder = StepwiseDecoder(hook, DELIMS, processors=processors, hook_lookahead=lookahead)
        outs[lookahead] = decoder(model, tok, ids, mask, params=params)
    ref = outs[0]
    assert all(ref.added_tokens) and sum(map(bool, ref.discarded)) == 2, "every row must be acted on"
    assert ref.sampled_tokens == [max_new_tokens] * len(PROMPTS), "every row must run to its budget"
    for lookahead in (8, max_new_tokens):
        out = outs[lookahead]
        assert out.texts == ref.texts, lookahead
        assert torch.equal(out.completion_ids, ref.completion_ids)
        assert torch.equal(out.completion_mask, ref.completion_mask)  # kept token counts
        assert torch.equal(out.injected_mask, ref.injected_mask)
        assert torch.equal(out.finished, ref.finished)
        assert out.steps_closed == ref.steps_closed and out.open_step == ref.open_step
        assert out.discarded == ref.discarded
        assert monitors[lookahead].rolled_back == monitors[0].rolled_back
        assert out.counted_tokens == ref.counted_tokens == [max_new_tokens] * len(PROMPTS)
        # the scenario: actions came late and discarded tokens sampled after their steps (in fewer hook calls)
        assert sum(out.sampled_tokens) > sum(ref.sampled_tokens), out.sampled_tokens
        assert monitors[lookahead].calls < monitors[0].calls
    if several and not wants:  # every step makes an event: rows close several steps while one waits
        assert monitors[8].most_steps_of_a_row > 1
    if wants:  # at the longest lookahead a waiting step waits until its row's budget runs out
        assert max(outs[max_new_tokens].sampled_tokens) > max_new_tokens + 8, outs[max_new_tokens].sampled_tokens


@pytest.mark.parametrize("lookahead", [0, 8, 40])
def test_every_unfinished_row_uses_its_whole_budget_under_sampling(varied_lm, lookahead):
    """Seeded sampling: the texts differ between lookaheads after an action, but the budget rule is the same: a row
    that did not finish has exactly ``max_new_tokens`` sampled tokens kept or in rolled-back steps (the lengths of
    L = 0, the algorithm as written); tokens discarded by lookahead are extra decoding work."""
    model, tok, ids, mask = varied_lm
    n = 40
    monitor = ScriptedMonitor(tok, {(i, t): i % 2 == 0 for i in range(len(PROMPTS)) for t in (1, 2)})
    params = SamplingParams(max_new_tokens=n, do_sample=True)
    out = stepwise_generate(model, tok, ids, mask, monitor, params, DELIMS, _gen(4), hook_lookahead=lookahead)
    assert sum(out.added_tokens) > 0 and any(monitor.rolled_back), "the test must exercise both actions"
    assert not all(out.finished), "the test must see a row that runs to its budget"
    counted = []
    for i in range(len(PROMPTS)):
        kept_sampled = int((out.completion_mask[i] - out.injected_mask[i]).sum())
        counted.append(kept_sampled + monitor.rolled_back[i])
        assert counted[i] <= n and out.sampled_tokens[i] >= counted[i]
        if not bool(out.finished[i]):
            assert counted[i] == n, (i, kept_sampled, monitor.rolled_back[i])
    assert out.counted_tokens == counted
    # with a lookahead, actions discarded tokens sampled after their steps (not counted above)
    assert (sum(out.sampled_tokens) > sum(counted)) == (lookahead > 0), (out.sampled_tokens, counted)


@pytest.mark.parametrize("parkable", [True, False])
def test_a_done_row_waiting_for_the_hook_leaves_the_batch_and_comes_back_when_the_hook_acts(
    varied_lm, monkeypatch, parkable
):
    """Of 8 prompts, row 1 (greedy text ``eeeee%{OI</think>...``) closes its third step at its third token and, with
    a long lookahead, decodes on until the stop string ``%{OI`` finishes it while the other rows run: it leaves the
    batch with the step still waiting for the hook (parked: the batch runs 7 rows, as plain decoding would; one done
    row of 8 is under the quarter that hands done rows' steps to the hook), and when the hook rolls that step back
    (once every row is done) it is put back in the batch and decodes on. What is kept is exactly what
    ``hook_lookahead = 0`` keeps (greedy), where the row never left the batch. The spy counts the real
    ``restore_rows`` calls. With a cache that cannot park rows (``parkable`` forced off) the waiting row stays in
    the batch instead, with the same result."""
    model, tok = varied_lm[:2]
    encoded = [encode_prompt(tok, p) for p in [*PROMPTS, "zz", "qrs", "The cat", "1+1="]]
    ids = pad_sequences(encoded, tok.pad_token_id, "left")
    mask = pad_sequences([[1] * len(e) for e in encoded], 0, "left")
    if not parkable:
        monkeypatch.setattr(IncrementalDecoder, "parkable", property(lambda self: False))
    params = SamplingParams(max_new_tokens=24, do_sample=False, stop_strings=["%{OI"])
    restored: list[int] = []
    real_restore = IncrementalDecoder.restore_rows

    def spy(self, parked):
        restored.append(len(parked))
        return real_restore(self, parked)

    monkeypatch.setattr(IncrementalDecoder, "restore_rows", spy)
    batch_sizes: list[int] = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    outs, monitors = {}, {}
    try:
        for lookahead in (0, 24):
            monitor = monitors[lookahead] = ScriptedMonitor(tok, {(1, 3): True}, several=lookahead > 0)
            batch_sizes.clear()
            outs[lookahead] = StepwiseDecoder(monitor, DELIMS, hook_lookahead=lookahead)(
                model, tok, ids, mask, params=params
            )
    finally:
        handle.remove()
    ref, out = outs[0], outs[24]
    if parkable:
        assert restored == [1], "row 1 must have been parked and put back"
        assert 7 in batch_sizes, batch_sizes  # the batch ran without the parked row
    else:
        assert restored == [] and 7 not in batch_sizes, (restored, batch_sizes)
    assert ref.discarded[1] and out.discarded == ref.discarded
    assert out.texts == ref.texts
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask)
    # the put-back row's cache is its own: the log-probabilities of what it decoded after coming back are unchanged
    torch.testing.assert_close(out.logprobs, ref.logprobs, rtol=0, atol=1e-5)
    assert torch.equal(out.finished, ref.finished)
    assert out.counted_tokens == ref.counted_tokens
    assert out.sampled_tokens[1] > ref.sampled_tokens[1]  # the lookahead decoded past the step, up to the stop


def test_traces_read_together_equal_each_events_own_trace_and_are_decoded_once(lm, monkeypatch):
    """``read_traces`` (the hook's batch read) gives every event the text ``decode_completion`` gives it alone --
    up to the first EOS, without pad/BOS, other special tokens kept -- and decodes each event at most once."""
    _, tok, *_ = lm
    text = tok("x=12<think>a b", add_special_tokens=False)["input_ids"]
    rows = [
        text,
        [tok.bos_token_id, *text, tok.pad_token_id],
        [*text[:3], tok.eos_token_id, *text[3:]],
        [],
    ]
    expected = [decode_completion(tok, ids) for ids in rows]
    assert expected[0] == "x=12<think>a b" and expected[1] == expected[0] and expected[2] == "x=1"
    assert decode_completions(tok, rows) == expected
    events = [StepEvent(k, 1, ids=tuple(ids), tokenizer=tok) for k, ids in enumerate(rows)]
    assert events[1].trace == expected[1]  # read alone first: kept, not decoded again
    decoded = []
    real = type(tok).decode
    monkeypatch.setattr(type(tok), "decode", lambda self, ids, **kw: decoded.append(list(ids)) or real(self, ids, **kw))
    assert read_traces(events) == expected
    assert len(decoded) == 3
    assert read_traces(events) == expected and len(decoded) == 3
    assert [e.trace for e in events] == expected


def _ban(*token_ids):
    """A logits processor that never lets ``token_ids`` be sampled (a policy biased away from them)."""

    def ban(ids, scores):
        scores = scores.clone()
        scores[:, list(token_ids)] = float("-inf")
        return scores

    return ban


@pytest.mark.parametrize("lookahead", [0, 8])
def test_a_policy_that_never_writes_a_delimiter_is_offered_all_its_text_in_steps(lm, lookahead):
    """The policy never samples the newline delimiter (a processor bans it, and </think>): its text is still offered
    to the hook in steps of ``max_step_tokens`` tokens (cut "length") and, at the row's end, the unfinished rest (cut
    "end"; an EOS that ended the row is not part of it), so the steps laid end to end are the whole completion."""
    model, tok, ids, mask, _ = lm
    vocab = tok.get_vocab()
    events: list[StepEvent] = []
    decoder = StepwiseDecoder(
        lambda ev: events.extend(ev) or {},
        "\n",
        processors=[_ban(vocab["\n"], vocab["</think>"])],
        hook_lookahead=lookahead,
        max_step_tokens=5,
    )
    out = decoder(model, tok, ids, mask, params=SamplingParams(max_new_tokens=23, do_sample=True), generator=_gen(1))
    assert not any("\n" in text for text in out.texts)
    for i in range(len(out.texts)):
        steps = sorted((e for e in events if e.row == i), key=lambda e: e.step_index)
        assert [e.step_index for e in steps] == list(range(1, len(steps) + 1))
        kept = out.completion_ids[i][out.completion_mask[i].bool()].tolist()
        kept = kept[:-1] if out.finished[i] and kept[-1] == tok.eos_token_id else kept
        # the steps tile the completion: each starts where the previous ended (openers before the first), the last
        # ends where the row's text ends
        assert all(t == tok.convert_tokens_to_ids("<think>") for t in kept[: steps[0].step_start])
        assert all(b.step_start == len(a.ids) for a, b in zip(steps, steps[1:]))
        assert list(steps[-1].ids) == kept
        assert all(e.cut == "length" and len(e.ids) - e.step_start == 5 for e in steps[:-1])
        assert len(steps) == -(-(len(kept) - steps[0].step_start) // 5)  # one step per 5 tokens, the rest at the end
        if (len(kept) - steps[0].step_start) % 5:  # an unfinished rest closes at the row's end
            assert steps[-1].cut == "end" and tok.eos_token_id not in steps[-1].ids
    assert any(not f for f in out.finished.tolist()), "the test must see a row that runs to its budget"


def test_without_a_step_length_the_row_end_still_closes_the_step(lm):
    """``max_step_tokens=None``: steps close only at delimiters and at the row's end, which offers the whole text."""
    model, tok, ids, mask, _ = lm
    events: list[StepEvent] = []
    vocab = tok.get_vocab()
    ban = _ban(vocab["\n"], vocab["</think>"])
    decoder = StepwiseDecoder(lambda ev: events.extend(ev) or {}, "\n", processors=[ban], max_step_tokens=None)
    out = decoder(model, tok, ids, mask, params=SamplingParams(max_new_tokens=30, do_sample=True), generator=_gen(2))
    assert sorted(e.row for e in events) == [i for i, text in enumerate(out.texts) if text.removeprefix("<think>")]
    assert all(e.cut == "end" and e.step_index == 1 for e in events)
    assert [e.trace for e in sorted(events, key=lambda e: e.row)] == [t for t in out.texts if t.removeprefix("<think>")]


def test_max_step_tokens_must_be_positive_or_none():
    with pytest.raises(ValueError, match="max_step_tokens must be an integer >= 1 or null"):
        StepwiseDecoder(max_step_tokens=0)


def _close_at(tok, prompt_width: int, position: int, then_ban: Sequence[int] = ()):
    """A logits processor that makes every row write ``</think>`` as its completion token ``position`` (0-based; a row
    that wrote it before writes it again) and bans ``then_ban`` everywhere: a policy that ends its reasoning early and
    writes its answer after it."""
    close = tok.convert_tokens_to_ids("</think>")

    def processor(ids, scores):
        kept = (ids[:, prompt_width:] != tok.pad_token_id).sum(-1)
        scores = scores.clone()
        scores[:, list(then_ban)] = float("-inf")
        forced = torch.full_like(scores, float("-inf"))
        forced[:, close] = 0.0
        return torch.where((kept == position)[:, None], forced, scores)

    return processor


@pytest.mark.parametrize("lookahead", [0, 8])
def test_with_answer_steps_every_token_after_the_closing_tag_lies_in_an_offered_answer_step(lm, lookahead):
    """The policy closes its reasoning (``</think>``) at its third token and answers after it until its budget runs
    out. With ``answer_steps`` the answer is offered to the hook in steps -- at delimiters, every ``max_step_tokens``
    tokens and at the row's end -- marked ``answer`` and never ``final``, which laid end to end are the whole answer;
    without it no answer step is offered and nothing after the final step. A hook that does nothing leaves the text as
    it was either way."""
    model, tok, ids, mask, _ = lm
    close = tok.convert_tokens_to_ids("</think>")
    processor = _close_at(tok, ids.shape[1], 2, then_ban=[tok.eos_token_id])
    params = SamplingParams(max_new_tokens=30, do_sample=True)
    outs, offered = {}, {}
    for answer_steps in (True, False):
        events: list[StepEvent] = []
        decoder = StepwiseDecoder(
            lambda ev, events=events: events.extend(ev) or {},
            DELIMS,
            processors=[processor],
            hook_lookahead=lookahead,
            max_step_tokens=4,
            answer_steps=answer_steps,
        )
        outs[answer_steps] = decoder(model, tok, ids, mask, params=params, generator=_gen(3))
        offered[answer_steps] = events
    on, off = outs[True], outs[False]
    assert on.texts == off.texts and torch.equal(on.completion_ids, off.completion_ids)
    assert not any(e.answer for e in offered[False])
    lengths = []
    for i in range(len(PROMPTS)):
        kept = on.completion_ids[i][on.completion_mask[i].bool()].tolist()
        answer_start = kept.index(close) + 1  # the reasoning's (first) closing tag: its final step ends there
        lengths.append(len(kept) - answer_start)
        (final,) = [e for e in offered[False] if e.row == i and e.final]
        assert len(final.ids) == answer_start
        assert all(len(e.ids) <= answer_start for e in offered[False] if e.row == i)  # nothing after the final step
        steps = sorted((e for e in offered[True] if e.row == i and e.answer), key=lambda e: e.step_index)
        assert [e.step_index for e in steps] == list(range(final.step_index + 1, final.step_index + 1 + len(steps)))
        assert not any(e.final for e in steps)
        # the answer steps tile the answer: the first starts at the closing tag, each where the previous ended, the
        # last where the row's text ends
        assert steps[0].step_start == answer_start
        assert all(b.step_start == len(a.ids) for a, b in zip(steps, steps[1:]))
        assert list(steps[-1].ids) == kept
        assert all(e.cut != "end" for e in steps[:-1])
        # the row's budget ran out inside an answer step: reported open with answer steps, not without
        assert on.open_step[i] == (steps[-1].cut == "end") and not off.open_step[i]
    assert max(lengths) >= 8, "the test must see answers of several steps"
    assert any(e.cut == "length" for e in offered[True] if e.answer)
    assert any(e.cut is None for e in offered[True] if e.answer)
    assert any(on.open_step), "the test must see a row whose budget ran out inside an answer step"


@pytest.mark.parametrize("lookahead", [0, 8])
def test_an_answer_step_rolled_back_or_kept_leaves_the_row_in_the_answer(lm, lookahead):
    """Rows 0 and 2 roll their first answer step back (with an injection), rows 1 and 3 keep it (the injection follows
    it): every later step of those rows is an answer step again (the resample keeps the index, attempt 1), no row
    closes a second final step (a closing tag sampled in the answer is text), and the last answer step ends where
    the row's text ends."""
    model, tok, ids, mask, _ = lm
    close = tok.convert_tokens_to_ids("</think>")
    inject = tok("XYZ", add_special_tokens=False)["input_ids"]
    events: list[tuple[int, StepEvent]] = []  # (hook call, event)
    acted: dict[int, tuple[int, StepEvent]] = {}

    def hook(batch):
        call = len({c for c, _ in events}) + 1
        events.extend((call, e) for e in batch)
        actions = {}
        for e in batch:
            if e.answer and e.row not in acted:
                acted[e.row] = call, e
                actions[e.row] = StepAction(inject, rollback=e.row % 2 == 0, step_index=e.step_index)
        return actions

    hook.several_steps_per_row = True
    decoder = StepwiseDecoder(
        hook,
        DELIMS,
        processors=[_close_at(tok, ids.shape[1], 1, then_ban=[tok.eos_token_id])],
        hook_lookahead=lookahead,
        answer_steps=True,
    )
    out = decoder(model, tok, ids, mask, params=SamplingParams(max_new_tokens=30, do_sample=True), generator=_gen(5))
    assert sorted(acted) == [0, 1, 2, 3]
    assert [bool(d) for d in out.discarded] == [True, False, True, False]
    for i, (call, first) in acted.items():
        # what the hook saw of the row in its later calls (the row's later steps in the same call were discarded)
        later = [e for c, e in events if e.row == i and c > call]
        assert later and all(e.answer and not e.final for e in later)
        if i % 2 == 0:  # the resample of the rolled-back step: same index, attempt 1
            assert (later[0].step_index, later[0].attempt) == (first.step_index, 1)
        else:
            assert later[0].step_index == first.step_index + 1
        kept = out.completion_ids[i][out.completion_mask[i].bool()].tolist()
        injected = out.injected_mask[i][out.completion_mask[i].bool()].tolist()
        assert injected.count(1) == len(inject)
        assert kept.index(close) < first.step_start  # the reasoning closed before the answer step acted on
        last = max((e for e in later), key=lambda e: (e.step_index, e.attempt))
        assert list(last.ids) == kept  # the last answer step ends where the row's text ends
