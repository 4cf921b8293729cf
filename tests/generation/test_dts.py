"""DTS, Decoding Tree Sketching (zoo.generation.dts, ``module/decoder=dts``, ``+method=dts``): entropy/varentropy,
the branch rules and children, the plain-sampler identity, freezing, DTS-Greedy's shortest trace, the batched step
over stacked caches against each branch alone, the DTS-Stable vote, bad input, and the method run end to end.

Trees whose shape must be known exactly are driven by a *scripted* logits processor (a real transformers-convention
processor on the decoder's seam, over a real model): it sets the next-token distribution from the tokens a
hypothesis has generated, so the tree is fixed by construction while the cache, the lockstep loop and the vote run
for real.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from zoo.answers import EXACT_ANSWER
from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation import DTSDecoder, SampleDecoder, entropy_varentropy, majority_vote
from zoo.generation.dts import branch_children, is_branch_point
from zoo.generation.sampling import IncrementalDecoder
from zoo.protocols import SamplingParams

from conftest import SMALL_BASE_POLICY

torch.set_num_threads(1)
PROMPTS = ["1+1=", "22+3=", "rev ab=", "9+9=", "5+50="]
ALWAYS = {"entropy_threshold": math.inf, "varentropy_threshold": -1.0}  # every row with >= 2 options branches


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def tiny():
    """A random tiny Llama whose EOS is likely enough that traces end at different steps."""
    backbone = TinyBackbone(seed=1)
    model, tok = backbone.build_model().eval(), backbone.tokenizer
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[tok.eos_token_id] = head[tok.convert_tokens_to_ids("=")] * 0.9
    ids, mask = encode_prompts(tok, PROMPTS)
    return model, tok, ids, mask


# -- entropy / varentropy -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [2, 7, 102])
@pytest.mark.parametrize("temperature", [0.6, 1.0, 2.0])
def test_uniform_logits_give_log_v_and_zero_varentropy(vocab, temperature):
    logits = torch.full((3, 4, vocab), 1.7)
    entropy, varentropy = entropy_varentropy(logits, temperature)
    assert entropy.shape == varentropy.shape == (3, 4)
    torch.testing.assert_close(entropy, torch.full((3, 4), math.log(vocab)), atol=1e-5, rtol=0)
    torch.testing.assert_close(varentropy, torch.zeros(3, 4), atol=1e-5, rtol=0)


def test_one_hot_gives_zero_entropy_and_varentropy():
    one_hot = torch.full((2, 50), -math.inf)
    one_hot[0, 3] = one_hot[1, 49] = 0.0
    entropy, varentropy = entropy_varentropy(one_hot)
    assert torch.equal(entropy, torch.zeros(2)) and torch.equal(varentropy, torch.zeros(2))
    entropy, varentropy = entropy_varentropy(torch.tensor([[80.0, 0.0, 0.0, 0.0]]))  # numerically one-hot
    assert float(entropy) < 1e-6 and float(varentropy) < 1e-6


def test_entropy_and_varentropy_of_a_known_distribution_at_the_entropy_temperature():
    # p = (1/2, 1/4, 1/4): H = 1.5 ln 2, surprisals ln 2, 2 ln 2, 2 ln 2 -> V = (ln 2)^2 / 4. The logits are
    # log p * T, so that softmax(logits / T) = p only if the temperature is applied as a divisor.
    temperature = 0.6
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25])) * temperature
    entropy, varentropy = entropy_varentropy(logits, temperature)
    assert float(entropy) == pytest.approx(1.5 * math.log(2), abs=1e-6)
    assert float(varentropy) == pytest.approx(math.log(2) ** 2 / 4, abs=1e-6)
    assert float(entropy_varentropy(logits, 1.0)[0]) != pytest.approx(1.5 * math.log(2), abs=1e-3)


def test_branch_rules_v2_decision_token_and_v1_high_entropy():
    entropy = torch.tensor([1.0, 1.0, 3.0, 2.5, 2.5])
    varentropy = torch.tensor([2.0, 1.0, 2.0, 1.5, 1.6])
    v2 = is_branch_point(entropy, varentropy, "decision_token", 2.5, 1.5)
    assert v2.tolist() == [True, False, False, False, True]  # H <= tau_H and V > tau_V (strict)
    v1 = is_branch_point(entropy, varentropy, "high_entropy", 2.5, 1.5)
    assert v1.tolist() == [False, False, True, False, False]  # H > tau_H, V ignored


def test_children_are_the_distinct_top_k_ids_by_logprob_lower_id_first_on_ties():
    scores = torch.tensor([0.1, 2.0, -1.0, 2.0, 0.5, 2.0, -math.inf])
    assert branch_children(scores, 3) == [1, 3, 5]
    assert branch_children(scores, 5) == [1, 3, 5, 4, 0]
    assert branch_children(torch.log_softmax(scores, -1), 4) == [1, 3, 5, 4]  # log-probs: same order
    only_two = torch.tensor([-math.inf, 0.3, -math.inf, 1.0])
    assert branch_children(only_two, 3) == [3, 1]  # impossible tokens are never children


# -- decoder invariants on a real (random) model -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["greedy", "stable"])
def test_infinite_varentropy_threshold_is_the_plain_sampler(tiny, mode):
    model, tok, ids, mask = tiny
    params = SamplingParams(20, do_sample=True, temperature=0.8, top_k=30)
    plain = SampleDecoder()(model, tok, ids, mask, params=params, generator=_gen(5))
    dts = DTSDecoder(varentropy_threshold=math.inf, temperature=None, mode=mode)
    out = dts(model, tok, ids, mask, params=params, generator=_gen(5))
    assert 0 < int(plain.finished.sum()) < len(PROMPTS), "rows must end at different steps"
    assert torch.equal(out.completion_ids, plain.completion_ids)
    assert torch.equal(out.completion_mask, plain.completion_mask)
    torch.testing.assert_close(out.logprobs, plain.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(out.finished, plain.finished) and out.texts == plain.texts
    assert all(not events for events in out.branch_events)
    # the decoder's own temperature is the same as the module's sampling settings at that temperature
    own = DTSDecoder(varentropy_threshold=math.inf, temperature=0.8)
    again = own(model, tok, ids, mask, params=SamplingParams(20, top_k=30), generator=_gen(5))
    assert torch.equal(again.completion_ids, plain.completion_ids)


def test_children_at_the_root_are_the_top_k_of_the_prompt_distribution(tiny):
    model, tok, ids, mask = tiny
    out = DTSDecoder(**ALWAYS, branch_top_k=4, max_active=6)(
        model, tok, ids, mask, params=SamplingParams(6), generator=_gen(1)
    )
    for row, events in enumerate(out.branch_events):
        root = events[0]
        assert root.step == 0 and len(set(root.children)) == 4
        prompt = ids[row][mask[row].bool()][None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=prompt).logits[0, -1].float(), -1)
        top = torch.topk(logp, 4).indices.tolist()
        assert list(root.children) == top
        assert logp[list(root.children)].tolist() == sorted(logp[list(root.children)].tolist(), reverse=True)


@pytest.mark.parametrize(("k", "max_active"), [(2, 1), (2, 4), (3, 12), (3, 5), (4, 7)])
def test_after_freeze_the_active_count_never_increases(tiny, k, max_active):
    model, tok, ids, mask = tiny
    out = DTSDecoder(**ALWAYS, branch_top_k=k, max_active=max_active, mode="stable", num_traces=99)(
        model, tok, ids, mask, params=SamplingParams(32, do_sample=True), generator=_gen(2)
    )
    for counts, frozen, events in zip(out.active_counts, out.frozen_at, out.branch_events):
        if frozen is None:  # every hypothesis finished before the tree reached the cap
            assert max(counts) < max_active
            continue
        after = counts[frozen + 1 :]  # branches of the freezing step itself may precede the check
        assert all(a >= b for a, b in zip(after, after[1:])), counts
        assert max(counts) <= max_active + k - 2  # the per-hypothesis check overshoots by at most k - 2
        assert all(e.step <= frozen for e in events)
        if max_active == 1:
            assert not events and frozen == 0
    frozen_trees = [counts for counts, frozen in zip(out.active_counts, out.frozen_at) if frozen is not None]
    assert len(frozen_trees) >= 3, "most always-branching trees must reach the cap"
    if max_active > 1:
        assert any(len(set(c[c.index(max(c)) :])) > 1 for c in frozen_trees), "finishes must shrink a frozen tree"


def test_dts_greedy_returns_a_minimal_length_finished_trajectory(tiny):
    """The same tree decoded to the end (stable, B large) finishes traces of several lengths; DTS-Greedy stops at
    the first one, which is the shortest of them. One prompt per call: with branching, prompts of a batch share the
    noise draws, so only a lone prompt's tree is the same in both runs until DTS-Greedy stops."""
    model, tok, ids, mask = tiny
    settings = {**ALWAYS, "branch_top_k": 3, "max_active": 12}
    params = SamplingParams(24, do_sample=True)
    several = 0
    for row in range(len(PROMPTS)):
        one = (ids[row : row + 1], mask[row : row + 1])
        greedy = DTSDecoder(**settings, mode="greedy")(model, tok, *one, params=params, generator=_gen(4))
        full = DTSDecoder(**settings, mode="stable", num_traces=1000)(
            model, tok, *one, params=params, generator=_gen(4)
        )
        lengths = full.finished_lengths[0]
        assert bool(greedy.finished[0]) == bool(lengths)
        if lengths:
            several += len(set(lengths)) > 1
            assert int(greedy.lengths[0]) == min(lengths) == lengths[0]
            assert greedy.active_counts[0] == full.active_counts[0][: len(greedy.active_counts[0])]
    assert several >= 2, "the check needs trees whose traces finish at different lengths"


