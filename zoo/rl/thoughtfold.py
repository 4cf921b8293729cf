"""ThoughtFold cores: introspective pruning of correct reasoning chains into span-masked DPO pairs.

Paper: "ThoughtFold: Folding Reasoning Chains via Introspective Preference Learning", arXiv:2606.03503 (ICML 2026).
Released code: github.com/ziyanliux/ThoughtFold (``thoughtfold/binsearch/*``); its DPO loss worker is not released,
so every choice it would have fixed is a constructor argument marked "[assumed]" (notes ``rl.md`` §4).

Inside the GRPO loop each outcome-correct rollout ``<think>s_1 .. s_n</think>answer`` is pruned with the current
policy as the verifier, and each verified pruning becomes a span-masked DPO pair trained in the same optimizer step
(the GRPO family's auxiliary-loss seam, :class:`zoo.rl.auxiliary.AuxiliaryLoss`; the adapter is
:class:`zoo.modules.thoughtfold.ThoughtFoldLoss`).

Equation / rule -> function:

- reasoning ``<think>body</think>answer``, body = steps joined by the delimiter -> :func:`parse_reasoning`,
  :func:`split_steps`, :func:`join_steps`
- binary search for the shortest passing prefix / kept count (monotone oracle) -> :func:`shortest_passing`
  (lock-step form for batched validation: :func:`bisect_shortest`, :func:`run_searches`)
- phase 1 cut points snapped to the previous step boundary (the released ``_smart_cut``) -> :func:`tail_cut_points`
- phase 2 keep the top-k steps by importance -> :func:`fold_steps`; importance: :func:`leave_one_out_importance`
  (backend-agnostic default), :func:`attention_importance` (attention from the answer; eager attention only)
- bridging steps (kept steps right after a pruned one) -> :func:`bridging_steps`
- pair label masks (phase 1: rejected = pruned tail, chosen = answer; phase 2: rejected = newly pruned steps,
  chosen = bridging steps) -> :func:`tail_pair`, :func:`fold_pair`, :func:`encode_pair`
- masked DPO ``-log sigmoid(beta_D [(log pi - log pi_ref)(c) - (log pi - log pi_ref)(r)])`` ->
  :func:`zoo.rl.losses.masked_dpo_loss`
- validation of a candidate: ``repeat`` sampled answers, invalid if they re-open ``<think>`` or run past the
  original length, accepted when the correct rate >= ``threshold`` -> :func:`answer_is_valid`, :func:`passes`
- ground-truth redundancy of a reasoning (tasks with labelled redundant steps) -> :func:`redundancy_stats`
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from zoo.errors import ConfigError
from zoo.losses import IGNORE_INDEX, masked_sequence_logprobs
from zoo.tokens import EOS, THINK_CLOSE, THINK_OPEN


# -- reasoning text ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reasoning:
    """A completion ``<think>body</think>answer``: ``body`` (the reasoning, without tags) and ``answer`` (the text
    after ``</think>``, EOS removed)."""

    body: str
    answer: str


def parse_reasoning(text: str) -> Reasoning | str:
    """The reasoning and answer of a completion, or the reason it has none: ``"no_reasoning"`` (no
    ``<think>...</think>`` block at the start), ``"unparsable_answer"`` (nothing after ``</think>`` or a second
    ``<think>`` in the answer).

    >>> parse_reasoning("<think>1+2=3\\ncheck 3</think>3")
    Reasoning(body='1+2=3\\ncheck 3', answer='3')
    >>> parse_reasoning("3")
    'no_reasoning'
    """
    stripped = text.lstrip()
    if not stripped.startswith(THINK_OPEN) or THINK_CLOSE not in stripped:
        return "no_reasoning"
    body, answer = stripped[len(THINK_OPEN) :].split(THINK_CLOSE, 1)
    if THINK_OPEN in body:
        return "no_reasoning"
    answer = answer.split(EOS, 1)[0].strip()
    if not answer or THINK_OPEN in answer or THINK_CLOSE in answer:
        return "unparsable_answer"
    return Reasoning(body, answer)


def split_steps(body: str, delimiter: str = "\n") -> list[str]:
    """The steps of a reasoning body (``body.split(delimiter)``; empty steps kept, so it round-trips)."""
    if not delimiter:
        raise ConfigError("thoughtfold step delimiter must be a non-empty string")
    return body.split(delimiter)


def join_steps(steps: Sequence[str], delimiter: str = "\n") -> str:
    """Inverse of :func:`split_steps`: ``join_steps(split_steps(b, d), d) == b``."""
    return delimiter.join(steps)


def completion_text(steps: Sequence[str], answer: str, delimiter: str = "\n") -> str:
    """``<think>`` + steps + ``</think>`` + answer (what a verifier reads)."""
    return f"{THINK_OPEN}{join_steps(steps, delimiter)}{THINK_CLOSE}{answer}"


# -- binary search ----------------------------------------------------------------------------------------------
def bisect_shortest(n: int, max_iterations: int, n_passes: bool = False) -> Generator[int, bool, int | None]:
    """Lock-step form of :func:`shortest_passing`: yields the ``k`` to test, receives whether it passed, returns
    the smallest passing ``k`` found (``None`` if ``n`` failed). With ``n_passes`` the oracle is known to pass at
    ``n`` (e.g. the original, outcome-correct rollout) and ``n`` is not queried.

    Invariant: the returned ``k`` passed (or is ``n`` with ``n_passes``); ``hi`` only ever moves to a passing ``k``.
    """
    if n < 1:
        raise ValueError(f"shortest_passing needs n >= 1, got {n}")
    if max_iterations < 1:
        raise ConfigError(f"thoughtfold max_iterations must be >= 1, got {max_iterations}")
    calls = 0
    if not n_passes:
        calls += 1
        if not (yield n):
            return None
    lo, hi = 1, n
    while lo < hi and calls < max_iterations:
        mid = (lo + hi) // 2
        calls += 1
        if (yield mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def shortest_passing(n: int, passes: Callable[[int], bool], max_iterations: int) -> int | None:
    """The smallest ``k`` in ``1..n`` with ``passes(k)`` under a monotone oracle (``passes(k)`` implies
    ``passes(k + 1)``); ``None`` if even ``n`` fails.

    ``n`` is queried first, then a binary search over ``1..n-1``: at most ``max_iterations`` oracle calls in all, so
    ``ceil(log2 n) + 1`` calls find the exact threshold. With fewer calls the smallest ``k`` that passed so far is
    returned; a ``k`` that failed is never returned.
    """
    search = bisect_shortest(n, max_iterations)
    try:
        k = next(search)
        while True:
            k = search.send(bool(passes(k)))
    except StopIteration as stop:
        return stop.value


def run_searches(
    searches: Sequence[Generator[Any, bool, Any]], evaluate: Callable[[list[Any]], list[bool]]
) -> list[Any]:
    """Drive several lock-step searches together: each round collects the pending query of every live search,
    evaluates them in one call (one batched validation) and sends each answer back to its search. Returns each
    search's return value, in order."""
    results: list[Any] = [None] * len(searches)
    pending: dict[int, Any] = {}
    for i, search in enumerate(searches):
        try:
            pending[i] = next(search)
        except StopIteration as stop:
            results[i] = stop.value
    while pending:
        order = list(pending)
        answers = evaluate([pending[i] for i in order])
        pending = {}
        for i, answer in zip(order, answers):
            try:
                pending[i] = searches[i].send(bool(answer))
            except StopIteration as stop:
                results[i] = stop.value
    return results


