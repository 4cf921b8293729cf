"""N-MARS: non-monotonic autoregressive sequence modelling with an ``<UNDO>`` token.

Paper: "N-MARS: Non-Monotonic AutoRegressive Sequence modeling" (ICML 2026 poster 61349; no arXiv release, catalogue
id ``icml2026:poster/61349``). The vocabulary gains one token, ``<UNDO>``; generating it retracts the previous
*effective* token. Training data comes from the model's own deviations: align a sample with the reference, keep the
deviating tokens, append as many ``<UNDO>`` as there are deviating tokens, then the correction. Masked SFT trains on
the kept prefix, the ``<UNDO>`` tokens and the corrections, never on the error tokens.

Sources (no official code): the ICML abstract and the authors' work-in-progress repository (notes ``rl.md`` section
5; ``docs/research/paper/theory/augmentation.md`` and ``masked_sft.md``, ``llmhalluc/reward/bt.py`` of
github.com/Tianyi-Billy-Ma/Halluc). Every choice the sources leave open is an argument, marked [reconstruction] or
[assumed] where it is ours.

Equation -> function:

- ``resolve(y)``: push non-UNDO tokens, UNDO pops the top when there is one -> :func:`resolve_undo`
  (an UNDO at an empty prefix is a no-op; the decoder never emits one, see :class:`UndoDecoder`)
- matching blocks ``M(y, y_hat)`` (maximal, non-overlapping, order-preserving) and the gaps between them
  -> :func:`deviation_gaps` (``difflib.SequenceMatcher(autojunk=False)``)
- ``y* = (..., matched, y_hat[error span], <UNDO>^k, y[correction], ...)`` with ``k`` = the error span's length, and
  the loss mask (False on error tokens) -> :func:`augment_with_undo` (built by :func:`augment_from_gaps`)
- stochastic error injection (baseline): ``y* = (y_1..y_i, e_1..e_k, <UNDO>^k, y_{i+1}..)``, ``e_j ~ U(V)``
  -> :func:`inject_random_errors`
- masked SFT ``L = -sum_{t not in errors} log p(y*_t | y*_<t)``: the loss mask becomes ``-100`` labels
  (:class:`zoo.datamodules.SFTDataModule`, ``loss_mask`` column) and :func:`zoo.losses.masked_nll`
- undo-aware decoding (physical sequence kept in context by default, KV-cache cropping as an option, output =
  resolved sequence, a cap on UNDOs) -> :class:`UndoDecoder` (``module/decoder=undo``)
- the first attempt, the resolved output and the UNDO count of a generation -> :func:`trace_undo`
- the GRPO reward on resolved outputs -> :mod:`zoo.rl.nmars`
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.errors import ConfigError, DataError
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill, padded_context
from zoo.generation.sampling import (
    IncrementalDecoder,
    decode_completions,
    ends_with_stop,
    max_token_length,
    stop_token_ids,
)
from zoo.protocols import GenerationResult, SamplingParams

UNDO_TOKEN = "<UNDO>"
UNDO_MODES = ("keep", "crop")
# [source: llmhalluc/reward/bt.py, max_backtracks=20] more UNDOs than this in one sequence is "excessive"
DEFAULT_MAX_UNDOS = 20


# -- cores ----------------------------------------------------------------------------------------------------------
def _check_token_id(value: object, what: str, vocab_size: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DataError(f"{what} must be an integer token id, got {value!r}")
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        bound = f"0..{vocab_size - 1}" if vocab_size is not None else ">= 0"
        raise DataError(f"{what} = {value} is outside the vocabulary (ids {bound})")
    return value


def _check_ids(ids: Sequence[int], what: str, undo_id: int, vocab_size: int | None, allow_undo: bool) -> list[int]:
    out = list(ids)
    for position, token in enumerate(out):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise DataError(f"{what}[{position}] = {token!r} is not a token id")
        if vocab_size is not None and token >= vocab_size:
            raise DataError(
                f"{what}[{position}] = {token} is outside the vocabulary (ids 0..{vocab_size - 1}); reference and "
                "sample must be token ids of the same tokenizer"
            )
        if not allow_undo and token == undo_id:
            raise DataError(
                f"{what}[{position}] is the UNDO token ({undo_id}); pass the resolved sequence "
                "(resolve_undo) of a generation that used UNDO"
            )
    return out


def resolve_undo(ids: Sequence[int], undo_id: int, *, vocab_size: int | None = None) -> list[int]:
    """The effective sequence of a physical one: every non-UNDO token is pushed, every UNDO pops the last
    effective token (stack semantics).

    An UNDO at an empty prefix (nothing left to retract) is a **no-op**: ``resolve_undo([u, a], u) == [a]``. The
    prompt is never retracted. :class:`UndoDecoder` does not sample UNDO at an empty prefix, so its outputs never
    contain such no-ops; they can only come from hand-written sequences.

    Args:
        ids: physical token ids (errors and UNDOs included).
        undo_id: id of ``<UNDO>``.
        vocab_size: when given, ``undo_id`` and every id must be below it.

    Returns:
        The resolved ids (a new list).

    >>> resolve_undo([1, 2, 9, 3, 9, 4], undo_id=9)
    [1, 4]
    """
    undo_id = _check_token_id(undo_id, "undo_id", vocab_size)
    if vocab_size is not None:
        _check_ids(ids, "ids", undo_id, vocab_size, allow_undo=True)
    stack: list[int] = []
    for token in ids:
        if token != undo_id:
            stack.append(token)
        elif stack:
            stack.pop()
    return stack


@dataclass(frozen=True)
class DeviationGap:
    """The region between two matching blocks: ``reference[ref_start:ref_end]`` was written as
    ``sample[sample_start:sample_end]`` (either side may be empty, not both)."""

    ref_start: int
    ref_end: int
    sample_start: int
    sample_end: int

    @property
    def num_deviating(self) -> int:
        """Number of deviating sample tokens ``k`` (= the number of UNDOs this gap gets)."""
        return self.sample_end - self.sample_start


def deviation_gaps(reference: Sequence[int], sample: Sequence[int]) -> list[DeviationGap]:
    """The gaps between the maximal matching blocks of ``reference`` and ``sample``, in order.

    The blocks are those of ``difflib.SequenceMatcher(a=reference, b=sample, autojunk=False)``: maximal,
    non-overlapping and order-preserving (notes: "Myers diff / difflib-style"; ``autojunk=False`` so that frequent
    tokens are never treated as junk). Between two consecutive blocks there is exactly one gap.
    """
    matcher = difflib.SequenceMatcher(a=list(reference), b=list(sample), autojunk=False)
    return [DeviationGap(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def augment_from_gaps(
    reference: Sequence[int], sample: Sequence[int], gaps: Iterable[DeviationGap], undo_id: int
) -> tuple[list[int], list[bool]]:
    """Build ``y*`` and its loss mask from a sample and its gaps against the reference.

    Outside the gaps the sample equals the reference (kept, mask True). Each gap contributes its deviating sample
    tokens (mask **False**: never trained), ``k`` UNDOs (True) and the reference's correction (True).

    Raises:
        DataError: the gaps are not ordered, overlap, or the sample differs from the reference outside them.
    """
    ids: list[int] = []
    mask: list[bool] = []
    ref_pos = sample_pos = 0
    for gap in gaps:
        if gap.ref_start < ref_pos or gap.sample_start < sample_pos or gap.ref_end < gap.ref_start:
            raise DataError(f"gaps must be ordered and non-overlapping; got {gap} after position {ref_pos}")
        kept = list(sample[sample_pos : gap.sample_start])
        if kept != list(reference[ref_pos : gap.ref_start]):
            raise DataError(f"the sample differs from the reference outside the gaps (before {gap})")
        ids += kept
        mask += [True] * len(kept)
        deviating = list(sample[gap.sample_start : gap.sample_end])
        correction = list(reference[gap.ref_start : gap.ref_end])
        ids += deviating + [undo_id] * len(deviating) + correction
        mask += [False] * len(deviating) + [True] * (len(deviating) + len(correction))
        ref_pos, sample_pos = gap.ref_end, gap.sample_end
    tail = list(sample[sample_pos:])
    if tail != list(reference[ref_pos:]):
        raise DataError("the sample differs from the reference after the last gap")
    return ids + tail, mask + [True] * len(tail)


def augment_with_undo(
    reference: Sequence[int], sample: Sequence[int], undo_id: int, *, vocab_size: int | None = None
) -> tuple[list[int], list[bool]]:
    """Augmented sequence ``y*`` and its loss mask from a model sample ``y_hat`` and the reference ``y``.

    ``y*`` walks the sample: tokens of matching blocks are kept; after each deviating span (the sample's tokens in a
    gap between blocks, :func:`deviation_gaps`) come as many UNDOs as the span has tokens, then the reference's
    tokens of that gap (the correction). Hence ``resolve_undo(y*) == y`` for every pair, and a sample equal to the
    reference gives ``y* == y`` with no UNDO.

    Loss mask: False on the deviating (error) tokens, True on kept tokens, UNDOs and corrections (the mSFT mask;
    plain SFT on the same sequence ignores it).

    Args:
        reference: ``y``, the reference completion's ids (no UNDO).
        sample: ``y_hat``, the sampled completion's ids, resolved (no UNDO; :func:`resolve_undo` a physical one).
        undo_id: id of ``<UNDO>``.
        vocab_size: when given, ``undo_id`` and every id must be below it (ids of another tokenizer are caught here).

    Returns:
        ``(ids, mask)`` of equal length.

    Raises:
        DataError: an id is not a token id / outside the vocabulary, or either sequence contains the UNDO id.

    >>> augment_with_undo([1, 2, 3], [1, 5, 3], undo_id=9)
    ([1, 5, 9, 2, 3], [True, False, True, True, True])
    """
    undo_id = _check_token_id(undo_id, "undo_id", vocab_size)
    reference = _check_ids(reference, "reference", undo_id, vocab_size, allow_undo=False)
    sample = _check_ids(sample, "sample", undo_id, vocab_size, allow_undo=False)
    return augment_from_gaps(reference, sample, deviation_gaps(reference, sample), undo_id)


def inject_random_errors(
    reference: Sequence[int],
    undo_id: int,
    error_ids: Sequence[int],
    rng: random.Random,
    num_errors: int = 1,
    max_error_length: int = 3,
) -> tuple[list[int], list[bool]]:
    """The random-error-injection baseline: ``y* = (y_1..y_i, e_1..e_k, <UNDO>^k, y_{i+1}..y_n)``.

    ``num_errors`` insertion points ``i`` are drawn without replacement from ``1..n`` (after at least one reference
    token) and a length ``k ~ U{1..max_error_length}`` for each; the error tokens are drawn uniformly from
    ``error_ids`` [source: augmentation.md section 3, ``e_j ~ Uniform(V)``; which ids make up ``V`` is the
    caller's choice]. Built by :func:`augment_from_gaps` with insertion gaps, so the mask and ``resolve_undo(y*) ==
    y`` hold exactly as for :func:`augment_with_undo`.

    Raises:
        DataError: an empty reference or ``error_ids``, ``num_errors < 1`` or more than ``len(reference)``,
            ``max_error_length < 1``, or ``error_ids`` containing the UNDO id.
    """
    reference = list(reference)
    if not reference:
        raise DataError("cannot inject errors into an empty reference")
    if not error_ids:
        raise DataError("error_ids is empty: give the token ids errors are drawn from")
    if undo_id in error_ids:
        raise DataError(f"error_ids contains the UNDO id {undo_id}")
    if not 1 <= num_errors <= len(reference):
        raise DataError(f"num_errors must be in 1..{len(reference)} (the reference length), got {num_errors}")
    if max_error_length < 1:
        raise DataError(f"max_error_length must be >= 1, got {max_error_length}")
    points = sorted(rng.sample(range(1, len(reference) + 1), num_errors))
    sample: list[int] = []
    gaps: list[DeviationGap] = []
    start = 0
    for point in points:
        sample += reference[start:point]
        errors = [rng.choice(list(error_ids)) for _ in range(rng.randint(1, max_error_length))]
        gaps.append(DeviationGap(point, point, len(sample), len(sample) + len(errors)))
        sample += errors
        start = point
    sample += reference[start:]
    return augment_from_gaps(reference, sample, gaps, undo_id)


@dataclass(frozen=True)
class UndoTrace:
    """What a physical sequence did: the resolved output, the first attempt and the UNDO count.

    Attributes:
        resolved: :func:`resolve_undo` of the sequence.
        first_attempt: the tokens before the first UNDO (the whole sequence when it has none).
        num_undos: number of UNDO tokens.
    """

    resolved: list[int]
    first_attempt: list[int]
    num_undos: int


def trace_undo(ids: Sequence[int], undo_id: int) -> UndoTrace:
    """:class:`UndoTrace` of a physical sequence (the pieces of the N-MARS reward and metrics)."""
    ids = list(ids)
    first = ids.index(undo_id) if undo_id in ids else len(ids)
    return UndoTrace(resolve_undo(ids, undo_id), ids[:first], ids.count(undo_id))


def undo_token_id(tokenizer: PreTrainedTokenizerBase, token: str = UNDO_TOKEN) -> int:
    """The id of ``token`` in ``tokenizer``; :class:`~zoo.errors.ConfigError` when the tokenizer lacks it."""
    vocab = tokenizer.get_vocab()
    if token not in vocab:
        raise ConfigError(
            f"the tokenizer has no {token!r} token. N-MARS adds it through the vocabulary extension: train with "
            "+method=nmars_sft (new_tokens=['<UNDO>'], output rows on), or start from such a policy "
            "(backbone.init_from=<its export>)"
        )
    return int(vocab[token])


# -- decoding -------------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class UndoResult(GenerationResult):
    """Output of :class:`UndoDecoder`.

    The :class:`~zoo.protocols.GenerationResult` fields describe the **physical** sequence (what was
    sampled, errors and UNDOs included: ``completion_ids``, ``completion_mask``, ``logprobs``, ``lengths``), except
    ``texts``, which are the **resolved** outputs (what verifiers and reward functions score). Plus:

    Attributes:
        resolved_ids: per row, the resolved completion ids (EOS excluded).
        physical_texts: per row, the decoded physical completion (``<UNDO>`` tokens visible).
        num_undos: per row, number of UNDOs sampled.
        capped: per row, whether the row reached the UNDO cap (UNDO was then banned for the rest of the row).
    """

    resolved_ids: list[list[int]]
    physical_texts: list[str]
    num_undos: list[int]
    capped: list[bool]


class UndoDecoder(Decoder):
    """Undo-aware decoding (``module/decoder=undo``): sample token by token; ``<UNDO>`` retracts the last effective
    token; the output is the resolved sequence.

    Args:
        undo_token: the UNDO token string (its id comes from the tokenizer at each call).
        mode: what the model sees after an UNDO:

            - ``keep`` (default): the physical sequence stays in context (errors and UNDOs), as in the augmented
              training data [source: WIP notes; rl.md 5(f)]. A forward pass over prompt + ``completion_ids``
              reproduces every sampling context, so GRPO can train on these rollouts.
            - ``crop``: the retracted token and the UNDO leave the context (the abstract's "retracts"); the next token
              is sampled given the prompt and the resolved prefix. Implemented by masking the retracted positions
              out of the attention mask and re-feeding the new last effective token (positions follow the mask, so
              this equals a fresh forward over the resolved prefix); trailing positions masked in every row are
              removed from the KV cache with its public ``crop``. For inference; not for GRPO rollouts.
        max_undos: cap on UNDOs per sequence (>= 1); a row that reached it cannot sample UNDO any more
            [default 20: ``max_backtracks`` of the WIP reward].
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder` (processors see the physical context).

    UNDO is banned (logit ``-inf`` before the processors) where there is nothing to retract (the resolved completion
    is empty: the prompt is never retracted) and once a row reached ``max_undos``. Stop strings are matched on the
    resolved text. Rows end at EOS (never retracted) or after ``params.max_new_tokens`` physical tokens. Returns an
    :class:`UndoResult`.
    """

    def __init__(
        self,
        undo_token: str = UNDO_TOKEN,
        mode: str = "keep",
        max_undos: int = DEFAULT_MAX_UNDOS,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
    ) -> None:
        super().__init__(processors, hooks)
        if mode not in UNDO_MODES:
            raise ConfigError(f"module.decoder.mode must be one of {UNDO_MODES}, got {mode!r}")
        if isinstance(max_undos, bool) or not isinstance(max_undos, int) or max_undos < 1:
            raise ConfigError(
                f"module.decoder.max_undos={max_undos!r}: undo-aware decoding needs a cap of at least 1 UNDO per "
                "sequence (0 would forbid <UNDO>; to decode without undos use module/decoder=sample)"
            )
        if not isinstance(undo_token, str) or not undo_token:
            raise ConfigError(f"module.decoder.undo_token must be a non-empty string, got {undo_token!r}")
        self.undo_token = undo_token
        self.mode = mode
        self.max_undos = max_undos

    @property
    def consistent_with_forward(self) -> bool:  # type: ignore[override]
        """``keep`` only: in ``crop`` mode later tokens were sampled without the retracted ones in context."""
        return self.mode == "keep"

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> UndoResult:
        undo_id = undo_token_id(tokenizer, self.undo_token)
        device, batch = prefill.device, prefill.batch_size
        eos, pad = stop_token_ids(model, tokenizer), tokenizer.pad_token_id
        window = max_token_length(tokenizer, params.stop_strings)
        state = prefill.start(model)
        if undo_id >= state.next_logits.shape[-1]:
            raise ConfigError(
                f"{self.undo_token!r} has id {undo_id} but the model has {state.next_logits.shape[-1]} output logits: "
                "it cannot emit the token. Extend the vocabulary with output rows (module.output_rows=true)"
            )
        crop = self.mode == "crop"
        prefill_logits = state.next_logits.clone()
        physical: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        stacks: list[list[int]] = [[] for _ in range(batch)]
        columns: list[list[int]] = [[] for _ in range(batch)]  # crop: cache column of each effective token
        undos = [0] * batch
        done = [False] * batch
        finished = [False] * batch
        for _ in range(params.max_new_tokens):
            logits = state.next_logits
            banned = [i for i in range(batch) if not done[i] and (not stacks[i] or undos[i] >= self.max_undos)]
            if banned:
                logits = logits.clone()
                logits[banned, undo_id] = float("-inf")
            context = padded_context(prefill.prompt_ids, physical, pad) if self.processors else None
            tokens, token_logprobs = self.next_tokens(logits, context, params, generator)
            feed = [pad] * batch
            fed = [False] * batch
            for i in range(batch):
                if done[i]:
                    continue
                token = int(tokens[i])
                physical[i].append(token)
                logprobs[i].append(float(token_logprobs[i]))
                if token in eos:
                    done[i] = finished[i] = True
                    continue
                if token == undo_id:
                    stacks[i].pop()
                    undos[i] += 1
                    if crop:
                        self._retract(state, i, stacks[i], columns[i], prefill_logits, feed, fed)
                        continue
                else:
                    stacks[i].append(token)
                    if params.stop_strings and ends_with_stop(tokenizer, stacks[i], params.stop_strings, window + 2):
                        done[i] = finished[i] = True
                        continue
                feed[i], fed[i] = token, True
            if all(done):
                break
            if crop:
                state.drop_masked_tail()
                base = state.attention_mask.shape[1]
                for i in range(batch):
                    if fed[i]:
                        columns[i].append(base)
            state.feed(
                torch.tensor(feed, dtype=torch.long, device=device)[:, None],
                torch.tensor(fed, dtype=torch.long, device=device)[:, None],
            )
        return self._result(tokenizer, prefill, physical, logprobs, stacks, undos, finished, stop_ids=eos)

    def _retract(
        self,
        state: IncrementalDecoder,
        row: int,
        stack: list[int],
        columns: list[int],
        prefill_logits: torch.Tensor,
        feed: list[int],
        fed: list[bool],
    ) -> None:
        """``crop`` mode after an UNDO of ``row``: mask the retracted token's column out of the context and make the
        next logits those given the resolved prefix (re-feed the new last effective token, or the prefill logits
        when nothing is left)."""
        state.attention_mask[row, columns.pop()] = 0
        if stack:
            state.attention_mask[row, columns.pop()] = 0
            feed[row], fed[row] = stack[-1], True
        else:
            state.next_logits[row] = prefill_logits[row]

    def _result(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        physical: list[list[int]],
        logprobs: list[list[float]],
        stacks: list[list[int]],
        undos: list[int],
        finished: list[bool],
        stop_ids: frozenset[int] | None = None,
    ) -> UndoResult:
        device, pad = prefill.device, tokenizer.pad_token_id
        width = max(1, max((len(p) for p in physical), default=0))
        completion_ids = torch.full((len(physical), width), pad, dtype=torch.long, device=device)
        completion_mask = torch.zeros_like(completion_ids)
        out_lp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=device)
        for i, (ids, lps) in enumerate(zip(physical, logprobs)):
            if ids:
                completion_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
                completion_mask[i, : len(ids)] = 1
                out_lp[i, : len(ids)] = torch.tensor(lps, dtype=torch.float32, device=device)
        return UndoResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            logprobs=out_lp,
            texts=decode_completions(tokenizer, stacks, stop_ids),
            finished=torch.tensor(finished, dtype=torch.bool, device=device),
            resolved_ids=[list(s) for s in stacks],
            physical_texts=decode_completions(tokenizer, physical, stop_ids),
            num_undos=list(undos),
            capped=[u >= self.max_undos for u in undos],
        )

    def __repr__(self) -> str:
        return (
            f"UndoDecoder(mode={self.mode!r}, max_undos={self.max_undos}, processors={len(self.processors)}, "
            f"hooks={len(self.hooks)})"
        )


__all__ = [
    "DEFAULT_MAX_UNDOS",
    "UNDO_MODES",
    "UNDO_TOKEN",
    "DeviationGap",
    "UndoDecoder",
    "UndoResult",
    "UndoTrace",
    "augment_from_gaps",
    "augment_with_undo",
    "deviation_gaps",
    "inject_random_errors",
    "resolve_undo",
    "trace_undo",
    "undo_token_id",
]
