"""The N-MARS GRPO reward: outcome of the resolved output, a backtrack term for the use of ``<UNDO>``, format.

Paper: "N-MARS: Non-Monotonic AutoRegressive Sequence modeling" (ICML 2026 poster 61349; no arXiv release). There is
no published reward; this is a [reconstruction] of the authors' work-in-progress ``llmhalluc/reward/bt.py``
(github.com/Tianyi-Billy-Ma/Halluc; notes ``rl.md`` 5(a)), with its defaults:

``r = w_o * outcome + w_b * backtrack + w_f * format`` with ``(w_o, w_b, w_f) = (1.0, 0.6, 0.3)`` where, for a
physical completion ``c`` (errors and UNDOs), its resolved output ``f = resolve(c)``, its first attempt ``i`` (the
tokens before the first UNDO) and the reference completion ``y``,

- ``acc(x, y)`` = 1 if ``x == y`` else the fraction of positions ``t < |y|`` with ``x_t == y_t``
  -> :func:`token_accuracy`;
- ``outcome`` = 1 if ``f == y`` else ``0.5 * acc(f, y)`` -> :func:`outcome_term`;
- ``backtrack`` with ``k`` UNDOs -> :func:`backtrack_term`: ``-1`` if ``k > 20`` (excessive); for ``k = 0``: 0 when
  ``c == y``, else ``-0.1`` (an error left uncorrected); otherwise it depends on ``first_attempt_check``:

  * ``prefix`` (default, [reconstruction]): ``-0.2 * k`` when ``i`` is an error-free prefix of ``y`` (the UNDOs
    retracted correct tokens: unnecessary); ``-0.3`` when ``f != y`` (failed correction); else (an error was
    corrected) ``+0.4 * (1 - acc(i, y)) + 0.25 / sqrt(k)`` when the first attempt was substantial
    (``|i| > 0.5 |y|``), ``-0.2 * k`` when it was not (stuttering);
  * ``exact`` (the WIP code as written): with ``gain = acc(f, y) - acc(i, y)``, the bonus when ``gain > 0`` and the
    attempt was substantial, ``-0.2 * k`` when ``gain > 0`` from a short attempt or when ``i == y``, ``-0.3``
    otherwise. A partial first attempt always has ``acc(i, y) < 1``, so retracting a correct token mid-sequence, or
    "correcting" to another wrong output, still earns the bonus whenever the output got longer; ``prefix`` closes
    these loopholes;

- ``format`` = 1 if the resolved text is ``<think>...</think>answer`` [adapted: the WIP reward checks a boxed answer;
  the zoo's tasks use this format] -> :class:`zoo.rl.FormatReward`.

Hence (``prefix``): correct without UNDO (1 + 0 + f) > correct after an unnecessary UNDO (1 - 0.6 * 0.2 k + f), and a
wrong first attempt corrected to the right answer beats staying wrong. Like the WIP reward it pays a correction bonus on
top of the outcome, so a substantial wrong attempt that is then corrected scores above a correct answer written at once
(``1 + 0.6 * (0.4 g + 0.25 / sqrt(k))`` vs ``1``); lower ``backtrack_weight`` where that matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from zoo.errors import ConfigError
from zoo.generation.undo import DEFAULT_MAX_UNDOS, UNDO_TOKEN, UndoTrace, trace_undo, undo_token_id
from zoo.rl.rewards import FormatReward, RewardFunctionError, _column


def token_accuracy(predicted: Sequence[int], reference: Sequence[int]) -> float:
    """1 for an exact match, else the fraction of reference positions the prediction matches (0 for an empty
    reference that is not matched)."""
    predicted, reference = list(predicted), list(reference)
    if predicted == reference:
        return 1.0
    if not reference:
        return 0.0
    return sum(p == r for p, r in zip(predicted, reference)) / len(reference)


def outcome_term(resolved: Sequence[int], reference: Sequence[int], partial_credit: float = 0.5) -> float:
    """1 for ``resolved == reference``, else ``partial_credit * token_accuracy(resolved, reference)``."""
    accuracy = token_accuracy(resolved, reference)
    return 1.0 if accuracy == 1.0 else partial_credit * accuracy


FIRST_ATTEMPT_CHECKS = ("prefix", "exact")


@dataclass(frozen=True)
class BacktrackWeights:
    """Constants of :func:`backtrack_term` (defaults: ``llmhalluc/reward/bt.py``; ``first_attempt_check``: see the
    module docstring)."""

    correction_bonus: float = 0.4
    efficiency_bonus: float = 0.25
    unnecessary_penalty: float = 0.2
    failed_correction_penalty: float = 0.3
    no_undo_penalty: float = 0.1
    max_undos: int = DEFAULT_MAX_UNDOS
    excessive_penalty: float = 1.0
    min_attempt_fraction: float = 0.5
    first_attempt_check: str = "prefix"

    def __post_init__(self) -> None:
        if self.first_attempt_check not in FIRST_ATTEMPT_CHECKS:
            raise ConfigError(
                f"first_attempt_check must be one of {FIRST_ATTEMPT_CHECKS}, got {self.first_attempt_check!r}"
            )


def backtrack_term(trace: UndoTrace, reference: Sequence[int], weights: BacktrackWeights | None = None) -> float:
    """The backtrack term of the module docstring for one completion (``trace`` = :func:`trace_undo` of it)."""
    w = weights or BacktrackWeights()
    k = trace.num_undos
    if k > w.max_undos:
        return -w.excessive_penalty
    if k == 0:
        return 0.0 if list(trace.resolved) == list(reference) else -w.no_undo_penalty
    first, reference = list(trace.first_attempt), list(reference)
    substantial = len(first) > w.min_attempt_fraction * len(reference)
    if w.first_attempt_check == "exact":
        initial = token_accuracy(first, reference)
        gain = token_accuracy(trace.resolved, reference) - initial
        if gain > 0:
            return (
                w.correction_bonus * gain + w.efficiency_bonus / math.sqrt(k)
                if substantial
                else -w.unnecessary_penalty * k
            )
        return -w.unnecessary_penalty * k if initial == 1.0 else -w.failed_correction_penalty
    if first == reference[: len(first)]:
        return -w.unnecessary_penalty * k
    if list(trace.resolved) != reference:
        return -w.failed_correction_penalty
    if not substantial:
        return -w.unnecessary_penalty * k
    return w.correction_bonus * (1.0 - token_accuracy(first, reference)) + w.efficiency_bonus / math.sqrt(k)


class NMarsReward:
    """The N-MARS reward as a reward function with TRL's signature
    ``(prompts, completions, completion_ids=..., **columns) -> list[float]``.

    It reads the physical completions' token ids (``completion_ids``: TRL passes them, and so does
    :class:`zoo.modules.GRPOModule`) and the reference completion from ``reference_column``; the tokenizer (to find
    ``<UNDO>``, tokenize references and decode resolved outputs) is given here or bound by the GRPO module
    (:meth:`bind_tokenizer`). ``completions`` (texts) are not used.

    Args:
        tokenizer: the policy's tokenizer (``None``: bound later).
        undo_token: the UNDO token string.
        reference_column: the column with each prompt's reference completion text.
        outcome_weight, backtrack_weight, format_weight: ``w_o, w_b, w_f`` (1.0 / 0.6 / 0.3).
        partial_credit: outcome of a wrong output per unit of token accuracy (0.5).
        correction_bonus, efficiency_bonus, unnecessary_penalty, failed_correction_penalty, no_undo_penalty,
            max_undos, excessive_penalty, min_attempt_fraction, first_attempt_check: :class:`BacktrackWeights`.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        undo_token: str = UNDO_TOKEN,
        reference_column: str = "reference",
        outcome_weight: float = 1.0,
        backtrack_weight: float = 0.6,
        format_weight: float = 0.3,
        partial_credit: float = 0.5,
        correction_bonus: float = 0.4,
        efficiency_bonus: float = 0.25,
        unnecessary_penalty: float = 0.2,
        failed_correction_penalty: float = 0.3,
        no_undo_penalty: float = 0.1,
        max_undos: int = DEFAULT_MAX_UNDOS,
        excessive_penalty: float = 1.0,
        min_attempt_fraction: float = 0.5,
        first_attempt_check: str = "prefix",
    ) -> None:
        if max_undos < 1:
            raise ConfigError(f"NMarsReward: max_undos must be >= 1, got {max_undos}")
        self.tokenizer = tokenizer
        self.undo_token = undo_token
        self.reference_column = reference_column
        self.weights = (float(outcome_weight), float(backtrack_weight), float(format_weight))
        self.partial_credit = float(partial_credit)
        self.backtrack = BacktrackWeights(
            correction_bonus,
            efficiency_bonus,
            unnecessary_penalty,
            failed_correction_penalty,
            no_undo_penalty,
            int(max_undos),
            excessive_penalty,
            min_attempt_fraction,
            first_attempt_check,
        )
        self.format = FormatReward()
        self.__name__ = "nmars"

    def bind_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Use the policy's tokenizer (called by :class:`zoo.modules.GRPOModule` when it is built)."""
        self.tokenizer = tokenizer

    def components(
        self, completion_ids: Sequence[Sequence[int]], references: Sequence[str]
    ) -> list[tuple[float, float, float]]:
        """``(outcome, backtrack, format)`` per completion (physical ids; EOS and anything after it ignored)."""
        if self.tokenizer is None:
            raise ConfigError("NMarsReward has no tokenizer: pass tokenizer= or let the GRPO module bind it")
        tokenizer = self.tokenizer
        undo_id = undo_token_id(tokenizer, self.undo_token)
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        out = []
        for ids, reference in zip(completion_ids, references):
            ids = [int(t) for t in ids]
            ids = ids[: ids.index(eos)] if eos in ids else [t for t in ids if t != pad]
            reference_ids = list(tokenizer(reference, add_special_tokens=False)["input_ids"])
            trace = trace_undo(ids, undo_id)
            text = tokenizer.decode(trace.resolved, skip_special_tokens=False)
            out.append(
                (
                    outcome_term(trace.resolved, reference_ids, self.partial_credit),
                    backtrack_term(trace, reference_ids, self.backtrack),
                    float(self.format.is_well_formed(text)),
                )
            )
        return out

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Any,
    ) -> list[float]:
        if completion_ids is None:
            raise RewardFunctionError(
                "reward function 'nmars' needs completion_ids (the physical token ids; TRL's GRPOTrainer and the "
                "zoo's GRPOModule pass them)"
            )
        if len(completion_ids) != len(completions):
            raise RewardFunctionError(
                f"reward function 'nmars': {len(completion_ids)} completion_ids for {len(completions)} completions"
            )
        references = _column(columns, self.reference_column, len(completions), self.__name__)
        w_o, w_b, w_f = self.weights
        return [
            w_o * o + w_b * b + w_f * f for o, b, f in self.components(completion_ids, [str(r) for r in references])
        ]

    def __repr__(self) -> str:
        return f"NMarsReward(weights={self.weights}, reference_column={self.reference_column!r})"


__all__ = [
    "FIRST_ATTEMPT_CHECKS",
    "BacktrackWeights",
    "NMarsReward",
    "backtrack_term",
    "outcome_term",
    "token_accuracy",
]
