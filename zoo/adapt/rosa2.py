"""ROSA2 — Words & Weights: test-time policy adaptation for multi-turn interactions (arXiv:2603.01375).

Within one conversation the user's feedback on each answer drives two streams [paper]: *words* (intent ambiguity,
fixed by a textual update of the instruction/context) and *weights* (capability gap, fixed by a ROSA step on
adapters, :mod:`zoo.adapt.rosa`). The turn loop (research notes agents.md 2(a), [reconstruction]: no public code)::

    y_k ~ pi_theta(. | c_k, x);  f_k = user(y_k)                        stop when f_k says "right"
    e_amb, e_cap = Decompose(f_k, y_k, c_k)                             (words stream)
    if e_amb: c_{k+1} = Revise(c_k, f_k)                                (words)
    if e_cap: theta <- theta + Delta_ROSA(pi*, observed rewards; c_{k+1}) (weights, one step)

Adapters and context start fresh in every conversation. The four arms of the paper's comparison are settings of
:class:`AdaptationSettings`: static (neither stream), words-only (every error goes to the words stream), weights-only
= ROSA (every error goes to a ROSA step), ROSA2 (both streams, each error routed by the decomposition).

Equation -> function:
    the turn loop above                   -> :func:`run_conversation`
    routing (decompose / all-to-one)      -> :func:`route`
    pi*, KL, the one-step update          -> :mod:`zoo.adapt.rosa`
    ||Delta theta|| of a conversation     -> :func:`parameter_shift`
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.adapt.rosa import candidate_logprobs, optimum_weights, rosa_loss, rosa_step
from zoo.errors import ConfigError


class FeedbackLike(Protocol):
    correct: bool
    reward: float
    hint: str | None


class DecompositionLike(Protocol):
    ambiguity: bool
    capability: bool


class ConversationLike(Protocol):
    """A problem with a simulated user: the policy's prompt under a reading, the candidate responses, feedback."""

    def initial_reading(self) -> Any: ...

    def prompt(self, reading: Any) -> str: ...

    def candidates(self) -> list[str]: ...

    def feedback(self, response: str) -> FeedbackLike: ...

    def describe(self) -> dict[str, Any]: ...


class WordsStream(Protocol):
    """The words stream: tells ambiguity from capability in a piece of feedback and rewrites the reading."""

    def decompose(self, conversation: Any, reading: Any, response: str, feedback: Any) -> DecompositionLike: ...

    def revise(self, conversation: Any, reading: Any, response: str, feedback: Any) -> Any: ...


@dataclass(frozen=True)
class AdaptationSettings:
    """What adapts within a conversation, and how.

    Args:
        words: the words stream may rewrite the reading.
        weights: ROSA steps may move the adapters.
        decompose: route each error by the words stream's decomposition (ROSA2); ``False``: every error goes to every
            enabled stream (words-only and weights-only baselines).
        max_turns: turns per conversation (the conversation stops at the first right answer).
        beta: KL strength of ``pi*`` [reconstruction: not public].
        lr: step size of the one ROSA step [reconstruction].
        unobserved_reward: reward of candidates the user has not judged yet [reconstruction].
        max_update_norm: scale a ROSA update down to this L2 norm (``None``: no cap).
        temperature: ``0`` answers the most likely candidate; ``> 0`` samples from ``pi^(1/T)`` on the candidates.
    """

    words: bool = True
    weights: bool = True
    decompose: bool = True
    max_turns: int = 5
    beta: float = 0.1
    lr: float = 0.2
    unobserved_reward: float = 0.5
    max_update_norm: float | None = 0.5
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"max_turns={self.max_turns} must be >= 1")
        if not self.beta > 0:
            raise ConfigError(f"rosa beta={self.beta} must be > 0")
        if not self.lr >= 0:
            raise ConfigError(f"rosa lr={self.lr} must be >= 0")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature} must be >= 0")
        if self.max_update_norm is not None and not self.max_update_norm > 0:
            raise ConfigError(f"max_update_norm={self.max_update_norm} must be > 0 or null")

    @property
    def arm(self) -> str:
        if self.words and self.weights:
            return "rosa2" if self.decompose else "words+weights"
        return "words" if self.words else "rosa" if self.weights else "static"


@dataclass
class Turn:
    """One turn of a conversation: what was asked and answered, the feedback, and what each stream did.

    ``ambiguity`` / ``capability``: the wrong answer was routed to the words / the weights (by the decomposition in
    ROSA2; every error to every enabled stream otherwise). ``reading_changed``: the words revised the reading;
    ``weight_step`` / ``rolled_back`` / ``update_norm``: the ROSA step was applied / undone (non-finite) / its L2 norm.
    """

    turn: int
    prompt: str
    response: str
    correct: bool
    hint: str | None
    ambiguity: bool = False
    capability: bool = False
    reading_changed: bool = False
    weight_step: bool = False
    rolled_back: bool = False
    update_norm: float = 0.0


