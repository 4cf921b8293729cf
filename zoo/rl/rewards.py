"""Reward functions with TRL's signature ``(prompts, completions, **columns) -> list[float]``.

Any TRL reward function works wherever these do and vice versa. Dataset columns (e.g. ``answer``) arrive as
keyword lists aligned with ``completions``. Each class sets ``__name__`` so TRL-style logging names it.

- :class:`ExactMatchReward`: 1 if the extracted answer equals the ``answer`` column, else 0 (RLVR verifier).
- :class:`FormatReward`: 1 if the completion is ``<think>...</think>`` followed by a non-empty answer.
- :class:`LengthBiasedProxyReward`: a verbosity-biased stand-in for a learned reward model (RLHF demo of GR3).
- :class:`WeightedSumReward`: weighted combination of several reward functions.
- :func:`score_rewards` / :func:`reward_matrix`: call reward functions and validate their output, naming the
  offending function when it returns the wrong count, ``None``, NaN or inf.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from zoo.answers import extract_answer
from zoo.errors import ConfigError, ZooError
from zoo.tokens import THINK_CLOSE, THINK_OPEN

RewardFn = Callable[..., Sequence[float | None]]
Extractor = Callable[[str], str | None]


class RewardFunctionError(ZooError, ValueError):
    """A reward function returned output that cannot be used; the message names the function."""


def _resolve_extractor(extractor: Extractor | str | None) -> Extractor:
    if extractor is None:
        return extract_answer
    if isinstance(extractor, str):
        module_name, _, attr = extractor.rpartition(".")
        if not module_name:
            raise ConfigError(f"extractor {extractor!r} must be a dotted path 'package.module.function'")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"cannot import answer extractor {extractor!r}: {err}") from err
    if not callable(extractor):
        raise ConfigError(f"extractor must be callable or a dotted path, got {type(extractor).__name__}")
    return extractor


def reward_name(fn: Any) -> str:
    """Readable name of a reward function (``__name__``, the wrapped function of a partial, or the class)."""
    if isinstance(fn, functools.partial):
        return reward_name(fn.func)
    name = getattr(fn, "__name__", None)
    return str(name) if name else type(fn).__name__


def _column(columns: Mapping[str, Any], key: str, n: int, who: str) -> Sequence[Any]:
    if key not in columns:
        raise RewardFunctionError(f"reward function {who!r} needs the dataset column {key!r}; got {sorted(columns)}")
    values = columns[key]
    if len(values) != n:
        raise RewardFunctionError(f"reward function {who!r}: column {key!r} has {len(values)} rows for {n} completions")
    return values


class ExactMatchReward:
    """Exact-match verifier: ``correct_reward`` if ``extractor(completion) == str(answer).strip()`` else
    ``incorrect_reward`` (also when the extractor returns ``None``).

    Args:
        extractor: completion -> answer string or None; a callable or a dotted import path (Hydra-friendly).
            Default :func:`zoo.answers.extract_answer`.
        answer_column: dataset column with the reference answers.
        correct_reward, incorrect_reward: the two reward values (1.0 / 0.0).
    """

    def __init__(
        self,
        extractor: Extractor | str | None = None,
        answer_column: str = "answer",
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
    ) -> None:
        self.extractor = _resolve_extractor(extractor)
        self.answer_column = answer_column
        self.correct_reward = float(correct_reward)
        self.incorrect_reward = float(incorrect_reward)
        self.__name__ = "exact_match"

    def is_correct(self, completions: Sequence[str], answers: Sequence[Any]) -> list[bool]:
        """Per completion, whether the extracted answer matches."""
        out = []
        for completion, answer in zip(completions, answers):
            predicted = self.extractor(completion)
            out.append(predicted is not None and predicted.strip() == str(answer).strip())
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        answers = _column(columns, self.answer_column, len(completions), self.__name__)
        return [self.correct_reward if ok else self.incorrect_reward for ok in self.is_correct(completions, answers)]

    def __repr__(self) -> str:
        return f"ExactMatchReward(extractor={reward_name(self.extractor)}, answer_column={self.answer_column!r})"


_FORMAT_RE = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)


class FormatReward:
    """Format check: ``reward`` if the completion is ``<think>...</think>`` followed by a non-empty answer that
    contains no further think tags, else 0.

    Args:
        reward: value for a well-formed completion (1.0).
        require_nonempty_think: also require non-whitespace text between the tags.
    """

    def __init__(self, reward: float = 1.0, require_nonempty_think: bool = False) -> None:
        self.reward = float(reward)
        self.require_nonempty_think = bool(require_nonempty_think)
        self.__name__ = "format"

    def is_well_formed(self, completion: str) -> bool:
        match = _FORMAT_RE.match(completion)
        if match is None:
            return False
        answer = match.group("answer")
        if not answer.strip() or THINK_OPEN in answer or THINK_CLOSE in answer:
            return False
        return not (self.require_nonempty_think and not match.group("think").strip())

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return [self.reward if self.is_well_formed(c) else 0.0 for c in completions]

    def __repr__(self) -> str:
        return f"FormatReward(reward={self.reward}, require_nonempty_think={self.require_nonempty_think})"


class LengthBiasedProxyReward:
    """Verbosity-biased proxy reward model (the RLHF analogue in the GR3 demo, notes §2(d)).

    ``score = sigmoid(correctness_weight * (2 * correct - 1) + kappa * min(l, L_max) / L_max + bias)``

    - grows with the completion length ``l`` for correct and incorrect answers alike (the length term does not
      look at correctness), so maximizing it inflates length — the failure GR3 targets;
    - bounded in (0, 1) and saturating: the length term is capped at ``L_max`` and passes through a sigmoid;
    - still prefers a correct answer at equal length (``correctness_weight > 0``), like an imperfect RM; with
      ``correctness_weight=0`` it is a pure length reward and needs no ``answer`` column.

    Args:
        max_length: ``L_max``, the length at which the bias saturates (the generation budget).
        kappa: strength of the length bias (1.5 in the notes).
        correctness_weight: weight of the correctness logit (1.0 gives the notes' ``2 * correct - 1``).
        bias: constant added to the logit.
        extractor, answer_column: how correctness is judged (as :class:`ExactMatchReward`).
        length_fn: completion -> length; default ``len`` (characters = tokens for the zoo's char tokenizer).
        output: ``"prob"`` (the sigmoid, in (0, 1)) or ``"logit"`` (raw score of any sign, for GR3's RLHF mode).
    """

    def __init__(
        self,
        max_length: int = 48,
        kappa: float = 1.5,
        correctness_weight: float = 1.0,
        bias: float = 0.0,
        extractor: Extractor | str | None = None,
        answer_column: str = "answer",
        length_fn: Callable[[str], int] | str | None = None,
        output: str = "prob",
    ) -> None:
        if max_length <= 0:
            raise ConfigError(f"LengthBiasedProxyReward: max_length must be > 0, got {max_length}")
        if output not in ("prob", "logit"):
            raise ConfigError(f"LengthBiasedProxyReward: output must be 'prob' or 'logit', got {output!r}")
        self.max_length = int(max_length)
        self.kappa = float(kappa)
        self.correctness_weight = float(correctness_weight)
        self.bias = float(bias)
        self.verifier = ExactMatchReward(extractor=extractor, answer_column=answer_column)
        self.length_fn: Callable[[str], int] = len if length_fn is None else _resolve_extractor(length_fn)  # type: ignore[assignment]
        self.output = output
        self.__name__ = "length_biased_proxy_rm"

    def logits(self, completions: Sequence[str], correct: Sequence[bool]) -> list[float]:
        """Raw scores before the sigmoid."""
        out = []
        for completion, ok in zip(completions, correct):
            frac = min(self.length_fn(completion), self.max_length) / self.max_length
            out.append(self.correctness_weight * (2.0 * float(ok) - 1.0) + self.kappa * frac + self.bias)
        return out

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        if self.correctness_weight != 0.0:
            answers = _column(columns, self.verifier.answer_column, len(completions), self.__name__)
            correct = self.verifier.is_correct(completions, answers)
        else:
            correct = [False] * len(completions)
        logits = self.logits(completions, correct)
        if self.output == "logit":
            return logits
        return [1.0 / (1.0 + math.exp(-x)) for x in logits]

    def __repr__(self) -> str:
        return (
            f"LengthBiasedProxyReward(max_length={self.max_length}, kappa={self.kappa}, "
            f"correctness_weight={self.correctness_weight}, bias={self.bias}, output={self.output!r})"
        )


def _as_list(fns: Sequence[RewardFn] | Mapping[str, RewardFn]) -> tuple[list[RewardFn], list[str]]:
    if isinstance(fns, Mapping):
        return list(fns.values()), [str(k) for k in fns]
    if callable(fns):
        fns = [fns]  # type: ignore[list-item]
    fn_list = list(fns)
    return fn_list, [reward_name(f) for f in fn_list]


def reward_matrix(
    reward_fns: Sequence[RewardFn] | Mapping[str, RewardFn],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Any] | None = None,
) -> Tensor:
    """Call every reward function and validate the output: ``float32 [N, num_fns]``.

    Raises :class:`RewardFunctionError` (a ``ValueError``) naming the function when it returns a count other
    than ``N = len(completions)``, or ``None``/NaN/inf/non-numbers (with the offending indices).
    """
    fns, names = _as_list(reward_fns)
    if not fns:
        raise ConfigError("no reward functions given")
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    n = len(completions)
    cols = dict(columns or {})
    out = torch.empty(n, len(fns), dtype=torch.float32)
    for j, (fn, name) in enumerate(zip(fns, names)):
        values = fn(prompts=list(prompts), completions=list(completions), **cols)
        if isinstance(values, Tensor):
            values = values.detach().cpu().reshape(-1).tolist()
        try:
            values = list(values)
        except TypeError as err:
            raise RewardFunctionError(
                f"reward function {name!r} returned {type(values).__name__}, expected a list of {n} floats"
            ) from err
        if len(values) != n:
            raise RewardFunctionError(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
        floats = []
        bad = []
        for i, v in enumerate(values):
            try:
                f = float("nan") if v is None else float(v)
            except (TypeError, ValueError):
                f = float("nan")
            if not math.isfinite(f):
                bad.append(i)
            floats.append(f)
        if bad:
            shown = ", ".join(f"{i}: {values[i]!r}" for i in bad[:5])
            more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
            raise RewardFunctionError(
                f"reward function {name!r} returned None/NaN/inf or a non-number for {len(bad)} of {n} "
                f"completions (index: value) {shown}{more}"
            )
        out[:, j] = torch.tensor(floats, dtype=torch.float32)
    return out


def _weights_vector(weights: Sequence[float] | Mapping[str, float] | None, names: list[str]) -> Tensor:
    if weights is None:
        return torch.ones(len(names))
    if isinstance(weights, Mapping):
        unknown = set(weights) - set(names)
        if unknown:
            raise ConfigError(f"reward weights for unknown reward functions {sorted(unknown)}; known: {names}")
        return torch.tensor([float(weights.get(name, 1.0)) for name in names])
    w = [float(x) for x in weights]
    if len(w) != len(names):
        raise ConfigError(f"{len(w)} reward weights for {len(names)} reward functions {names}")
    return torch.tensor(w)


def score_rewards(
    reward_fns: Sequence[RewardFn] | Mapping[str, RewardFn],
    weights: Sequence[float] | Mapping[str, float] | None,
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Any] | None = None,
) -> Tensor:
    """Weighted sum of validated rewards ``sum_j w_j r_j(completion)``: ``float32 [N]``.

    ``weights=None`` weighs every function 1 (TRL ``reward_weights`` default). A mapping of reward functions
    names them by key; weights may then be a mapping too (missing keys weigh 1). Errors as :func:`reward_matrix`.
    """
    _, names = _as_list(reward_fns)
    w = _weights_vector(weights, names)
    return reward_matrix(reward_fns, prompts, completions, columns) @ w


class WeightedSumReward:
    """Weighted combination of reward functions, itself a TRL-style reward function.

    Args:
        reward_fns: list of reward functions, or a mapping name -> function (easier to override in Hydra).
        weights: one weight per function (list or mapping by name); ``None`` = all 1.
        name: ``__name__`` for logging.
    """

    def __init__(
        self,
        reward_fns: Sequence[RewardFn] | Mapping[str, RewardFn],
        weights: Sequence[float] | Mapping[str, float] | None = None,
        name: str = "weighted_sum",
    ) -> None:
        fns, names = _as_list(reward_fns)
        if not fns:
            raise ConfigError("WeightedSumReward: no reward functions given")
        self.reward_fns = reward_fns if isinstance(reward_fns, Mapping) else fns
        self.names = names
        self.weights = _weights_vector(weights, names)
        self.__name__ = name

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        return score_rewards(self.reward_fns, self.weights.tolist(), prompts, completions, columns).tolist()

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}*{w:g}" for n, w in zip(self.names, self.weights.tolist()))
        return f"WeightedSumReward({parts})"
