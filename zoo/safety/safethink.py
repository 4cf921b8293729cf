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
  :func:`always_prefix_generate` (through the same decoder)

Conventions fixed here (the sources are silent; see inference.md 1(f)):

* SafeThink decodes through the decoder seam (:func:`safethink_decoder`): a module's
  :class:`~zoo.generation.stepwise.StepwiseDecoder` with its settings, else one with SafeThink's defaults and the
  module decoder's processors and hooks; the step settings below are that decoder's;
* steps end at ``step_delimiters`` (newline by default); the last reasoning step ends at a final-step delimiter
  (``final_step_delimiters``, the closing tag ``</think>`` by default) and is monitored like the others;
* the answer is monitored too (``monitor_answer``, on by default; the paper's loop stops at the reasoning): the text
  after a kept final step is cut into steps by the same rules (the decoder copy's ``answer_steps``), numbered on
  from the reasoning, and every answer step is scored, whatever ``m`` (``m`` is the early-steering budget of the
  reasoning; ``m = 0`` stays plain generation) -- so a policy that writes ``</think>`` at once and the harmful text
  after it is scored and steered. A violating answer step is handled as a violating final step: discarded and
  resampled after the prefix, which then lands at the start of that answer step (after ``</think>`` or the previous
  answer step), also in keep mode (:attr:`Intervention.answer`); as at any step, its resample is not checked again.
  ``monitor_answer=False`` leaves the answer unscored (the loop as the paper writes it);
* a policy cannot escape the monitor by never writing a delimiter: a step with no delimiter is scored once it holds
  ``max_step_tokens`` tokens (256 by default) and, unfinished, when its row ends (EOS, stop string, budget), so every
  reasoning token lies in a step that is scored while ``t <= m`` (and every answer token in a scored answer step); a
  violation there acts as at any step (keep mode: the prefix follows it and the row continues, an EOS that ended it
  dropped, unless its budget is spent);
* [assumed] a violation at the final step always discards that step and resamples it after the prefix (line 4b),
  also in keep mode: keeping it would put the prefix after the closing tag, in the answer;
* the prefix stays visible in the returned text; in keep mode (4a) it opens the next step, so with the
  default newline delimiter the prefix and what the model writes after it form step t + 1;
* at most one intervention per step index (a resampled step is not checked again), so a row gets at most
  ``m`` interventions in its reasoning, all at steps ``t <= m`` (and at most one per answer step in its answer);
* the scorer is called only when a step closes and only while ``t <= m`` or in the answer;
* scorer calls are batched over rows and steps (the decoder's ``hook_lookahead``; SafeThink's default decoder uses
  :data:`DEFAULT_HOOK_LOOKAHEAD` = 32):
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
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder, SampleDecoder
from zoo.generation.stepwise import StepAction, StepEvent, StepwiseDecoder, StepwiseResult, read_traces
from zoo.protocols import SamplingParams
from zoo.safety.scorers import as_scorer, scorer_name, scoring_session, validate_scores

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
        cut: how the step closed without a delimiter: ``"length"`` (the decoder's ``max_step_tokens``) or ``"end"``
            (its row ended inside it); ``None``: at a delimiter.
        answer: the step lies in the answer, after ``</think>`` (``monitor_answer``); such a step is always
            discarded and resampled after the prefix.
    """

    step: int
    score: float
    step_text: str
    discarded: bool
    cut: str | None = None
    answer: bool = False


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

    @property
    def num_answer_interventions(self) -> list[int]:
        """Per row, the number of interventions in the answer (:attr:`Intervention.answer`)."""
        return [sum(i.answer for i in r) for r in self.interventions]


class SafeThinkHook:
    """The step hook of SafeThink: score closing steps with ``t <= m`` (and answer steps), inject the prefix when
    ``R < tau``.

    Args:
        scorer: ``(prompts, traces) -> scores in [0, 1]`` (called through :func:`~zoo.safety.scorers.scoring_session`:
            a causal classifier scores each row incrementally, from its KV cache).
        prompts: the prompt text of every batch row (what the scorer sees with the trace).
        tau: threshold; a step violates when ``R_safe < tau`` (algorithm line 3).
        max_steps_monitored: ``m``; ``None`` monitors every step; ``0`` never calls the scorer.
        prefix_ids: token ids of the corrective prefix.
        discard_violating_step: line 4b (drop the step, resample after the prefix) instead of 4a (a final step and
            an answer step are always resampled).
        monitor_answer: score every answer step (:attr:`StepEvent.answer`, offered by a decoder with
            ``answer_steps``) whatever ``m``; ``False``: answer steps are not wanted.
        max_answer_interventions: at most this many steerings per row in its answer (default 1; ``None``: no
            bound); once a row has had them, its later answer steps are not scored. A bound keeps the injected
            tokens bounded, so the decoder's context check counts them before decoding: a policy that keeps answering
            harmfully after the prefix would otherwise be steered at every answer step until the row ran past the
            model's positions.

    ``max_appended_tokens`` (the tokens injected into one row: ``m`` prefixes in its reasoning and
    ``max_answer_interventions`` in its answer; ``None`` when either is unbounded) lets the decoder's context check
    count them before decoding; unbounded injections are checked by the decoder as they happen (a
    :class:`~zoo.errors.ConfigError` once a row would run past the model's positions). With ``hook_lookahead > 0``
    the hook takes every waiting step of a row in one call (``several_steps_per_row``): all of them are scored in one
    scorer call (a causal classifier reads the scores of a row's steps off one pass over its newest trace), the row's
    first violating step is acted on, and its later steps -- sampled after it, so discarded by the action -- are not
    recorded.
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
        monitor_answer: bool = True,
        max_answer_interventions: int | None = 1,
    ) -> None:
        check_answer_interventions(max_answer_interventions)
        self.scorer = as_scorer(scorer)
        self.name = scorer_name(self.scorer)
        # rows are scored again as their traces grow: a causal classifier keeps each row's KV cache
        self.session = scoring_session(self.scorer)
        self.prompts = list(prompts)
        self.tau = float(tau)
        self.m = max_steps_monitored
        self.prefix_ids = list(prefix_ids)
        self.discard = discard_violating_step
        self.monitor_answer = bool(monitor_answer)
        self.max_answer_interventions = max_answer_interventions
        batch = len(self.prompts)
        self.interventions: list[list[Intervention]] = [[] for _ in range(batch)]
        self.step_scores: list[list[tuple[int, float]]] = [[] for _ in range(batch)]
        self.calls = 0
        self.seconds = 0.0

    @property
    def max_appended_tokens(self) -> int | None:
        """At most ``m`` prefixes per row in the reasoning (one per monitored step index) and
        ``max_answer_interventions`` in its answer; ``None`` when either is unbounded."""
        answer = self.max_answer_interventions if self.monitor_answer else 0
        if self.m is None or answer is None:
            return None
        return (self.m + answer) * len(self.prefix_ids)

    def wants(self, row: int, step_index: int, attempt: int, answer: bool = False) -> bool:
        """Whether a step is checked: ``t <= m`` (an answer step: ``monitor_answer``), the first attempt of the
        step, and no intervention at ``t`` yet (the decoder makes events only for these)."""
        if answer:
            cap = self.max_answer_interventions
            monitored = self.monitor_answer and (cap is None or sum(iv.answer for iv in self.interventions[row]) < cap)
        else:
            monitored = self.m is None or step_index <= self.m
        return monitored and attempt == 0 and not any(iv.step == step_index for iv in self.interventions[row])

    def monitored(self, event: StepEvent) -> bool:
        """:meth:`wants` of an event."""
        return self.wants(event.row, event.step_index, event.attempt, answer=event.answer)

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
                # a final or answer step is always resampled after the prefix: a kept final step would put the prefix
                # in the answer, a kept answer step would leave the unsafe text in what the user reads
                discard = self.discard or event.final or event.answer
                self.interventions[event.row].append(
                    Intervention(event.step_index, score, event.step_text, discard, event.cut, event.answer)
                )
                actions[event.row] = StepAction(self.prefix_ids, rollback=discard, step_index=event.step_index)
        return actions


def prefix_token_ids(tokenizer: PreTrainedTokenizerBase, prefix: str) -> list[int]:
    """Token ids of the corrective prefix (no special tokens); an empty prefix is an error."""
    ids = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError(f"the SafeThink prefix {prefix!r} encodes to no tokens")
    return ids


def check_answer_interventions(max_answer_interventions: int | None) -> None:
    """``max_answer_interventions`` is ``None`` or an integer ``>= 0``."""
    if max_answer_interventions is not None and (
        isinstance(max_answer_interventions, bool)
        or not isinstance(max_answer_interventions, int)
        or max_answer_interventions < 0
    ):
        raise ConfigError(f"max_answer_interventions must be None or an int >= 0, got {max_answer_interventions!r}")


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


def safethink_decoder(decoder: Decoder | None = None) -> StepwiseDecoder:
    """The step-wise decoder SafeThink runs through, from a module's decoder (the decoder seam): a
    :class:`~zoo.generation.stepwise.StepwiseDecoder` as it is (its delimiters, lookahead, step length, processors
    and hooks); a plain :class:`~zoo.generation.decoders.SampleDecoder`, or none, as a step-wise decoder with the
    same processor and hook lists and SafeThink's step settings (the ``StepwiseDecoder`` defaults: newline steps,
    ``</think>`` final step, ``max_step_tokens`` 256; ``hook_lookahead`` :data:`DEFAULT_HOOK_LOOKAHEAD`), which
    decodes token-identically when no step violates. Any other decoder (greedy, DTS, undo, watermark, ...) decodes
    in a loop that cannot be monitored step by step: a :class:`~zoo.errors.ConfigError` says what to set."""
    if isinstance(decoder, StepwiseDecoder):
        return decoder
    if decoder is not None and type(decoder) is not SampleDecoder:
        raise ConfigError(
            f"SafeThink monitors through a step-wise decoder, and the module's decoder is {type(decoder).__name__}, "
            "whose decoding loop it cannot score step by step; set module/decoder=stepwise (greedy decoding: "
            "module.eval_generation.do_sample=false), or module/decoder=sample"
        )
    stepwise = StepwiseDecoder(hook_lookahead=DEFAULT_HOOK_LOOKAHEAD)
    if decoder is not None:  # the same lists: what a callback adds to them applies to SafeThink's decoding too
        stepwise.processors, stepwise.hooks = decoder.processors, decoder.hooks
    return stepwise


def _prompt_inputs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    prompt_ids: torch.Tensor | None,
    prompt_attention_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask: the given ones (rows must match ``prompts``), else BOS + text."""
    if prompt_ids is None:
        return encode_prompts(tokenizer, prompts, next(model.parameters()).device)
    if prompt_ids.shape[0] != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but prompt_ids has {prompt_ids.shape[0]} rows")
    return prompt_ids, (torch.ones_like(prompt_ids) if prompt_attention_mask is None else prompt_attention_mask)


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
    prompt_ids: torch.Tensor | None = None,
    prompt_attention_mask: torch.Tensor | None = None,
    decoder: Decoder | None = None,
    monitor_answer: bool = True,
    max_answer_interventions: int | None = 1,
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
        prompt_ids, prompt_attention_mask: pre-tokenized left-padded prompts (rows match ``prompts``), e.g. a
            module's own encoding of them (chat template); ``None``: BOS + text, as the datamodules encode prompts.
        decoder: the decoder to run through (:func:`safethink_decoder`): a
            :class:`~zoo.generation.stepwise.StepwiseDecoder` brings the step settings -- ``step_delimiters``,
            ``final_step_delimiters`` (the last reasoning step, monitored too), ``max_step_tokens`` (a step with no
            delimiter is scored after that many tokens, and an unfinished one at the row's end), ``hook_lookahead``
            (``L > 0``: rows decode on while closed steps wait up to ``L`` iterations, and the waiting steps of all
            rows are scored in one call; exact: same distribution as ``0``, token-identical to it under greedy
            decoding and to plain decoding when nothing violates) -- and its logits processors and forward hooks;
            ``None`` or a plain sampler: SafeThink's defaults (``hook_lookahead`` 32). The decoder is not changed
            (SafeThink's hook is set on a copy).
        monitor_answer: also score the answer after ``</think>`` step by step, every answer step whatever
            ``max_steps_monitored`` (the decoder copy's ``answer_steps`` is set to this); a violating answer step is
            discarded and resampled after the prefix, which lands at its start (:attr:`Intervention.answer`).
            ``False``: the answer is not scored (the paper's loop; a policy that closes its reasoning at once is then
            never steered).
        max_answer_interventions: at most this many steerings per row in its answer (default 1; ``None``: no bound;
            see :class:`SafeThinkHook`).

    Returns:
        :class:`SafeThinkResult`.
    """
    check_safethink_args(tau, max_steps_monitored)
    prompt_ids, prompt_attention_mask = _prompt_inputs(model, tokenizer, prompts, prompt_ids, prompt_attention_mask)
    stepwise = safethink_decoder(decoder)
    if stepwise.step_hook is not None:
        raise ConfigError(
            f"the step-wise decoder already has a step hook ({type(stepwise.step_hook).__name__}); SafeThink's hook "
            "would replace it: remove it (decoder.step_hook = None) or give SafeThink a decoder of its own"
        )
    prefix_ids = prefix_token_ids(tokenizer, prefix)
    hook = SafeThinkHook(
        scorer,
        prompts,
        tau,
        max_steps_monitored,
        prefix_ids,
        discard_violating_step,
        monitor_answer,
        max_answer_interventions,
    )
    if max_steps_monitored == 0:  # the baseline: plain generation, nothing scored
        run = stepwise.with_step_hook(None)
    else:
        run = stepwise.with_step_hook(hook, answer_steps=monitor_answer)
    out = run(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)
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
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    prompt_ids: torch.Tensor | None = None,
    prompt_attention_mask: torch.Tensor | None = None,
    decoder: Decoder | None = None,
) -> list[str]:
    """Baseline: always start the reasoning with the prefix -- the prompt ids are followed by the tokens of the
    decoder's first step opener, the prefix and its first step delimiter (``<think>Wait, think safely\n`` with
    SafeThink's defaults), and the model continues from there through the same decoder as SafeThink (no step hook:
    plain decoding with its processors and forward hooks; :func:`safethink_decoder`).

    Prompts as :func:`safethink_generate`. The returned texts include the forced opening, so they parse like ordinary
    completions.
    """
    stepwise = safethink_decoder(decoder)
    forced = (stepwise.step_openers[0] if stepwise.step_openers else "") + prefix + stepwise.step_delimiters[0]
    ids, mask = _prompt_inputs(model, tokenizer, prompts, prompt_ids, prompt_attention_mask)
    forced_ids = torch.tensor(prefix_token_ids(tokenizer, forced), dtype=ids.dtype, device=ids.device)
    ids = torch.cat([ids, forced_ids.expand(ids.shape[0], -1)], dim=1)
    mask = torch.cat([mask, torch.ones(ids.shape[0], len(forced_ids), dtype=mask.dtype, device=mask.device)], dim=1)
    result = stepwise.with_step_hook(None)(model, tokenizer, ids, mask, params=params, generator=generator)
    return [forced + t for t in result.texts]
