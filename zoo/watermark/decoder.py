"""Watermarked generation on the decoder seam: sentence-level rejection sampling for any causal LM.

:class:`SemanticWatermarkDecoder` (``module/decoder=semantic_watermark``) writes a text sentence by sentence. It
serves SemStamp, k-SemStamp and X-Guard alike; only the partition of its :class:`~zoo.watermark.fitting.SchemeSpec`
differs. One call decodes a batch of prompts:

1. the first sentence of each row is keyed on the region of its prompt's last sentence (region 0 for a prompt
   without one), as in :meth:`zoo.watermark.sampler.RejectionSampler.generate`;
2. a *round*: every row still running asks for ``n_b = min(candidates_per_round, max_trials - drawn)``
   candidates. Its context (prompt ids + the ids of the sentences it accepted, or a window of them, see
   ``context_sentences``) is prefilled once and the KV cache rows are repeated ``n_b`` times, then all candidates
   of all rows are sampled in one batch (:meth:`~zoo.generation.decoders.Decoder.sample_loop`), each stopping on
   its own at its first sentence end (:func:`~zoo.watermark.sentences.first_sentence_end`, the detector's rule),
   at EOS, at a stop string or at ``sentence_max_tokens``;
3. :meth:`RejectionSampler.choose <zoo.watermark.sampler.RejectionSampler.choose>` embeds every candidate of the
   round in one encoder call and picks, per row, the first candidate that is green given the previous region and
   reaches the margin; after ``max_trials`` candidates without one the fallback is accepted (SemStamp's
   ``N_max``). The accepted candidate's *sampled ids* are appended (never re-tokenised text), so the context is
   exactly what the model wrote;
4. a row ends when the model ends the text (a candidate that is EOS before any word, drawn before any passing
   candidate; or an accepted candidate that ends with EOS), after ``max_sentences`` sentences, when its
   ``max_new_tokens`` budget is spent, or after accepting a candidate that was cut by ``sentence_max_tokens``.
   While a row has fewer than ``min_sentences`` sentences its candidates may not sample EOS (the EOS logit is
   masked, as ``min_new_tokens`` does for tokens): the model cannot end the text early, so every text reaches the
   length its detection needs.

Candidates that cannot pass whatever their region (``valid`` of
:meth:`~zoo.watermark.sampler.RejectionSampler.choose`): one cut by ``sentence_max_tokens`` before its sentence
ended (detection would glue it to the next sentence), one with text after its sentence end (a token spanning the
boundary), and a later sentence that does not start with whitespace (detection splits only at a mark followed by
whitespace). They can still be the fallback.

Logits processors of the decoder apply to every candidate token; they receive the round's context (the left-padded
ids the model sees) followed by the candidate's tokens. Forward hooks are attached around the whole call; with
hooks no context is prefilled once for its candidates (they see every candidate row, as with every decoder).
Returns a :class:`WatermarkGenerationResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import pad_sequences
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill
from zoo.generation.sampling import context_length, decode_completion, decode_completions, stop_token_ids
from zoo.protocols import GenerationResult, SamplingParams
from zoo.watermark.fitting import SchemeSpec, as_scheme_spec, margin_at_rejection
from zoo.watermark.sampler import (
    INITIAL_REGION,
    RejectionSampler,
    RowState,
    SentenceSample,
    WatermarkedText,
    WatermarkScheme,
    check_sampler_settings,
)
from zoo.watermark.sentences import first_sentence_end, split_sentences


@dataclass(kw_only=True)
class WatermarkGenerationResult(GenerationResult):
    """Output of :class:`SemanticWatermarkDecoder`: the :class:`~zoo.protocols.GenerationResult` fields
    (``completion_ids`` = the accepted candidates' sampled ids, EOS included where the model ended the text) plus:

    Attributes:
        watermarked: per row, the prompt text, the accepted sentences and their
            :class:`~zoo.watermark.sampler.SentenceSample` (region, margin, green, passed, trials).
        sampled_tokens: per row, tokens sampled over all candidates, rejected ones included (the decoding work).
        rounds: candidate rounds of the call.
        prompt_regions: per row, the region that keyed its first sentence.
    """

    watermarked: list[WatermarkedText]
    sampled_tokens: list[int] = field(default_factory=list)
    rounds: int = 0
    prompt_regions: list[int] = field(default_factory=list)

    @property
    def samples(self) -> list[SentenceSample]:
        """Every accepted sentence of every row, in row order."""
        return [s for text in self.watermarked for s in text.samples]

    @property
    def success_rate(self) -> float:
        """Watermark Success Rate over all sentences of the batch (NaN when no sentence was written)."""
        samples = self.samples
        return sum(s.passed for s in samples) / len(samples) if samples else float("nan")

    @property
    def mean_trials(self) -> float:
        """Mean candidates drawn per accepted sentence over the batch (NaN when no sentence was written)."""
        samples = self.samples
        return sum(s.trials for s in samples) / len(samples) if samples else float("nan")


@dataclass
class _Candidate:
    """One sampled continuation: ids (EOS kept when sampled), text (up to EOS) and how it ended."""

    ids: list[int]
    logprobs: list[float]
    text: str
    terminal: bool  # ended by EOS or a stop string: the model ended the text
    whole: bool  # a whole sentence (ended at a sentence end, or terminal with words)
    valid: bool  # may pass the acceptance test

    @property
    def ends_text(self) -> bool:
        """EOS (or a stop string) before any word: the model proposes to end the text here."""
        return self.terminal and not self.text.strip()


class _Row:
    """Book-keeping of one prompt: its context, accepted sentences and the rejection state of the open position."""

    def __init__(self, prompt_ids: list[int], prompt_text: str, previous_region: int) -> None:
        self.prompt_ids = prompt_ids
        self.prompt_text = prompt_text
        self.sentence_ids: list[list[int]] = []
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.samples: list[SentenceSample] = []
        self.state = RowState(previous_region)
        self.pool: dict[int, _Candidate] = {}  # candidate number of the open position -> candidate
        self.sampled = 0
        self.done = False
        self.finished = False

    def context(self, window: int | None, lead: list[int], is_space: Callable[[int], bool]) -> list[int]:
        """What the model sees: the whole text, or its last ``window`` units (the prompt is one unit; without the
        prompt the window starts with ``lead`` (BOS) and a sentence without the whitespace before it)."""
        if window is None or len(self.sentence_ids) < window:
            return self.prompt_ids + [t for ids in self.sentence_ids for t in ids]
        first, *rest = self.sentence_ids[len(self.sentence_ids) - window :]
        start = 0
        while start < len(first) and is_space(first[start]):
            start += 1
        return lead + first[start:] + [t for ids in rest for t in ids]

    def append(self, candidate: _Candidate) -> None:
        self.ids += candidate.ids
        self.logprobs += candidate.logprobs


class SemanticWatermarkDecoder(Decoder):
    """Sentence-level semantic watermarking as a decoder (the loop of the module docstring).

    Args:
        scheme: a :class:`~zoo.watermark.sampler.WatermarkScheme`, or a :class:`~zoo.watermark.fitting.SchemeSpec`
            / mapping of its fields (encoder, partition file or fit settings, key, gamma), built on first use.
        margin: acceptance margin in the partition's units (SemStamp ``|cos|`` 0.01 in MarkLLM; 0 disables).
        margin_rejection: instead of ``margin``, the fraction of domain sentences the margin test rejects: the margin
            is set, when the scheme is built, to :func:`~zoo.watermark.fitting.margin_at_rejection` on the held-out
            sentences of the scheme's domain corpus (:meth:`~zoo.watermark.fitting.SchemeSpec.heldout_sentences`),
            so partitions with margins in different units get the same budget. Needs a scheme given by its
            settings.
        max_trials: ``N_max`` candidates per sentence before the fallback is accepted (SemStamp: 100); 1 =
            unwatermarked sentence-by-sentence sampling (see :meth:`unwatermarked`).
        candidates_per_round: candidates sampled per row in one batch per round.
        fallback: ``last`` (SemStamp's code) or ``best`` (the green candidate with the largest margin).
        max_sentences: sentences per row (``None``: until EOS or ``max_new_tokens``).
        min_sentences: sentences a row writes before the model may end it with EOS (0: no floor). Detection needs
            length: at ``gamma`` 0.25 a text of n scored sentences passes ``z > 3`` only with at least
            ``0.25 n + 3 sqrt(0.1875 n)`` green ones.
        sentence_max_tokens: token budget of one candidate.
        context_sentences: the model sees the whole text, prompt included (``None``), or only its last ``k >= 1``
            units, the prompt counting as one: with ``k = 1`` the first sentence follows the prompt and every later
            one follows only the sentence before it (after BOS, without the whitespace before it). A sliding window
            for small models trained on short texts (the tiny backbone on ``task=topic_text``); the watermark
            keys do not depend on it.
        stop_at_mark: a candidate stops at its terminal mark (True) or at the whitespace after it (False: no stop
            inside ``3.5``; the whitespace then belongs to the sentence).
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder`.
    """

    def __init__(
        self,
        scheme: WatermarkScheme | SchemeSpec | Mapping[str, Any] | None = None,
        *,
        margin: float = 0.0,
        margin_rejection: float | None = None,
        max_trials: int = 100,
        candidates_per_round: int = 8,
        fallback: str = "last",
        max_sentences: int | None = None,
        min_sentences: int = 0,
        sentence_max_tokens: int = 128,
        context_sentences: int | None = None,
        stop_at_mark: bool = True,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
    ) -> None:
        super().__init__(processors, hooks)
        check_sampler_settings(margin, max_trials, candidates_per_round, fallback)
        if max_sentences is not None and max_sentences < 1:
            raise ConfigError(f"max_sentences must be >= 1 or null, got {max_sentences}")
        if min_sentences < 0 or (max_sentences is not None and min_sentences > max_sentences):
            raise ConfigError(f"min_sentences must be >= 0 and <= max_sentences ({max_sentences}), got {min_sentences}")
        if sentence_max_tokens < 1:
            raise ConfigError(f"sentence_max_tokens must be >= 1, got {sentence_max_tokens}")
        if context_sentences is not None and context_sentences < 1:
            raise ConfigError(f"context_sentences must be >= 1 or null, got {context_sentences}")
        if isinstance(scheme, WatermarkScheme):
            self._scheme: WatermarkScheme | None = scheme
            self.spec: SchemeSpec | None = None
        else:
            self._scheme = None
            self.spec = as_scheme_spec(scheme if scheme is not None else SchemeSpec())
        if margin_rejection is not None and (self.spec is None or not 0.0 <= margin_rejection < 1.0):
            raise ConfigError(
                f"margin_rejection must be in [0, 1) and needs the scheme's settings (its domain corpus), got "
                f"{margin_rejection} with {'settings' if self.spec is not None else 'a built scheme'}"
            )
        self._margin: float | None = float(margin) if margin_rejection is None else None
        self.margin_rejection = margin_rejection
        self.max_trials = int(max_trials)
        self.candidates_per_round = int(candidates_per_round)
        self.fallback = fallback
        self.max_sentences = max_sentences
        self.min_sentences = int(min_sentences)
        self.sentence_max_tokens = int(sentence_max_tokens)
        self.context_sentences = context_sentences
        self.stop_at_mark = stop_at_mark

    # -- the scheme -------------------------------------------------------------------------------------------
    @property
    def scheme(self) -> WatermarkScheme:
        """The watermark scheme (encoder loaded and partition loaded or fit on first access)."""
        if self._scheme is None:
            assert self.spec is not None
            self._scheme = self.spec.build()
        return self._scheme

    @property
    def margin(self) -> float:
        """The acceptance margin (measured on held-out domain sentences on first access with ``margin_rejection``)."""
        if self._margin is None:
            assert self.spec is not None
            assert self.margin_rejection is not None
            scheme = self.scheme
            sentences = self.spec.heldout_sentences()
            self._margin = margin_at_rejection(
                scheme.partitioner, scheme.encoder.encode(sentences), self.margin_rejection
            )
        return self._margin

    def sampler(self) -> RejectionSampler:
        """The :class:`~zoo.watermark.sampler.RejectionSampler` of this decoder's settings."""
        return RejectionSampler(
            self.scheme,
            margin=self.margin,
            max_trials=self.max_trials,
            candidates_per_round=self.candidates_per_round,
            fallback=self.fallback,  # type: ignore[arg-type]
        )

    def unwatermarked(self) -> SemanticWatermarkDecoder:
        """The same decoder with ``max_trials = 1``: every sentence is the model's first candidate (unwatermarked
        text written and stopped exactly like the watermarked one; its samples still record regions)."""
        plain = SemanticWatermarkDecoder(
            self.scheme,
            margin=self.margin,
            max_trials=1,
            candidates_per_round=1,
            fallback=self.fallback,
            max_sentences=self.max_sentences,
            min_sentences=self.min_sentences,
            sentence_max_tokens=self.sentence_max_tokens,
            context_sentences=self.context_sentences,
            stop_at_mark=self.stop_at_mark,
            processors=self.processors,
            hooks=self.hooks,
        )
        return plain

    # -- the seam ---------------------------------------------------------------------------------------------
    def check_length(self, model: PreTrainedModel, prefill: Prefill, params: SamplingParams) -> None:
        if self.context_sentences is None:
            super().check_length(model, prefill, params)
            return
        # with a window the model holds the prompt and k - 1 sentences, or BOS and k sentences, plus a candidate
        k, sentence = self.context_sentences, self.sentence_max_tokens
        span = max(
            prefill.length + min(params.max_new_tokens, k * sentence),
            1 + min(params.max_new_tokens, (k + 1) * sentence),
        )
        positions = context_length(model)
        if positions is not None and span > positions:
            raise ConfigError(
                f"prompt length {prefill.length} with context_sentences {k} and sentence_max_tokens {sentence} "
                f"needs {span} positions, more than the model context ({positions}); lower sentence_max_tokens or "
                "context_sentences, or shorten the prompts"
            )

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> WatermarkGenerationResult:
        if prefill.inputs_embeds is not None or prefill.model_inputs:
            raise ConfigError(
                "the semantic watermark decoder decodes from prompt ids only (no inputs_embeds or extra model inputs)"
            )
        if not params.do_sample and self.max_trials > 1:
            raise ConfigError(
                "the semantic watermark decoder rejects and resamples sentences: set do_sample=true "
                "(module.generation / eval_generation); greedy decoding proposes the same sentence every trial"
            )
        sampler = self.sampler()
        mask = prefill.attention_mask.bool()
        prompt_ids = [prefill.prompt_ids[i][mask[i]].tolist() for i in range(prefill.batch_size)]
        prompt_texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in prompt_ids]
        prompt_regions = self.prompt_regions(sampler.scheme, prompt_texts)
        rows = [_Row(ids, text, region) for ids, text, region in zip(prompt_ids, prompt_texts, prompt_regions)]
        rounds = 0
        while active := [row for row in rows if not row.done]:
            rounds += 1
            candidates = self.propose(model, tokenizer, active, sampler, params, generator, prefill.device)
            self.settle(active, candidates, sampler, params)
        pad = tokenizer.pad_token_id
        return WatermarkGenerationResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=pad_sequences([r.ids for r in rows], pad).to(prefill.device),
            completion_mask=pad_sequences([[1] * len(r.ids) for r in rows], 0).to(prefill.device),
            logprobs=_pad_floats([r.logprobs for r in rows]).to(prefill.device),
            texts=decode_completions(tokenizer, (r.ids for r in rows), stop_token_ids(model, tokenizer)),
            finished=torch.tensor([r.finished for r in rows], dtype=torch.bool, device=prefill.device),
            watermarked=[WatermarkedText(r.prompt_text, [s.text for s in r.samples], r.samples) for r in rows],
            sampled_tokens=[r.sampled for r in rows],
            rounds=rounds,
            prompt_regions=prompt_regions,
        )

    # -- the loop's parts -------------------------------------------------------------------------------------
    @staticmethod
    def prompt_regions(scheme: WatermarkScheme, prompts: Sequence[str]) -> list[int]:
        """Region of each prompt's last sentence (:data:`~zoo.watermark.sampler.INITIAL_REGION` without one)."""
        last = [split_sentences(p)[-1:] for p in prompts]
        regions = scheme.regions([s[0] for s in last if s])[0].tolist()
        found = iter(regions)
        return [int(next(found)) if s else INITIAL_REGION for s in last]

    def propose(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        rows: Sequence[_Row],
        sampler: RejectionSampler,
        params: SamplingParams,
        generator: torch.Generator | None,
        device: torch.device,
    ) -> list[list[_Candidate]]:
        """One round: sample the candidates of every running row in one batch; returns them per row."""
        sizes = [sampler.round_size(row.state) for row in rows]
        budgets = [min(self.sentence_max_tokens, params.max_new_tokens - len(row.ids)) for row in rows]
        lead = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
        contexts = [row.context(self.context_sentences, lead, self._is_space(tokenizer)) for row in rows]
        ids = pad_sequences(contexts, tokenizer.pad_token_id, "left").to(device)
        attention = pad_sequences([[1] * len(c) for c in contexts], 0, "left").to(device)
        repeat = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(sizes)).to(device)
        # each context prefilled once and copied to its rows, unless forward hooks watch the model (shares_prefills)
        state = Prefill(ids[repeat], attention[repeat], share_repeats=self.shares_prefills).start(model)
        budget_of = [budgets[j] for j in repeat.tolist()]

        def sentence_done(i: int, sampled: list[int]) -> bool:
            if len(sampled) >= budget_of[i]:
                return True
            text = tokenizer.decode(sampled, skip_special_tokens=False)
            return first_sentence_end(text, at_end=self.stop_at_mark) is not None

        round_params = replace(params, max_new_tokens=max(budgets))
        short = torch.tensor([len(row.samples) < self.min_sentences for row in rows], device=device)
        stops = stop_token_ids(model, tokenizer)
        result = self.sample_loop(
            state, ids[repeat], tokenizer, round_params, generator, row_stop=sentence_done, no_eos=short[repeat]
        )
        out: list[list[_Candidate]] = []
        k = 0
        for row, size in zip(rows, sizes):
            found = []
            for _ in range(size):
                length = int(result.completion_mask[k].sum())
                found.append(
                    self.candidate(
                        tokenizer,
                        result.completion_ids[k, :length].tolist(),
                        result.logprobs[k, :length].tolist(),
                        params,
                        first=not row.samples,
                        stop_ids=stops,
                    )
                )
                k += 1
            out.append(found)
        return out

    @staticmethod
    def _is_space(tokenizer: PreTrainedTokenizerBase) -> Callable[[int], bool]:
        cache: dict[int, bool] = {}

        def is_space(token: int) -> bool:
            if token not in cache:
                cache[token] = tokenizer.decode([token]).isspace()
            return cache[token]

        return is_space

    def candidate(
        self,
        tokenizer: PreTrainedTokenizerBase,
        ids: list[int],
        logprobs: list[float],
        params: SamplingParams,
        first: bool,
        stop_ids: frozenset[int] | None = None,
    ) -> _Candidate:
        """Classify a sampled continuation (see the module docstring for what may pass); ``stop_ids``: the ids that
        end the text (:func:`~zoo.generation.sampling.stop_token_ids`; default the tokenizer's EOS)."""
        stop_ids = frozenset([tokenizer.eos_token_id]) if stop_ids is None else stop_ids
        text = decode_completion(tokenizer, ids, stop_ids)
        hit_eos = bool(ids) and ids[-1] in stop_ids
        terminal = hit_eos or any(text.endswith(s) for s in params.stop_strings)
        end = first_sentence_end(text, at_end=True)
        whole = (end is not None) or (terminal and bool(text.strip()))
        clean_end = end is None or not text[end:].strip()
        joins = first or not text or text[0].isspace()
        return _Candidate(ids, logprobs, text, terminal, whole, whole and clean_end and joins)

    def settle(
        self,
        rows: Sequence[_Row],
        candidates: Sequence[Sequence[_Candidate]],
        sampler: RejectionSampler,
        params: SamplingParams,
    ) -> None:
        """Apply the acceptance test to a round's candidates and update the rows (accept, end, or go on)."""
        considered: list[list[_Candidate]] = []
        for row, found in zip(rows, candidates):
            row.sampled += sum(len(c.ids) for c in found)
            end_at = next((i for i, c in enumerate(found) if c.ends_text), len(found))
            considered.append(list(found[:end_at]))
            for i, c in enumerate(considered[-1]):
                row.pool[row.state.trials + i + 1] = c
        choosing = [i for i, c in enumerate(considered) if c]
        chosen = sampler.choose(
            [[c.text for c in considered[i]] for i in choosing],
            [rows[i].state for i in choosing],
            [[c.valid for c in considered[i]] for i in choosing],
        )
        decided = dict(zip(choosing, chosen))
        for i, (row, found) in enumerate(zip(rows, candidates)):
            sample = decided.get(i)
            if sample is not None:
                number = sample.trials if sample.passed else row.state.fallback.trials  # type: ignore[union-attr]
                self.accept(row, row.pool[number], sample, params)
            elif len(considered[i]) < len(found):  # the model ended the text before any candidate passed
                row.append(found[len(considered[i])])
                row.done = row.finished = True

    def accept(self, row: _Row, candidate: _Candidate, sample: SentenceSample, params: SamplingParams) -> None:
        """Append an accepted sentence to its row and decide whether the row goes on."""
        row.append(candidate)
        row.sentence_ids.append(candidate.ids)
        row.samples.append(sample)
        row.state = RowState(sample.region)
        row.pool.clear()
        if candidate.terminal:
            row.done = row.finished = True
        elif not candidate.whole:  # cut by sentence_max_tokens: the text ends there
            row.done = True
        elif self.max_sentences is not None and len(row.samples) >= self.max_sentences:
            row.done = row.finished = True
        elif len(row.ids) >= params.max_new_tokens:
            row.done = True

    def __repr__(self) -> str:
        scheme = self.spec if self.spec is not None else self._scheme
        return (
            f"SemanticWatermarkDecoder(scheme={scheme!r}, "
            f"margin={self._margin if self._margin is not None else f'at rejection {self.margin_rejection}'}, "
            f"max_trials={self.max_trials}, "
            f"candidates_per_round={self.candidates_per_round}, min_sentences={self.min_sentences}, "
            f"processors={len(self.processors)}, hooks={len(self.hooks)})"
        )


def _pad_floats(rows: Sequence[Sequence[float]]) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(list(r), dtype=torch.float32)
    return out


__all__ = ["SemanticWatermarkDecoder", "WatermarkGenerationResult"]
