"""Step-wise decoding (``module/decoder=stepwise``): a decoder that hands every reasoning step to a step hook, which
may inject tokens after it or roll it back, and continues from the KV cache.

Hugging Face ``generate`` cannot force tokens mid-generation (huggingface/transformers#37771) and logits processors
cannot see model outputs (#34265), so :class:`StepwiseDecoder` is a decoder of its own (:mod:`zoo.generation.decoders`:
logits processors and forward hooks apply as in every decoder) on
:class:`~zoo.generation.sampling.IncrementalDecoder`. Used by SafeThink (:mod:`zoo.safety.safethink`); written for any
step-level monitor.

What the decoder guarantees
---------------------------

* **Plain decoding when the hook does nothing.** One :meth:`~zoo.generation.decoders.Decoder.next_tokens` call per
  iteration over the batch, as :class:`~zoo.generation.decoders.SampleDecoder`: with no step hook, or one that never
  acts, the output is token-identical to ``SampleDecoder`` with the same seed, and the model runs on the rows plain
  decoding runs on (finished rows leave the KV-cached batch; with logits processors, which see every row, none
  leaves).
* **Every reasoning token lies in a step the hook is offered.** A row's text is cut into steps, numbered from 1; a step
  closes, and becomes a :class:`StepEvent`, when

  - its text contains a step delimiter (``step_delimiters``, newline by default);
  - its text contains a final-step delimiter (``final_step_delimiters``, ``</think>`` by default;
    :attr:`StepEvent.final`): the last reasoning step; the text after a kept final step (the answer) is not cut,
    unless ``answer_steps`` (below);
  - it reached ``max_step_tokens`` tokens without a delimiter (:attr:`StepEvent.cut` ``== "length"``), so that a
    policy that never writes a delimiter is still offered its text step by step;
  - the row ends inside it: EOS (not part of the step), a stop string or the budget (``cut == "end"``).

  Openers (``step_openers``, ``<think>``) at the start of a reasoning step are not part of it. A hook that declares
  ``wants(row, step_index, attempt)`` is offered only the steps it wants.
* **With ``answer_steps``, every answer token too.** The text after a kept final step (the answer) is cut into steps
  by the same rules -- step delimiters, ``max_step_tokens``, the row's end -- numbered on from the reasoning steps and
  marked :attr:`StepEvent.answer`; they are never ``final`` (a final-step delimiter in the answer is plain text) and
  have no openers. A hook's ``wants`` is called with ``answer=True`` for them. Rolling an answer step back resamples
  it after the reasoning (which stays done); keeping it keeps the row in the answer. Without ``answer_steps``
  (default) the answer is not cut, and the decoding is what it was before the option existed.
* **Budget.** ``params.max_new_tokens`` bounds per row the sampled tokens kept or rolled back by the hook; injected
  tokens are extra; tokens discarded because they were sampled after a step the hook acted on (lookahead, below) are
  not counted; the EOS of a row whose ``end`` step the hook acted on is dropped and stays counted. Every row ends (EOS,
  stop string or budget).
* **Exact continuation.** After an injection or a rollback the next logits equal a fresh forward over the kept tokens:
  discarded positions are masked out of the attention mask (positions come from the running mask), never rewritten;
  rows diverge freely (per-row chunks with a padding mask).
* **Lookahead is exact.** With ``hook_lookahead = L > 0`` rows decode on while their closed steps wait for the hook,
  which then sees the steps of many rows in one call -- and, when it declares ``several_steps_per_row``, several steps
  of one row. An action first discards what its row sampled after the acted-on step, so the kept text is what ``L = 0``
  keeps: token-identical under greedy decoding for a hook whose decision depends on the event alone, the same
  distribution under sampling. A waiting step is handed over once it is ``L`` iterations old, when its row closed
  another step (single-step hooks) or ended, or once few rows still run (:data:`DONE_ROWS_FLUSH_FRACTION`); meanwhile
  a row that ended leaves the batch (its cache rows parked) and comes back only if the hook acts on it.
* **Context.** The prefill + ``max_new_tokens`` + the hook's declared ``max_appended_tokens`` must fit the model's
  positions (checked before decoding); an injection beyond what the hook declared that would run past them raises a
  :class:`~zoo.errors.ConfigError`.
* **Reporting.** :class:`StepwiseResult` marks injected tokens, counts kept steps (answer steps included) and reports
  rows that ended inside a step (``open_step``); a warning names the delimiter when a row never wrote one.

What a hook may do
------------------

A hook is ``hook(events: list[StepEvent]) -> {row: StepAction}``: the events of one call are in row order (a row's
steps in step order), at most one per row unless it declares ``several_steps_per_row``. For each row it acts on it
returns a :class:`StepAction`: ``append_ids`` (injected after the step, or after its start when rolling back),
``rollback`` (discard the step and resample it), and with several steps of the row in the call the ``step_index`` it
acts on (the row's later steps in the call are discarded with the action). Acting on an ``end`` step lets the row
continue after the injection unless its budget is spent. A hook must not return rows that closed no step in the call.
It may declare ``wants``, ``max_appended_tokens`` (the most tokens it appends to one row) and
``several_steps_per_row``; it reads :attr:`StepEvent.trace` / :attr:`StepEvent.step_text` only when it needs them
(:func:`read_traces` decodes many at once). The hook is :attr:`StepwiseDecoder.step_hook`, or given for one decoder
copy with :meth:`StepwiseDecoder.with_step_hook` (how a callback monitors through a module's decoder).
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import pad_token_id
from zoo.errors import ConfigError
from zoo.generation.decoders import COMPACT_FRACTION, Decoder, ForwardHook, LogitsProcessor, Prefill, padded_context
from zoo.generation.sampling import (
    IncrementalDecoder,
    ParkedRow,
    TokenTextMatcher,
    check_context,
    context_length,
    decode_completion,
    decode_completions,
    stop_token_ids,
)
from zoo.protocols import GenerationResult, SamplingParams
from zoo.tokens import THINK_CLOSE, THINK_OPEN


@dataclass(frozen=True)
class StepEvent:
    """A step that just closed in one row.

    Attributes:
        row: batch row.
        step_index: 1-based index of the step (steps rolled back are not counted; a resampled step keeps
            the index of the step it replaces).
        attempt: 0 for the first sample of this step index, ``k`` for the k-th resample after a rollback.
        final: the step closed at a final-step delimiter (the end of the reasoning, e.g. ``</think>``).
        ids: the row's completion ids so far, this step included (an EOS that ended the row is not).
        step_start: where the step starts in ``ids``.
        tokenizer: decodes :attr:`step_text` and :attr:`trace` when they are read.
        cut: ``None`` when a delimiter closed the step; ``"length"`` when it reached the decoder's
            ``max_step_tokens`` without one; ``"end"`` when the row ended inside it (EOS, stop string or budget).
        answer: the step lies in the answer, after a kept final step (only with the decoder's ``answer_steps``);
            never ``final``.
    """

    row: int
    step_index: int
    attempt: int = 0
    final: bool = False
    ids: tuple[int, ...] = ()
    step_start: int = 0
    tokenizer: PreTrainedTokenizerBase | None = field(default=None, repr=False, compare=False)
    cut: str | None = None
    answer: bool = False

    @cached_property
    def step_text(self) -> str:
        """Text of the step, its delimiter included (a cut step has none)."""
        return self.tokenizer.decode(list(self.ids[self.step_start :]), skip_special_tokens=False)

    @cached_property
    def trace(self) -> str:
        """The completion so far (decoded, special tokens kept), this step included."""
        return decode_completion(self.tokenizer, self.ids)


def read_traces(events: Sequence[StepEvent]) -> list[str]:
    """The :attr:`StepEvent.trace` of every event, those not read yet decoded together (:func:`decode_completions`:
    the tokenizer's special ids looked up once per call, not per event) and cached on their events."""
    unread: dict[int, list[StepEvent]] = {}
    for event in events:
        if "trace" not in event.__dict__:
            unread.setdefault(id(event.tokenizer), []).append(event)
    for group in unread.values():
        for event, text in zip(group, decode_completions(group[0].tokenizer, (e.ids for e in group))):
            event.__dict__["trace"] = text  # where the cached property keeps its value
    return [event.trace for event in events]


@dataclass(frozen=True)
class StepAction:
    """What the hook does to a row whose step closed.

    Attributes:
        append_ids: token ids appended after the step (or after the rolled-back point); injected, not sampled.
        rollback: discard the step just generated (and resample from its start, after ``append_ids``).
        step_index: the step acted on (its :attr:`StepEvent.step_index`); ``None``: the row's only step in the call.
            Needed when the call held several steps of the row (a hook with ``several_steps_per_row``).
    """

    append_ids: Sequence[int] = ()
    rollback: bool = False
    step_index: int | None = None


StepHook = Callable[[list[StepEvent]], dict[int, StepAction]]


@dataclass(kw_only=True)
class StepwiseResult(GenerationResult):
    """Output of :class:`StepwiseDecoder`: the :class:`~zoo.protocols.GenerationResult` fields
    (``completion_ids`` hold the kept tokens, sampled and injected; ``logprobs`` are 0 on injected tokens) plus:

    Attributes:
        injected_mask: ``[B, L]`` 1 on tokens appended by the hook (0 on sampled tokens and padding).
        steps_closed: per row, number of kept steps closed by a delimiter (a final step included) or cut at
            ``max_step_tokens``.
        open_step: per row, whether the row's budget ran out inside a step that reached no delimiter (offered to
            the hook as an ``end`` step): a reasoning step, or with ``answer_steps`` an answer step (without it the
            answer after a final step is not a step).
        discarded: per row, texts of the steps rolled back.
        hook_seconds: wall time spent inside the hook.
        total_seconds: wall time of the whole call.
        sampled_tokens: per row, number of sampled tokens kept or discarded (the decoding work; with
            ``hook_lookahead > 0`` it includes the tokens a lookahead action discarded, which the budget does not
            count).
        counted_tokens: per row, the sampled tokens counted against ``max_new_tokens``: kept, or in a step the
            hook rolled back (``sampled_tokens`` less those a lookahead action discarded; equal with
            ``hook_lookahead = 0``).
    """

    injected_mask: torch.Tensor
    steps_closed: list[int]
    open_step: list[bool]
    discarded: list[list[str]] = field(default_factory=list)
    hook_seconds: float = 0.0
    total_seconds: float = 0.0
    sampled_tokens: list[int] = field(default_factory=list)
    counted_tokens: list[int] = field(default_factory=list)

    @property
    def added_tokens(self) -> list[int]:
        """Per row, number of injected tokens kept in the completion."""
        return [int(x) for x in self.injected_mask.sum(-1).tolist()]


class _Row:
    """Book-keeping of one batch row: kept tokens (with the cache column each was fed at, ``-1`` while not yet fed),
    where the current step starts, the closed steps waiting for the hook, and the row's token budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget  # counted tokens after which the row is done (``max_new_tokens``)
        self.ids: list[int] = []
        self.injected: list[bool] = []
        self.logprobs: list[float] = []
        self.cols: list[int] = []
        self.step_start = 0  # index in ``ids`` where the current step starts
        self.steps_closed = 0
        self.attempt = 0
        self.done = False  # samples no more: finished, or its budget is spent
        self.finished = False  # ended by EOS or a stop string
        self.reasoning_done = False  # a final step was kept: the rest is the answer (cut only with answer_steps)
        self.delimited = False  # a delimiter (step or final) closed one of its steps
        self.discarded: list[str] = []
        self.sampled = 0
        self.lookahead_discarded = 0  # sampled tokens discarded by lookahead actions: not counted by the budget
        self.pending: list[StepEvent] = []  # closed steps the hook has not seen yet (lookahead), in step order
        self.pending_since = 0  # the loop iteration at which the oldest of them closed
        self.stale = False  # rolled back with nothing new to feed: the logits after the last kept token are stale

    @property
    def counted(self) -> int:
        """Sampled tokens that count against the budget: kept ones and those of rolled-back steps (as with
        ``hook_lookahead = 0``), not those sampled after a waiting step and discarded when the hook acted on it."""
        return self.sampled - self.lookahead_discarded

    def add_sampled(self, token: int, logprob: float) -> None:
        """Append one sampled token (not yet fed) and count it."""
        self.ids.append(token)
        self.injected.append(False)
        self.logprobs.append(logprob)
        self.cols.append(-1)
        self.sampled += 1

    def append(self, ids: Sequence[int], injected: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids.extend(ids)
        self.injected.extend([injected] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.cols.extend([-1] * len(ids))

    def truncate(self, length: int, state: IncrementalDecoder, k: int) -> None:
        """Drop the tokens from ``length`` on, masking the cache columns they were fed at (state row ``k``)."""
        fed = [c for c in self.cols[length:] if c >= 0]
        if fed:
            state.attention_mask[k, fed] = 0
        del self.ids[length:], self.injected[length:], self.logprobs[length:], self.cols[length:]


#: A hook that takes several steps per row gets the waiting steps of rows that ended once the rows still running are
#: at most this fraction of the rows in play (cached and parked): an action then puts its row back while the batch
#: still runs, instead of in a second pass after every other row ended (up to 50% more forward passes when every
#: monitored step is acted on, ``benchmarks/safethink_overhead.py``).
DONE_ROWS_FLUSH_FRACTION = 0.75
#: Without parking (a cache that cannot set rows aside) rows that ended and still wait for the hook stay in the batch;
#: the batch is compacted once at most this fraction of its rows are running or waiting, as often as the hook is
#: called for them (compacting more often would not free them sooner).
UNPARKED_COMPACT_FRACTION = DONE_ROWS_FLUSH_FRACTION
#: Default :attr:`StepwiseDecoder.max_step_tokens`: longer than any step of the zoo's synthetic traces (tens of
#: characters) and than a typical newline-delimited reasoning step of a real reasoning model (tens to a few hundred
#: tokens), so that a policy that writes delimiters keeps its steps, while one that writes none is still offered its
#: text every 256 tokens (and at its end).
DEFAULT_MAX_STEP_TOKENS = 256


@dataclass
class _CacheRows:
    """Which batch rows the KV-cached state holds: ``rows[k]`` is the batch row at cache row ``k`` (``index`` the same
    as a tensor, ``prompt_logits[k]`` its logits after the prompt). ``parked`` holds, by batch row, rows that ended
    while closed steps of theirs still wait for the hook, set aside from the state
    (:meth:`IncrementalDecoder.park_rows`) so that the batch shrinks as in plain decoding; an action on one puts it
    back (:meth:`restore`)."""

    rows: list[int]
    index: torch.Tensor
    prompt_logits: torch.Tensor
    parked: dict[int, tuple[ParkedRow, torch.Tensor]] = field(default_factory=dict)

    def keep(self, state: IncrementalDecoder, positions: list[int]) -> bool:
        """Keep only the cache rows ``positions``; False when the cache cannot drop rows."""
        index = torch.tensor(positions, dtype=torch.long, device=self.index.device)
        if not state.select_rows(index):
            return False
        self.rows = [self.rows[k] for k in positions]
        self.index = self.index[index]
        self.prompt_logits = self.prompt_logits[index]
        return True

    def park(self, state: IncrementalDecoder, positions: list[int]) -> None:
        """Set the cache rows ``positions`` aside (they stay in the state until :meth:`keep` drops them)."""
        for k, row in zip(positions, state.park_rows(positions)):
            self.parked[self.rows[k]] = (row, self.prompt_logits[k : k + 1])

    def restore(self, state: IncrementalDecoder, rows: list[int]) -> None:
        """Put the parked batch rows ``rows`` back at the end of the state."""
        if not rows:
            return
        parked = [self.parked.pop(i) for i in rows]
        state.restore_rows([row for row, _ in parked])
        self.rows = self.rows + list(rows)
        self.index = torch.cat([self.index, torch.tensor(rows, dtype=torch.long, device=self.index.device)])
        self.prompt_logits = torch.cat([self.prompt_logits, *(logits for _, logits in parked)])


@dataclass
class _Call:
    """State of one decode call (the decoder keeps none between calls).

    Attributes:
        hook: the step hook of the call.
        lookahead: ``hook_lookahead``.
        prompt_lengths: per batch row, the prefilled tokens (padding excluded).
        max_positions: the model's positions (``None``: unbounded).
        hook_seconds: wall time inside the hook.
        acted: the hook acted since the last feed (rows may then have several tokens, or none, to feed).
        waiting: rows whose closed steps wait for a hook that takes several steps per row.
        at_risk: rows whose injections exceed what the hook declared: their context is checked every iteration.
    """

    hook: StepHook | None
    lookahead: int
    prompt_lengths: list[int]
    max_positions: int | None
    hook_seconds: float = 0.0
    acted: bool = False
    waiting: set[int] = field(default_factory=set)
    at_risk: set[int] = field(default_factory=set)


def _acted_step(events: list[StepEvent], action: StepAction) -> StepEvent:
    """The event of a row that ``action`` applies to (its ``step_index``, or the row's only event)."""
    if action.step_index is None:
        if len(events) > 1:
            raise ValueError(
                f"step hook acted on row {events[0].row}, which closed steps {[e.step_index for e in events]} in "
                "this call, without saying which (StepAction.step_index)"
            )
        return events[0]
    for event in events:
        if event.step_index == action.step_index:
            return event
    raise ValueError(
        f"step hook acted on step {action.step_index} of row {events[0].row}, which closed steps "
        f"{[e.step_index for e in events]} in this call"
    )


def _as_tuple(
    delimiters: str | Sequence[str], what: str = "step delimiters", empty_ok: bool = False
) -> tuple[str, ...]:
    out = (delimiters,) if isinstance(delimiters, str) else tuple(delimiters)
    if (not out and not empty_ok) or any(not d for d in out):
        raise ValueError(f"{what} must be non-empty strings, got {delimiters!r}")
    return out


_NO_OPENERS: frozenset[int] = frozenset()


def _has_text(ids: list[int], start: int, end: int, opener_ids: set[int] | frozenset[int]) -> bool:
    """Whether ``ids[start:end]`` holds a token other than a reasoning opener (an open step worth offering)."""
    return any(t not in opener_ids for t in ids[start:end])


class StepwiseDecoder(Decoder):
    """Decoder with a hook offered every reasoning step of every row (the contract of the module docstring).

    Args:
        step_hook: ``events -> {row: StepAction}`` (the module docstring says what it may do); ``None`` = plain
            decoding (token-identical to :class:`~zoo.generation.decoders.SampleDecoder` with the same seed).
        step_delimiters: a step closes when its text contains one of these (default: newline, the zoo's
            ``STEP_DELIMITER``).
        step_openers: tokens that open the reasoning block (``<think>``); sampled at the start of a step they are
            not part of it, so a rollback of the first step keeps the reasoning block open.
        warn_no_delimiter: warn when a row reaches ``max_new_tokens`` without ever writing a delimiter.
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder`.
        final_step_delimiters: a step also closes at these, as the last step of the reasoning (``StepEvent.final``);
            default the closing tag ``</think>``; ``()`` = none.
        hook_lookahead: ``0`` (default): the hook sees each closed step before the row samples on. ``L > 0``: rows
            keep decoding while a closed step waits for at most ``L`` iterations, and the hook gets the waiting steps
            of all rows in one call (exact, see the module docstring); the cost: the tokens an action discards were
            decoded (``StepwiseResult.sampled_tokens``) and their cache columns stay, masked. ``0`` is the step loop
            as written; a method opts in (SafeThink does).
        max_step_tokens: a step with no delimiter closes after this many tokens (``StepEvent.cut == "length"``), so
            that a policy that never writes a delimiter is still offered its text in steps; default
            :data:`DEFAULT_MAX_STEP_TOKENS`; ``None``: steps close only at delimiters and at the row's end.
        answer_steps: also cut the answer (the text after a kept final step) into steps offered to the hook
            (:attr:`StepEvent.answer`; the module docstring says how), so that no sampled token escapes the hook;
            ``False`` (default): the answer is not cut (token-identical to decoding before the option).

    Returns a :class:`StepwiseResult`.
    """

    def __init__(
        self,
        step_hook: StepHook | None = None,
        step_delimiters: str | Sequence[str] = "\n",
        step_openers: Sequence[str] = (THINK_OPEN,),
        warn_no_delimiter: bool = True,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
        final_step_delimiters: str | Sequence[str] = (THINK_CLOSE,),
        hook_lookahead: int = 0,
        max_step_tokens: int | None = DEFAULT_MAX_STEP_TOKENS,
        answer_steps: bool = False,
    ) -> None:
        super().__init__(processors, hooks)
        if hook_lookahead < 0:
            raise ConfigError(f"hook_lookahead must be >= 0, got {hook_lookahead}")
        if max_step_tokens is not None and (
            isinstance(max_step_tokens, bool) or not isinstance(max_step_tokens, int) or max_step_tokens < 1
        ):
            raise ConfigError(
                f"max_step_tokens must be an integer >= 1 or null (steps close only at delimiters and at the row's "
                f"end), got {max_step_tokens!r}"
            )
        self.hook_lookahead = int(hook_lookahead)
        self.max_step_tokens = max_step_tokens
        self.step_hook = step_hook
        self.step_delimiters = _as_tuple(step_delimiters)
        self.final_step_delimiters = _as_tuple(final_step_delimiters, "final step delimiters", empty_ok=True)
        self.step_openers = tuple(step_openers)
        self.warn_no_delimiter = warn_no_delimiter
        self.answer_steps = bool(answer_steps)

    def with_step_hook(self, step_hook: StepHook | None, answer_steps: bool | None = None) -> StepwiseDecoder:
        """A decoder with these settings and the same processor and hook lists (not copies: what a callback adds to
        them applies to both) whose step hook is ``step_hook`` (and ``answer_steps``, when given, that setting: a
        monitor that must see the answer turns it on); this decoder is left as it is."""
        other = copy.copy(self)
        other.step_hook = step_hook
        if answer_steps is not None:
            other.answer_steps = bool(answer_steps)
        return other

    def max_injected_tokens(self) -> int:
        """The most tokens the step hook may append to one row (its ``max_appended_tokens``; 0 without a hook or
        when it does not say, in which case injections are checked as they happen)."""
        return int(getattr(self.step_hook, "max_appended_tokens", None) or 0)

    def check_length(self, model: PreTrainedModel, prefill: Prefill, params: SamplingParams) -> None:
        """The prefill + ``max_new_tokens`` + the hook's declared injections must fit the model's positions."""
        what = "prompt" if prefill.inputs_embeds is None else "prefill (inputs_embeds)"
        check_context(model, prefill.length, params, what, self.max_injected_tokens(), "tokens injected by the hook")

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> StepwiseResult:
        start = time.perf_counter()
        hook, max_step, answer_steps = self.step_hook, self.max_step_tokens, self.answer_steps
        wants = getattr(hook, "wants", None)
        device, batch_size = prefill.device, prefill.batch_size
        eos, pad = stop_token_ids(model, tokenizer), pad_token_id(tokenizer)
        steps = TokenTextMatcher(tokenizer, self.step_delimiters)
        finals = TokenTextMatcher(tokenizer, self.final_step_delimiters) if self.final_step_delimiters else None
        stops = TokenTextMatcher(tokenizer, params.stop_strings) if params.stop_strings else None
        vocab = tokenizer.get_vocab()
        opener_ids = {vocab[t] for t in self.step_openers if t in vocab}
        call = _Call(hook, self.hook_lookahead, prefill.attention_mask.sum(-1).tolist(), context_length(model))
        state = prefill.start(model)
        rows = [_Row(params.max_new_tokens) for _ in range(batch_size)]
        compact = not self.processors
        # rows that ended leave the state when compact; those whose steps wait for the hook are parked when the
        # cache allows it (else they stay in the batch until the hook has seen their steps)
        parking = compact and state.parkable
        # the prompt logits: to resample a row rolled back to its first token
        cache = _CacheRows(list(range(batch_size)), torch.arange(batch_size, device=device), state.next_logits.clone())
        # Each iteration a running row's counted tokens grow by one, or the row is done and waits for the hook (at
        # most ``lookahead`` iterations per wait); only a lookahead action lowers them, by at most ``lookahead`` (the
        # age of the waiting step), at most once per counted token: so no row runs for more than
        # ``max_new_tokens * (2 * lookahead + 1)`` iterations.
        for iteration in range(params.max_new_tokens * (2 * call.lookahead + 1)):
            context = padded_context(prefill.prompt_ids, [r.ids for r in rows], pad) if self.processors else None
            sampled, logprobs_t = self.next_tokens(
                state.next_logits, context, params, generator, cache.index, batch_size
            )
            tokens, logprobs = sampled.tolist(), logprobs_t.tolist()
            fresh: dict[int, StepEvent] = {}  # rows that closed a step the hook wants, at this token
            running = 0  # cached rows not done after this token
            for k, i in enumerate(cache.rows):
                row = rows[i]
                if row.done:
                    continue
                token = tokens[k]
                row.add_sampled(token, logprobs[k])
                # out of budget (not finished): a step closing here still counts
                row.done = row.counted >= row.budget
                cut = None
                end = len(row.ids)  # the step's ids end here (an EOS that ends the row is not part of it)
                final = False
                answer = row.reasoning_done  # the token lies in the answer, after a kept final step
                uncut = answer and not answer_steps  # the answer is not cut into steps
                openers = _NO_OPENERS if answer else opener_ids  # an answer step has no openers: all of it is text
                if token in eos or (stops is not None and stops.ends_with(row.ids)):
                    row.done = row.finished = True
                    end -= token in eos
                    if uncut or not _has_text(row.ids, row.step_start, end, openers):
                        continue
                    cut = "end"
                else:
                    running += not row.done
                    final = not answer and finals is not None and finals.contains(row.ids, row.step_start)
                    if uncut or not (final or steps.contains(row.ids, row.step_start)):
                        # An opener such as <think> that began the current reasoning step is not part of it
                        if (
                            not answer
                            and token in opener_ids
                            and all(t in opener_ids for t in row.ids[row.step_start :])
                        ):
                            row.step_start = len(row.ids)
                        if uncut:
                            continue
                        if row.done and _has_text(row.ids, row.step_start, end, openers):
                            cut = "end"
                        elif max_step is not None and end - row.step_start >= max_step:
                            cut = "length"
                        else:
                            continue
                    else:
                        row.delimited = True
                index = row.steps_closed + 1
                if hook is not None and (
                    wants is None
                    or (wants(i, index, row.attempt, answer=True) if answer else wants(i, index, row.attempt))
                ):
                    ids = tuple(row.ids[:end])
                    fresh[i] = StepEvent(i, index, row.attempt, final, ids, row.step_start, tokenizer, cut, answer)
                if cut != "end":  # the step is kept unless the hook acts on it (then _act puts the row as it was)
                    row.steps_closed, row.attempt, row.step_start = index, 0, len(row.ids)
                    row.reasoning_done = answer or final
            if hook is not None and self._deliver_events(
                call, rows, cache, fresh, state, tokenizer, iteration, running
            ):
                running = sum(not rows[i].done for i in cache.rows)  # the hook acted: rows may run again
            if running == 0:
                break
            if parking:  # as SampleDecoder: rows that ended leave the batch once a tenth of it has
                if running <= COMPACT_FRACTION * len(cache.rows):
                    cache.park(state, [k for k, i in enumerate(cache.rows) if rows[i].done and rows[i].pending])
                    cache.keep(state, [k for k, i in enumerate(cache.rows) if not rows[i].done])
            elif compact:  # a row that ended with steps waiting for the hook stays: an action makes it run again
                keep = [k for k, i in enumerate(cache.rows) if not rows[i].done or rows[i].pending]
                if len(keep) <= UNPARKED_COMPACT_FRACTION * len(cache.rows):
                    cache.keep(state, keep)
            if call.at_risk:
                for i in cache.rows:
                    if i in call.at_risk:
                        self._check_positions(i, call.prompt_lengths[i], rows[i], call.max_positions)
            self._feed(state, rows, cache.rows, pad, cache.prompt_logits, call.acted)
            call.acted = False
        else:
            if not all(r.done for r in rows):  # cannot happen (see the bound above); never loop forever
                raise RuntimeError("StepwiseDecoder: rows still running after the iteration bound")
        return self._result(
            tokenizer, prefill, params, rows, pad, call.hook_seconds, time.perf_counter() - start, stop_ids=eos
        )

    def _deliver_events(
        self,
        call: _Call,
        rows: list[_Row],
        cache: _CacheRows,
        fresh: dict[int, StepEvent],
        state: IncrementalDecoder,
        tokenizer: PreTrainedTokenizerBase,
        iteration: int,
        running: int,
    ) -> bool:
        """Hand closed steps to the hook: at once (``lookahead == 0``), or -- all waiting ones in one call -- once
        the oldest waiting one is ``lookahead`` iterations old, or a row with a closed step is done (ended or out
        of budget) or closed another step. A hook that takes ``several_steps_per_row`` gets a row's later steps in
        the same call, and a done row's steps wait like the others until the oldest waiting step is ``lookahead``
        iterations old, every row is done, or few rows still run (:data:`DONE_ROWS_FLUSH_FRACTION`).
        Meanwhile the done row leaves the batch with the other done rows when its cache can be parked (put back if
        the hook acts on it); without parking it stays in the batch until its steps have gone to the hook.

        ``iteration``: the loop's iteration (a waiting step's age is counted from the one it closed at); ``running``:
        the cached rows not done. Returns whether the hook acted on a row."""
        lookahead = call.lookahead
        if lookahead and getattr(call.hook, "several_steps_per_row", False):
            for i, event in fresh.items():
                if not rows[i].pending:
                    rows[i].pending_since = iteration
                    call.waiting.add(i)
                rows[i].pending.append(event)
            if not call.waiting:
                return False
            in_play = len(cache.rows) + len(cache.parked)
            many_done = not self.processors and running <= DONE_ROWS_FLUSH_FRACTION * in_play
            if (
                any(iteration - rows[i].pending_since >= lookahead for i in call.waiting)
                or running == 0
                or (many_done and any(rows[i].done for i in call.waiting))
            ):
                waiting = sorted(call.waiting)
                events = [event for i in waiting for event in rows[i].pending]
                for i in waiting:
                    rows[i].pending = []
                call.waiting.clear()
                return bool(self._call_hook(call, events, rows, cache, state, tokenizer))
            return False
        waiting = {i: rows[i].pending[0] for i in sorted([*cache.rows, *cache.parked]) if rows[i].pending}
        flush = any(
            iteration - rows[i].pending_since >= lookahead or rows[i].done or i in fresh for i in waiting
        ) or any(rows[i].done for i in fresh)
        now = list(waiting.values()) if flush else []
        later: dict[int, StepEvent] = {}
        for i, event in fresh.items():
            if i in waiting:
                later[i] = event  # its fate depends on the earlier step's (``i in fresh`` flushed that one)
            elif lookahead == 0 or flush:
                now.append(event)
            else:
                rows[i].pending, rows[i].pending_since = [event], iteration
        if flush:
            for i in waiting:
                rows[i].pending = []
        acted = self._call_hook(call, now, rows, cache, state, tokenizer) if now else set()
        survivors = [event for i, event in later.items() if i not in acted]  # else it lay in the discarded part
        if survivors and (lookahead == 0 or any(rows[e.row].done for e in survivors)):
            acted |= self._call_hook(call, survivors, rows, cache, state, tokenizer)
        else:
            for event in survivors:
                rows[event.row].pending, rows[event.row].pending_since = [event], iteration
        return bool(acted)

    def _call_hook(
        self,
        call: _Call,
        events: list[StepEvent],
        rows: list[_Row],
        cache: _CacheRows,
        state: IncrementalDecoder,
        tokenizer: PreTrainedTokenizerBase,
    ) -> set[int]:
        """Call the hook on ``events`` (in step order per row) and apply its actions (a parked row acted on is put
        back in the batch first; the others have no waiting step left and are dropped); returns the rows acted
        on."""
        t0 = time.perf_counter()
        actions = call.hook(events) or {}
        call.hook_seconds += time.perf_counter() - t0
        by_row: dict[int, list[StepEvent]] = {}
        for event in events:
            by_row.setdefault(event.row, []).append(event)
        unknown = set(actions) - set(by_row)
        if unknown:
            raise ValueError(f"step hook returned actions for rows {sorted(unknown)} that closed no step")
        cache.restore(state, [i for i in actions if i in cache.parked])
        for i in [i for i in cache.parked if not rows[i].pending]:
            del cache.parked[i]
        position = {i: k for k, i in enumerate(cache.rows)}
        limit = call.max_positions
        for i, action in actions.items():
            self._act(rows[i], position[i], _acted_step(by_row[i], action), action, state, tokenizer)
            call.acted = True
            if limit is not None and call.prompt_lengths[i] + rows[i].budget + sum(rows[i].injected) > limit:
                call.at_risk.add(i)  # checked every iteration from now on
        return set(actions)

    @staticmethod
    def _act(
        row: _Row,
        k: int,
        event: StepEvent,
        action: StepAction,
        state: IncrementalDecoder,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        """Apply ``action`` to the step of ``event``: tokens sampled after it are discarded (lookahead; they leave the
        row's budget; the EOS after an ``end`` step stays counted), then the step is kept (and counted) or rolled
        back (its tokens stay counted, as with ``hook_lookahead = 0``), then ``append_ids`` are appended. The row
        runs again unless out of budget. An answer step (:attr:`StepEvent.answer`) rolled back or kept leaves the
        reasoning done: the row stays in the answer."""
        end = len(event.ids)
        if event.cut != "end":  # after an ``end`` step nothing was sampled but the EOS that ended the row
            row.lookahead_discarded += sum(not injected for injected in row.injected[end:])
        row.truncate(end, state, k)
        row.finished = False
        row.done = row.counted >= row.budget
        row.step_start, row.attempt = event.step_start, event.attempt
        if action.rollback:
            row.discarded.append(tokenizer.decode(row.ids[event.step_start :], skip_special_tokens=False))
            row.truncate(event.step_start, state, k)
            row.steps_closed, row.reasoning_done = event.step_index - 1, event.answer
            row.attempt += 1
        else:
            row.steps_closed, row.reasoning_done = event.step_index, event.final or event.answer
        row.append([int(t) for t in action.append_ids], True)
        row.step_start = len(row.ids)
        row.stale = not row.ids or row.cols[-1] >= 0  # nothing new to feed: the last kept token is fed again

    @staticmethod
    def _feed(
        state: IncrementalDecoder,
        rows: list[_Row],
        cached: list[int],
        pad: int,
        prompt_logits: torch.Tensor,
        acted: bool = True,
    ) -> None:
        """Feed every cached row's tokens not yet in the cache (the sampled token, or injected ids; per-row padding);
        a row rolled back with nothing new re-feeds its last kept token (its old column masked), or gets the logits
        after its prompt back. ``acted=False`` (the hook acted on no row since the last feed): each cached row that
        is not done has exactly one token to feed, its newest (one column, as plain decoding feeds)."""
        if not acted:
            base_col = state.attention_mask.shape[1]
            column, fed = [], []
            for i in cached:
                row = rows[i]
                if row.done:
                    column.append(pad)
                    fed.append(0)
                else:
                    column.append(row.ids[-1])
                    fed.append(1)
                    row.cols[-1] = base_col
            if any(fed):
                device = state.attention_mask.device
                state.feed(
                    torch.tensor(column, dtype=torch.long, device=device)[:, None],
                    torch.tensor(fed, dtype=torch.long, device=device)[:, None],
                )
            return
        chunks: list[list[int]] = []
        for k, i in enumerate(cached):
            row = rows[i]
            if row.stale:
                row.stale = False
                if not row.ids:
                    state.next_logits[k] = prompt_logits[k]
                else:
                    state.attention_mask[k, row.cols[-1]] = 0
                    row.cols[-1] = -1
            first = len(row.cols)
            while first and row.cols[first - 1] < 0:
                first -= 1
            chunks.append([] if row.done else row.ids[first:])
        width = max((len(c) for c in chunks), default=0)
        if not width:
            return
        device = state.attention_mask.device
        base_col = state.attention_mask.shape[1]
        chunk_ids = torch.tensor([c + [pad] * (width - len(c)) for c in chunks], dtype=torch.long, device=device)
        chunk_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in chunks], dtype=torch.long)
        for k, i in enumerate(cached):
            n = len(chunks[k])
            if n:
                rows[i].cols[-n:] = range(base_col, base_col + n)
        state.feed(chunk_ids, chunk_mask.to(device))

    @staticmethod
    def _check_positions(row_index: int, prompt_length: int, row: _Row, limit: int) -> None:
        """A row's prompt + kept tokens (sampled and injected) must stay within the model's positions."""
        if prompt_length + len(row.ids) <= limit:
            return
        raise ConfigError(
            f"row {row_index}: prompt {prompt_length} + {len(row.ids)} completion tokens ({sum(row.injected)} of them "
            f"injected by the step hook) exceed the model context ({limit} positions); lower max_new_tokens or the "
            "injections (e.g. SafeThink's max_steps_monitored)"
        )

    def _result(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        rows: list[_Row],
        pad: int,
        hook_seconds: float,
        total_seconds: float,
        stop_ids: frozenset[int] | None = None,
    ) -> StepwiseResult:
        batch, device = len(rows), prefill.device
        width = max((len(r.ids) for r in rows), default=0)
        completion_ids = torch.tensor(
            [r.ids + [pad] * (width - len(r.ids)) for r in rows], dtype=torch.long, device=device
        ).reshape(batch, width)
        completion_mask = torch.tensor(
            [[1] * len(r.ids) + [0] * (width - len(r.ids)) for r in rows], dtype=torch.long, device=device
        ).reshape(batch, width)
        injected_mask = torch.tensor(
            [[int(x) for x in r.injected] + [0] * (width - len(r.ids)) for r in rows], dtype=torch.long, device=device
        ).reshape(batch, width)
        logprobs = torch.tensor(
            [r.logprobs + [0.0] * (width - len(r.ids)) for r in rows], dtype=torch.float32, device=device
        ).reshape(batch, width)
        open_step = [
            not r.finished and (self.answer_steps or not r.reasoning_done) and len(r.ids) > r.step_start for r in rows
        ]
        never = [i for i, r in enumerate(rows) if not r.finished and not r.delimited]
        if self.warn_no_delimiter and never:
            cuts = f"every {self.max_step_tokens} tokens (max_step_tokens) and " if self.max_step_tokens else ""
            warnings.warn(
                f"step delimiter {list(self.step_delimiters)!r} never appeared in {len(never)} of {batch} rows "
                f"(rows {never[:8]}{' ...' if len(never) > 8 else ''}) before max_new_tokens="
                f"{params.max_new_tokens}; their text was offered to the step hook {cuts}at the row's end "
                "(StepEvent.cut; StepwiseResult.open_step / steps_closed); check step_delimiters",
                RuntimeWarning,
                stacklevel=5,
            )
        return StepwiseResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            injected_mask=injected_mask,
            logprobs=logprobs,
            texts=decode_completions(tokenizer, (r.ids for r in rows), stop_ids),
            finished=torch.tensor([r.finished for r in rows], dtype=torch.bool, device=device),
            steps_closed=[r.steps_closed for r in rows],
            open_step=open_step,
            discarded=[r.discarded for r in rows],
            hook_seconds=hook_seconds,
            total_seconds=total_seconds,
            sampled_tokens=[r.sampled for r in rows],
            counted_tokens=[r.counted for r in rows],
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
    final_step_delimiters: str | Sequence[str] = (THINK_CLOSE,),
    hook_lookahead: int = 0,
    max_step_tokens: int | None = DEFAULT_MAX_STEP_TOKENS,
    answer_steps: bool = False,
) -> StepwiseResult:
    """:class:`StepwiseDecoder` with ``hook`` (no processors or hooks) on left-padded prompts."""
    decoder = StepwiseDecoder(
        hook,
        step_delimiters,
        step_openers,
        warn_no_delimiter,
        final_step_delimiters=final_step_delimiters,
        hook_lookahead=hook_lookahead,
        max_step_tokens=max_step_tokens,
        answer_steps=answer_steps,
    )
    return decoder(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)
