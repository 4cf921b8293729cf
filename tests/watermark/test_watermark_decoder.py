"""The semantic watermark decoder (``module/decoder=semantic_watermark``) on a real tiny Llama and the char tokenizer.

The random model's text is shaped into sentences by a real logits processor (``SentenceShaper``: letters a-h,
spaces and periods; the model's logits pick the letters), so every sentence-level path runs on real sampling:
per-row stopping at sentence ends, N candidates per row in one batch, one encoder call per round, the margin test,
``max_trials`` then the fallback, rows ending on their own, and the generation -> detection round trip.
"""

from __future__ import annotations

import pytest
import torch
from wm_helpers import LETTERS, SentenceShaper, small_backbone

from zoo.encoding import encode_prompts
from zoo.errors import ConfigError
from zoo.generation import ModuleHook, SampleDecoder
from zoo.protocols import SamplingParams
from zoo.watermark import (
    HashingEncoder,
    LSHPartitioner,
    SemanticWatermarkDecoder,
    WatermarkScheme,
    detect,
    green_regions,
    split_sentences,
)

KEY = 11
PROMPTS = ["The rain fell on the farms.", "Hello.", "The chef baked fresh bread. Then it rained.", "No mark here"]
SAMPLED = SamplingParams(300, do_sample=True, temperature=1.0)


