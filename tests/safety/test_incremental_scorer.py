"""Incremental (KV-cached) safety scoring: exact against a full read, used by SafeThink, and the full-read path kept.

Real transformers classifiers built from configs (tiny Llama, tiny GPT-2, tiny BERT; random weights with a wide
initialisation so that scores differ between texts) and the zoo's real character tokenizer; the policy of the
SafeThink test is a random tiny Llama with frequent characters as step delimiters (the control flow is under test).
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    LlamaConfig,
    LlamaForSequenceClassification,
)

from zoo.backbones import TinyBackbone
from zoo.errors import ConfigError
from zoo.generation.stepwise import StepwiseDecoder
from zoo.protocols import SamplingParams
from zoo.safety import DEFAULT_HOOK_LOOKAHEAD, SequenceClassifierScorer, safethink_generate
from zoo.safety.scorers import (
    IncrementalScoringSession,
    StatelessSession,
    as_scorer,
    is_causal_classifier,
    last_layer_mlp,
    length_groups,
    scoring_session,
)

torch.set_num_threads(1)
TINY_POLICY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}
PROMPTS = ["JB 44+21=", "12+3=", "JB 7+8=", "a much longer prompt: 1+2+3+4="]


@pytest.fixture(scope="module")
def tok():
    return TinyBackbone().tokenizer


def _llama(tok, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        num_labels=2,
        pad_token_id=tok.pad_token_id,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: the cache holds fewer heads than the queries
        initializer_range=0.5,
    )
    return LlamaForSequenceClassification(config).eval()


def _gpt2(tok, seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tok),
        num_labels=1,  # one logit: score = sigmoid
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,  # learned positions: padding must not index past them
        initializer_range=0.5,
    )
    return GPT2ForSequenceClassification(config).eval()


# Per row: its trace at successive step closes (rows join late, skip calls, get the prefix injected, lose a step).
TRACES = {
    0: ["<think>4+1=5\n", "<think>4+1=5\n4+2=6\n", "<think>4+1=5\n4+2=6\nWait, think safely", "<think>4+1=5\n9\n"],
    1: ["<think>", "<think>2+3=5\n", None, "<think>2+3=5\n1+1=2\n3</think>"],
    2: [None, "<think>7+8=15\n7+8=15\n", "<think>7+8=15\n7+8=15\n", "<think>7"],
    3: [
        "<think>1+2=3\n",
        "<think>1+2=3\nWait, think safely\n1+1=2\n",
        "<think>1+2=3\nWait, think safely\n1+1=2\n5\n",
        None,
    ],
}


@pytest.mark.parametrize("build", [_llama, _gpt2])
def test_incremental_scores_equal_full_reads(tok, build):
    scorer = SequenceClassifierScorer(build(tok), tok, batch_size=3)
    assert scorer.incremental
    session = scorer.session()
    assert isinstance(session, IncrementalScoringSession)
    total_tokens = 0
    seen = []
    for call in range(4):
        rows = [r for r in (3, 0, 2, 1) if TRACES[r][call] is not None]
        prompts, traces = [PROMPTS[r] for r in rows], [TRACES[r][call] for r in rows]
        got = session(rows, prompts, traces)
        # the reference: each text read on its own (no padding), the scorer's full path
        want = [scorer([p], [t])[0] for p, t in zip(prompts, traces)]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
        total_tokens += sum(len(x) for x in tok(scorer.texts(prompts, traces))["input_ids"])
        seen.extend(got)
    assert len({round(s, 4) for s in seen}) > len(seen) // 2  # the scores differ between texts (the test has power)
    assert session.fed_tokens < 0.6 * total_tokens  # only new tokens were fed


def test_texts_over_max_length_are_read_left_truncated(tok):
    scorer = SequenceClassifierScorer(_llama(tok), tok, max_length=16)
    session = scorer.session()
    prompts, short, long = PROMPTS[:2], ["<think>1\n", "<think>"], ["<think>1\n2+2=4\n3+3=6\n", "<think>"]
    torch.testing.assert_close(torch.tensor(session([0, 1], prompts, short)), torch.tensor(scorer(prompts, short)))
    # row 0 now exceeds 16 tokens: the full, left-truncated read; then it comes back under the limit
    got = session([0, 1], prompts, long)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(scorer(prompts, long)), rtol=0, atol=1e-5)
    got = session([0], prompts[:1], ["<think>1\n2\n"])
    torch.testing.assert_close(
        torch.tensor(got), torch.tensor(scorer(prompts[:1], ["<think>1\n2\n"])), rtol=0, atol=1e-5
    )


def test_the_full_read_path_is_the_models_own_pooled_output(tok):
    model = _llama(tok)
    scorer = SequenceClassifierScorer(model, tok, incremental=False)
    session = scorer.session()
    assert isinstance(session, StatelessSession)
    traces = [TRACES[r][0] or "<think>" for r in range(4)]
    got = session([0, 1, 2, 3], PROMPTS, traces)
    with torch.no_grad():
        want = [
            torch.softmax(model(**tok(p + t, return_tensors="pt")).logits[0], -1)[1].item()
            for p, t in zip(PROMPTS, traces)
        ]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-6)


def test_incremental_is_chosen_for_causal_classifiers_only(tok):
    bert = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            pad_token_id=tok.pad_token_id,
        )
    )
    assert is_causal_classifier(_llama(tok)) and is_causal_classifier(_gpt2(tok))
    assert not is_causal_classifier(bert)
    assert not SequenceClassifierScorer(bert, tok).incremental
    assert isinstance(scoring_session(SequenceClassifierScorer(bert, tok)), StatelessSession)
    with pytest.raises(ConfigError, match="incremental=true needs a causal"):
        SequenceClassifierScorer(bert, tok, incremental=True)
    with pytest.raises(ConfigError, match="incremental must be"):
        SequenceClassifierScorer(_llama(tok), tok, incremental="yes")
    assert isinstance(scoring_session(lambda prompts, traces: [1.0] * len(traces)), StatelessSession)


@pytest.fixture(scope="module")
def policy():
    bb = TinyBackbone(**TINY_POLICY, seed=3)
    return bb.build_model().eval(), bb.tokenizer


@pytest.mark.parametrize("discard", [False, True])
def test_safethink_interventions_are_the_same_with_incremental_scoring(policy, discard):
    model, tok = policy
    rm = _llama(tok, seed=1)
    prompts = PROMPTS * 2

    def run(incremental):
        return safethink_generate(
            model,
            tok,
            prompts,
            SequenceClassifierScorer(rm, tok, incremental=incremental),
            tau=0.5,
            max_steps_monitored=3,
            discard_violating_step=discard,
            params=SamplingParams(max_new_tokens=40, do_sample=True),
            generator=torch.Generator().manual_seed(0),
            decoder=StepwiseDecoder(step_delimiters=list("aeiou "), hook_lookahead=DEFAULT_HOOK_LOOKAHEAD),
        )

    assert_same_safethink_output(run(True), run(False))


def assert_same_safethink_output(out, ref) -> None:
    """Same texts, interventions and step scores; the reference intervened on some steps but not all."""
    assert 0 < sum(ref.num_interventions) < sum(len(s) for s in ref.step_scores)  # both branches ran
    assert out.texts == ref.texts
    assert [[(i.step, i.step_text, i.discarded) for i in r] for r in out.interventions] == [
        [(i.step, i.step_text, i.discarded) for i in r] for r in ref.interventions
    ]
    for a, b in zip(out.step_scores, ref.step_scores):
        assert [s for s, _ in a] == [s for s, _ in b]
        torch.testing.assert_close(torch.tensor([x for _, x in a]), torch.tensor([x for _, x in b]), rtol=0, atol=1e-5)


def test_as_scorer_passes_the_option_to_a_classifier_directory(tok, tmp_path):
    _llama(tok).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert as_scorer(tmp_path).incremental
    assert not as_scorer(tmp_path, incremental=False).incremental
    assert isinstance(scoring_session(as_scorer(tmp_path, incremental=False)), StatelessSession)
    with pytest.raises(ConfigError, match="not incremental but incremental=True"):
        as_scorer(lambda prompts, traces: [1.0] * len(traces), incremental=True)
    assert as_scorer(lambda prompts, traces: [1.0] * len(traces), incremental=False)(["a"], ["b"]) == [1.0]


@pytest.mark.parametrize("build", [_llama, _gpt2])
def test_several_texts_of_a_row_in_one_call_are_scored_exactly(tok, build):
    """A row's traces after several steps in one call: each score equals a full read of its text. Texts that extend
    the one before are read off one feed of the newest; one that does not (row 0's last trace lost a step, row 2's
    last is shorter) starts another pass."""
    scorer = SequenceClassifierScorer(build(tok), tok, batch_size=3)
    rows = [r for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    traces = [t for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    prompts = [PROMPTS[r] for r in rows]
    got = scorer.session()(rows, prompts, traces)
    want = [scorer([p], [t])[0] for p, t in zip(prompts, traces)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
    # row 3's three traces extend one another: one feed of the longest text holds all three scores
    chain = scorer.session()
    chain([3, 3, 3], [PROMPTS[3]] * 3, TRACES[3][:3])
    longest = tok(scorer.texts([PROMPTS[3]], [TRACES[3][2]]))["input_ids"][0]
    assert chain.fed_tokens == len(longest)


def test_length_groups_split_where_padding_is_saved():
    lengths = [60, 5, 58, 6, 61, 5]
    # one pass: 6 x 61 = 366 padded tokens; short | long: 3 x 6 + 3 x 61 = 201, saving 165
    assert length_groups(lengths, 128) == [[1, 5, 3], [2, 0, 4]]
    assert length_groups(lengths, 166) == [[1, 5, 3, 2, 0, 4]]  # saves too little: one pass
    assert length_groups([7] * 5, 0) == [[0, 1, 2, 3, 4]]  # nothing to save
    assert length_groups([], 128) == []
    groups = length_groups([1, 40, 2, 90, 41, 3, 88], 20)
    assert sorted(k for g in groups for k in g) == list(range(7))  # every row once
    assert groups == [[0, 2, 5], [1, 4], [6, 3]]


@pytest.mark.parametrize("build", [_llama, _gpt2])
def test_rows_of_very_different_lengths_are_fed_in_groups_and_scored_exactly(tok, build, monkeypatch):
    """Short and long texts in one call: two forward passes (no short row padded to the longest), scores equal to
    full reads, and a later call reuses what each group stored."""
    model = build(tok)
    scorer = SequenceClassifierScorer(model, tok)
    # 16 rows, short and long interleaved: one pass would pad 8 texts of ~14 tokens to ~43 (saving > 128 tokens)
    short = [f"<think>{k}\n" for k in range(8)]
    long = [f"<think>{k}+1={k + 1}\n" * 6 for k in range(8)]
    rows, prompts = list(range(16)), ["12+3="] * 16
    traces = [t for pair in zip(short, long) for t in pair]
    widths: list[int] = []
    base = getattr(model, model.base_model_prefix)
    hook = base.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    session = scorer.session()
    try:
        got = session(rows, prompts, traces)
    finally:
        hook.remove()
    want = [scorer([p], [t])[0] for p, t in zip(prompts, traces)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
    assert len(widths) == 2 and min(widths) < 20 < max(widths)
    grown = [t + "5\n" for t in traces]
    got = session(rows, prompts, grown)
    want = [scorer([p], [t])[0] for p, t in zip(prompts, grown)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)


@pytest.mark.parametrize("build", [_llama, _gpt2])
def test_the_last_layers_mlp_runs_only_where_a_score_is_read(tok, build):
    """The last decoder layer's MLP gets one position per score read (the other positions need only that layer's keys
    and values); the scores still equal full reads. Other layers run everywhere."""
    model = build(tok)
    scorer = SequenceClassifierScorer(model, tok)
    mlp = last_layer_mlp(model)
    layers = getattr(model, model.base_model_prefix)
    blocks = layers.layers if hasattr(layers, "layers") else layers.h
    assert mlp is blocks[-1].mlp and mlp is not blocks[0].mlp
    positions: dict[str, list[int]] = {"last": [], "first": []}
    hooks = [
        mlp.register_forward_hook(lambda _m, args, _o: positions["last"].append(args[0].shape[:-1].numel())),
        blocks[0].mlp.register_forward_hook(lambda _m, args, _o: positions["first"].append(args[0].shape[:-1].numel())),
    ]
    rows = [r for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    traces = [t for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    prompts = [PROMPTS[r] for r in rows]
    session = scorer.session()
    try:
        got = session(rows, prompts, traces)
    finally:
        for hook in hooks:
            hook.remove()
    want = [scorer([p], [t])[0] for p, t in zip(prompts, traces)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=0, atol=1e-5)
    assert sum(positions["last"]) == len(traces)  # one position per score
    assert sum(positions["first"]) >= session.fed_tokens > 2 * len(traces)  # every fed token (and padding)


def test_without_a_findable_mlp_the_last_layer_runs_whole_with_the_same_scores(tok):
    """BERT's blocks are not a direct list of the base model (and BERT is not causal): no MLP found. A session with no
    MLP to narrow feeds every position through the last layer and gets the same scores."""
    config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    bert = BertForSequenceClassification(config)
    assert last_layer_mlp(bert) is None
    model = _llama(tok)
    scorer = SequenceClassifierScorer(model, tok)
    rows = [r for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    traces = [t for r in (3, 0, 2, 1) for t in TRACES[r] if t is not None]
    prompts = [PROMPTS[r] for r in rows]
    seen: list[int] = []
    hook = model.model.layers[-1].mlp.register_forward_hook(lambda _m, a, _o: seen.append(a[0].shape[:-1].numel()))
    try:
        narrowed = scorer.session()
        narrowed_scores = narrowed(rows, prompts, traces)
        narrowed_positions, seen[:] = sum(seen), []
        whole = scorer.session()
        whole.last_mlp = None
        whole_scores = whole(rows, prompts, traces)
    finally:
        hook.remove()
    torch.testing.assert_close(torch.tensor(whole_scores), torch.tensor(narrowed_scores), rtol=0, atol=1e-5)
    assert narrowed_positions == len(traces) and sum(seen) >= whole.fed_tokens > len(traces)


class RecordingScorer(SequenceClassifierScorer):
    """The real classifier scorer; records the rows of every session call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[int]] = []

    def session(self):
        inner = super().session()

        def record(rows, prompts, traces):
            self.calls.append(list(rows))
            return inner(rows, prompts, traces)

        return record


