"""DTS: Decoding Tree Sketching -- training-free branching at decision tokens, as a decoder (``module/decoder=dts``).

Paper: *DTS: Decoding Tree Sketching* (arXiv 2511.00640, ICML 2026); official code
github.com/ZichengXu/Decoding-Tree-Sketching, ``decoding_tree_sketching/kvbatch_decoder.py`` (commit f4a7e6e), whose
rules this decoder follows (written anew for the transformers-5 ``Cache`` API; the official one uses
``DynamicCache.key_cache`` / ``to_legacy_cache``, removed in transformers 5).

All active hypotheses of all prompts advance one token per step in lockstep, in one batched forward over one
stacked KV cache. At each step every hypothesis looks at its next-token distribution ``p = softmax(z / T_ent)``:

* it **branches** into its top-``k`` tokens (one child each, deterministic) when the branch rule holds and its
  prompt's tree is not frozen; the rule is ``H <= tau_H and V > tau_V`` ("decision token": few competing options;
  the ICML code, Feb 2026) or, as an option, ``H > tau_H`` (the first release, Oct 2025);
* otherwise it **samples** one token (at the decoder's ``temperature``, or the module's sampling settings).

A prompt's tree **freezes** for good once its number of active hypotheses reaches ``max_active``. The check runs
before each hypothesis, so the count can overshoot the cap by at most ``k - 2`` within the step that reaches it.
A hypothesis that emits EOS (or a stop string) is **finished**. A prompt is done once it has ``num_traces``
finished traces (counted at the end of a step: every trace finishing in that step is kept, in order), or, with
``early_stop``, as soon as the finished answers reach a consensus. Then, as the official decoder and runner
(``kvbatch_decoder.generate`` returns every trace of ``finished``; ``run_experiments.online_majority_vote`` votes
over all of them), **every finished trace votes** (``vote_over=finished``, so ``|finished|`` may exceed ``B``):

* **DTS-Greedy** (``mode=greedy``, ``B = 1``): the traces that finish in the first step in which any finishes
  (lockstep: the shortest); a trace whose answer cannot be parsed does not win over one that finished with it;
* **DTS-Stable** (``mode=stable``): majority vote (:func:`~zoo.generation.voting.majority_vote`) over the answers
  of the finished traces.

Traces without an answer (``None`` or empty) do not vote; the returned trajectory is the first finished trace that
gave the winning answer, or the first finished trace when none has an answer (the runner's ``traces[0]``). The
option ``vote_over=first_b`` votes over the first ``B`` finished traces only (finish order: step, then row).

When nothing finishes within ``max_new_tokens``, the active hypothesis with the highest log-probability (``sum log
softmax(z)``, temperature 1, as the official code) is returned, unfinished.

Equation -> function:

=====================================================================  =================================================
paper / official code                                                  here
=====================================================================  =================================================
``H = -sum_v p_v log p_v``, ``V = sum_v p_v (-log p_v - H)^2``,        :func:`entropy_varentropy`
``p = softmax(z / T_ent)``
decision token ``H <= tau_H and V > tau_V`` (v2); ``H > tau_H`` (v1)   :func:`is_branch_point`
children = distinct top-k ids by log-prob (ties: lower id first)       :func:`branch_children`
freeze at ``#active >= max_active``; lockstep step; finish; fallback   :meth:`DTSDecoder.decode`
majority vote over the finished answers; consensus early stop        :func:`~zoo.generation.voting.majority_vote`,
                                                                       :func:`~zoo.generation.voting.winner_share`
=====================================================================  =================================================

KV cache (``share_cache``, on by default): what hypotheses have in common is stored once. After the prefill, the
stacked cache becomes a :class:`~zoo.generation.tree_cache.TreeKVCache`: per layer one store of token keys/values
and one slot table ``[#active, L]`` saying which stored token every hypothesis reads at each position. When
hypotheses branch or finish, rows follow them through ``Cache.reorder_cache`` (the public API beam search uses;
:meth:`~zoo.generation.sampling.IncrementalDecoder.reorder_rows`), which here reorders the slot table only: the
children of a branch read their parent's slots, so the prompt **and every branch point's prefix** (all the tokens
the hypotheses have in common) are held once, and each step stores one new token per active hypothesis. Nothing
is copied at a branch; the only copies are (1) each forward's dense ``[#active, heads, L, head_dim]`` view that
every attention layer receives, gathered from the store for that layer and freed after it (one layer at a time:
the model sees the same keys/values as with a stacked cache, so the tokens out are the same) and (2) a compaction
of the stores when finished hypotheses leave more than half of the stored tokens unread. The stored cache grows
as ``prompt + tokens decoded`` instead of ``#active x (prompt + generated)`` -- the official decoder copies caches
per branch and stacks and splits them at every step. Caches that are not plain full-attention ``DynamicCache`` s
(sliding windows, linear attention, quantized caches), and ``share_cache=false``, keep the stacked cache, whose
rows are copied at every branch (``reorder_cache``'s ``index_select``).

Sampling noise is drawn per hypothesis *slot* (the first child of a branch keeps its parent's slot, the others
take the lowest slot freed by a finished hypothesis, or a new one): without branching the slots are the prompts, so
the output equals the plain sampler's (:class:`~zoo.generation.decoders.SampleDecoder`) with the same generator;
the noise of a step is ``[slots, vocabulary]``, with slots bounded by the most hypotheses alive at once. With
branching, a prompt's samples depend on the other prompts of the batch (they share the noise draws).

A row with fewer than two possible tokens (``-inf`` elsewhere, e.g. after a logits processor) does not branch.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.answers import AnswerVerifier
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill, padded_context
from zoo.generation.sampling import (
    decode_completion,
    decode_completions,
    ends_with_stop,
    max_token_length,
    sample_next,
    stop_token_ids,
)
from zoo.generation.tree_cache import TreeKVCache
from zoo.generation.voting import VotedResult, check_verifier, first_index, majority_vote, stack_rows, winner_share
from zoo.protocols import SamplingParams

BRANCH_RULES = ("decision_token", "high_entropy")
MODES = ("greedy", "stable")
VOTE_OVER = ("finished", "first_b")
DEFAULT_STABLE_TRACES = 8


def entropy_varentropy(logits: torch.Tensor, temperature: float = 0.6) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy and varentropy of the next-token distribution ``p = softmax(logits / temperature)`` (natural log).

    ``H = -sum_v p_v log p_v`` and ``V = sum_v p_v (-log p_v - H)^2`` (the variance of the surprisal). Tokens of
    probability 0 (``-inf`` logits) contribute nothing.

    Args:
        logits: ``[..., V]`` next-token logits.
        temperature: ``T_ent`` (0.6 in the paper's code).

    Returns:
        ``(H [...], V [...])`` in float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    p = logp.exp()
    surprisal = torch.where(p > 0, -logp, torch.zeros_like(logp))
    entropy = (p * surprisal).sum(-1)
    varentropy = (p * (surprisal - entropy[..., None]) ** 2).sum(-1)
    return entropy, varentropy


def is_branch_point(
    entropy: torch.Tensor,
    varentropy: torch.Tensor,
    rule: str = "decision_token",
    entropy_threshold: float = 2.5,
    varentropy_threshold: float = 1.5,
) -> torch.Tensor:
    """``[...]`` bool: where a hypothesis branches.

    ``decision_token`` (the ICML code): ``H <= tau_H and V > tau_V``; ``high_entropy`` (first release): ``H > tau_H``
    (``varentropy_threshold`` unused).
    """
    if rule == "decision_token":
        return (entropy <= entropy_threshold) & (varentropy > varentropy_threshold)
    if rule == "high_entropy":
        return entropy > entropy_threshold
    raise ValueError(f"branch rule must be one of {BRANCH_RULES}, got {rule!r}")


def branch_children(scores: torch.Tensor, k: int) -> list[int]:
    """The children of a branch: the ``k`` most likely distinct token ids of ``scores`` (``[V]`` logits or
    log-probs), ordered by log-probability, ties broken by the lower id (the official ``(-logp, id)`` sort).
    Tokens of probability 0 (``-inf``) are left out, so a row with fewer than ``k`` possible tokens has fewer
    children (at least one)."""
    values, ids = torch.sort(scores.float(), descending=True, stable=True)
    values, ids = values[:k].tolist(), ids[:k].tolist()
    children = [i for v, i in zip(values, ids) if v != -math.inf]
    return children or ids[:1]


@dataclass(frozen=True)
class BranchEvent:
    """One hypothesis branching.

    Attributes:
        step: position of the branching token in the trajectory (0 = the first generated token).
        entropy, varentropy: ``H`` and ``V`` of the distribution it branched on.
        children: the token ids of its children, most likely first.
    """

    step: int
    entropy: float
    varentropy: float
    children: tuple[int, ...]


@dataclass(kw_only=True)
class DTSResult(VotedResult):
    """Output of :class:`DTSDecoder`: the :class:`~zoo.generation.voting.VotedResult` fields (one completion per
    prompt; ``answers`` = the answers of the traces that voted, ``decoded_tokens`` = tokens emitted by all its
    hypotheses) plus, per prompt:

    Attributes:
        branch_events: every branch of the prompt's tree, in order.
        active_counts: number of active hypotheses at the start of each step.
        frozen_at: the step at which branching froze (``None``: never).
        finished_lengths: lengths (tokens, EOS included) of the traces that finished (EOS or a stop string), in
            finish order, including any beyond ``num_traces`` that finished in the same step.
        early_stopped: the consensus early stop ended the prompt.
        entropies, varentropies: ``H`` and ``V`` at each token of the returned trajectory.
    """

    branch_events: list[list[BranchEvent]]
    active_counts: list[list[int]]
    frozen_at: list[int | None]
    finished_lengths: list[list[int]]
    early_stopped: list[bool]
    entropies: list[list[float]]
    varentropies: list[list[float]]

    def row_meta(self) -> dict[str, list[Any]]:
        return {
            **super().row_meta(),
            "branch_events": [len(e) for e in self.branch_events],
            "branch_steps": [[e.step for e in events] for events in self.branch_events],
            "max_active": [max(c, default=0) for c in self.active_counts],
            "mean_active": [sum(c) / len(c) if c else 0.0 for c in self.active_counts],
            "num_finished": [len(lengths) for lengths in self.finished_lengths],
            "entropies": self.entropies,
            "varentropies": self.varentropies,
        }


class _Node:
    """One generated token of a hypothesis; the trajectory is the chain of parents (no list copy per child)."""

    __slots__ = ("depth", "entropy", "logprob", "parent", "token", "varentropy")

    def __init__(self, token: int, logprob: float, entropy: float, varentropy: float, parent: _Node | None) -> None:
        self.token = token
        self.logprob = logprob
        self.entropy = entropy
        self.varentropy = varentropy
        self.parent = parent
        self.depth = 1 if parent is None else parent.depth + 1

    def chain(self) -> list[_Node]:
        nodes, node = [], self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def tail(self, n: int) -> list[int]:
        out, node = [], self
        while node is not None and len(out) < n:
            out.append(node.token)
            node = node.parent
        return out[::-1]


class _Hyp:
    """An active hypothesis: its prompt, noise slot, last token node and log-probability at temperature 1."""

    __slots__ = ("node", "prompt", "score", "slot")

    def __init__(self, prompt: int, slot: int, node: _Node | None = None, score: float = 0.0) -> None:
        self.prompt, self.slot, self.node, self.score = prompt, slot, node, score

    def tokens(self) -> list[int]:
        return [] if self.node is None else [n.token for n in self.node.chain()]


class _Tree:
    """Book-keeping of one prompt."""

    def __init__(self) -> None:
        self.frozen_at: int | None = None
        self.finished: list[tuple[_Hyp, str | None]] = []
        self.done = False
        self.early_stopped = False
        self.events: list[BranchEvent] = []
        self.active_counts: list[int] = []
        self.decoded_tokens = 0


class DTSDecoder(Decoder):
    """Decoding Tree Sketching (``module/decoder=dts``); see the module docstring for the algorithm.

    Args:
        entropy_threshold: ``tau_H`` (2.5; the first release used 3.5 with ``high_entropy``).
        varentropy_threshold: ``tau_V`` (1.5); ``inf`` never branches (the plain sampler).
        branch_top_k: children per branch ``k`` (3); between 2 and the vocabulary size.
        max_active: active hypotheses per prompt at which branching freezes (12 in the README; 48 in the paper's
            run script).
        entropy_temperature: ``T_ent`` of :func:`entropy_varentropy` (0.6).
        temperature: sampling temperature of tokens that do not branch (0.6, the paper's runs); ``0`` = greedy
            (the official ``prefer_greedy_when_confident``); ``None`` = the module's sampling settings.
        mode: ``greedy`` (stop at the first finished trace) or ``stable`` (stop at ``num_traces`` finished traces).
        num_traces: ``B``; ``None`` = 1 for ``greedy``, 8 for ``stable`` (``greedy`` requires 1).
        vote_over: which finished traces vote: ``finished`` (all of them, the traces finishing in the stopping
            step included: the official rule) or ``first_b`` (the first ``B`` in finish order).
        branch_rule: ``decision_token`` (``H <= tau_H and V > tau_V``, default) or ``high_entropy`` (``H > tau_H``).
        early_stop: stable mode: stop a prompt once at least ``early_stop_min_answers`` finished answers exist and
            the most common holds a share ``>= early_stop_min_share`` (official defaults 4 and 0.4; off by default:
            the official path raises a NameError when it fires, so the paper's numbers cannot come from it).
        verifier: extracts the answer of a finished trace (``None``: the shared ``</think>ANSWER`` format).
        share_cache: store what hypotheses have in common (the prompt, every branch point's prefix) once
            (:class:`~zoo.generation.tree_cache.TreeKVCache`; the same tokens out); ``False`` keeps a stacked cache
            whose rows copy the shared prefix.
        processors, hooks: as every :class:`~zoo.generation.decoders.Decoder` (processors change the distribution
            that H, V, the children and the samples are computed from).
    """

    def __init__(
        self,
        entropy_threshold: float = 2.5,
        varentropy_threshold: float = 1.5,
        branch_top_k: int = 3,
        max_active: int = 12,
        entropy_temperature: float = 0.6,
        temperature: float | None = 0.6,
        mode: str = "greedy",
        num_traces: int | None = None,
        branch_rule: str = "decision_token",
        early_stop: bool = False,
        early_stop_min_answers: int = 4,
        early_stop_min_share: float = 0.4,
        vote_over: str = "finished",
        verifier: AnswerVerifier | None = None,
        share_cache: bool = True,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
    ) -> None:
        super().__init__(processors, hooks)
        field = "module.decoder"
        if int(branch_top_k) < 2:
            raise ConfigError(
                f"{field}.branch_top_k must be >= 2 (a branch has at least two children), got {branch_top_k}"
            )
        if int(max_active) < 1:
            raise ConfigError(f"{field}.max_active must be >= 1, got {max_active}")
        if mode not in MODES:
            raise ConfigError(f"{field}.mode must be one of {MODES}, got {mode!r}")
        if vote_over not in VOTE_OVER:
            raise ConfigError(f"{field}.vote_over must be one of {VOTE_OVER}, got {vote_over!r}")
        if branch_rule not in BRANCH_RULES:
            raise ConfigError(f"{field}.branch_rule must be one of {BRANCH_RULES}, got {branch_rule!r}")
        if num_traces is None:
            num_traces = 1 if mode == "greedy" else DEFAULT_STABLE_TRACES
        if int(num_traces) < 1:
            raise ConfigError(f"{field}.num_traces must be >= 1, got {num_traces}")
        if mode == "greedy" and int(num_traces) != 1:
            raise ConfigError(
                f"{field}.num_traces={num_traces} needs mode=stable: mode=greedy returns the first finished trace "
                "(num_traces 1)"
            )
        if not entropy_temperature > 0:
            raise ConfigError(f"{field}.entropy_temperature must be > 0, got {entropy_temperature}")
        if temperature is not None and temperature < 0:
            raise ConfigError(f"{field}.temperature must be >= 0 (0 = greedy) or null, got {temperature}")
        if int(early_stop_min_answers) < 1 or not 0 < early_stop_min_share <= 1:
            raise ConfigError(
                f"{field}.early_stop_min_answers must be >= 1 and early_stop_min_share in (0, 1], got "
                f"{early_stop_min_answers} and {early_stop_min_share}"
            )
        for name, value in (("entropy_threshold", entropy_threshold), ("varentropy_threshold", varentropy_threshold)):
            if math.isnan(float(value)):
                raise ConfigError(f"{field}.{name} must be a number (inf allowed), got {value!r}")
        if branch_rule == "decision_token" and float(entropy_threshold) < 0:
            # H >= 0 always, so H <= tau_H never holds: a plain sampler that looks like DTS
            raise ConfigError(
                f"{field}.entropy_threshold={entropy_threshold} never branches: branch_rule=decision_token branches "
                "where the entropy H <= entropy_threshold, and H is never negative. Use a threshold >= 0 (the paper: "
                "2.5); to decode without branching on purpose set module.decoder.varentropy_threshold=inf"
            )
        self.entropy_threshold = float(entropy_threshold)
        self.varentropy_threshold = float(varentropy_threshold)
        self.branch_top_k = int(branch_top_k)
        self.max_active = int(max_active)
        self.entropy_temperature = float(entropy_temperature)
        self.temperature = temperature
        self.mode = mode
        self.num_traces = int(num_traces)
        self.branch_rule = branch_rule
        self.early_stop = bool(early_stop)
        self.early_stop_min_answers = int(early_stop_min_answers)
        self.early_stop_min_share = float(early_stop_min_share)
        self.vote_over = vote_over
        self.verifier = check_verifier(verifier, field)
        self.share_cache = bool(share_cache)

    # -- the loop ---------------------------------------------------------------------------------------------
    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> DTSResult:
        sample = params.with_temperature(self.temperature)
        eos, device = stop_token_ids(model, tokenizer), prefill.device
        window = max_token_length(tokenizer, sample.stop_strings) + 2
        state = prefill.start(model)
        vocab = int(state.next_logits.shape[-1])
        if self.branch_top_k > vocab:
            raise ConfigError(
                f"module.decoder.branch_top_k={self.branch_top_k} exceeds the vocabulary of the model ({vocab} tokens)"
            )
        state.check_reorderable()
        if self.share_cache:
            shared = TreeKVCache.from_cache(state.cache)
            if shared is not None:  # otherwise the stacked cache as it is (e.g. sliding windows)
                state.cache = shared
        trees = [_Tree() for _ in range(prefill.batch_size)]
        hyps = [_Hyp(prompt=i, slot=i) for i in range(prefill.batch_size)]
        num_slots, free_slots = prefill.batch_size, []
        for step in range(sample.max_new_tokens):
            scores = state.next_logits
            if self.processors:
                contexts = [h.tokens() for h in hyps]
                prompts = prefill.prompt_ids[[h.prompt for h in hyps]]
                scores = self.process(padded_context(prompts, contexts, tokenizer.pad_token_id), scores)
            entropy, varentropy = entropy_varentropy(scores, self.entropy_temperature)
            branches = is_branch_point(
                entropy, varentropy, self.branch_rule, self.entropy_threshold, self.varentropy_threshold
            ).tolist()
            slots = torch.tensor([h.slot for h in hyps], device=device)
            sampled, _ = sample_next(scores, sample, generator, rows=slots, num_rows=num_slots)
            logp_sample = torch.log_softmax(scores.float() / sample.temperature, dim=-1)
            logp_model = torch.log_softmax(scores.float(), dim=-1)
            sampled_lp = logp_sample.gather(-1, sampled[:, None]).squeeze(-1).tolist()
            sampled_score = logp_model.gather(-1, sampled[:, None]).squeeze(-1).tolist()
            entropy, varentropy, sampled = entropy.tolist(), varentropy.tolist(), sampled.tolist()

            # 1) plan the children of every hypothesis (the freeze check runs before each one, per prompt)
            counts = Counter(h.prompt for h in hyps)
            for prompt, count in counts.items():
                trees[prompt].active_counts.append(count)
            parents: list[int] = []
            children: list[_Hyp] = []
            for row, hyp in enumerate(hyps):
                tree = trees[hyp.prompt]
                if tree.frozen_at is None and counts[hyp.prompt] >= self.max_active:
                    tree.frozen_at = step
                tokens = (
                    branch_children(scores[row], self.branch_top_k) if tree.frozen_at is None and branches[row] else []
                )
                if len(tokens) > 1:  # a row with a single possible token does not branch
                    tree.events.append(BranchEvent(step, entropy[row], varentropy[row], tuple(tokens)))
                    counts[hyp.prompt] += len(tokens) - 1
                    picked = torch.tensor(tokens, device=device)
                    lps, gains = logp_sample[row, picked].tolist(), logp_model[row, picked].tolist()
                else:
                    tokens, lps, gains = [sampled[row]], [sampled_lp[row]], [sampled_score[row]]
                for rank, (token, lp, gain) in enumerate(zip(tokens, lps, gains)):
                    slot = hyp.slot
                    if rank and free_slots:
                        slot = heapq.heappop(free_slots)
                    elif rank:
                        slot, num_slots = num_slots, num_slots + 1
                    node = _Node(token, lp, entropy[row], varentropy[row], hyp.node)
                    children.append(_Hyp(hyp.prompt, slot, node, hyp.score + gain))
                    parents.append(row)

            # 2) finished traces (in row order), then the rows that go on
            going_on: list[tuple[int, _Hyp]] = []
            for row, child in zip(parents, children):
                tree = trees[child.prompt]
                tree.decoded_tokens += 1
                if tree.early_stopped:
                    continue
                if not self.ends(tokenizer, child, eos, sample.stop_strings, window):
                    going_on.append((row, child))
                    continue
                tree.finished.append(
                    (child, self.verifier.extract_answer(decode_completion(tokenizer, child.tokens(), eos)))
                )
                if len(tree.finished) >= self.num_traces:
                    tree.done = True
                if self.mode == "stable" and self.early_stop and self.consensus([a for _, a in tree.finished]):
                    tree.done = tree.early_stopped = True
            going_on = [(row, child) for row, child in going_on if not trees[child.prompt].done]
            rows, previous = [row for row, _ in going_on], len(hyps)
            hyps = [child for _, child in going_on]
            for slot in {c.slot for c in children} - {h.slot for h in hyps}:  # finished or dropped: reusable
                heapq.heappush(free_slots, slot)
            if not hyps or step + 1 == sample.max_new_tokens:
                break
            if rows != list(range(previous)):  # a branch or a finish: the stacked cache follows the hypotheses
                state.reorder_rows(torch.tensor(rows, device=device))
            state.feed(torch.tensor([[h.node.token] for h in hyps], device=device))
        return self.result(tokenizer, prefill, trees, hyps, eos)

    @staticmethod
    def ends(
        tokenizer: PreTrainedTokenizerBase, hyp: _Hyp, eos: Collection[int], stop_strings: Sequence[str], window: int
    ) -> bool:
        """Whether the hypothesis just emitted a stop token (:func:`~zoo.generation.sampling.stop_token_ids`) or
        completed a stop string."""
        if hyp.node.token in eos:
            return True
        return bool(stop_strings) and ends_with_stop(tokenizer, hyp.node.tail(window), stop_strings, window)

    def consensus(self, answers: Sequence[str | None]) -> bool:
        """The stable-mode early stop: enough valid answers and a large enough share for the most common."""
        count, share = winner_share(answers)
        return count >= self.early_stop_min_answers and share >= self.early_stop_min_share

    # -- the answer of each prompt ----------------------------------------------------------------------------
    def result(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        trees: list[_Tree],
        hyps: list[_Hyp],
        stop_ids: Collection[int] | None = None,
    ) -> DTSResult:
        chosen: list[_Hyp | None] = []
        answers: list[list[str | None]] = []
        voted: list[str | None] = []
        for prompt, tree in enumerate(trees):
            if tree.finished:
                voting = tree.finished if self.vote_over == "finished" else tree.finished[: self.num_traces]
                votes = [a for _, a in voting]
                winner = majority_vote(votes)
                chosen.append(voting[first_index(votes, winner)][0])
                answers.append(votes)
                voted.append(winner)
            else:  # nothing finished within the budget: the most likely active hypothesis (official fallback)
                active = [h for h in hyps if h.prompt == prompt]
                chosen.append(max(active, key=lambda h: h.score) if active else None)
                answers.append([])
                voted.append(None)
        chains = [[] if h is None or h.node is None else h.node.chain() for h in chosen]
        ids, mask, logprobs = stack_rows(
            [[n.token for n in c] for c in chains],
            [[n.logprob for n in c] for c in chains],
            tokenizer.pad_token_id,
            prefill.device,
        )
        finished_ids = {id(h) for tree in trees for h, _ in tree.finished}
        return DTSResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
            texts=decode_completions(tokenizer, ([n.token for n in c] for c in chains), stop_ids),
            finished=torch.tensor([id(h) in finished_ids for h in chosen], dtype=torch.bool, device=prefill.device),
            answers=answers,
            voted=voted,
            decoded_tokens=[t.decoded_tokens for t in trees],
            branch_events=[t.events for t in trees],
            active_counts=[t.active_counts for t in trees],
            frozen_at=[t.frozen_at for t in trees],
            finished_lengths=[[h.node.depth for h, _ in t.finished] for t in trees],
            early_stopped=[t.early_stopped for t in trees],
            entropies=[[n.entropy for n in c] for c in chains],
            varentropies=[[n.varentropy for n in c] for c in chains],
        )

    def __repr__(self) -> str:
        return (
            f"DTSDecoder(mode={self.mode}, B={self.num_traces}, rule={self.branch_rule}, "
            f"tau_H={self.entropy_threshold}, tau_V={self.varentropy_threshold}, k={self.branch_top_k}, "
            f"max_active={self.max_active})"
        )


__all__ = [
    "BRANCH_RULES",
    "MODES",
    "VOTE_OVER",
    "BranchEvent",
    "DTSDecoder",
    "DTSResult",
    "branch_children",
    "entropy_varentropy",
    "is_branch_point",
]