@dataclass
class ConversationRecord:
    """A finished conversation: its turns, the turn of the first right answer (``None``: never), the adapters' shift
    ``||theta_end - theta_start||_2`` and the seconds spent adapting (words and weights, not answering)."""

    conversation: dict[str, Any]
    turns: list[Turn] = field(default_factory=list)
    success_turn: int | None = None
    parameter_shift: float = 0.0
    adapt_seconds: float = 0.0
    weight_steps: int = 0
    words_updates: int = 0
    rollbacks: int = 0

    def solved_by(self, k: int) -> bool:
        return self.success_turn is not None and self.success_turn <= k

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def route(
    settings: AdaptationSettings,
    words: WordsStream | None,
    conversation: Any,
    reading: Any,
    response: str,
    feedback: Any,
) -> tuple[bool, bool]:
    """``(to_words, to_weights)`` for a wrong answer: the decomposition (ROSA2) or every enabled stream."""
    if settings.decompose and settings.words and settings.weights:
        parts = words.decompose(conversation, reading, response, feedback)
        return bool(parts.ambiguity), bool(parts.capability)
    return settings.words, settings.weights


def parameter_shift(params: Sequence[nn.Parameter], start: Sequence[Tensor]) -> float:
    """``||theta - theta_start||_2`` over ``params``."""
    total = sum(((p.detach().double() - s.double()) ** 2).sum() for p, s in zip(params, start, strict=True))
    return float(torch.as_tensor(total).sqrt())


def choose(logp: Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """The answered candidate: the most likely one, or a draw from ``softmax(logp / T)``."""
    if temperature == 0:
        return int(torch.argmax(logp))
    probs = torch.softmax(logp.detach().float() / temperature, dim=0)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def run_conversation(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    adapters: Sequence[nn.Parameter],
    conversation: ConversationLike,
    settings: AdaptationSettings,
    words: WordsStream | None = None,
    generator: torch.Generator | None = None,
) -> ConversationRecord:
    """Play one conversation, adapting words and/or weights after each wrong answer; stop at the first right one.

    The caller resets ``adapters`` before (and after) the conversation; this function changes only them (and only
    with ``settings.weights``).
    """
    if settings.words and words is None:
        raise ConfigError("words adaptation is on but no words stream was given (module.words)")
    start = [p.detach().clone() for p in adapters]
    record = ConversationRecord(conversation.describe())
    reading = conversation.initial_reading()
    candidates = conversation.candidates()
    observed: dict[str, float] = {}
    for k in range(1, settings.max_turns + 1):
        prompt = conversation.prompt(reading)
        with torch.no_grad():
            logp = candidate_logprobs(model, tokenizer, prompt, candidates)
        response = candidates[choose(logp, settings.temperature, generator)]
        feedback = conversation.feedback(response)
        turn = Turn(k, prompt, response, bool(feedback.correct), feedback.hint)
        record.turns.append(turn)
        if feedback.correct:
            record.success_turn = k
            break
        observed[response] = float(feedback.reward)
        if k == settings.max_turns:
            break
        began = time.perf_counter()
        to_words, to_weights = route(settings, words, conversation, reading, response, feedback)
        turn.ambiguity, turn.capability = to_words, to_weights
        if to_words:
            revised = words.revise(conversation, reading, response, feedback)
            turn.reading_changed = revised != reading
            record.words_updates += int(turn.reading_changed)
            reading = revised
        if to_weights:
            with torch.enable_grad():
                logp = candidate_logprobs(model, tokenizer, conversation.prompt(reading), candidates)
                rewards = torch.tensor(
                    [observed.get(c, settings.unobserved_reward) for c in candidates], dtype=logp.dtype
                )
                target = optimum_weights(logp, rewards.to(logp.device), settings.beta)
                step = rosa_step(adapters, rosa_loss(target, logp), settings.lr, settings.max_update_norm)
            turn.weight_step, turn.rolled_back, turn.update_norm = step.applied, step.rolled_back, step.update_norm
            record.weight_steps += int(step.applied)
            record.rollbacks += int(step.rolled_back)
        record.adapt_seconds += time.perf_counter() - began
    record.parameter_shift = parameter_shift(adapters, start)
    return record


__all__ = [
    "AdaptationSettings",
    "ConversationLike",
    "ConversationRecord",
    "Turn",
    "WordsStream",
    "choose",
    "parameter_shift",
    "route",
    "run_conversation",
]
