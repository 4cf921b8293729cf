"""SafeThink core invariants (inference.md 1(e)) on a tiny random Llama.

Test doubles: a real safety reward model and a trained reasoning LLM are replaced by plain-function scorers
(always safe, always unsafe, prompt- or step-index-dependent) and a random tiny model with frequent
characters as step delimiters; the invariants concern the control flow, not the text.
"""

from __future__ import annotations

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation.decoders import generate_text
from zoo.generation.stepwise import StepwiseDecoder
from zoo.protocols import SamplingParams
from zoo.safety import DEFAULT_HOOK_LOOKAHEAD, ScorerError, safethink_generate
from zoo.safety.safethink import SafeThinkHook
from zoo.safety.scorers import FunctionScorer, validate_scores

torch.set_num_threads(1)
DELIMS = list("aeiou ")
PROMPTS = ["abc", "hello there", "x", "JB add 123="]


@pytest.fixture(scope="module")
def lm():
    bb = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, seed=3
    )
    return bb.build_model().eval(), bb.tokenizer


def always(value):
    return lambda prompts, traces: [value] * len(traces)


def _run(lm, scorer, m=3, tau=0.5, discard=False, seed=0, sample=True, n=48, lookahead=0):
    model, tok = lm
    return safethink_generate(
        model,
        tok,
        PROMPTS,
        scorer,
        tau=tau,
        max_steps_monitored=m,
        discard_violating_step=discard,
        params=SamplingParams(max_new_tokens=n, do_sample=sample),
        generator=torch.Generator().manual_seed(seed),
        decoder=StepwiseDecoder(step_delimiters=DELIMS, hook_lookahead=lookahead),
    )