@pytest.mark.parametrize("discard", [False, True])
def test_safethink_scores_several_steps_of_a_row_per_call_and_keeps_what_no_lookahead_keeps(discard):
    """Greedy decoding with a real classifier scorer: with ``hook_lookahead`` the hook scores every waiting step of a
    row in one call, acts on the row's first violating step and drops the later ones; the kept texts,
    interventions and step scores equal ``hook_lookahead=0``'s, in fewer scorer calls."""
    # greedy text of a random model with tied embeddings repeats one token
    bb = TinyBackbone(**TINY_POLICY, seed=0, tie_word_embeddings=False)
    model, tok = bb.build_model().eval(), bb.tokenizer
    rm = _llama(tok, seed=1)
    outs, scorers = {}, {}
    for lookahead in (0, 32):
        scorers[lookahead] = RecordingScorer(rm, tok)
        outs[lookahead] = safethink_generate(
            model,
            tok,
            PROMPTS * 2,
            scorers[lookahead],
            tau=0.5,
            max_steps_monitored=4,
            discard_violating_step=discard,
            params=SamplingParams(max_new_tokens=40, do_sample=False),
            decoder=StepwiseDecoder(step_delimiters=list("aeiou "), hook_lookahead=lookahead),
        )
    assert_same_safethink_output(outs[32], outs[0])
    assert any(len(set(c)) < len(c) for c in scorers[32].calls)  # several steps of one row in a call
    assert len(scorers[32].calls) < len(scorers[0].calls)
