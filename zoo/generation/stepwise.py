"""Step-wise decoding (``module/decoder=stepwise``): decode until a step delimiter, hand the partial traces to a
step hook, optionally append (or roll back and replace) tokens per row, and continue from the KV cache.

Hugging Face ``generate`` cannot force tokens mid-generation (huggingface/transformers#37771) and logits
processors cannot see model outputs (#34265), so :class:`StepwiseDecoder` is a decoder of its own
(:mod:`zoo.generation.decoders`; logits processors and forward hooks apply as in every decoder) whose loop sits on
:class:`~zoo.generation.sampling.IncrementalDecoder`:

* one :meth:`~zoo.generation.decoders.Decoder.next_tokens` call per iteration over the whole batch, exactly as in
  :class:`~zoo.generation.decoders.SampleDecoder` -- with no step hook, or one that never acts, the output is
  token-identical to plain decoding with the same seed (same RNG consumption, same shapes fed to the model);
* a step of a row closes when its text since the last close contains a delimiter; the hook receives every
  row that closed a step at this token (:class:`StepEvent`) and returns a :class:`StepAction` per row it acts on;
* appended tokens are fed together with the row's sampled token in one chunk whose width varies per row
  (per-row padding mask), so rows diverge freely;
* ``rollback`` discards the step just generated: its cached positions are masked out of the attention mask
  (positions come from the running mask, so the continuation is exactly a fresh forward over the kept
  tokens -- the cache is never rewritten);
* generation ends per row at EOS (or a stop string), and for everyone at ``max_new_tokens`` sampled tokens;
  a row whose delimiter never appeared is reported (``steps_closed == 0``, ``open_step``) and a warning
  names the delimiter.

The step hook is an attribute (:attr:`StepwiseDecoder.step_hook`) so that a callback can set it on a module's
decoder at run time. Used by SafeThink (:mod:`zoo.safety.safethink`); written for any step-level monitor.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.tokenizer import THINK_OPEN
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill, padded_context
from zoo.generation.sampling import GenerationResult, SamplingParams, decode_completion, max_token_length


@dataclass(frozen=True)
class StepEvent:
    """A step that just closed in one row.

    Attributes:
        row: batch row.
        step_index: 1-based index of the step (steps rolled back are not counted; a resampled step keeps
            the index of the step it replaces).
        step_text: text of the step, delimiter included.
        trace: the completion so far (decoded, special tokens kept), this step included.
        attempt: 0 for the first sample of this step index, ``k`` for the k-th resample after a rollback.
    """

    row: int
    step_index: int
    step_text: str
    trace: str
    attempt: int = 0


@dataclass(frozen=True)
class StepAction:
    """What the hook does to a row whose step closed.

    Attributes:
        append_ids: token ids appended after the step (or after the rolled-back point); injected, not sampled.
        rollback: discard the step just generated (and resample from its start, after ``append_ids``).
    """

    append_ids: Sequence[int] = ()
    rollback: bool = False


StepHook = Callable[[list[StepEvent]], dict[int, StepAction]]


@dataclass(kw_only=True)
class StepwiseResult(GenerationResult):
    """Output of :class:`StepwiseDecoder`: the :class:`~zoo.generation.sampling.GenerationResult` fields
    (``completion_ids`` hold the kept tokens, sampled and injected; ``logprobs`` are 0 on injected tokens) plus:

    Attributes:
        injected_mask: ``[B, L]`` 1 on tokens appended by the hook (0 on sampled tokens and padding).
        steps_closed: per row, number of kept steps closed by a delimiter.
        open_step: per row, whether the row ended inside a step that never reached a delimiter.
        discarded: per row, texts of the steps rolled back.
        hook_seconds: wall time spent inside the hook.
        total_seconds: wall time of the whole call.
        sampled_tokens: per row, number of sampled tokens kept or discarded (the decoding work).
    """

    injected_mask: torch.Tensor
    steps_closed: list[int]
    open_step: list[bool]
    discarded: list[list[str]] = field(default_factory=list)
    hook_seconds: float = 0.0
    total_seconds: float = 0.0
    sampled_tokens: list[int] = field(default_factory=list)

    @property
    def added_tokens(self) -> list[int]:
        """Per row, number of injected tokens kept in the completion."""
        return [int(x) for x in self.injected_mask.sum(-1).tolist()]


class _Row:
    """Book-keeping of one row: kept tokens, where the current step starts, and its cache columns."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.injected: list[bool] = []
        self.logprobs: list[float] = []
        self.step_start = 0  # index in ``ids`` where the current step starts
        self.step_cols: list[int] = []  # decoder columns of the current step's fed tokens
        self.steps_closed = 0
        self.attempt = 0
        self.done = False
        self.finished = False
        self.discarded: list[str] = []
        self.sampled = 0


def _as_tuple(delimiters: str | Sequence[str]) -> tuple[str, ...]:
    out = (delimiters,) if isinstance(delimiters, str) else tuple(delimiters)
    if not out or any(not d for d in out):
        raise ValueError(f"step delimiters must be non-empty strings, got {delimiters!r}")
    return out


