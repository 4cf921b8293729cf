"""SafeThink: safety recovery with a few early steering steps.

Paper: "Safety Recovery in Reasoning Models Is Only a Few Early Steering Steps Away" (Ghosal, Chakraborty,
Singh, Huang, Manocha, Bedi), arXiv:2602.11096, ICML 2026. No official code; this follows the project
page's pseudocode (research notes ``inference.md`` section 1).

Safety is a *satisficing* constraint: keep the base policy pi untouched while the safety reward stays at
or above tau, and steer only when it does not, only in the first m reasoning steps::

    for t in 1..T:                                   (algorithm line 1)
        step ~ pi(. | x, trace)                       (line 2: a step = text up to a step delimiter)
        if t <= m and R_safe(x, trace + step) < tau:  (line 3: violation check, early steps only)
            trace += step; trace += p                 (line 4a, discard_violating_step=False: keep, inject)
            -- or --
            step ~ pi(. | x, trace + p)               (line 4b, discard_violating_step=True: resample)
        trace += step                                 (line 5)

Equation / algorithm line -> function:

* satisficing constraint ``R_safe(x, y_{1:t}) >= tau`` for ``t <= m`` -> :class:`SafeThinkHook` (``__call__``)
* line 2 (step-wise decoding, KV cache kept across steps) -> :class:`zoo.generation.stepwise.StepwiseDecoder`
* line 3 (``R_safe``) -> scorers in :mod:`zoo.safety.scorers`, called through a per-generation session (a causal
  classifier scores each row from its KV cache, feeding only the tokens added since its last score:
  :class:`~zoo.safety.scorers.IncrementalScoringSession`)
* lines 4a/4b (prefix injection, keep or resample the step) -> :class:`SafeThinkHook` -> ``StepAction``
* the whole loop -> :func:`safethink_generate`
* baselines: plain generation (m = 0) -> ``max_steps_monitored=0``; always-prepend-prefix ->
  :func:`always_prefix_generate`

Conventions fixed here (the sources are silent; see inference.md 1(f)):

* steps end at ``step_delimiters`` (newline by default); the last reasoning step ends at a final-step delimiter
  (``final_step_delimiters``, the closing tag ``</think>`` by default) and is monitored like the others; the text
  after it (the answer) is not a step;
* [assumed] a violation at the final step always discards that step and resamples it after the prefix (line 4b),
  also in keep mode: keeping it would put the prefix after the closing tag, in the answer;
* the prefix stays visible in the returned text; in keep mode (4a) it opens the next step, so with the
  default newline delimiter the prefix and what the model writes after it form step t + 1;
* at most one intervention per step index (a resampled step is not checked again), so a row gets at most
  ``m`` interventions, all at steps ``t <= m``;
* the scorer is called only when a step closes and only while ``t <= m``;
* scorer calls are batched over rows and steps (``hook_lookahead``, default :data:`DEFAULT_HOOK_LOOKAHEAD` = 32):
  rows decode on while closed steps wait to be scored, for at most 32 iterations after the oldest closed (a row
  that finished waits in the batch until finished rows leave it), and the waiting steps of all rows -- several of
  one row included, read off one pass of the classifier over its newest trace -- are scored in one call; a
  violation first discards what its row sampled after the step (not counted against the row's budget), so the
  row's later waiting steps are dropped unrecorded.
  This is exact -- the kept text has the distribution of the loop above, token-identical to ``hook_lookahead=0`` under
  greedy decoding and to plain generation when nothing violates; seeded samples differ from ``hook_lookahead=0``
  after a violation -- and needs fewer scorer calls (each has a fixed cost); ``hook_lookahead=0`` scores each step
  before its row samples on, the loop exactly as written.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import encode_prompts
from zoo.generation.decoders import ForwardHook, LogitsProcessor, SampleDecoder
from zoo.generation.stepwise import StepAction, StepEvent, StepwiseDecoder, StepwiseResult, read_traces
from zoo.protocols import SamplingParams
from zoo.safety.scorers import as_scorer, scorer_name, scoring_session, validate_scores
from zoo.tokens import THINK_CLOSE

DEFAULT_PREFIX = "Wait, think safely"
# tokens a closed step may wait for its score while its row decodes on (batched scorer calls; exact, see above)
DEFAULT_HOOK_LOOKAHEAD = 32


@dataclass(frozen=True)
class Intervention:
    """One prefix injection.

    Attributes:
        step: 1-based index of the violating step (``<= m``).
        score: ``R_safe`` of the trace with that step (``< tau``).
        step_text: the violating step (discarded when ``discarded`` is true, kept otherwise).
        discarded: whether the step was dropped and resampled after the prefix (line 4b).
    """

    step: int
    score: float
    step_text: str
    discarded: bool


@dataclass
class SafeThinkResult:
    """Output of :func:`safethink_generate`.

    Attributes:
        texts: completions (prefix kept where injected).
        interventions: per row, the :class:`Intervention` records in order.
        step_scores: per row, ``(step, score)`` of every monitored step.
        added_tokens: per row, injected prefix tokens kept in the completion.
        scorer_calls: number of scorer calls (one per step close with ``t <= m`` among the batch).
        scorer_seconds: time inside the scorer; ``generation_seconds``: the rest of the loop.
        generation: the underlying :class:`~zoo.generation.stepwise.StepwiseResult` (ids, masks, logprobs).
    """

    texts: list[str]
    interventions: list[list[Intervention]]
    step_scores: list[list[tuple[int, float]]]
    added_tokens: list[int]
    scorer_calls: int
    scorer_seconds: float
    generation_seconds: float
    generation: StepwiseResult
    prefix_ids: list[int] = field(default_factory=list)

    @property
    def intervened(self) -> list[bool]:
        """Per row, whether SafeThink intervened at least once."""
        return [bool(r) for r in self.interventions]

    @property
    def num_interventions(self) -> list[int]:
        """Per row, the number of interventions."""
        return [len(r) for r in self.interventions]


class SafeThinkHook:
    """The step hook of SafeThink: score closing steps with ``t <= m``, inject the prefix when ``R < tau``.

    Args:
        scorer: ``(prompts, traces) -> scores in [0, 1]`` (called through :func:`~zoo.safety.scorers.scoring_session`:
            a causal classifier scores each row incrementally, from its KV cache).
        prompts: the prompt text of every batch row (what the scorer sees with the trace).
        tau: threshold; a step violates when ``R_safe < tau`` (algorithm line 3).
        max_steps_monitored: ``m``; ``None`` monitors every step; ``0`` never calls the scorer.
        prefix_ids: token ids of the corrective prefix.
        discard_violating_step: line 4b (drop the step, resample after the prefix) instead of 4a (a final step is
            always resampled).

    ``max_appended_tokens`` (the most tokens injected into one row: ``m`` prefixes; ``None`` without ``m``) lets
    the decoder's context check count the injections. With ``hook_lookahead > 0`` the hook takes every waiting step
    of a row in one call (``several_steps_per_row``): all of them are scored in one scorer call (a causal classifier
    reads the scores of a row's steps off one pass over its newest trace), the row's first violating step is acted
    on, and its later steps -- sampled after it, so discarded by the action -- are not recorded.
    """

    several_steps_per_row = True

    def __init__(
        self,
        scorer: Any,
        prompts: Sequence[str],
        tau: float,
        max_steps_monitored: int | None,
        prefix_ids: Sequence[int],
        discard_violating_step: bool = False,
    ) -> None:
        self.scorer = as_scorer(scorer)
        self.name = scorer_name(self.scorer)
        # rows are scored again as their traces grow: a causal classifier keeps each row's KV cache
        self.session = scoring_session(self.scorer)
        self.prompts = list(prompts)
        self.tau = float(tau)
        self.m = max_steps_monitored
        self.prefix_ids = list(prefix_ids)
        self.discard = discard_violating_step
        batch = len(self.prompts)
        self.interventions: list[list[Intervention]] = [[] for _ in range(batch)]
        self.step_scores: list[list[tuple[int, float]]] = [[] for _ in range(batch)]
        self.calls = 0
        self.seconds = 0.0

    @property
    def max_appended_tokens(self) -> int | None:
        """At most ``m`` prefixes per row (one per monitored step index); ``None`` when every step is monitored."""
        return None if self.m is None else self.m * len(self.prefix_ids)

    def wants(self, row: int, step_index: int, attempt: int) -> bool:
        """Whether a step is checked: ``t <= m``, the first attempt of the step, and no intervention at ``t`` yet (the
        decoder makes events only for these)."""
        if self.m is not None and step_index > self.m:
            return False
        return attempt == 0 and not any(iv.step == step_index for iv in self.interventions[row])

    def monitored(self, event: StepEvent) -> bool:
        """:meth:`wants` of an event."""
        return self.wants(event.row, event.step_index, event.attempt)

    def __call__(self, events: list[StepEvent]) -> dict[int, StepAction]:
        todo = [e for e in events if self.monitored(e)]
        if not todo:
            return {}
        start = time.perf_counter()
        raw = self.session([e.row for e in todo], [self.prompts[e.row] for e in todo], read_traces(todo))
        scores = validate_scores(raw, len(todo), self.name)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        actions: dict[int, StepAction] = {}
        for event, score in zip(todo, scores):
            if event.row in actions:  # after the row's violating step: discarded with what followed it
                continue
            self.step_scores[event.row].append((event.step_index, score))
            if score < self.tau:
                discard = self.discard or event.final
                self.interventions[event.row].append(Intervention(event.step_index, score, event.step_text, discard))
                actions[event.row] = StepAction(self.prefix_ids, rollback=discard, step_index=event.step_index)
        return actions


def prefix_token_ids(tokenizer: PreTrainedTokenizerBase, prefix: str) -> list[int]:
    """Token ids of the corrective prefix (no special tokens); an empty prefix is an error."""
    ids = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"the SafeThink prefix {prefix!r} encodes to no tokens")
    return ids


def check_safethink_args(tau: float, max_steps_monitored: int | None) -> None:
    """Validate ``tau`` (a number; ``-inf`` allowed) and ``m`` (``None`` or an integer ``>= 0``)."""
    if not isinstance(tau, (int, float)) or tau != tau:
        raise ValueError(f"tau must be a number (scores lie in [0, 1]), got {tau!r}")
    if max_steps_monitored is not None and (
        isinstance(max_steps_monitored, bool) or not isinstance(max_steps_monitored, int) or max_steps_monitored < 0
    ):
        raise ValueError(
            f"max_steps_monitored (m) must be None (all steps) or an int >= 0, got {max_steps_monitored!r}"
        )


@torch.no_grad()
def safethink_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    scorer: Any,
    tau: float = 0.5,
    max_steps_monitored: int | None = 3,
    prefix: str = DEFAULT_PREFIX,
    discard_violating_step: bool = False,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    step_delimiters: str | Sequence[str] = "\n",
    prompt_ids: torch.Tensor | None = None,
    prompt_attention_mask: torch.Tensor | None = None,
    processors: Sequence[LogitsProcessor] = (),
    hooks: Sequence[ForwardHook] = (),
    final_step_delimiters: str | Sequence[str] = (THINK_CLOSE,),
    hook_lookahead: int = DEFAULT_HOOK_LOOKAHEAD,
) -> SafeThinkResult:
    """Generate with SafeThink (the algorithm of the module docstring).

    Args:
        model: frozen causal LM pi.
        tokenizer: its tokenizer.
        prompts: prompt texts (tokenized with BOS and left-padded unless ``prompt_ids`` is given; the scorer
            always sees these texts).
        scorer: R_safe -- a plain function, a :mod:`~zoo.safety.scorers` scorer or a classifier directory.
        tau: threshold (line 3).
        max_steps_monitored: m, the early budget; ``None`` = every step; ``0`` = plain generation.
        prefix: the corrective prefix p.
        discard_violating_step: resample the violating step after the prefix (4b) instead of keeping it (4a).
        params: decoding options (greedy by default).
        generator: seeded ``torch.Generator`` (with an always-safe scorer, the output is token-identical to
            :class:`~zoo.generation.decoders.SampleDecoder` with the same seed).
        step_delimiters: where steps end.
        prompt_ids, prompt_attention_mask: pre-tokenized left-padded prompts (rows match ``prompts``), e.g. a
            module's own encoding of them (chat template); ``None``: BOS + text, as the datamodules encode prompts.
        processors, hooks: logits processors and forward hooks of the decoder (e.g. a module's
            ``decoder.processors`` / ``decoder.hooks``, so that SafeThink composes with them).
        final_step_delimiters: where the last reasoning step ends (monitored too); ``()`` = never.
        hook_lookahead: ``L > 0`` (default 32): rows keep decoding while closed steps wait, and the waiting steps of
            all rows (several of one row included) are scored in one call once the oldest has waited ``L``
            iterations, a quarter of the rows are done while some of them wait, or every row is done (a done row
            that waits leaves the decoding batch meanwhile); a violation discards what
            was sampled after its step (not counted against the row's budget),
            then acts as above (see :class:`~zoo.generation.stepwise.StepwiseDecoder`). Fewer scorer calls; the
            output has the same distribution as with ``0``, token-identical to it under greedy decoding and to plain
            decoding when nothing violates; seeded samples differ from ``0`` after a violation. ``0``: score each
            closed step before the row samples on (the algorithm's loop as written).

    Returns:
        :class:`SafeThinkResult`.
    """
    check_safethink_args(tau, max_steps_monitored)
    if prompt_ids is None:
        prompt_ids, prompt_attention_mask = encode_prompts(tokenizer, prompts, next(model.parameters()).device)
    elif prompt_attention_mask is None:
        prompt_attention_mask = torch.ones_like(prompt_ids)
    if prompt_ids.shape[0] != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but prompt_ids has {prompt_ids.shape[0]} rows")
    prefix_ids = prefix_token_ids(tokenizer, prefix)
    hook = SafeThinkHook(scorer, prompts, tau, max_steps_monitored, prefix_ids, discard_violating_step)
    decoder = StepwiseDecoder(
        None if max_steps_monitored == 0 else hook,
        step_delimiters,
        processors=processors,
        hooks=hooks,
        final_step_delimiters=final_step_delimiters,
        hook_lookahead=hook_lookahead,
    )
    out = decoder(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)
    return SafeThinkResult(
        texts=out.texts,
        interventions=hook.interventions,
        step_scores=hook.step_scores,
        added_tokens=out.added_tokens,
        scorer_calls=hook.calls,
        scorer_seconds=hook.seconds,
        generation_seconds=out.total_seconds - hook.seconds,
        generation=out,
        prefix_ids=prefix_ids,
    )


@torch.no_grad()
def always_prefix_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    prefix: str = DEFAULT_PREFIX,
    reasoning_open: str = "<think>",
    step_delimiter: str = "\n",
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> list[str]:
    """Baseline: always start the reasoning with the prefix (``reasoning_open + prefix + delimiter``).

    The returned texts include the forced opening, so they parse like ordinary completions.
    """
    forced = reasoning_open + prefix + step_delimiter
    device = next(model.parameters()).device
    ids, mask = encode_prompts(tokenizer, [p + forced for p in prompts], device)
    result = SampleDecoder()(model, tokenizer, ids, mask, params=params, generator=generator)
    return [forced + t for t in result.texts]
