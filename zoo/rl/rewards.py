"""Reward functions with TRL's signature ``(prompts, completions, **columns) -> list[float]``.

Any TRL reward function works wherever these do and vice versa. Dataset columns (e.g. ``answer``) arrive as
keyword lists aligned with ``completions``. Each class sets ``__name__`` so TRL-style logging names it.

- :class:`ExactMatchReward`: 1 if the extracted answer equals the ``answer`` column, else 0 (RLVR verifier).
- :class:`FormatReward`: 1 if the completion is ``<think>...</think>`` followed by a non-empty answer.
- :class:`LengthBiasedProxyReward`: a verbosity-biased stand-in for a learned reward model (RLHF demo of GR3).
- :class:`WeightedSumReward`: weighted combination of several reward functions.
- :func:`score_rewards` / :func:`reward_matrix`: call reward functions and validate their output, naming the
  offending function when it returns the wrong count, NaN or inf.

TRL's reward-function protocol (``GRPOTrainer._calculate_rewards``, TRL 1.16) holds here too:

- a function may return ``None`` for a completion it does not apply to: NaN in :func:`reward_matrix`, left out of
  the weighted sum (:func:`weighted_rewards`, TRL's ``nansum``); a completion that no function scores is an error
  here (TRL warns and gives it advantage 0);
- with a :class:`RewardContext` every function also receives ``trainer_state`` (a ``transformers.TrainerState``),
  ``log_metric(name, value)`` and ``log_extra(column, values)``, the keyword arguments TRL passes;
- an ``async def`` function (or a class with an async ``__call__``) is awaited; all async functions of a call run
  concurrently (``asyncio.gather``) on one event loop in a daemon thread that lives as long as the process, as in TRL.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import math
import re
import threading
from collections import defaultdict
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


class RewardContext:
    """The keyword arguments TRL's ``GRPOTrainer`` gives every reward function besides the dataset columns:
    ``trainer_state`` (a ``transformers.TrainerState``: ``global_step``, ``epoch``, ``max_steps``, ...),
    ``log_metric(name, value)`` (a scalar averaged over the step and logged with the trainer's metrics) and
    ``log_extra(column, values)`` (a column of the completions table, one value per completion).

    Args:
        trainer_state: the state the functions read; built by the trainer (the GRPO module fills it from Lightning's
            ``global_step``, ``current_epoch``, ``max_steps``, ``max_epochs`` and the process ranks).

    After the call, :attr:`metrics` maps each name to the values logged under it and :attr:`extras` each column to its
    values.
    """

    KEYS = ("trainer_state", "log_metric", "log_extra")

    def __init__(self, trainer_state: Any = None) -> None:
        if trainer_state is None:
            from transformers import TrainerState

            trainer_state = TrainerState()
        self.trainer_state = trainer_state
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.extras: dict[str, list[Any]] = defaultdict(list)

    def log_metric(self, name: str, value: float) -> None:
        """Record a scalar (TRL: ``GRPOTrainer._log_metric``)."""
        self.metrics[str(name)].append(float(value))

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        """Record a column of the completions table (TRL: ``GRPOTrainer._log_completion_extra``)."""
        self.extras[str(column)].extend(values)

    def kwargs(self) -> dict[str, Any]:
        """``{"trainer_state": ..., "log_metric": ..., "log_extra": ...}``."""
        return {"trainer_state": self.trainer_state, "log_metric": self.log_metric, "log_extra": self.log_extra}

    def metric_means(self) -> dict[str, float]:
        """Mean of each metric logged during the call."""
        return {name: sum(values) / len(values) for name, values in self.metrics.items() if values}


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The event loop async reward functions run on: one per process, in a daemon thread, so that clients an async
    function keeps between calls stay bound to a live loop and a caller inside a running loop (a notebook) can wait."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="zoo-async-rewards", daemon=True).start()
            _LOOP = loop
        return _LOOP


def _run_concurrently(coroutines: list[Any]) -> list[Any]:
    async def gather() -> list[Any]:
        return list(await asyncio.gather(*coroutines))

    return asyncio.run_coroutine_threadsafe(gather(), _event_loop()).result()


def reward_matrix(
    reward_fns: Sequence[RewardFn] | Mapping[str, RewardFn],
    prompts: Sequence[str],
    completions: Sequence[str],
    columns: Mapping[str, Any] | None = None,
    context: RewardContext | None = None,
) -> Tensor:
    """Call every reward function and validate the output: ``float32 [N, num_fns]``, NaN where a function returned
    ``None`` (it does not apply to that completion; TRL's convention).

    Args:
        reward_fns: the functions (a list, or a mapping name -> function).
        prompts, completions: ``N`` of each.
        columns: dataset columns, each a list of ``N`` values, passed as keyword arguments.
        context: passes ``trainer_state``, ``log_metric`` and ``log_extra`` too (see :class:`RewardContext`).

    Async functions are awaited, all of them concurrently. Raises :class:`RewardFunctionError` (a ``ValueError``)
    naming the function when it returns a count other than ``N``, or NaN/inf/non-numbers (with the offending indices).
    """
    fns, names = _as_list(reward_fns)
    if not fns:
        raise ConfigError("no reward functions given")
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    n = len(completions)
    cols = dict(columns or {})
    if context is not None:
        cols.update(context.kwargs())
    outputs: list[Any] = [None] * len(fns)
    pending: list[int] = []
    for j, fn in enumerate(fns):
        outputs[j] = fn(prompts=list(prompts), completions=list(completions), **cols)
        if inspect.isawaitable(outputs[j]):
            pending.append(j)
    if pending:
        for j, value in zip(pending, _run_concurrently([outputs[j] for j in pending])):
            outputs[j] = value
    out = torch.empty(n, len(fns), dtype=torch.float32)
    for j, (values, name) in enumerate(zip(outputs, names)):
        out[:, j] = _validated(values, name, n)
    return out


def _validated(values: Any, name: str, n: int) -> Tensor:
    if isinstance(values, Tensor):
        values = values.detach().cpu().reshape(-1).tolist()
    try:
        values = list(values)
    except TypeError as err:
        raise RewardFunctionError(
            f"reward function {name!r} returned {type(values).__name__}, expected a list of {n} floats (or None)"
        ) from err
    if len(values) != n:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
    floats = []
    bad = []
    for i, v in enumerate(values):
        if v is None:  # does not apply to this completion
            floats.append(float("nan"))
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not math.isfinite(f):
            bad.append(i)
        floats.append(f)
    if bad:
        shown = ", ".join(f"{i}: {values[i]!r}" for i in bad[:5])
        more = f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        raise RewardFunctionError(
            f"reward function {name!r} returned NaN/inf or a non-number for {len(bad)} of {n} completions "
            f"(index: value) {shown}{more}; return None for a completion the function does not apply to"
        )
    return torch.tensor(floats, dtype=torch.float32)


def weighted_rewards(
    matrix: Tensor, weights: Tensor, names: Sequence[str] | None = None, completions: Sequence[str] | None = None
) -> Tensor:
    """``sum_j w_j r_j`` per completion over the functions that scored it (NaN entries, from ``None``, left out:
    TRL's ``nansum``): ``matrix [N, F]``, ``weights [F]`` -> ``[N]``.

    Raises:
        RewardFunctionError: a completion that no function scored (every entry NaN), naming the functions and the
            completion (TRL warns and gives it advantage 0; here it is a configuration to fix).
    """
    unscored = torch.isnan(matrix).all(dim=1)
    if matrix.shape[1] and bool(unscored.any()):
        i = int(unscored.nonzero()[0, 0])
        who = ", ".join(repr(x) for x in names) if names else f"all {matrix.shape[1]}"
        text = f" ({completions[i][:60]!r})" if completions is not None else ""
        raise RewardFunctionError(
            f"every reward function ({who}) returned None for completion {i}{text} and {int(unscored.sum()) - 1} "
            "other(s): add a reward function that scores every completion"
        )
    return torch.nansum(matrix * weights.to(matrix).unsqueeze(0), dim=1)


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
    """Weighted sum of validated rewards ``sum_j w_j r_j(completion)`` over the functions that scored the completion
    (:func:`weighted_rewards`): ``float32 [N]``.

    ``weights=None`` weighs every function 1 (TRL ``reward_weights`` default). A mapping of reward functions
    names them by key; weights may then be a mapping too (missing keys weigh 1). Errors as :func:`reward_matrix` and
    :func:`weighted_rewards`.
    """
    _, names = _as_list(reward_fns)
    w = _weights_vector(weights, names)
    return weighted_rewards(reward_matrix(reward_fns, prompts, completions, columns), w, names, completions)


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

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float | None]:
        """The weighted sum of the functions that scored each completion; ``None`` where none did (so the
        combination itself follows TRL's protocol). ``trainer_state``/``log_metric``/``log_extra`` among ``columns``
        reach the combined functions."""
        matrix = reward_matrix(self.reward_fns, prompts, completions, columns)
        unscored = torch.isnan(matrix).all(dim=1).tolist()
        total = torch.nansum(matrix * self.weights.unsqueeze(0), dim=1).tolist()
        return [None if skip else value for value, skip in zip(total, unscored)]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}*{w:g}" for n, w in zip(self.names, self.weights.tolist()))
        return f"WeightedSumReward({parts})"