_FAST_PATH_CACHE: dict[tuple[int, int, tuple[str, ...]], frozenset[int] | None] = {}


def _single_token_delimiters(tokenizer: PreTrainedTokenizerBase, delimiters: tuple[str, ...]) -> frozenset[int] | None:
    """Token ids that close a step, when that test is exact: every delimiter is one token and no other token's
    text contains a delimiter (else ``None``: fall back to checking decoded text, e.g. BPE ``".\\n"`` tokens)."""
    key = (id(tokenizer), len(tokenizer), delimiters)
    if key not in _FAST_PATH_CACHE:
        encoded = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in delimiters]
        ids: frozenset[int] | None = None
        if all(len(e) == 1 for e in encoded):
            ids = frozenset(e[0] for e in encoded)
            texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)
            if any(i not in ids and any(d in t for d in delimiters) for i, t in enumerate(texts)):
                ids = None
        _FAST_PATH_CACHE[key] = ids
    return _FAST_PATH_CACHE[key]


class StepwiseDecoder(Decoder):
    """Decoder with a hook called whenever rows close a reasoning step (the loop of the module docstring).

    Args:
        step_hook: ``events -> {row: StepAction}``; ``None`` = plain decoding (token-identical to
            :class:`~zoo.generation.decoders.SampleDecoder` with the same seed).
        step_delimiters: a step closes when its text contains one of these (default: newline, the zoo's
            ``STEP_DELIMITER``).
        step_openers: tokens that open the reasoning block (``<think>``); sampled at the start of a step they are
            not part of it, so a rollback of the first step keeps the reasoning block open.
        warn_no_delimiter: warn when a row reaches ``max_new_tokens`` without ever closing a step.
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder`.

    ``params.max_new_tokens`` bounds the *sampled* tokens; injected tokens are extra. Returns a
    :class:`StepwiseResult`.
    """

    def __init__(
        self,
        step_hook: StepHook | None = None,
        step_delimiters: str | Sequence[str] = "\n",
        step_openers: Sequence[str] = (THINK_OPEN,),
        warn_no_delimiter: bool = True,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
    ) -> None:
        super().__init__(processors, hooks)
        self.step_hook = step_hook
        self.step_delimiters = _as_tuple(step_delimiters)
        self.step_openers = tuple(step_openers)
        self.warn_no_delimiter = warn_no_delimiter

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> StepwiseResult:
        start = time.perf_counter()
        hook, delimiters = self.step_hook, self.step_delimiters
        device, batch = prefill.device, prefill.batch_size
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        stop_window = max_token_length(tokenizer, params.stop_strings)
        delim_window = max_token_length(tokenizer, delimiters) + 1
        delim_ids = _single_token_delimiters(tokenizer, delimiters)
        vocab = tokenizer.get_vocab()
        opener_ids = {vocab[t] for t in self.step_openers if t in vocab}
        decoder = prefill.start(model)
        rows = [_Row() for _ in range(batch)]
        # next-token logits at the start of each row's current step (to resample after a bare rollback)
        step_start_logits = decoder.next_logits.clone()
        hook_seconds = 0.0
        for _ in range(params.max_new_tokens):
            context = padded_context(prefill.prompt_ids, [r.ids for r in rows], pad) if self.processors else None
            tokens, logprobs = self.next_tokens(decoder.next_logits, context, params, generator)
            events: list[StepEvent] = []
            closed: set[int] = set()
            for i, row in enumerate(rows):
                if row.done:
                    continue
                tok = int(tokens[i])
                row.ids.append(tok)
                row.injected.append(False)
                row.logprobs.append(float(logprobs[i]))
                row.sampled += 1
                if tok == eos:
                    row.done = row.finished = True
                    continue
                if params.stop_strings:
                    tail = tokenizer.decode(row.ids[-(stop_window + 2) :], skip_special_tokens=False)
                    if any(tail.endswith(s) for s in params.stop_strings):
                        row.done = row.finished = True
                        continue
                step_ids = row.ids[row.step_start :]
                if delim_ids is not None:
                    closes = tok in delim_ids
                else:
                    tail = tokenizer.decode(step_ids[-delim_window:], skip_special_tokens=False)
                    closes = any(d in tail for d in delimiters)
                if closes:
                    closed.add(i)
                    if hook is not None:
                        events.append(
                            StepEvent(
                                row=i,
                                step_index=row.steps_closed + 1,
                                step_text=tokenizer.decode(step_ids, skip_special_tokens=False),
                                trace=decode_completion(tokenizer, row.ids),
                                attempt=row.attempt,
                            )
                        )
            actions: dict[int, StepAction] = {}
            if events:
                t0 = time.perf_counter()
                actions = hook(events) or {}
                hook_seconds += time.perf_counter() - t0
                unknown = set(actions) - {e.row for e in events}
                if unknown:
                    raise ValueError(f"step hook returned actions for rows {sorted(unknown)} that closed no step")
            if all(r.done for r in rows):
                break
            # Build the per-row chunk to feed: [sampled token] + appended ids, or appended ids after a rollback.
            chunks: list[list[int]] = []
            for i, row in enumerate(rows):
                if row.done:
                    chunks.append([])
                    continue
                action = actions.get(i)
                if action is not None and action.rollback:
                    row.discarded.append(tokenizer.decode(row.ids[row.step_start :], skip_special_tokens=False))
                    for col in row.step_cols:
                        decoder.attention_mask[i, col] = 0
                    del row.ids[row.step_start :], row.injected[row.step_start :], row.logprobs[row.step_start :]
                    row.attempt += 1
                    decoder.next_logits[i] = step_start_logits[i]
                    chunk = []
                else:
                    chunk = [int(tokens[i])]
                    if i in closed:
                        row.steps_closed += 1
                        row.attempt = 0
                if action is not None and action.append_ids:
                    appended = [int(t) for t in action.append_ids]
                    row.ids.extend(appended)
                    row.injected.extend([True] * len(appended))
                    row.logprobs.extend([0.0] * len(appended))
                    chunk += appended
                chunks.append(chunk)
            width = max(len(c) for c in chunks)
            if width:
                chunk_ids = torch.full((batch, width), pad, dtype=torch.long, device=device)
                chunk_mask = torch.zeros((batch, width), dtype=torch.long, device=device)
                base_col = decoder.attention_mask.shape[1]
                for i, chunk in enumerate(chunks):
                    if chunk:
                        chunk_ids[i, : len(chunk)] = torch.tensor(chunk, dtype=torch.long, device=device)
                        chunk_mask[i, : len(chunk)] = 1
                        rows[i].step_cols.extend(range(base_col, base_col + len(chunk)))
                decoder.feed(chunk_ids, chunk_mask)
            for i, row in enumerate(rows):
                # The next step's sampled text starts here (after a closed step, or after an opener such as
                # <think> that began the current step); injected tokens before it are kept on a rollback.
                opened = len(row.ids) > row.step_start and all(t in opener_ids for t in row.ids[row.step_start :])
                if i in closed or (opened and not row.done):
                    row.step_start = len(row.ids)
                    row.step_cols = []
                    step_start_logits[i] = decoder.next_logits[i]
        width = max((len(r.ids) for r in rows), default=0)
        completion_ids = torch.full((batch, max(width, 1)), pad, dtype=torch.long, device=device)
        completion_mask = torch.zeros_like(completion_ids)
        injected_mask = torch.zeros_like(completion_ids)
        out_lp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=device)
        for i, row in enumerate(rows):
            n = len(row.ids)
            if n:
                completion_ids[i, :n] = torch.tensor(row.ids, dtype=torch.long, device=device)
                completion_mask[i, :n] = 1
                injected_mask[i, :n] = torch.tensor(row.injected, dtype=torch.long, device=device)
                out_lp[i, :n] = torch.tensor(row.logprobs, dtype=torch.float32, device=device)
        if width == 0:
            completion_ids, completion_mask, injected_mask, out_lp = (
                t[:, :0] for t in (completion_ids, completion_mask, injected_mask, out_lp)
            )
        open_step = [not r.finished and len(r.ids) > r.step_start for r in rows]
        never = [i for i, r in enumerate(rows) if not r.finished and r.steps_closed == 0]
        if self.warn_no_delimiter and never:
            warnings.warn(
                f"step delimiter {list(delimiters)!r} never appeared in {len(never)} of {batch} rows "
                f"(rows {never[:8]}{' ...' if len(never) > 8 else ''}) before max_new_tokens="
                f"{params.max_new_tokens}; those rows were generated as one unfinished step (see "
                "StepwiseResult.open_step / steps_closed)",
                RuntimeWarning,
                stacklevel=4,
            )
        return StepwiseResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            injected_mask=injected_mask,
            logprobs=out_lp,
            texts=[decode_completion(tokenizer, r.ids) for r in rows],
            finished=torch.tensor([r.finished for r in rows], dtype=torch.bool, device=device),
            steps_closed=[r.steps_closed for r in rows],
            open_step=open_step,
            discarded=[r.discarded for r in rows],
            hook_seconds=hook_seconds,
            total_seconds=time.perf_counter() - start,
            sampled_tokens=[r.sampled for r in rows],
        )


def stepwise_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_attention_mask: torch.Tensor,
    hook: StepHook | None = None,
    params: SamplingParams | None = None,
    step_delimiters: str | Sequence[str] = "\n",
    generator: torch.Generator | None = None,
    warn_no_delimiter: bool = True,
    step_openers: Sequence[str] = (THINK_OPEN,),
) -> StepwiseResult:
    """:class:`StepwiseDecoder` with ``hook`` (no processors or hooks) on left-padded prompts."""
    decoder = StepwiseDecoder(hook, step_delimiters, step_openers, warn_no_delimiter)
    return decoder(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)
