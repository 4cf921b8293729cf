"""Step-wise decoding (``module/decoder=stepwise``): decode until a step delimiter, hand the partial traces to a
step hook, optionally append (or roll back and replace) tokens per row, and continue from the KV cache.

Hugging Face ``generate`` cannot force tokens mid-generation (huggingface/transformers#37771) and logits
processors cannot see model outputs (#34265), so :class:`StepwiseDecoder` is a decoder of its own
(:mod:`zoo.generation.decoders`; logits processors and forward hooks apply as in every decoder) whose loop sits on
:class:`~zoo.generation.sampling.IncrementalDecoder`:

* one :meth:`~zoo.generation.decoders.Decoder.next_tokens` call per iteration over the batch, exactly as in
  :class:`~zoo.generation.decoders.SampleDecoder` -- with no step hook, or one that never acts, the output is
  token-identical to plain decoding with the same seed (same RNG consumption, same shapes fed to the model);
  finished rows leave the KV-cached batch as in ``SampleDecoder`` (not with logits processors, which see every row)
  -- with a lookahead, also those whose steps still wait for the hook: they are parked (their cache rows set aside,
  :meth:`~zoo.generation.sampling.IncrementalDecoder.park_rows`) and put back only if the hook acts on them, so the
  model runs on exactly the rows plain decoding runs on;
* a step of a row closes when its text since the last close contains a delimiter (``step_delimiters``), or a
  final-step delimiter (``final_step_delimiters``, ``</think>`` by default: the last reasoning step closes at the
  closing tag; after it the row's text -- the answer -- is not split into steps); the hook receives every row that
  closed a step at this token (:class:`StepEvent`, with ``final`` set for a final step) and returns a
  :class:`StepAction` per row it acts on;
* whether a token closes a step is read from per-token tables (:class:`~zoo.generation.sampling.TokenTextMatcher`):
  text is decoded only for tokens that could complete a delimiter, and the trace of a step only if the hook reads it;
* appended tokens are fed together with the row's sampled token in one chunk whose width varies per row
  (per-row padding mask), so rows diverge freely; iterations where the hook acts on no row feed the sampled tokens
  as one column, like plain decoding;
* ``rollback`` discards the step just generated: its cached positions are masked out of the attention mask
  (positions come from the running mask, so the continuation is exactly a fresh forward over the kept
  tokens -- the cache is never rewritten); a row left with nothing new to feed feeds its last kept token again
  (its old column masked) to get the logits after it;
* with ``hook_lookahead > 0`` rows keep decoding while their closed steps wait for the hook, which then sees the
  steps of many rows in one call (fewer calls of an expensive scorer) -- with a hook that declares
  ``several_steps_per_row``, also several steps of one row; an action discards what was sampled after its step
  first, and those discarded tokens are not counted against the row's budget, so the kept text is exactly what
  ``hook_lookahead = 0`` keeps (token-identical under greedy decoding);
* generation ends per row at EOS (or a stop string), or when the row's counted tokens reach ``max_new_tokens``:
  every sampled token counts (kept, or in a step the hook rolled back) except those a lookahead action discarded;
  the loop runs until every row has ended. A row whose delimiter never appeared is reported
  (``steps_closed == 0``, ``open_step``) and a warning names the delimiter;
* the context check counts injected tokens: a hook that declares ``max_appended_tokens`` (per row) is checked
  before decoding; any other injection that would run past the model's positions raises a ``ConfigError``.

The step hook is an attribute (:attr:`StepwiseDecoder.step_hook`) so that a callback can set it on a module's
decoder at run time. Used by SafeThink (:mod:`zoo.safety.safethink`); written for any step-level monitor.
"""