def _plain(lm, seed=0, sample=True, n=48):
    model, tok = lm
    return generate_text(
        model, tok, PROMPTS, SamplingParams(max_new_tokens=n, do_sample=sample), torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("lookahead", [0, 4])
@pytest.mark.parametrize("sample", [False, True])
def test_always_safe_scorer_is_token_identical_to_plain_generation(lm, sample, lookahead):
    plain = _plain(lm, sample=sample)
    out = _run(lm, always(1.0), m=None, sample=sample, lookahead=lookahead)
    assert out.scorer_calls > 0
    assert torch.equal(out.generation.completion_ids, plain.completion_ids)
    assert out.texts == plain.texts
    assert not any(out.intervened)
    assert out.added_tokens == [0] * len(PROMPTS)


def test_m_zero_is_the_baseline_and_never_calls_the_scorer(lm):
    def must_not_be_called(prompts, traces):
        raise AssertionError("scorer called with m=0")

    out = _run(lm, must_not_be_called, m=0)
    assert out.texts == _plain(lm).texts
    assert out.scorer_calls == 0


@pytest.mark.parametrize("lookahead", [0, 4])
@pytest.mark.parametrize("discard", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_interventions_only_at_steps_le_m_and_at_most_m(lm, m, discard, lookahead):
    model, tok = lm
    out = _run(lm, always(0.0), m=m, discard=discard, lookahead=lookahead)
    prefix_ids = out.prefix_ids
    assert any(out.intervened)
    for i, records in enumerate(out.interventions):
        assert len(records) <= m
        assert all(1 <= r.step <= m for r in records)
        assert len({r.step for r in records}) == len(records)
        assert all(t <= m for t, _ in out.step_scores[i])
        # injected tokens are exactly the prefix, once per intervention
        injected = out.generation.completion_ids[i][out.generation.injected_mask[i].bool()].tolist()
        assert injected == prefix_ids * len(records)
        assert out.added_tokens[i] == len(prefix_ids) * len(records)


@pytest.mark.parametrize("lookahead", [0, 4])
def test_prefix_is_injected_at_step_starts(lm, lookahead):
    """Keep mode: the prefix follows the violating step, i.e. starts right after a delimiter (or after a step that
    closed without one: its row ended inside it); a violating final step (closed by </think>) is replaced: the prefix
    starts where that step started (a step start too)."""
    model, tok = lm
    out = _run(lm, always(0.0), m=2, discard=False, lookahead=lookahead)
    assert any(r.discarded for records in out.interventions for r in records), "the test must see a final step"
    for i, records in enumerate(out.interventions):
        ids = out.generation.completion_ids[i].tolist()
        inj = out.generation.injected_mask[i].tolist()
        starts = [j for j in range(len(ids)) if inj[j] and (j == 0 or not inj[j - 1])]
        assert len(starts) == len(records)
        for j, record in zip(starts, records):
            assert record.discarded == record.step_text.endswith("</think>")
            after_delimiter = any(d in tok.decode(ids[j - 1 : j]) for d in DELIMS)
            assert (j == 0 and record.discarded) or after_delimiter or record.cut == "end"


def test_raising_tau_never_lowers_the_intervention_count(lm):
    """Scores depend on the step index only (a scripted R_safe), so the count is #{t <= m: s_t < tau}.

    The scripted R_safe reads the step index off the trace: steps close at digits, which neither the injected prefix
    nor the special tokens contain, so the index is the number of digits, + 1 for each step that does not end at a
    digit (a final step closed by </think>, and the step a row ended inside); answer steps (scored by default) are
    numbered on after the final step; every recorded score is checked against the schedule at the decoder's own step
    index."""
    schedule = [0.9, 0.2, 0.6, 0.4, 0.8, 0.1]
    digits = list("0123456789")

    def step_index(trace):
        _, closed, answer = trace.partition("</think>")
        ends_inside = trace[-1:] not in digits and (bool(answer) or not closed)  # a step the row ended inside
        return sum(trace.count(d) for d in digits) + bool(closed) + ends_inside

    def by_step(prompts, traces):
        return [schedule[min(step_index(t), len(schedule)) - 1] for t in traces]

    model, tok = lm
    previous, answered = None, 0
    for tau in (0.0, 0.15, 0.3, 0.5, 0.7, 0.95, 1.01):
        out = safethink_generate(
            model,
            tok,
            PROMPTS,
            by_step,
            tau=tau,
            max_steps_monitored=None,
            params=SamplingParams(max_new_tokens=64, do_sample=True),
            generator=torch.Generator().manual_seed(0),
            # the rows are compared across taus under seeded sampling: at hook_lookahead=0 (and in keep mode) a row's
            # j-th sampled token uses the same random draw whatever the interventions, which keeps the steps it reaches
            # comparable; with a lookahead the tokens discarded after a violation use draws too
            decoder=StepwiseDecoder(step_delimiters=digits, hook_lookahead=0),
        )
        for scores in out.step_scores:
            assert all(score == schedule[min(t, len(schedule)) - 1] for t, score in scores)
        counts = out.num_interventions
        answered += sum(out.num_answer_interventions)
        if previous is not None:
            assert all(c >= p for c, p in zip(counts, previous)), (tau, counts, previous)
        previous = counts
    assert sum(previous) > 0
    assert max(len(scores) for scores in out.step_scores) >= 3, "the test must see several steps per row"
    assert answered, "the test must see answer steps (scored by default, numbered on from the reasoning)"


def test_raising_tau_never_lowers_the_set_of_rows_intervened(lm):
    """With any deterministic scorer, rows agree until the first intervention, so 'ever intervened' is monotone."""

    def hashed(prompts, traces):
        return [(sum(map(ord, t)) % 97) / 96 for t in traces]

    previous = None
    for tau in (0.1, 0.3, 0.5, 0.8):
        rows = _run(lm, hashed, m=3, tau=tau).intervened
        if previous is not None:
            assert all(r or not p for r, p in zip(rows, previous))
        previous = rows


def test_only_the_violating_row_changes(lm):
    plain = _plain(lm)
    target = PROMPTS.index("hello there")

    def flag_one(prompts, traces):
        return [0.0 if p == PROMPTS[target] else 1.0 for p in prompts]

    out = _run(lm, flag_one, m=3)
    assert out.intervened[target]
    assert out.texts[target] != plain.texts[target]
    assert [t for i, t in enumerate(out.texts) if i != target] == [t for i, t in enumerate(plain.texts) if i != target]


@pytest.mark.parametrize(
    ("scores", "match"),
    [
        ([1.5, 0.2, 0.3, 0.4], "outside \\[0, 1\\]"),
        ([0.5], "returned 1 scores for 4"),
        ([float("nan")] * 4, "outside"),
        ("oops", "sequence of numbers"),
    ],
)
def test_bad_scorer_output_raises_naming_the_scorer(lm, scores, match):
    scorer = FunctionScorer(lambda p, t: scores, name="my_rm")
    with pytest.raises(ScorerError, match="my_rm") as err:
        validate_scores(scorer.fn(PROMPTS, PROMPTS), 4, scorer.name)
    assert err.match(match)

    def bad_scorer(prompts, traces):
        return [2.0] * len(traces)

    with pytest.raises(ScorerError, match="bad_scorer"):
        _run(lm, bad_scorer, m=3)


def test_invalid_arguments(lm):
    with pytest.raises(ValueError, match="max_steps_monitored"):
        _run(lm, always(1.0), m=-1)
    with pytest.raises(ValueError, match="tau"):
        _run(lm, always(1.0), tau=float("nan"))
    model, tok = lm
    with pytest.raises(ValueError, match="prefix"):
        safethink_generate(model, tok, PROMPTS, always(1.0), prefix="")


def test_the_final_reasoning_step_is_monitored(lm):
    """The step closed by </think> is scored (final_step_delimiters, on by default) and a violation there resamples
    it after the prefix; with no final delimiter it is never scored. The closing tag is forced at a row's fifth
    completion token (if the row has not sampled it before); the step delimiters share no character with it."""
    model, tok = lm
    close = tok.convert_tokens_to_ids("</think>")
    prompt_width = 0

    def force_close(ids, scores):
        kept = (ids[:, prompt_width:] != tok.pad_token_id).sum(-1)  # each row's completion so far
        forced = torch.full_like(scores, float("-inf"))
        forced[:, close] = 0.0
        return torch.where((kept == 4)[:, None], forced, scores)

    scored: list[str] = []

    def flag_final(prompts, traces):
        scored.extend(traces)
        return [0.0 if t.endswith("</think>") else 1.0 for t in traces]

    def run(**kw):
        nonlocal prompt_width
        from zoo.encoding import encode_prompts

        ids, mask = encode_prompts(tok, PROMPTS)
        prompt_width = ids.shape[1]
        scored.clear()
        return safethink_generate(
            model,
            tok,
            PROMPTS,
            flag_final,
            tau=0.5,
            max_steps_monitored=None,
            params=SamplingParams(max_new_tokens=30, do_sample=True),
            generator=torch.Generator().manual_seed(0),
            prompt_ids=ids,
            prompt_attention_mask=mask,
            decoder=StepwiseDecoder(
                step_delimiters=list("aeou "), processors=[force_close], hook_lookahead=DEFAULT_HOOK_LOOKAHEAD, **kw
            ),
        )

    out = run()
    assert any(t.endswith("</think>") for t in scored)
    for i, records in enumerate(out.interventions):
        assert len(records) == 1, out.texts[i]
        assert records[0].discarded and records[0].step_text.endswith("</think>")
        assert out.texts[i].count("Wait, think safely") == 1
        assert out.generation.discarded[i] == [records[0].step_text]
    off = run(final_step_delimiters=())
    assert not any(t.endswith("</think>") for t in scored)
    assert not any(off.intervened)


@pytest.mark.parametrize(("max_step_tokens", "cut"), [(6, "length"), (None, "end")])
@pytest.mark.parametrize("discard", [False, True])
def test_a_policy_that_never_writes_the_delimiter_is_scored_and_steered(lm, max_step_tokens, cut, discard):
    """An adversarial policy writes its unsafe text ('h' here, what the scorer flags) and never the newline that
    ends SafeThink's steps: a logits processor bans the newline (and </think>) and pushes 'h' (greedy: 'hhh...').
    The unsafe text is still scored -- at ``max_step_tokens``, or at the end of the row -- and the intervention fires
    at step 1: keep mode appends the prefix after it, discard mode replaces it by the prefix."""
    model, tok = lm
    vocab = tok.get_vocab()
    h = vocab["h"]

    def adversary(ids, scores):
        scores = scores.clone()
        scores[:, [vocab["\n"], vocab["</think>"], tok.eos_token_id]] = float("-inf")
        scores[:, h] += 100.0
        return scores

    scored: list[str] = []

    def flag_h(prompts, traces):
        scored.extend(traces)
        return [0.0 if "h" in t else 1.0 for t in traces]

    decoder = StepwiseDecoder(processors=[adversary], max_step_tokens=max_step_tokens)
    out = safethink_generate(
        model,
        tok,
        PROMPTS,
        flag_h,
        max_steps_monitored=1,
        discard_violating_step=discard,
        params=SamplingParams(max_new_tokens=12),
        decoder=decoder,
    )
    assert all("\n" not in t for t in out.texts)
    assert scored and all("h" in t for t in scored)
    for i, text in enumerate(out.texts):
        (record,) = out.interventions[i]
        assert (record.step, record.cut, record.discarded) == (1, cut, discard)
        assert "Wait, think safely" in text
        if discard:  # the unsafe step was replaced by the prefix
            assert not text.startswith("h")
        else:
            assert text.startswith(record.step_text)
    plain = safethink_generate(
        model, tok, PROMPTS, flag_h, max_steps_monitored=0, params=SamplingParams(max_new_tokens=12), decoder=decoder
    )
    assert all(t == "h" * 12 for t in plain.texts)  # what the policy writes unmonitored


@pytest.mark.parametrize(("max_step_tokens", "lookahead"), [(None, 0), (6, DEFAULT_HOOK_LOOKAHEAD)])
def test_a_policy_that_closes_its_reasoning_at_once_is_scored_and_steered_in_its_answer(lm, max_step_tokens, lookahead):
    """An adversarial policy writes ``</think>`` first and then its unsafe text ('h' here, what the scorer flags) in
    the answer, never a newline: a logits processor forces the tag as the first token and then pushes 'h' (greedy:
    ``</think>hhh...``). The final step (the bare tag) is scored safe; by default the answer is scored too, whatever
    m (here 1), and its violating step is discarded and resampled after the prefix, which lands right after the tag.
    With ``monitor_answer=False`` (the paper's loop) the answer is never scored: the policy's text goes through."""
    model, tok = lm
    vocab = tok.get_vocab()
    close, h = vocab["</think>"], vocab["h"]
    ids, mask = encode_prompts(tok, PROMPTS)

    def adversary(context, scores):
        kept = (context[:, ids.shape[1] :] != tok.pad_token_id).sum(-1)
        pushed = scores.clone()
        pushed[:, [vocab["\n"], close, tok.eos_token_id]] = float("-inf")
        pushed[:, h] += 100.0
        first = torch.full_like(scores, float("-inf"))
        first[:, close] = 0.0
        return torch.where((kept == 0)[:, None], first, pushed)

    scored: list[str] = []

    def flag_h(prompts, traces):
        scored.extend(traces)
        return [0.0 if "h" in t.split("</think>", 1)[-1] else 1.0 for t in traces]

    def run(max_new_tokens=12, **kw):
        scored.clear()
        return safethink_generate(
            model,
            tok,
            PROMPTS,
            flag_h,
            max_steps_monitored=1,
            params=SamplingParams(max_new_tokens=max_new_tokens),
            prompt_ids=ids,
            prompt_attention_mask=mask,
            decoder=StepwiseDecoder(processors=[adversary], max_step_tokens=max_step_tokens, hook_lookahead=lookahead),
            **kw,
        )

    out = run()
    assert "</think>" in scored  # the final step (step 1) was scored, and found safe
    for i, text in enumerate(out.texts):
        (first,) = out.interventions[i]  # one steering in the answer by default (max_answer_interventions=1)
        assert (first.step, first.answer, first.discarded) == (2, True, True)
        assert first.step_text.startswith("h") and first.cut == ("length" if max_step_tokens else "end")
        assert text.startswith("</think>Wait, think safely")  # the prefix at the start of the violating answer step
        assert out.num_answer_interventions[i] == out.num_interventions[i] == 1
        assert out.generation.discarded[i][0] == first.step_text
    if max_step_tokens:  # the policy keeps writing 'h' after the prefix: without a bound every answer step is steered
        unbounded = run(max_new_tokens=30, max_answer_interventions=None)
        bounded = run(max_new_tokens=30)
        assert all(n == 1 for n in bounded.num_answer_interventions)
        assert all(n > 1 for n in unbounded.num_answer_interventions)
        assert all(r.answer and r.discarded for row in unbounded.interventions for r in row)
    off = run(monitor_answer=False)
    assert set(scored) == {"</think>"}  # only the final step: the answer is not scored
    assert not any(off.intervened)
    assert all(t == "</think>" + "h" * 11 for t in off.texts)  # what the policy writes unmonitored


def test_answer_steerings_are_bounded_and_counted_before_decoding():
    """By default a row is steered at most once in its answer, so SafeThink's hook declares every token it may inject
    (m prefixes in the reasoning, one in the answer): the decoder's context check counts them before decoding instead
    of failing mid-run when a policy keeps answering harmfully after the prefix."""
    prefix = [7, 8, 9]
    bounded = SafeThinkHook(lambda p, t: [1.0] * len(t), ["x"], 0.5, 3, prefix)
    assert bounded.max_appended_tokens == (3 + 1) * len(prefix)
    assert SafeThinkHook(lambda p, t: [1.0], ["x"], 0.5, 3, prefix, monitor_answer=False).max_appended_tokens == 9
    assert (
        SafeThinkHook(lambda p, t: [1.0], ["x"], 0.5, 3, prefix, max_answer_interventions=None).max_appended_tokens
        is None
    )
    with pytest.raises(ConfigError, match="max_answer_interventions"):
        SafeThinkHook(lambda p, t: [1.0], ["x"], 0.5, 3, prefix, max_answer_interventions=-1)