# -- the batched step over stacked caches ---------------------------------------------------------------------------
def _gpt2(tok) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2, **ids)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(params=["llama", "gpt2"])
def any_model(request, tiny):
    model, tok, ids, mask = tiny
    return (model if request.param == "llama" else _gpt2(tok)), tok, ids, mask


def _alone(model, tok, prompt_ids, prompt_mask, tokens):
    """Next-token logits of one branch run alone: uncached, unpadded, batch of one."""
    seq = torch.cat([prompt_ids[prompt_mask.bool()], torch.tensor(tokens, dtype=torch.long)])[None]
    return model(input_ids=seq).logits[0, -1].float()


@torch.no_grad()
def test_reordered_stacked_cache_gives_each_branch_its_own_logits(any_model):
    model, tok, ids, mask = any_model
    state = IncrementalDecoder(model, ids[:3], mask[:3])
    owner, tokens = [0, 1, 2], [[], [], []]
    vocab = state.next_logits.shape[-1]
    for step, rows in enumerate([[0, 0, 1, 2, 2, 2], [5, 0, 0, 3, 1], [4, 4, 2, 0]]):
        state.reorder_rows(torch.tensor(rows))
        owner, tokens = [owner[r] for r in rows], [list(tokens[r]) for r in rows]
        new = [(7 * i + 11 * step + 3) % vocab for i in range(len(rows))]
        for t, n in zip(tokens, new):
            t.append(n)
        state.feed(torch.tensor(new)[:, None])
        for i in range(len(rows)):
            alone = _alone(model, tok, ids[owner[i]], mask[owner[i]], tokens[i])
            torch.testing.assert_close(state.next_logits[i], alone, atol=1e-5, rtol=0)