# -- phase 1: tail truncation -----------------------------------------------------------------------------------
def tail_cut_points(steps: Sequence[str], min_steps: int = 1) -> list[int]:
    """The numbers of leading steps a snapped tail cut can keep, ascending, ending with ``len(steps)``:
    ``min_steps, ..., len(steps) - 1, len(steps)``.

    The released ``BinarySearchEnvironment._smart_cut`` first snaps the character cut to the previous newline, so a
    cut inside line ``j`` (0-based) keeps ``j`` whole lines; its keyword window is then the last kept line and ends
    at the cut, so the forward branch (``find("\\n", mid)`` past the end) keeps the same text and the backward branch
    only drops the final newline: the keywords (``see``, ``another``; ``yes``, ``no``, ...) never change the kept
    lines. Every prefix of whole steps is thus a cut point. The released cut snaps to any ``"\\n"``; here to the
    step delimiter (the same with the zoo's one-step-per-line tasks). Counts below ``min_steps`` are dropped (the
    released cut can keep 0 lines).
    """
    return [*range(max(int(min_steps), 0), len(steps)), len(steps)]


# -- phase 2: internal folding ----------------------------------------------------------------------------------
def fold_steps(scores: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` most important steps, in their original order (ties: the earlier step)."""
    if not 0 <= k <= len(scores):
        raise ValueError(f"cannot keep {k} of {len(scores)} steps")
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:k])


def bridging_steps(previous: Sequence[int], kept: Sequence[int]) -> list[int]:
    """Kept steps immediately after a newly pruned one: ``i`` in ``kept`` whose predecessor in ``previous`` (the
    step indices of the longer, previous best) is not kept. Both are ascending lists of original step indices."""
    kept_set = set(kept)
    out = []
    for before, index in zip(previous, previous[1:]):
        if index in kept_set and before not in kept_set:
            out.append(index)
    return out


def keep_range(n: int, min_keep_ratio: float, max_keep_ratio: float) -> tuple[int, int]:
    """``(k_min, k_max)``: the kept-step counts phase 2 searches, from the kept-fraction bounds (released: r in
    [0.1, 0.9]); at least 1 and at most ``n - 1`` (folding must prune something)."""
    k_min = max(1, math.ceil(min_keep_ratio * n))
    k_max = min(n - 1, math.floor(max_keep_ratio * n))
    return k_min, k_max


# -- importance -------------------------------------------------------------------------------------------------
def _pad_right(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long)


@torch.no_grad()
def answer_logprobs(
    model: torch.nn.Module, rows: Sequence[Sequence[int]], answer_starts: Sequence[int], pad_id: int
) -> torch.Tensor:
    """``[B]`` log-probability of each row's tokens from ``answer_starts[b]`` on (one right-padded forward)."""
    device = next(model.parameters()).device
    ids = _pad_right(rows, pad_id).to(device)
    attention = _pad_right([[1] * len(r) for r in rows], 0).to(device)
    labels = ids.masked_fill(attention == 0, IGNORE_INDEX)
    for b, start in enumerate(answer_starts):
        labels[b, :start] = IGNORE_INDEX
    logits = model(input_ids=ids, attention_mask=attention).logits
    return masked_sequence_logprobs(logits.float(), labels)


def leave_one_out_importance(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    steps: Sequence[str],
    answer: str,
    encode: Callable[[str], list[int]],
    pad_id: int,
    delimiter: str = "\n",
) -> list[float]:
    """Importance of each step = how much the answer's log-probability drops without it:
    ``log pi(answer | x, all steps) - log pi(answer | x, steps without i)`` ([assumed] the backend-agnostic default;
    the released code scores with attention). One batched forward of ``n + 1`` rows."""
    variants = [list(range(len(steps)))] + [[j for j in range(len(steps)) if j != i] for i in range(len(steps))]
    rows, starts = [], []
    tail = encode(f"{THINK_CLOSE}{answer}") + encode(EOS)
    for kept in variants:
        head = list(prompt_ids) + encode(THINK_OPEN + join_steps([steps[j] for j in kept], delimiter))
        rows.append(head + tail)
        starts.append(len(head) + 1)  # the answer tokens after </think> (and EOS) are scored
    logps = answer_logprobs(model, rows, starts, pad_id)
    return (logps[0] - logps[1:]).tolist()


def require_eager_attention(model: torch.nn.Module) -> None:
    """Raise a ``ConfigError`` unless ``model`` computes attention eagerly (attention weights are only returned by the
    eager implementation; SDPA / flash kernels never materialize them)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None) if config is not None else None
    if implementation != "eager":
        raise ConfigError(
            f"thoughtfold importance='attention' reads attention weights, but the backbone uses attention "
            f"implementation {implementation!r}; load it with attn_implementation=eager (backbone.attn_implementation="
            "eager for hf backbones) or use importance=leave_one_out"
        )


@torch.no_grad()
def attention_importance(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    steps: Sequence[str],
    answer: str,
    encode: Callable[[str], list[int]],
    delimiter: str = "\n",
) -> list[float]:
    """Importance of each step = mean attention it receives from the answer tokens (mean over layers, heads and
    answer positions; a step's score is the mean over its tokens, released code: sentence score = mean token score).
    Needs eager attention (:func:`require_eager_attention`)."""
    require_eager_attention(model)
    ids = list(prompt_ids) + encode(THINK_OPEN)
    spans = []
    for i, step in enumerate(steps):
        if i:
            ids += encode(delimiter)
        start = len(ids)
        ids += encode(step)
        spans.append((start, len(ids)))
    ids += encode(THINK_CLOSE)
    answer_start = len(ids)
    ids += encode(answer)
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([ids], device=device), output_attentions=True)
    attention = torch.stack([a[0].float() for a in out.attentions]).mean(dim=(0, 1))  # [T, T]
    from_answer = attention[answer_start:].mean(dim=0)
    return [float(from_answer[a:b].mean()) if b > a else 0.0 for a, b in spans]


# -- validation -------------------------------------------------------------------------------------------------
def answer_is_valid(answer_text: str, finished: bool) -> bool:
    """A validation answer is invalid when it re-opens the reasoning block or did not end within its budget (the
    original completion's length)."""
    return finished and THINK_OPEN not in answer_text and THINK_CLOSE not in answer_text


def passes(correct: Sequence[bool], valid: Sequence[bool], threshold: float, rate_over: str = "all") -> bool:
    """Accept a candidate when its correct rate reaches ``threshold``: correct valid answers over all samples
    (``rate_over='all'``, [assumed] default) or over the valid ones (``'valid'``; no valid answer fails)."""
    hits = sum(1 for c, v in zip(correct, valid) if c and v)
    total = len(correct) if rate_over == "all" else sum(valid)
    return total > 0 and hits / total >= threshold


# -- pairs ------------------------------------------------------------------------------------------------------
Segment = tuple[str, bool]  # (text, scored)


def completion_segments(
    steps: Sequence[str],
    answer: str,
    scored_steps: Sequence[int] | set[int] = (),
    score_answer: bool = False,
    delimiter: str = "\n",
) -> list[Segment]:
    """The completion as ``(text, scored)`` segments: ``<think>``, the steps (a step's text only; delimiters are
    never scored), ``</think>``, the answer and ``<eos>`` (scored together when ``score_answer``)."""
    scored = set(scored_steps)
    out: list[Segment] = [(THINK_OPEN, False)]
    for i, step in enumerate(steps):
        if i:
            out.append((delimiter, False))
        out.append((step, i in scored))
    out += [(THINK_CLOSE, False), (answer, score_answer), (EOS, score_answer)]
    return out


@dataclass
class PreferencePair:
    """One span-masked DPO pair of a prompt: ``chosen`` / ``rejected`` completions as scored segments.

    ``kind``: ``tail`` (phase 1), ``fold`` (phase 2), ``overjump_tail`` / ``overjump_fold`` (over-simplified
    failures). ``row``: the rollout row it came from.
    """

    row: int
    kind: str
    chosen: list[Segment]
    rejected: list[Segment]
    meta: dict[str, Any] = field(default_factory=dict)

    def text(self, side: str, scored_only: bool = False) -> str:
        segments = self.chosen if side == "chosen" else self.rejected
        return "".join(t for t, s in segments if s or not scored_only)


def tail_pair(
    row: int, steps: Sequence[str], keep: int, previous: int, answer: str, previous_answer: str, delimiter: str = "\n"
) -> PreferencePair:
    """Phase 1 concise success: chosen = the first ``keep`` steps + its verified answer (loss on the answer only),
    rejected = the previous best, ``previous`` steps + its answer (loss on the pruned tail steps ``keep..previous-1``
    only)."""
    if not 0 <= keep < previous <= len(steps):
        raise ValueError(f"tail pair needs 0 <= keep < previous <= {len(steps)}, got {keep}, {previous}")
    chosen = completion_segments(steps[:keep], answer, (), True, delimiter)
    rejected = completion_segments(steps[:previous], previous_answer, range(keep, previous), False, delimiter)
    return PreferencePair(row, "tail", chosen, rejected, {"pruned": previous - keep})


def fold_pair(
    row: int,
    steps: Sequence[str],
    kept: Sequence[int],
    previous: Sequence[int],
    answer: str,
    previous_answer: str,
    delimiter: str = "\n",
    bridge_fallback: str = "answer",
) -> PreferencePair:
    """Phase 2 concise success: chosen = the kept steps (original indices ``kept`` subset of ``previous``) + its
    verified answer, loss on the bridging steps; rejected = the previous best (``previous`` steps) + its answer,
    loss on the newly pruned steps only. When no kept step follows a pruned one (only the tail was pruned), the
    chosen side scores its answer (``bridge_fallback='answer'``, [assumed]) or nothing (``'none'``)."""
    kept_set, prev_set = set(kept), set(previous)
    if not kept_set < prev_set:
        raise ValueError("fold pair: the kept steps must be a strict subset of the previous ones")
    bridge = set(bridging_steps(previous, kept))
    pruned = prev_set - kept_set
    chosen_steps = [steps[i] for i in kept]
    chosen_scored = [j for j, i in enumerate(kept) if i in bridge]
    score_answer = not chosen_scored and bridge_fallback == "answer"
    chosen = completion_segments(chosen_steps, answer, chosen_scored, score_answer, delimiter)
    rejected_scored = [j for j, i in enumerate(previous) if i in pruned]
    rejected = completion_segments([steps[i] for i in previous], previous_answer, rejected_scored, False, delimiter)
    return PreferencePair(row, "fold", chosen, rejected, {"pruned": len(pruned), "bridging": len(bridge)})


def encode_pair(
    pair: PreferencePair, prompt_ids: Sequence[int], encode: Callable[[str], list[int]]
) -> dict[str, list[int]]:
    """Token rows of a pair: ``{side}_input_ids`` (prompt + completion) and ``{side}_labels`` (the token where the
    segment is scored, ``-100`` elsewhere). Segments are tokenized one by one, so a mask covers exactly its
    segment's tokens whatever the tokenizer merges across boundaries (the pair's rows may then tokenize the
    completion differently from the sampled one; with the zoo's character tokenizer they are identical)."""
    out: dict[str, list[int]] = {}
    for side, segments in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        ids, labels = list(prompt_ids), [IGNORE_INDEX] * len(prompt_ids)
        for text, scored in segments:
            piece = encode(text) if text else []
            ids += piece
            labels += piece if scored else [IGNORE_INDEX] * len(piece)
        out[f"{side}_input_ids"] = ids
        out[f"{side}_labels"] = labels
    return out


# -- the introspective search ------------------------------------------------------------------------------------
@dataclass
class FoldTarget:
    """An outcome-correct rollout to fold: its rollout ``row``, reasoning ``steps`` and ``answer``."""

    row: int
    steps: list[str]
    answer: str


@dataclass
class Verdict:
    """A validated candidate: ``passed`` (correct rate >= threshold), a correct valid sampled ``answer`` (for the
    chosen side) and a wrong sampled one (for over-simplified-failure pairs), ``None`` when there is none."""

    passed: bool
    answer: str | None = None
    wrong_answer: str | None = None


#: ``validate([(target index, candidate step indices), ...]) -> [Verdict, ...]``: one batched validation round.
Validate = Callable[[list[tuple[int, list[int]]]], list[Verdict]]
#: ``importance(target index, steps, answer) -> scores``: per-step importance of a reasoning.
Importance = Callable[[int, list[str], str], list[float]]


class ThoughtFolder:
    """Phase 1 (tail truncation) then phase 2 (internal folding) over a batch of correct rollouts, in lock step (one
    batched validation per search round), emitting span-masked pairs.

    Args:
        tail: run phase 1.
        fold: run phase 2 (on the phase-1 result).
        max_iterations: oracle calls per phase and rollout (released: 5).
        min_cot_length: phase 1 only for reasonings of at least this many characters (released: 300).
        min_steps: the fewest leading steps phase 1 keeps (:func:`tail_cut_points`).
        min_keep_ratio, max_keep_ratio: phase 2 kept-fraction range (released: r in [0.1, 0.9]); [reconstruction]
            the released search bisects r; here the kept count ``k`` is bisected over that range (``r = k / n``).
        pairs_from: ``chain`` = one pair per verified shortening against the previous best (released: "rejected =
            previous (longer) best"), ``final`` = one pair per phase, final best against the phase's start.
        bridge_fallback: chosen-side mask of a fold pair without bridging steps (:func:`fold_pair`).
        delimiter: the step delimiter (released: ``"\\n\\n"``; the zoo's tasks: ``"\\n"``).
    """

    def __init__(
        self,
        tail: bool = True,
        fold: bool = True,
        max_iterations: int = 5,
        min_cot_length: int = 300,
        min_steps: int = 1,
        min_keep_ratio: float = 0.1,
        max_keep_ratio: float = 0.9,
        pairs_from: str = "chain",
        bridge_fallback: str = "answer",
        delimiter: str = "\n",
    ) -> None:
        if max_iterations < 1:
            raise ConfigError(f"thoughtfold max_iterations must be >= 1, got {max_iterations}")
        if pairs_from not in ("chain", "final"):
            raise ConfigError(f"thoughtfold pairs_from must be 'chain' or 'final', got {pairs_from!r}")
        if bridge_fallback not in ("answer", "none"):
            raise ConfigError(f"thoughtfold bridge_fallback must be 'answer' or 'none', got {bridge_fallback!r}")
        if not 0 < min_keep_ratio <= max_keep_ratio < 1:
            raise ConfigError(
                f"thoughtfold keep ratios need 0 < min_keep_ratio <= max_keep_ratio < 1, got {min_keep_ratio}, "
                f"{max_keep_ratio}"
            )
        if not delimiter:
            raise ConfigError("thoughtfold delimiter must be a non-empty string")
        self.tail, self.fold = bool(tail), bool(fold)
        self.max_iterations = int(max_iterations)
        self.min_cot_length = int(min_cot_length)
        self.min_steps = int(min_steps)
        self.min_keep_ratio, self.max_keep_ratio = float(min_keep_ratio), float(max_keep_ratio)
        self.pairs_from = pairs_from
        self.bridge_fallback = bridge_fallback
        self.delimiter = delimiter

    def _chain_pairs(self, chain: list[tuple[Any, str]], make: Callable[..., PreferencePair]) -> list[PreferencePair]:
        links = list(zip(chain, chain[1:])) if self.pairs_from == "chain" else [(chain[0], chain[-1])]
        return [make(new, answer, prev, prev_answer) for (prev, prev_answer), (new, answer) in links if new != prev]

    def search(
        self, targets: Sequence[FoldTarget], validate: Validate, importance: Importance
    ) -> tuple[list[PreferencePair], dict[str, float]]:
        """Fold every target; returns the pairs (success pairs, then over-simplified failures, kind
        ``overjump_*``) and counts: ``candidates`` (validated prunings), ``verified`` (those that passed),
        ``tail_pruned_steps`` / ``fold_pruned_steps`` (steps removed by each phase, summed over targets)."""
        stats = {"candidates": 0.0, "verified": 0.0, "tail_pruned_steps": 0.0, "fold_pruned_steps": 0.0}
        verdicts: dict[tuple[int, tuple[int, ...]], Verdict] = {}
        # (target, failed candidate, verified best, its answer, verdict of the failed candidate)
        failures: list[tuple[int, list[int], list[int], str, Verdict]] = []

        def evaluate(queries: list[tuple[int, list[int]]]) -> list[bool]:
            fresh = [(t, kept) for t, kept in queries if (t, tuple(kept)) not in verdicts]
            for (t, kept), verdict in zip(fresh, validate(fresh) if fresh else []):
                verdicts[(t, tuple(kept))] = verdict
                stats["candidates"] += 1
                stats["verified"] += float(verdict.passed)
            return [verdicts[(t, tuple(kept))].passed for t, kept in queries]

        pairs: list[PreferencePair] = []
        # phase 1: prefixes of the reasoning at the snapped cut points
        best = [list(range(len(t.steps))) for t in targets]
        best_answer = [t.answer for t in targets]
        if self.tail:
            cuts = [
                tail_cut_points(t.steps, self.min_steps)
                if len(join_steps(t.steps, self.delimiter)) >= self.min_cot_length
                else [len(t.steps)]
                for t in targets
            ]
            history: list[list[int]] = [[] for _ in targets]

            def tail_search(i: int) -> Generator[tuple[int, list[int]], bool, None]:
                search = bisect_shortest(len(cuts[i]), self.max_iterations, n_passes=True)
                try:
                    index = next(search)
                    while True:
                        keep = cuts[i][index - 1]
                        history[i].append(keep)
                        index = search.send((yield (i, list(range(keep)))))
                except StopIteration:
                    return None

            run_searches([tail_search(i) for i in range(len(targets))], evaluate)
            for i, target in enumerate(targets):
                chain = [(len(target.steps), target.answer)]
                for keep in history[i]:
                    verdict = verdicts[(i, tuple(range(keep)))]
                    if verdict.passed and keep < chain[-1][0]:
                        chain.append((keep, verdict.answer))
                for keep in history[i]:
                    verdict = verdicts[(i, tuple(range(keep)))]
                    if not verdict.passed and keep < chain[-1][0]:
                        failures.append((i, list(range(keep)), list(range(chain[-1][0])), chain[-1][1], verdict))
                pairs += self._chain_pairs(
                    chain,
                    lambda new, answer, prev, prev_answer, i=i: tail_pair(
                        targets[i].row, targets[i].steps, new, prev, answer, prev_answer, self.delimiter
                    ),
                )
                best[i], best_answer[i] = list(range(chain[-1][0])), chain[-1][1]
                stats["tail_pruned_steps"] += len(target.steps) - chain[-1][0]
        # phase 2: the top-k steps of the phase-1 result by importance
        if self.fold:
            fold_history: list[list[list[int]]] = [[] for _ in targets]
            orders: list[list[int] | None] = []
            for i, target in enumerate(targets):
                n = len(best[i])
                k_min, k_max = keep_range(n, self.min_keep_ratio, self.max_keep_ratio)
                if n < 2 or k_min > k_max:
                    orders.append(None)
                    continue
                scores = importance(i, [target.steps[j] for j in best[i]], best_answer[i])
                # the steps by decreasing importance: the first k of them are fold_steps(scores, k)
                orders.append([best[i][j] for j in sorted(range(n), key=lambda j, s=scores: (-float(s[j]), j))])

            def fold_search(i: int) -> Generator[tuple[int, list[int]], bool, None]:
                ranked = orders[i]
                n = len(best[i])
                k_min, k_max = keep_range(n, self.min_keep_ratio, self.max_keep_ratio)
                search = bisect_shortest(k_max - k_min + 1, self.max_iterations)
                try:
                    index = next(search)
                    while True:
                        kept = sorted(ranked[: k_min + index - 1])
                        fold_history[i].append(kept)
                        index = search.send((yield (i, kept)))
                except StopIteration:
                    return None

            run_searches([fold_search(i) for i in range(len(targets)) if orders[i] is not None], evaluate)
            for i in range(len(targets)):
                chain: list[tuple[Any, str]] = [(tuple(best[i]), best_answer[i])]
                passed = [k for k in fold_history[i] if verdicts[(i, tuple(k))].passed]
                for kept in sorted(passed, key=len, reverse=True):
                    if len(kept) < len(chain[-1][0]):
                        chain.append((tuple(kept), verdicts[(i, tuple(kept))].answer))
                final = list(chain[-1][0])
                for kept in fold_history[i]:
                    verdict = verdicts[(i, tuple(kept))]
                    if not verdict.passed and len(kept) < len(final) and set(kept) < set(final):
                        failures.append((i, kept, final, chain[-1][1], verdict))
                pairs += self._chain_pairs(
                    chain,
                    lambda new, answer, prev, prev_answer, i=i: fold_pair(
                        targets[i].row,
                        targets[i].steps,
                        list(new),
                        list(prev),
                        answer,
                        prev_answer,
                        self.delimiter,
                        self.bridge_fallback,
                    ),
                )
                stats["fold_pruned_steps"] += len(best[i]) - len(final)
                best[i], best_answer[i] = final, chain[-1][1]
        pairs += [self._overjump(targets[i], *failure) for i, *failure in failures if failure[-1].wrong_answer]
        return pairs, stats

    def _overjump(
        self, target: FoldTarget, failed: list[int], kept: list[int], answer: str, verdict: Verdict
    ) -> PreferencePair:
        """Over-simplified failure ([reconstruction]; built but not trained by default, as in the released
        trainer, which skips "overjump" strategies; its README says failures are used as rejected samples):
        chosen = the verified best ``kept`` + its answer, loss on the steps the failed candidate dropped; rejected =
        the failed candidate + a wrong sampled answer, loss on that answer."""
        failed_set = set(failed)
        dropped = [j for j, i in enumerate(kept) if i not in failed_set]
        tail = failed == list(range(len(failed))) and kept == list(range(len(kept)))
        kind = "overjump_tail" if tail else "overjump_fold"
        chosen = completion_segments([target.steps[i] for i in kept], answer, dropped, False, self.delimiter)
        rejected = completion_segments(
            [target.steps[i] for i in failed], verdict.wrong_answer or "", (), True, self.delimiter
        )
        return PreferencePair(target.row, kind, chosen, rejected, {"pruned": len(kept) - len(failed)})


# -- ground truth -----------------------------------------------------------------------------------------------
def reasoning_stats(
    text: str,
    reference: str,
    reference_redundant: Sequence[bool],
    count_tokens: Callable[[str], int],
    delimiter: str = "\n",
) -> dict[str, float]:
    """``think_tokens`` of a generated completion (``count_tokens`` of its reasoning body; 0 without a reasoning
    block) and, when it has one, :func:`redundancy_stats` against the labelled reference completion."""
    parsed = parse_reasoning(text)
    if isinstance(parsed, str):
        return {"think_tokens": 0.0}
    ref = parse_reasoning(reference)
    ref_steps = split_steps(ref.body if not isinstance(ref, str) else "", delimiter)
    return {
        "think_tokens": float(count_tokens(parsed.body)),
        **redundancy_stats(parsed.body, ref_steps, reference_redundant, delimiter),
    }


def line_removals(redundant: Sequence[bool]) -> list[tuple[str, list[int]]]:
    """The candidates of the line-removal probe of a labelled reasoning of ``len(redundant)`` steps: ``("full",
    every step)``, then ``("essential", every step but j)`` for each essential step j and ``("redundant", every step
    but j)`` for each redundant step j (kept step indices, in order). Validated like ThoughtFold's prunings, they
    measure whether verification can tell a dropped essential line from a dropped redundant one."""
    steps = range(len(redundant))
    return [("full", list(steps))] + [
        ("redundant" if is_redundant else "essential", [i for i in steps if i != j])
        for j, is_redundant in enumerate(redundant)
    ]


def redundancy_stats(
    body: str, reference_steps: Sequence[str], reference_redundant: Sequence[bool], delimiter: str = "\n"
) -> dict[str, float]:
    """Ground-truth redundancy of a generated reasoning against a reference with labelled redundant steps:
    ``think_steps`` (non-empty steps), ``redundant_rate`` (fraction of them that are not essential reference steps),
    ``essential_retention`` (fraction of the reference's essential steps present)."""
    essential = [s for s, r in zip(reference_steps, reference_redundant) if not r]
    steps = [s.strip() for s in split_steps(body, delimiter) if s.strip()]
    essential_set = {s.strip() for s in essential}
    redundant = sum(1 for s in steps if s not in essential_set)
    present = set(steps)
    return {
        "think_steps": float(len(steps)),
        "redundant_rate": redundant / len(steps) if steps else 0.0,
        "essential_retention": sum(1 for s in essential if s.strip() in present) / len(essential) if essential else 1.0,
    }


__all__ = [
    "FoldTarget",
    "PreferencePair",
    "Reasoning",
    "ThoughtFolder",
    "Verdict",
    "answer_is_valid",
    "answer_logprobs",
    "attention_importance",
    "bisect_shortest",
    "bridging_steps",
    "completion_segments",
    "completion_text",
    "encode_pair",
    "fold_pair",
    "fold_steps",
    "join_steps",
    "keep_range",
    "leave_one_out_importance",
    "line_removals",
    "parse_reasoning",
    "passes",
    "reasoning_stats",
    "redundancy_stats",
    "require_eager_attention",
    "run_searches",
    "shortest_passing",
    "split_steps",
    "tail_cut_points",
    "tail_pair",
]