class CountingEncoder(HashingEncoder):
    """The real hashing encoder, counting its calls and the sentences of each."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.calls: list[int] = []

    def encode(self, sentences):
        self.calls.append(len(sentences))
        return super().encode(sentences)


def lsh_scheme(key: int = KEY, encoder: HashingEncoder | None = None) -> WatermarkScheme:
    encoder = encoder or HashingEncoder(64)
    # LSH is data independent: hyperplanes through the origin split the random-word sentences evenly
    partition = LSHPartitioner(8, seed=3).fit(torch.randn(32, encoder.dim))
    return WatermarkScheme(encoder, partition, key=key, gamma=0.25)


@pytest.fixture(scope="module")
def lm():
    backbone = small_backbone(max_position_embeddings=384)
    model = backbone.build_model().eval()
    return model, backbone.tokenizer


def run(lm, decoder, prompts=PROMPTS, params=SAMPLED, seed=0, **shaper):
    model, tokenizer = lm
    decoder.processors.append(SentenceShaper(tokenizer, **shaper))
    ids, mask = encode_prompts(tokenizer, prompts)
    return decoder(model, tokenizer, ids, mask, params=params, generator=torch.Generator().manual_seed(seed))


def test_rows_stop_at_their_own_sentence_ends_and_text_splits_back_into_the_accepted_sentences(lm):
    scheme = lsh_scheme()
    decoder = SemanticWatermarkDecoder(scheme, max_trials=40, candidates_per_round=4, max_sentences=5)
    result = run(lm, decoder)
    tokenizer = lm[1]
    assert result.finished.all()  # every row wrote its 5 sentences
    lengths = result.lengths.tolist()
    assert len(set(lengths)) > 1  # rows end at different tokens: per-row stopping
    for b, (text, written) in enumerate(zip(result.texts, result.watermarked)):
        sentences = [s.text for s in written.samples]
        assert len(sentences) == 5
        assert split_sentences(text) == sentences  # detection sees exactly the accepted sentences
        assert all(s.endswith(".") and set(s[:-1]) <= set(LETTERS + " ") for s in sentences)
        # the completion ids are the accepted candidates' sampled ids, nothing after the last period
        kept = result.completion_ids[b, : lengths[b]].tolist()
        assert tokenizer.decode(kept) == text and text.endswith(".")
        assert result.completion_mask[b, lengths[b] :].sum() == 0
        # regions and green flags are the scheme's; the first sentence is keyed on the prompt's last sentence
        regions = scheme.partitioner.assign(scheme.encoder.encode(sentences)).tolist()
        assert [s.region for s in written.samples] == regions
        previous = [result.prompt_regions[b], *regions[:-1]]
        for sample, prev in zip(written.samples, previous):
            assert sample.green == (sample.region in green_regions(KEY, prev, 8, 0.25).tolist())
            assert sample.passed == sample.green  # margin 0: green is enough
            assert 1 <= sample.trials <= 40
    assert result.prompt_regions == [scheme.context_region(p) for p in PROMPTS]
    assert result.success_rate == 1.0
    assert sum(result.sampled_tokens) >= int(result.completion_mask.sum())


def test_candidates_of_all_rows_are_sampled_in_one_batch_and_embedded_in_one_call(lm):
    model, _ = lm
    encoder = CountingEncoder()
    decoder = SemanticWatermarkDecoder(lsh_scheme(encoder=encoder), max_trials=7, candidates_per_round=3)
    batch_sizes: list[int] = []
    # a plain torch hook (not one of the decoder's hooks): it sees the shared prefill
    handle = model.register_forward_pre_hook(lambda m, a, kw: batch_sizes.append(_rows(kw)), with_kwargs=True)
    try:
        result = run(lm, decoder, params=SamplingParams(60, do_sample=True), prompts=PROMPTS[:2])
    finally:
        handle.remove()
    # one encoder call for the prompts' last sentences, then one per round with every candidate of the round
    assert len(encoder.calls) == 1 + result.rounds
    assert encoder.calls[0] == 2
    assert encoder.calls[1] == 6  # round 1: 3 candidates for each of the 2 rows
    # a row's trials never exceed what was embedded for it (rounds go on after a pass only for other rows)
    assert sum(s.trials for s in result.samples) <= sum(encoder.calls[1:])
    # the first round prefills the 2 contexts once, then samples 2 x 3 candidates in one batch
    assert batch_sizes[0] == 2 and batch_sizes[1] == 6


def test_the_decoders_forward_hooks_see_every_candidate_row_of_the_prefill(lm):
    """The seam's rule (Prefill.share_repeats): with forward hooks attached no prefill is shared, so a hook that
    records per-row activations gets one row per candidate; the text is the same as without the hook."""
    decoder = SemanticWatermarkDecoder(lsh_scheme(), max_trials=7, candidates_per_round=3)
    batch_sizes: list[int] = []
    decoder.hooks.append(
        ModuleHook("", lambda module, args, kwargs: batch_sizes.append(_rows(kwargs)), pre=True, with_kwargs=True)
    )
    params = SamplingParams(60, do_sample=True)
    hooked = run(lm, decoder, params=params, prompts=PROMPTS[:2])
    assert batch_sizes[0] == 6 and batch_sizes[1] == 6
    plain = SemanticWatermarkDecoder(lsh_scheme(), max_trials=7, candidates_per_round=3)
    assert run(lm, plain, params=params, prompts=PROMPTS[:2]).texts == hooked.texts


def _rows(kwargs) -> int:
    ids = kwargs.get("input_ids")
    return int((ids if ids is not None else kwargs["inputs_embeds"]).shape[0])


def test_max_trials_then_the_fallback_is_accepted_in_rounds_cut_to_the_trials_left(lm):
    encoder = CountingEncoder()
    # margin 10 is unreachable for |cos|: nothing passes, every sentence is a fallback after exactly 5 candidates
    decoder = SemanticWatermarkDecoder(
        lsh_scheme(encoder=encoder), margin=10.0, max_trials=5, candidates_per_round=2, max_sentences=2
    )
    result = run(lm, decoder, prompts=PROMPTS[:3])
    assert result.success_rate == 0.0
    assert all(s.trials == 5 and not s.passed for s in result.samples)
    assert len(result.samples) == 6
    # per sentence: rounds of 2, 2, 1 candidates per row (3 rows, in one batch)
    assert encoder.calls[1:4] == [6, 6, 3]
    # fallback "last": the accepted sentence is the 5th candidate, still a whole sentence
    assert all(split_sentences(t) == [s.text for s in w.samples] for t, w in zip(result.texts, result.watermarked))


def test_the_margin_test_is_applied(lm):
    scheme = lsh_scheme()
    decoder = SemanticWatermarkDecoder(scheme, margin=0.05, max_trials=60, candidates_per_round=6, max_sentences=3)
    result = run(lm, decoder)
    passed = [s for s in result.samples if s.passed]
    assert passed and all(s.green and s.margin >= 0.05 for s in passed)
    margins = scheme.partitioner.margin(scheme.encoder.encode([s.text for s in passed]))
    assert torch.allclose(margins, torch.tensor([s.margin for s in passed], dtype=torch.float64))


def test_a_row_whose_model_ends_the_text_stops_while_the_others_go_on(lm):
    decoder = SemanticWatermarkDecoder(lsh_scheme(), max_trials=20, candidates_per_round=4, max_sentences=3)
    prompts = ["END now.", "The rain fell.", "END again.", "Go on."]
    result = run(lm, decoder, prompts=prompts, end_prefix="END")
    eos = lm[1].eos_token_id
    for b, prompt in enumerate(prompts):
        if prompt.startswith("END"):
            assert result.watermarked[b].samples == [] and result.texts[b] == ""
            assert result.completion_ids[b, 0] == eos and result.lengths[b] == 1 and result.finished[b]
        else:
            assert len(result.watermarked[b].samples) == 3 and result.finished[b]


def test_min_sentences_keeps_a_model_that_wants_to_end_from_ending_before_the_floor(lm):
    """EOS is masked while a row has fewer than ``min_sentences`` sentences, then the model may end the text."""
    prompts = ["END now.", "The rain fell.", "END again."]
    eos = lm[1].eos_token_id
    free = run(
        lm,
        SemanticWatermarkDecoder(lsh_scheme(), max_trials=8, max_sentences=4),
        prompts,
        end_prefix="END",
        end_bias=30.0,
    )
    assert [len(w.samples) for w in free.watermarked] == [0, 4, 0]  # without the floor the END rows end at once
    floor = SemanticWatermarkDecoder(lsh_scheme(), max_trials=8, max_sentences=4, min_sentences=2)
    result = run(lm, floor, prompts, end_prefix="END", end_bias=30.0)
    assert [len(w.samples) for w in result.watermarked] == [2, 4, 2]
    for b in (0, 2):  # two sentences without EOS, then EOS ends the text
        length = int(result.lengths[b])
        ids = result.completion_ids[b, :length].tolist()
        assert ids[-1] == eos and eos not in ids[:-1] and result.finished[b]
        assert len(split_sentences(result.texts[b])) == 2
    # the kept tokens' log-probs are under the masked (renormalised) distribution: finite, and EOS-free tokens of an
    # END row have log-prob near 0 only because EOS is masked (unmasked they would sit near -30)
    kept = result.logprobs[0, : int(result.lengths[0]) - 1]
    assert torch.isfinite(kept).all() and kept.min() > -15


def test_sample_loop_no_eos_masks_eos_for_the_given_rows_only(lm):
    model, tokenizer = lm
    ids, mask = encode_prompts(tokenizer, ["END a.", "END b.", "END c."])
    from zoo.generation.decoders import as_prefill

    decoder = SampleDecoder(processors=[SentenceShaper(tokenizer, end_prefix="END", end_bias=30.0)])
    with torch.no_grad():
        result = decoder.sample_loop(
            as_prefill(ids, mask, None, {}).start(model),
            ids,
            tokenizer,
            SamplingParams(12, do_sample=True),
            torch.Generator().manual_seed(0),
            no_eos=torch.tensor([True, False, True]),
        )
    eos = tokenizer.eos_token_id
    assert result.lengths.tolist() == [12, 1, 12]
    assert result.completion_ids[1, 0] == eos
    assert eos not in result.completion_ids[0].tolist() + result.completion_ids[2].tolist()


def test_the_token_budget_ends_rows_unfinished(lm):
    decoder = SemanticWatermarkDecoder(lsh_scheme(), max_trials=10, candidates_per_round=2, sentence_max_tokens=30)
    result = run(lm, decoder, params=SamplingParams(45, do_sample=True))
    assert (result.lengths <= 45).all()
    assert not result.finished.any()  # no row ended by EOS or max_sentences


def test_watermarked_text_is_detected_and_plain_text_is_not_at_the_fixed_threshold(lm):
    scheme = lsh_scheme()
    decoder = SemanticWatermarkDecoder(scheme, max_trials=40, candidates_per_round=8, max_sentences=7)
    prompts = [f"The text number {i} starts here." for i in range(6)]
    marked = run(lm, decoder, prompts=prompts, seed=1)
    plain = run(lm, SemanticWatermarkDecoder(scheme, max_trials=1, max_sentences=7), prompts=prompts, seed=2)
    assert decoder.unwatermarked().max_trials == 1
    marked_z = [detect(t, scheme).z for t in marked.texts]
    plain_z = [detect(t, scheme).z for t in plain.texts]
    assert all(z > 3.0 for z in marked_z), marked_z
    assert not any(z > 3.0 for z in plain_z), plain_z
    assert all(s.trials == 1 for s in plain.samples)  # max_trials = 1: the first candidate every time
    # the key matters: another key does not detect the watermarked texts
    assert sum(detect(t, lsh_scheme(key=KEY + 1)).detected for t in marked.texts) <= 1
    # given the prompt (in front or not), sentence 1 is scored too, keyed on the prompt as the decoder keyed it
    for prompt, text in zip(prompts, marked.texts):
        alone, keyed = detect(text, scheme), detect(prompt + text, scheme, prompt=prompt)
        assert keyed.sentences == alone.sentences and keyed.num_scored == len(keyed.sentences)
        assert keyed.green[1:] == alone.green[1:] and keyed.z > alone.z > 3.0


def test_a_context_window_lets_long_texts_through_a_short_model_context(lm):
    model, tokenizer = lm
    long = SamplingParams(420, do_sample=True)
    with pytest.raises(ConfigError, match="exceeds the model context"):
        run(lm, SemanticWatermarkDecoder(lsh_scheme(), max_trials=4), params=long)
    seen: list[list[int]] = []
    # max_trials = 1 (one candidate per sentence) keeps this fast; the window does not depend on it
    decoder = SemanticWatermarkDecoder(lsh_scheme(), max_trials=1, context_sentences=1, sentence_max_tokens=40)
    decoder.processors.append(lambda ids, scores: (seen.append(ids[0].tolist()), scores)[1])
    result = run(lm, decoder, params=long, prompts=PROMPTS[:1])
    assert result.lengths.max() > 384  # longer than the model's positions
    sentences = result.watermarked[0].samples
    assert len(sentences) > 10
    # each round's model context: the prompt first, then BOS + the previous sentence (no leading space)
    bos = tokenizer.bos_token_id
    starts = [ids for ids in seen if ids[0] in (bos, tokenizer.pad_token_id)]
    contexts = {tokenizer.decode([i for i in ids if i != tokenizer.pad_token_id]) for ids in starts}
    assert "<bos>" + PROMPTS[0] in contexts
    assert {"<bos>" + s.text for s in sentences[:-1]} <= contexts
    assert max(len(ids) for ids in seen) <= max(len(tokenizer(PROMPTS[0])["input_ids"]) + 1, 1 + 40) + 40
    with pytest.raises(ConfigError, match="sentence_max_tokens"):
        run(lm, SemanticWatermarkDecoder(lsh_scheme(), context_sentences=2, sentence_max_tokens=200), params=long)


def test_the_decoder_serves_a_generating_module(lm):
    from zoo.modules import CausalLMModule

    backbone = small_backbone(max_position_embeddings=384)
    decoder = SemanticWatermarkDecoder(lsh_scheme(), max_trials=30, candidates_per_round=8, max_sentences=6)
    decoder.processors.append(SentenceShaper(backbone.tokenizer))
    module = CausalLMModule(backbone, generation={"max_new_tokens": 300, "do_sample": True}, decoder=decoder)
    ids, mask = encode_prompts(backbone.tokenizer, PROMPTS[:2])
    torch.manual_seed(0)
    result = module.generate(ids, mask)
    assert all(detect(text, decoder.scheme).z > 3.0 for text in result.texts)


def test_bad_settings_and_inputs_are_one_clear_error(lm):
    model, tokenizer = lm
    for kwargs, field in (
        ({"max_sentences": 0}, "max_sentences"),
        ({"min_sentences": -1}, "min_sentences"),
        ({"min_sentences": 3, "max_sentences": 2}, "min_sentences"),
        ({"sentence_max_tokens": 0}, "sentence_max_tokens"),
        ({"context_sentences": 0}, "context_sentences"),
        ({"margin": -0.1}, "margin"),
        ({"max_trials": 0}, "max_trials"),
        ({"candidates_per_round": 0}, "candidates_per_round"),
        ({"fallback": "first"}, "fallback"),
    ):
        with pytest.raises(ConfigError, match=field):
            SemanticWatermarkDecoder(lsh_scheme(), **kwargs)
    with pytest.raises(ConfigError, match="unknown"):
        SemanticWatermarkDecoder({"encoder": "hashing:64", "secret": 1})
    ids, mask = encode_prompts(tokenizer, PROMPTS[:1])
    decoder = SemanticWatermarkDecoder(lsh_scheme())
    with pytest.raises(ConfigError, match="do_sample=true"):
        decoder(model, tokenizer, ids, mask, params=SamplingParams(20))
    with pytest.raises(ConfigError, match="prompt ids only"):
        decoder(model, tokenizer, attention_mask=mask, inputs_embeds=model.get_input_embeddings()(ids), params=SAMPLED)
    # greedy is fine when nothing is resampled (max_trials = 1)
    assert SemanticWatermarkDecoder(lsh_scheme(), max_trials=1)(model, tokenizer, ids, mask, params=SamplingParams(8))


def test_sample_loop_row_stop_cuts_rows_where_plain_sampling_would_have_continued(lm):
    """The shared loop with an extra per-row stop equals plain sampling truncated at the stop (same seed)."""
    model, tokenizer = lm
    ids, mask = encode_prompts(tokenizer, ["ab.", "cd ef.", "gh."])
    shaper = SentenceShaper(tokenizer)
    params = SamplingParams(40, do_sample=True)
    reference = SampleDecoder(processors=[shaper])(
        model, tokenizer, ids, mask, params=params, generator=torch.Generator().manual_seed(5)
    )
    period = tokenizer.get_vocab()["."]
    decoder = SampleDecoder(processors=[shaper])
    from zoo.generation.decoders import as_prefill

    with torch.no_grad():
        cut = decoder.sample_loop(
            as_prefill(ids, mask, None, {}).start(model),
            ids,
            tokenizer,
            params,
            torch.Generator().manual_seed(5),
            row_stop=lambda i, row: row[-1] == period,
        )
    for b in range(3):
        full = reference.completion_ids[b].tolist()
        stop = full.index(period) + 1
        assert cut.completion_ids[b, :stop].tolist() == full[:stop]
        assert cut.lengths[b] == stop and cut.finished[b]