class CaptureScores:
    """A pass-through logits processor recording what the decoder computed at every step."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls.append((input_ids.clone(), scores.clone()))
        return scores


@torch.no_grad()
def test_dts_step_logits_equal_each_branch_run_alone(any_model):
    model, tok, ids, mask = any_model
    capture = CaptureScores()
    decoder = DTSDecoder(**ALWAYS, branch_top_k=3, max_active=8, mode="stable", num_traces=99, processors=[capture])
    out = decoder(model, tok, ids[:3], mask[:3], params=SamplingParams(6, do_sample=True), generator=_gen(0))
    assert max(max(c) for c in out.active_counts) >= 8
    width = ids.shape[1]
    checked = 0
    for context, scores in capture.calls:
        for row in range(context.shape[0]):
            prompt, generated = context[row, :width], context[row, width:].tolist()
            alone = _alone(model, tok, prompt, prompt != tok.pad_token_id, generated)
            torch.testing.assert_close(scores[row], alone, atol=1e-5, rtol=0)
            checked += 1
    assert checked > 40


# -- a scripted tree: finishes, votes, greedy ------------------------------------------------------------------------
class ScriptedTree:
    """Next-token distribution from what a hypothesis generated (prompt width ``width``):

    position 0, 1: digits 1/2/3 (logits 2, 1, 0.5: a decision at each); position 2: ``</think>``;
    position 3: EOS after ``11`` (empty answer), else the answer ``y`` after ``12``/``13``, ``x`` otherwise;
    position 4: EOS. Leaves in row order: 11 (finishes at step 3), then 12, 13, 21, ..., 33 (step 4).
    With ``eleven_ends_early=False`` trace 11 emits a space at position 3 (still no answer) and finishes with the
    others at step 4, first in row order.
    """

    def __init__(self, tok, width: int, eleven_ends_early: bool = True) -> None:
        self.tok, self.width, self.eleven_ends_early = tok, width, eleven_ends_early
        self.space = tok.convert_tokens_to_ids(" ")
        self.digits = tok.convert_tokens_to_ids(["1", "2", "3"])
        self.close, self.eos = tok.convert_tokens_to_ids("</think>"), tok.eos_token_id
        self.x, self.y = tok.convert_tokens_to_ids(["x", "y"])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, -math.inf)
        for row, ids in enumerate(input_ids[:, self.width :].tolist()):
            pos = len(ids)
            if pos < 2:
                out[row, self.digits] = torch.tensor([2.0, 1.0, 0.5])
            elif pos == 2:
                out[row, self.close] = 0.0
            elif pos == 3:
                first_two = self.tok.decode(ids[:2])
                eleven = self.eos if self.eleven_ends_early else self.space
                out[row, eleven if first_two == "11" else self.y if first_two in ("12", "13") else self.x] = 0.0
            else:
                out[row, self.eos] = 0.0
        return out


@pytest.fixture
def scripted(tiny):
    model, tok, ids, mask = tiny
    return model, tok, ids[:2], mask[:2], ScriptedTree(tok, ids.shape[1])


def test_stable_vote_runs_over_every_trace_finished_in_the_stopping_step(scripted):
    """The official runner votes over every trace ``kvbatch_decoder.generate`` returns: all of ``finished``, the
    traces finishing in the step that reaches ``B`` included, empty answers skipped."""
    model, tok, ids, mask, script = scripted
    decoder = DTSDecoder(**ALWAYS, mode="stable", num_traces=3, verifier=EXACT_ANSWER, processors=[script])
    out = decoder(model, tok, ids, mask, params=SamplingParams(8, do_sample=True), generator=_gen(0))
    for row in range(2):
        assert out.finished_lengths[row] == [4] + [5] * 8  # every trace finishing in the stopping step is kept
        assert out.answers[row] == ["", "y", "y"] + ["x"] * 6  # all 9 vote, in finish order
        expected = Counter(a for a in out.answers[row] if a).most_common(1)[0][0]
        assert out.voted[row] == expected == majority_vote(out.answers[row]) == "x"
        # the returned trace is the first that answered "x" (21)
        assert out.texts[row] == "21</think>x" and bool(out.finished[row])
        assert [len(e.children) for e in out.branch_events[row]] == [3, 3, 3, 3]
    assert out.row_meta()["voted_answer"] == ["x", "x"]


def test_vote_over_first_b_votes_over_the_first_b_finished_traces_only(scripted):
    model, tok, ids, mask, script = scripted
    decoder = DTSDecoder(
        **ALWAYS, mode="stable", num_traces=3, vote_over="first_b", verifier=EXACT_ANSWER, processors=[script]
    )
    out = decoder(model, tok, ids, mask, params=SamplingParams(8, do_sample=True), generator=_gen(0))
    assert out.finished_lengths == [[4] + [5] * 8] * 2  # the same stop; only the voters differ
    assert out.answers == [["", "y", "y"]] * 2 and out.voted == ["y", "y"]
    assert out.texts == ["12</think>y"] * 2  # the first voting trace with the winning answer


def test_greedy_does_not_return_an_unparsable_trace_over_one_that_finished_in_the_same_step(tiny):
    """B = 1: all 9 traces finish at step 4, trace 11 (no answer) first in row order. The official vote skips its
    empty answer, so the returned trace is the first with the winning answer, not trace 11."""
    model, tok, ids, mask = tiny
    script = ScriptedTree(tok, ids.shape[1], eleven_ends_early=False)
    out = DTSDecoder(**ALWAYS, processors=[script])(
        model, tok, ids[:2], mask[:2], params=SamplingParams(8), generator=_gen(0)
    )
    assert out.finished_lengths == [[5] * 9] * 2
    assert out.answers == [["", "y", "y"] + ["x"] * 6] * 2 and out.voted == ["x", "x"]
    assert out.texts == ["21</think>x"] * 2 and bool(out.finished.all())


def test_greedy_on_the_scripted_tree_returns_the_early_finisher(scripted):
    model, tok, ids, mask, script = scripted
    out = DTSDecoder(**ALWAYS, processors=[script])(model, tok, ids, mask, params=SamplingParams(8), generator=_gen(0))
    assert out.texts == ["11</think>", "11</think>"] and out.lengths.tolist() == [4, 4]
    assert out.answers == [[""], [""]] and out.voted == [None, None]
    assert out.decoded_tokens == [3 + 9 + 9 + 9] * 2  # tokens emitted by all hypotheses in steps 0-3


def test_consensus_early_stop_ends_a_prompt_as_soon_as_answers_agree(scripted):
    model, tok, ids, mask, script = scripted
    decoder = DTSDecoder(
        **ALWAYS,
        mode="stable",
        num_traces=8,
        early_stop=True,
        early_stop_min_answers=2,
        early_stop_min_share=0.6,
        processors=[script],
    )
    out = decoder(model, tok, ids, mask, params=SamplingParams(8), generator=_gen(0))
    assert out.early_stopped == [True, True]
    assert out.answers == [["", "y", "y"], ["", "y", "y"]]  # stopped at the second valid answer, before B = 8
    assert out.voted == ["y", "y"]


def test_nothing_finished_returns_the_most_likely_active_hypothesis(scripted):
    model, tok, ids, mask, script = scripted
    out = DTSDecoder(**ALWAYS, processors=[script])(model, tok, ids, mask, params=SamplingParams(2), generator=_gen(0))
    assert out.texts == ["11", "11"] and not bool(out.finished.any())  # digit logits 2 > 1 > 0.5: "1" then "1"
    assert out.answers == [[], []] and out.row_meta()["finished"] == [False, False]


class PrefixScript:
    """Next-token logits ``{token: logit}`` looked up by the text a hypothesis generated (prompt width ``width``);
    a prefix not in the table gets EOS."""

    def __init__(self, tok, width: int, table: dict[str, dict[str, float]]) -> None:
        self.tok, self.width, self.table = tok, width, table

    def logits(self, prefix: str) -> torch.Tensor:
        out = torch.full((len(self.tok),), -math.inf)
        for token, logit in self.table.get(prefix, {self.tok.eos_token: 0.0}).items():
            out[self.tok.convert_tokens_to_ids(token)] = logit
        return out

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        rows = [self.logits(self.tok.decode(ids)) for ids in input_ids[:, self.width :].tolist()]
        return torch.stack(rows).to(scores)


ROOT = {"1": 2.0, "2": 1.0, "3": 0.5}


def test_entropy_and_the_branch_rule_use_the_entropy_temperature_not_t1(tiny):
    """``H`` at ``T_ent = 0.6`` of the root (logits 2, 1, 0.5) is below ``tau_H``, at ``T = 1`` above it: with the
    ``high_entropy`` rule the root must not branch, and the recorded ``H``/``V`` are those at ``T_ent``."""
    model, tok, ids, mask = tiny
    script = PrefixScript(tok, ids.shape[1], {"": ROOT})
    root = script.logits("")
    (h_ent, v_ent), (h_one, _) = entropy_varentropy(root, 0.6), entropy_varentropy(root, 1.0)
    assert h_ent < h_one - 0.1
    settings = {"branch_rule": "high_entropy", "entropy_threshold": float(h_ent + h_one) / 2, "processors": [script]}
    params = SamplingParams(4, do_sample=True)
    out = DTSDecoder(**settings, entropy_temperature=0.6)(
        model, tok, ids[:2], mask[:2], params=params, generator=_gen(0)
    )
    assert out.branch_events == [[], []]
    for row in range(2):
        assert out.entropies[row][0] == pytest.approx(float(h_ent), abs=1e-5)
        assert out.varentropies[row][0] == pytest.approx(float(v_ent), abs=1e-5)
    at_one = DTSDecoder(**settings, entropy_temperature=1.0)(
        model, tok, ids[:2], mask[:2], params=params, generator=_gen(0)
    )
    assert [len(e) for e in at_one.branch_events] == [1, 1]  # the threshold sits between the two entropies


def test_fallback_ranks_unfinished_hypotheses_by_temperature_one_logprobs(tiny):
    """Nothing finishes in 2 tokens; every hypothesis branches. At ``T = 1``, ``21`` (root ``log p(2) = -1.46``, then
    a near-certain ``1``) beats ``1?`` (``log p(1) = -0.46``, then a uniform choice, ``-log 3``); at the sampling
    temperature 0.6 the order flips. The official decoder ranks by the ``T = 1`` sum (``Hyp.logprob``)."""
    model, tok, ids, mask = tiny
    table = {
        "": ROOT,
        "1": dict.fromkeys("123", 0.0),
        "2": {"1": 5.0, "2": 0.0, "3": 0.0},
        "3": dict.fromkeys("123", 0.0),
    }
    script = PrefixScript(tok, ids.shape[1], table)

    def best(temperature: float) -> str:
        paths = {a + b: 0.0 for a in "123" for b in "123"}
        for path in paths:
            first = torch.log_softmax(script.logits("") / temperature, -1)[tok.convert_tokens_to_ids(path[0])]
            second = torch.log_softmax(script.logits(path[0]) / temperature, -1)[tok.convert_tokens_to_ids(path[1])]
            paths[path] = float(first + second)
        return max(paths, key=paths.get)

    assert best(1.0) == "21" and best(0.6) == "11"  # the two readings disagree on this tree
    decoder = DTSDecoder(**ALWAYS, temperature=0.6, processors=[script])
    out = decoder(model, tok, ids[:2], mask[:2], params=SamplingParams(2), generator=_gen(0))
    assert not bool(out.finished.any())
    assert out.texts == ["21", "21"]


# -- bad input -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"branch_top_k": 1}, "branch_top_k"),
        ({"max_active": 0}, "max_active"),
        ({"mode": "beam"}, "mode"),
        ({"branch_rule": "entropy"}, "branch_rule"),
        ({"mode": "greedy", "num_traces": 4}, "num_traces"),
        ({"entropy_temperature": 0.0}, "entropy_temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"verifier": "task"}, "verifier"),
    ],
)
def test_bad_settings_are_one_clear_error(kwargs, field):
    with pytest.raises(ConfigError, match=f"module.decoder.{field}"):
        DTSDecoder(**kwargs)


def test_a_negative_entropy_threshold_that_never_branches_is_refused():
    """decision_token branches where H <= tau_H; H >= 0, so tau_H < 0 decoded without a single branch event and no
    word (a plain sampler passed off as DTS). high_entropy (H > tau_H) does branch with it, so it stays allowed."""
    entropy = torch.tensor([0.0, 0.5, 3.0])
    assert not is_branch_point(entropy, torch.full_like(entropy, 9.0), "decision_token", -1.0, 0.0).any()
    with pytest.raises(ConfigError, match=r"module.decoder.entropy_threshold=-1.0 never branches.*varentropy_thr"):
        DTSDecoder(entropy_threshold=-1.0)
    assert DTSDecoder(entropy_threshold=-1.0, branch_rule="high_entropy").entropy_threshold == -1.0
    assert DTSDecoder(entropy_threshold=0.0).entropy_threshold == 0.0


def test_branch_top_k_above_the_vocabulary_is_a_clear_error(tiny):
    model, tok, ids, mask = tiny
    with pytest.raises(ConfigError, match=r"branch_top_k=500 exceeds the vocabulary of the model \(102 tokens\)"):
        DTSDecoder(branch_top_k=500)(model, tok, ids, mask, params=SamplingParams(4))


def _to_legacy_tuples(module, args, out):
    """Forward hook making a model behave like a remote-code model that returns legacy ``((key, value), ...)``
    tuples as its cache (a test double of such a backbone)."""
    key = "cache" if "cache" in out else "past_key_values"
    out[key] = tuple((layer.keys, layer.values) for layer in out[key].layers)
    return out


def test_a_model_whose_cache_cannot_be_reordered_is_a_clear_error(tiny):
    model, tok, ids, mask = tiny
    handle = model.register_forward_hook(_to_legacy_tuples)
    try:
        with pytest.raises(ConfigError, match=r"LlamaForCausalLM \(tuple\) cannot be reordered by row"):
            DTSDecoder()(model, tok, ids, mask, params=SamplingParams(4))
    finally:
        handle.remove()


# -- +method=dts end to end ------------------------------------------------------------------------------------------
def test_method_dts_predicts_with_tree_statistics_per_problem(train_cfg, base_policy_cache, tmp_path):
    from zoo.cli.train import check_methods, run

    overrides = [
        "+method=dts",
        *SMALL_BASE_POLICY,
        "stage=predict",
        "datamodule.source.num_test=12",
        "datamodule.eval_batch_size=6",
        "module.generation.max_new_tokens=24",
        "module.decoder.entropy_threshold=10",
        "module.decoder.varentropy_threshold=0.01",
        "module.decoder.max_active=4",
        "module.decoder.mode=stable",
        "module.decoder.num_traces=3",
        "logger=none",
    ]
    cfg = train_cfg(overrides, cache_dir=base_policy_cache)
    assert check_methods(cfg)["dts"]["kind"] == "decoder"
    run(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    stats = json.loads((tmp_path / "run" / "decode_stats_predict.json").read_text())
    assert len(rows) == 12
    mean = lambda key: sum(float(r[key]) for r in rows) / len(rows)
    assert stats["predict/decode/repetition_rate"] == pytest.approx(1 - mean("finished"))
    assert stats["predict/decode/tokens_per_problem"] == pytest.approx(mean("completion_tokens"))
    assert stats["predict/decode/branch_events"] == pytest.approx(mean("branch_events"))
    assert stats["predict/decode/accuracy"] == pytest.approx(mean("correct"))
    assert all(r["decoded_tokens"] >= r["completion_tokens"] and r["max_active"] >= 1 for r in rows)
    # H and V at every token of the returned completion
    assert all(len(r["entropies"]) == len(r["varentropies"]) == r["completion_tokens"] for r in rows)
    assert all(v >= 0 for r in rows for v in r["varentropies"])
    assert any(r["branch_events"] > 0 for r in rows), "the thresholds must let some trees branch"


def _saved_gpt2(path) -> str:
    tok = build_char_tokenizer()
    _gpt2(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("backbone", ["hf_gpt2", "tiny_bnb_int8", "tiny_bnb_nf4"])
def test_method_dts_evaluates_hf_and_quantized_backbones(train_cfg, tmp_path, backbone):
    from zoo.cli.train import run

    if backbone == "hf_gpt2":
        chosen = ["backbone=hf", f"backbone.name_or_path={_saved_gpt2(tmp_path / 'gpt2')}"]
    else:
        chosen = [f"quant={backbone.removeprefix('tiny_')}", "backbone.hidden_size=64", "backbone.num_hidden_layers=2"]
    overrides = [
        "+method=dts",
        *chosen,
        "backbone.init_from=null",
        "datamodule.source.num_test=6",
        "datamodule.eval_batch_size=6",
        "module.generation.max_new_tokens=8",
        "module.decoder.varentropy_threshold=-1",
        "module.decoder.entropy_threshold=100",
        "module.decoder.max_active=3",
        "logger=none",
    ]
    metrics = run(train_cfg(overrides))
    assert metrics["test/decode/branch_events"] >= 1  # random weights, forced to branch until 3 are active
    assert 3 <= metrics["test/decode/max_active"] <= 3 + 3 - 2
    assert metrics["test/decode/decoded_tokens_per_problem"] > metrics["test/decode/tokens_per_problem"]