from __future__ import annotations

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
        ids: the row's completion ids so far, this step included.
        step_start: where the step starts in ``ids``.
        tokenizer: decodes :attr:`step_text` and :attr:`trace` when they are read.
    """

    row: int
    step_index: int
    attempt: int = 0
    final: bool = False
    ids: tuple[int, ...] = ()
    step_start: int = 0
    tokenizer: PreTrainedTokenizerBase | None = field(default=None, repr=False, compare=False)

    @cached_property
    def step_text(self) -> str:
        """Text of the step, delimiter included."""
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
        steps_closed: per row, number of kept steps closed by a delimiter (a final step included).
        open_step: per row, whether the row ended inside a step that never reached a delimiter.
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
    """Book-keeping of one row: kept tokens (with the cache column each was fed at, ``-1`` while not yet fed), where
    the current step starts, the step event waiting for the hook, and the row's token budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget  # counted tokens after which the row is done (``max_new_tokens``)
        self.ids: list[int] = []
        self.injected: list[bool] = []
        self.logprobs: list[float] = []
        self.cols: list[int] = []
        self.step_start = 0  # index in ``ids`` where the current step starts
        self.steps_closed = 0
        self.attempt = 0
        self.done = False
        self.finished = False
        self.reasoning_done = False  # a final step was kept: the rest is not split into steps
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


# Done rows whose steps wait for the hook (lookahead, a hook taking several steps per row) hand them to the hook once
# a quarter of the rows in play are done. Measured (benchmarks/safethink_overhead.py, every monitored step violating):
# waiting longer puts the acted-on rows back in a second wave after the batch finished, 50% more forward passes;
# with no violation it saves one of three scorer calls.
DONE_ROWS_FLUSH_FRACTION = 0.75
# Without parking (a cache that cannot set rows aside) those rows stay in the batch until then: compacting earlier
# would only trigger more hook calls.
UNPARKED_COMPACT_FRACTION = DONE_ROWS_FLUSH_FRACTION


@dataclass
class _Batch:
    """Which rows are in the KV-cached state: ``live[k]`` is the batch row of the state's row ``k`` (``index`` the
    same as a tensor, ``prompt_logits[k]`` its logits after the prompt). ``parked`` holds, by batch row, done rows
    whose closed steps still wait for the hook, set aside from the state (:meth:`IncrementalDecoder.park_rows`) so
    that the batch shrinks as in plain decoding; an action on one puts it back (:meth:`restore`)."""

    live: list[int]
    index: torch.Tensor
    prompt_logits: torch.Tensor
    parked: dict[int, tuple[ParkedRow, torch.Tensor]] = field(default_factory=dict)

    def keep(self, state: IncrementalDecoder, positions: list[int]) -> bool:
        """Keep only the state rows ``positions``; False when the cache cannot drop rows."""
        index = torch.tensor(positions, dtype=torch.long, device=self.index.device)
        if not state.select_rows(index):
            return False
        self.live = [self.live[k] for k in positions]
        self.index = self.index[index]
        self.prompt_logits = self.prompt_logits[index]
        return True

    def park(self, state: IncrementalDecoder, positions: list[int]) -> None:
        """Set the state rows ``positions`` aside (they stay in the state until :meth:`keep` drops them)."""
        for k, row in zip(positions, state.park_rows(positions)):
            self.parked[self.live[k]] = (row, self.prompt_logits[k : k + 1])

    def restore(self, state: IncrementalDecoder, rows: list[int]) -> None:
        """Put the parked batch rows ``rows`` back at the end of the state."""
        if not rows:
            return
        parked = [self.parked.pop(i) for i in rows]
        state.restore_rows([row for row, _ in parked])
        self.live = self.live + list(rows)
        self.index = torch.cat([self.index, torch.tensor(rows, dtype=torch.long, device=self.index.device)])
        self.prompt_logits = torch.cat([self.prompt_logits, *(logits for _, logits in parked)])


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


class StepwiseDecoder(Decoder):
    """Decoder with a hook called whenever rows close a reasoning step (the loop of the module docstring).

    Args:
        step_hook: ``events -> {row: StepAction}`` (one event per row per call unless the hook declares
            ``several_steps_per_row``); ``None`` = plain decoding (token-identical to
            :class:`~zoo.generation.decoders.SampleDecoder` with the same seed). A hook may declare
            ``max_appended_tokens`` (an int: the most tokens it appends to one row), which the context check counts,
            ``wants(row, step_index, attempt) -> bool``, the steps it looks at (others make no event), and
            ``several_steps_per_row = True``: with ``hook_lookahead > 0`` it then gets every waiting step of a row
            in one call (in step order), acts on at most one per row (:attr:`StepAction.step_index`) and ignores
            that row's later steps in the call, which the action discards (they were sampled after it).
        step_delimiters: a step closes when its text contains one of these (default: newline, the zoo's
            ``STEP_DELIMITER``).
        step_openers: tokens that open the reasoning block (``<think>``); sampled at the start of a step they are
            not part of it, so a rollback of the first step keeps the reasoning block open.
        warn_no_delimiter: warn when a row reaches ``max_new_tokens`` without ever closing a step.
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder`.
        final_step_delimiters: a step also closes at these, as the last step of the reasoning (``StepEvent.final``);
            default the closing tag ``</think>``; ``()`` = none (the text after the last ``step_delimiters`` is then
            never a step).
        hook_lookahead: ``0`` (default): the hook sees each closed step before the row samples on. ``L > 0``: rows
            keep decoding while a closed step waits, and the hook gets the waiting steps of all rows in one call
            once the oldest is ``L`` tokens old (or its row finished, ran out of budget, or -- unless the hook takes
            ``several_steps_per_row`` -- closed another step); an action first discards the tokens sampled after
            that step (their cache columns masked). Fewer, larger
            hook calls; the kept text has the same distribution (discarded tokens never condition what is kept),
            and the tokens an action discards because they were sampled after its step do not count against the
            row's budget, so the kept text is exactly what ``L = 0`` keeps: token-identical under greedy decoding
            for a hook whose decision depends on the event alone (and with no action at all, also under seeded
            sampling); with seeded sampling the samples differ from ``L = 0`` after an action (the discarded tokens
            used random numbers). The cost: the discarded tokens are decoded (``StepwiseResult.sampled_tokens``)
            and their cache columns stay, masked (positions come from the running mask, so only kept tokens count
            against the model's context). The default stays ``0``, the algorithm as written; a method opts in
            (SafeThink does).

    ``params.max_new_tokens`` bounds, per row, the *sampled* tokens kept or rolled back by the hook (the tokens a
    lookahead action discards are not counted); injected tokens are extra. Returns a :class:`StepwiseResult`.
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
    ) -> None:
        super().__init__(processors, hooks)
        if hook_lookahead < 0:
            raise ConfigError(f"hook_lookahead must be >= 0, got {hook_lookahead}")
        self.hook_lookahead = int(hook_lookahead)
        self.step_hook = step_hook
        self.step_delimiters = _as_tuple(step_delimiters)
        self.final_step_delimiters = _as_tuple(final_step_delimiters, "final step delimiters", empty_ok=True)
        self.step_openers = tuple(step_openers)
        self.warn_no_delimiter = warn_no_delimiter

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
        hook, lookahead = self.step_hook, self.hook_lookahead
        wants = getattr(hook, "wants", None)
        device, batch = prefill.device, prefill.batch_size
        eos, pad = tokenizer.eos_token_id, pad_token_id(tokenizer)
        steps = TokenTextMatcher(tokenizer, self.step_delimiters)
        finals = TokenTextMatcher(tokenizer, self.final_step_delimiters) if self.final_step_delimiters else None
        stops = TokenTextMatcher(tokenizer, params.stop_strings) if params.stop_strings else None
        vocab = tokenizer.get_vocab()
        opener_ids = {vocab[t] for t in self.step_openers if t in vocab}
        max_positions = context_length(model)
        prompt_lengths = prefill.attention_mask.sum(-1).tolist()
        state = prefill.start(model)
        rows = [_Row(params.max_new_tokens) for _ in range(batch)]
        compact = not self.processors
        # finished rows leave the state when compact; done rows whose steps wait for the hook are parked when the
        # cache allows it (else they stay in the batch until the hook has seen their steps)
        parking = compact and state.parkable
        # the prompt logits: to resample a row rolled back to its first token
        live = _Batch(list(range(batch)), torch.arange(batch, device=device), state.next_logits.clone())
        self._hook_seconds = 0.0
        self._acted = False  # the hook acted since the last feed (rows may have several or no tokens to feed)
        self._waiting: set[int] = set()  # rows with steps waiting for the hook (lookahead)
        # rows whose injected tokens could run past the model's positions (the hook appended more than it declared):
        # checked every iteration; sampled tokens alone cannot (``check_length``: prompt + max_new_tokens fits)
        self._prompt_lengths, self._max_positions = prompt_lengths, max_positions
        self._at_risk: set[int] = set()
        # Each iteration a live row's counted tokens grow by one, or the row is done and waits for the hook (at most
        # ``lookahead`` iterations per wait); only a lookahead action lowers them, by at most ``lookahead`` (the age
        # of the waiting step), at most once per counted token: so no row is live for more than
        # ``max_new_tokens * (2 * lookahead + 1)`` iterations.
        for iteration in range(params.max_new_tokens * (2 * lookahead + 1)):
            context = padded_context(prefill.prompt_ids, [r.ids for r in rows], pad) if self.processors else None
            sampled, logprobs_t = self.next_tokens(state.next_logits, context, params, generator, live.index, batch)
            tokens, logprobs = sampled.tolist(), logprobs_t.tolist()
            fresh: dict[int, StepEvent] = {}  # rows that closed a step the hook wants, at this token
            running = 0  # live rows not done after this token
            for k, i in enumerate(live.live):
                row = rows[i]
                if row.done:
                    continue
                token = tokens[k]
                row.add_sampled(token, logprobs[k])
                # out of budget (not finished): a step closing here still counts
                row.done = row.counted >= row.budget
                if token == eos or (stops is not None and stops.ends_with(row.ids)):
                    row.done = row.finished = True
                    continue
                running += not row.done
                final = not row.reasoning_done and finals is not None and finals.contains(row.ids, row.step_start)
                if row.reasoning_done or not (final or steps.contains(row.ids, row.step_start)):
                    # An opener such as <think> that began the current step is not part of it
                    if not row.done and token in opener_ids and all(t in opener_ids for t in row.ids[row.step_start :]):
                        row.step_start = len(row.ids)
                    continue
                index = row.steps_closed + 1
                if hook is not None and (wants is None or wants(i, index, row.attempt)):
                    fresh[i] = StepEvent(i, index, row.attempt, final, tuple(row.ids), row.step_start, tokenizer)
                # the step is kept unless the hook acts on it (then _act restores the row as it was here)
                row.steps_closed, row.attempt, row.reasoning_done, row.step_start = index, 0, final, len(row.ids)
            if hook is not None and self._deliver_events(
                rows, live, fresh, lookahead, state, tokenizer, iteration, running
            ):
                running = sum(not rows[i].done for i in live.live)  # the hook acted: rows may be live again
            if running == 0:
                break
            if parking:  # as SampleDecoder: done rows leave the batch once a tenth of it is done
                if running <= COMPACT_FRACTION * len(live.live):
                    live.park(state, [k for k, i in enumerate(live.live) if rows[i].done and rows[i].pending])
                    live.keep(state, [k for k, i in enumerate(live.live) if not rows[i].done])
            elif compact:  # a done row whose steps wait for the hook stays: an action makes it live again
                keep = [k for k, i in enumerate(live.live) if not rows[i].done or rows[i].pending]
                if len(keep) <= UNPARKED_COMPACT_FRACTION * len(live.live):
                    live.keep(state, keep)
            if self._at_risk:
                for i in live.live:
                    if i in self._at_risk:
                        self._check_positions(i, prompt_lengths[i], rows[i], max_positions)
            self._feed(state, rows, live.live, pad, live.prompt_logits, self._acted)
            self._acted = False
        else:
            if not all(r.done for r in rows):  # cannot happen (see the bound above); never loop forever
                raise RuntimeError("StepwiseDecoder: rows still live after the iteration bound")
        return self._result(tokenizer, prefill, params, rows, pad, self._hook_seconds, time.perf_counter() - start)

    def _deliver_events(
        self,
        rows: list[_Row],
        live: _Batch,
        fresh: dict[int, StepEvent],
        lookahead: int,
        state: IncrementalDecoder,
        tokenizer: PreTrainedTokenizerBase,
        iteration: int,
        running: int,
    ) -> bool:
        """Hand closed steps to the hook: at once (``lookahead == 0``), or -- all waiting ones in one call -- once
        the oldest waiting one is ``lookahead`` iterations old, or a row with a closed step is done (finished or out
        of budget) or closed another step. A hook that takes ``several_steps_per_row`` gets a row's later steps in
        the same call, and a done row's steps wait like the others until the oldest waiting step is ``lookahead``
        iterations old, every row is done, or a quarter of the rows in play are done (``DONE_ROWS_FLUSH_FRACTION``:
        an action then puts the row back while the batch still runs, rather than in a second wave after it).
        Meanwhile the done row leaves the batch with the other done rows when its cache can be parked (put back if
        the hook acts on it), so that waiting costs no forward work beyond what plain decoding keeps in its batch;
        without parking it stays in the batch until its steps have gone to the hook.

        ``iteration``: the loop's iteration (a waiting step's age is counted from the one it closed at); ``running``:
        the live rows not done. Returns whether the hook acted on a row."""
        if lookahead and getattr(self.step_hook, "several_steps_per_row", False):
            for i, event in fresh.items():
                if not rows[i].pending:
                    rows[i].pending_since = iteration
                    self._waiting.add(i)
                rows[i].pending.append(event)
            if not self._waiting:
                return False
            # a quarter of the rows in play done (parked rows count): a done row's steps go to the hook then
            in_play = len(live.live) + len(live.parked)
            many_done = not self.processors and running <= DONE_ROWS_FLUSH_FRACTION * in_play
            if (
                any(iteration - rows[i].pending_since >= lookahead for i in self._waiting)
                or running == 0
                or (many_done and any(rows[i].done for i in self._waiting))
            ):
                waiting = sorted(self._waiting)
                events = [event for i in waiting for event in rows[i].pending]
                for i in waiting:
                    rows[i].pending = []
                self._waiting.clear()
                return bool(self._call_hook(events, rows, live, state, tokenizer))
            return False
        waiting = {i: rows[i].pending[0] for i in sorted([*live.live, *live.parked]) if rows[i].pending}
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
        acted = self._call_hook(now, rows, live, state, tokenizer) if now else set()
        survivors = [event for i, event in later.items() if i not in acted]  # else it lay in the discarded part
        if survivors and (lookahead == 0 or any(rows[e.row].done for e in survivors)):
            acted |= self._call_hook(survivors, rows, live, state, tokenizer)
        else:
            for event in survivors:
                rows[event.row].pending, rows[event.row].pending_since = [event], iteration
        return bool(acted)

    def _call_hook(
        self,
        events: list[StepEvent],
        rows: list[_Row],
        live: _Batch,
        state: IncrementalDecoder,
        tokenizer: PreTrainedTokenizerBase,
    ) -> set[int]:
        """Call the hook on ``events`` (in step order per row) and apply its actions (a parked row acted on is put
        back in the batch first; the others have no waiting step left and are dropped); returns the rows acted
        on."""
        t0 = time.perf_counter()
        actions = self.step_hook(events) or {}
        self._hook_seconds += time.perf_counter() - t0
        by_row: dict[int, list[StepEvent]] = {}
        for event in events:
            by_row.setdefault(event.row, []).append(event)
        unknown = set(actions) - set(by_row)
        if unknown:
            raise ValueError(f"step hook returned actions for rows {sorted(unknown)} that closed no step")
        live.restore(state, [i for i in actions if i in live.parked])
        for i in [i for i in live.parked if not rows[i].pending]:
            del live.parked[i]
        position = {i: k for k, i in enumerate(live.live)}
        limit = self._max_positions
        for i, action in actions.items():
            self._act(rows[i], position[i], _acted_step(by_row[i], action), action, state, tokenizer)
            self._acted = True
            if limit is not None and self._prompt_lengths[i] + rows[i].budget + sum(rows[i].injected) > limit:
                self._at_risk.add(i)  # checked every iteration from now on
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
        row's budget), then the step is kept (and counted) or rolled back (its tokens stay counted, as with
        ``hook_lookahead = 0``), then ``append_ids`` are appended. The row is live again unless out of budget."""
        end = len(event.ids)
        row.lookahead_discarded += sum(not injected for injected in row.injected[end:])
        row.truncate(end, state, k)
        row.finished = False
        row.done = row.counted >= row.budget
        row.step_start, row.attempt = event.step_start, event.attempt
        if action.rollback:
            row.discarded.append(tokenizer.decode(row.ids[event.step_start :], skip_special_tokens=False))
            row.truncate(event.step_start, state, k)
            row.steps_closed, row.reasoning_done = event.step_index - 1, False
            row.attempt += 1
        else:
            row.steps_closed, row.reasoning_done = event.step_index, event.final
        row.append([int(t) for t in action.append_ids], True)
        row.step_start = len(row.ids)
        row.stale = not row.ids or row.cols[-1] >= 0  # nothing new to feed: the last kept token is fed again

    @staticmethod
    def _feed(
        state: IncrementalDecoder,
        rows: list[_Row],
        live: list[int],
        pad: int,
        prompt_logits: torch.Tensor,
        acted: bool = True,
    ) -> None:
        """Feed every live row's tokens not yet in the cache (the sampled token, or injected ids; per-row padding);
        a row rolled back with nothing new re-feeds its last kept token (its old column masked), or gets the logits
        after its prompt back. ``acted=False`` (the hook acted on no row since the last feed): each live row that is
        not done has exactly one token to feed, its newest (one column, as plain decoding feeds)."""
        if not acted:
            base_col = state.attention_mask.shape[1]
            column, fed = [], []
            for i in live:
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
        for k, i in enumerate(live):
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
        for k, i in enumerate(live):
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
        open_step = [not r.finished and len(r.ids) > r.step_start for r in rows]
        never = [i for i, r in enumerate(rows) if not r.finished and r.steps_closed == 0]
        if self.warn_no_delimiter and never:
            warnings.warn(
                f"step delimiter {list(self.step_delimiters)!r} never appeared in {len(never)} of {batch} rows "
                f"(rows {never[:8]}{' ...' if len(never) > 8 else ''}) before max_new_tokens="
                f"{params.max_new_tokens}; those rows were generated as one unfinished step (see "
                "StepwiseResult.open_step / steps_closed)",
                RuntimeWarning,
                stacklevel=5,
            )
        return StepwiseResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            injected_mask=injected_mask,
            logprobs=logprobs,
            texts=decode_completions(tokenizer, (r.ids for r in rows)),
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
) -> StepwiseResult:
    """:class:`StepwiseDecoder` with ``hook`` (no processors or hooks) on left-padded prompts."""
    decoder = StepwiseDecoder(
        hook,
        step_delimiters,
        step_openers,
        warn_no_delimiter,
        final_step_delimiters=final_step_delimiters,
        hook_lookahead=hook_lookahead,
    )
    return decoder(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)
