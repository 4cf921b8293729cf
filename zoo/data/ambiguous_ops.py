"""AmbiguousOps: the toy world of the ROSA2 demo (research notes agents.md 2(d)) [reconstruction].

A problem is a pair ``(a, b)`` and the user's *intent*, one operation mod ``modulus``. The tiny policy is
pre-trained (``+method=sft task=ambiguous_ops``, through the artifact cache) on prompts that name the intent by one
symbol::

    3*5=   ->   5          (the product mod 10: every answer is one character, so one token)

with some intents deliberately under-trained (``intent_weights``): the *capability gap*. A conversation starts from an
ambiguous instruction ("combine 3 and 5"), read as the ``default_intent``: the *intent ambiguity*. The simulated user
(:class:`Conversation.feedback`) says whether an answer is right and, with probability ``hint_prob``, adds a textual
hint ("I meant the product").

The words stream of this world is a rule (:class:`IntentWords`), the analogue of a textual-gradient step on the
instruction: it decomposes the feedback (a wrong answer that *is* the operation the instruction was read as points at
the reading, an answer that is not points at the weights; a hint naming another operation points at the reading) and
rewrites the reading (to the hinted operation, or to the next not-yet-ruled-out one).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from zoo.answers import PlainAnswerVerifier
from zoo.data.tasks import Example, Task
from zoo.errors import ConfigError

# name -> (prompt symbol, hint phrase, operation); results are taken mod the modulus
OPERATIONS: dict[str, tuple[str, str, Callable[[int, int], int]]] = {
    "add": ("+", "the sum", lambda a, b: a + b),
    "sub": ("-", "the difference", lambda a, b: a - b),
    "mul": ("*", "the product", lambda a, b: a * b),
    "max": (">", "the larger one", max),
    "min": ("<", "the smaller one", min),
    "absdiff": ("|", "the distance", lambda a, b: abs(a - b)),
}
HINT_PREFIX = "I meant "


class AmbiguousOpsTask(PlainAnswerVerifier, Task):
    """``a<symbol>b=`` -> ``(a op b) mod modulus`` (the completion is the answer: no reasoning block).

    The prompt space is small and fixed (``len(intents) * modulus**2`` prompts), so held-out splits are fresh draws
    of the same prompts (``distinct_prompts = False``); the conversations ask the trained prompts too.

    Args:
        intents: the operations (names of :data:`OPERATIONS`), in the order the words stream tries them.
        modulus: answers are ``0 .. modulus - 1`` (at most 10: one digit, one token); operands are drawn from the same.
        intent_weights: relative frequency of each intent in the draws (missing: 1). Low weights under-train an
            intent: the capability gap of the demo.
    """

    name = "ambiguous_ops"
    distinct_prompts = False

    def __init__(
        self,
        intents: Sequence[str] = ("add", "sub", "mul", "max"),
        modulus: int = 10,
        intent_weights: Mapping[str, float] | None = None,
    ) -> None:
        unknown = [i for i in intents if i not in OPERATIONS]
        if unknown or len(set(intents)) != len(intents) or len(intents) < 2:
            raise ConfigError(
                f"task.intents={list(intents)}: need at least two distinct operations among {sorted(OPERATIONS)}"
            )
        if not 2 <= modulus <= 10:
            raise ConfigError(f"task.modulus={modulus} must be in [2, 10] (answers are one digit)")
        weights = dict(intent_weights or {})
        if set(weights) - set(intents) or any(float(w) < 0 for w in weights.values()):
            raise ConfigError(f"task.intent_weights={weights}: non-negative weights of intents among {list(intents)}")
        self.intents = list(intents)
        self.modulus = modulus
        self.intent_weights = {i: float(weights.get(i, 1.0)) for i in self.intents}
        if sum(self.intent_weights.values()) <= 0:
            raise ConfigError("task.intent_weights: at least one intent needs a positive weight")

    def execute(self, intent: str, a: int, b: int) -> str:
        """The answer text of ``a <intent> b``."""
        return str(OPERATIONS[intent][2](a, b) % self.modulus)

    def prompt(self, intent: str, a: int, b: int) -> str:
        """The prompt text that names ``intent`` by its symbol."""
        return f"{a}{OPERATIONS[intent][0]}{b}="

    def answers(self) -> list[str]:
        """Every possible answer text (the candidate responses of a conversation)."""
        return [str(v) for v in range(self.modulus)]

    def hint(self, intent: str) -> str:
        """The simulated user's textual hint for ``intent`` (``"I meant the product"``)."""
        return HINT_PREFIX + OPERATIONS[intent][1]

    def parse_hint(self, text: str) -> str | None:
        """The intent a hint names (``None`` when it names none of :attr:`intents`)."""
        for intent in self.intents:
            if OPERATIONS[intent][1] in text:
                return intent
        return None

    def sample(self, rng: random.Random) -> Example:
        intent = rng.choices(self.intents, weights=[self.intent_weights[i] for i in self.intents])[0]
        a, b = rng.randrange(self.modulus), rng.randrange(self.modulus)
        answer = self.execute(intent, a, b)
        return Example(self.prompt(intent, a, b), answer, answer, {"intent": intent})


@dataclass(frozen=True)
class Reading:
    """The words state of a conversation: how the instruction is read (``intent``) and the readings ruled out."""

    intent: str
    ruled_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class Feedback:
    """What the simulated user says about one answer: ``reward`` (1 right, 0 wrong) and an optional textual hint."""

    correct: bool
    reward: float
    hint: str | None = None


@dataclass
class Conversation:
    """One problem ``(a, b)`` with the user's hidden ``intent``; its user answers with :meth:`feedback`.

    Args:
        task: the world (operations, prompts, answers).
        a, b: the operands.
        intent: what the user means (hidden from the policy).
        default_intent: how the ambiguous instruction is read before any feedback.
        hint_prob: probability that a wrong answer's feedback carries a hint.
        seed: seed of the user's hint draws.
    """

    task: AmbiguousOpsTask
    a: int
    b: int
    intent: str
    default_intent: str
    hint_prob: float
    seed: int
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def answer(self) -> str:
        return self.task.execute(self.intent, self.a, self.b)

    @property
    def kind(self) -> str:
        """``ambiguous`` (the default reading is wrong), ``gap`` (under-trained intent), ``both`` or ``clear``."""
        weights = self.task.intent_weights
        gap = weights[self.intent] < max(weights.values())
        ambiguous = self.intent != self.default_intent
        return {(True, True): "both", (True, False): "ambiguous", (False, True): "gap"}.get((ambiguous, gap), "clear")

    def initial_reading(self) -> Reading:
        return Reading(self.default_intent)

    def prompt(self, reading: Reading) -> str:
        """The policy's input under a reading of the instruction."""
        return self.task.prompt(reading.intent, self.a, self.b)

    def candidates(self) -> list[str]:
        return self.task.answers()

    def feedback(self, response: str) -> Feedback:
        """Correctness and, when wrong and with probability ``hint_prob``, the hint naming the user's intent."""
        correct = response.strip() == self.answer
        hint = None
        if not correct and self._rng.random() < self.hint_prob:
            hint = self.task.hint(self.intent)
        return Feedback(correct, 1.0 if correct else 0.0, hint)

    def describe(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "intent": self.intent, "answer": self.answer, "kind": self.kind}


class AmbiguousOpsConversations:
    """The conversations of a run: conversation ``i`` is drawn from ``(seed, i)`` only.

    Args:
        task: the world the policy was trained on.
        default_intent: the reading of the ambiguous instruction (default: the first intent).
        user_intents: what users mean (default: every intent of the task, uniformly).
        hint_prob: ``h``, the probability of a textual hint with a wrong answer.
        seed: base seed.
    """

    def __init__(
        self,
        task: AmbiguousOpsTask,
        default_intent: str | None = None,
        user_intents: Sequence[str] | None = None,
        hint_prob: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.task = task
        self.default_intent = default_intent or task.intents[0]
        self.user_intents = list(user_intents or task.intents)
        bad = [i for i in [self.default_intent, *self.user_intents] if i not in task.intents]
        if bad:
            raise ConfigError(f"ambiguous_ops: intents {bad} are not among the task's intents {task.intents}")
        if not 0.0 <= hint_prob <= 1.0:
            raise ConfigError(f"hint_prob={hint_prob} must be in [0, 1]")
        self.hint_prob = hint_prob
        self.seed = seed

    def __call__(self, index: int) -> Conversation:
        rng = random.Random(f"ambiguous_ops/{self.seed}/{index}")
        intent = rng.choice(self.user_intents)
        a, b = rng.randrange(self.task.modulus), rng.randrange(self.task.modulus)
        return Conversation(self.task, a, b, intent, self.default_intent, self.hint_prob, rng.randrange(2**31))


@dataclass(frozen=True)
class Decomposition:
    """Which stream a piece of feedback points at: the reading (``ambiguity``) and/or the weights (``capability``)."""

    ambiguity: bool
    capability: bool


class IntentWords:
    """The words stream of AmbiguousOps (a rule standing in for an LLM's textual gradient) [reconstruction].

    * :meth:`decompose`: a hint naming another operation than the reading, or a wrong answer that is exactly the
      operation as read, is intent ambiguity; a wrong answer that is not the reading's operation (and a hint that
      confirms the reading) is a capability gap.
    * :meth:`revise`: the reading becomes the hinted operation, or else the next intent (task order) not ruled out.
    """

    def decompose(
        self, conversation: Conversation, reading: Reading, response: str, feedback: Feedback
    ) -> Decomposition:
        if feedback.correct:
            return Decomposition(False, False)
        hinted = conversation.task.parse_hint(feedback.hint) if feedback.hint else None
        if hinted is not None:
            return Decomposition(hinted != reading.intent, hinted == reading.intent)
        faithful = response.strip() == conversation.task.execute(reading.intent, conversation.a, conversation.b)
        return Decomposition(faithful, not faithful)

    def revise(self, conversation: Conversation, reading: Reading, response: str, feedback: Feedback) -> Reading:
        hinted = conversation.task.parse_hint(feedback.hint) if feedback.hint else None
        if hinted is not None:
            ruled_out = tuple(i for i in conversation.task.intents if i != hinted and i in reading.ruled_out)
            if hinted != reading.intent:
                ruled_out = (*ruled_out, reading.intent) if reading.intent not in ruled_out else ruled_out
            return Reading(hinted, ruled_out)
        ruled_out = (*reading.ruled_out, reading.intent)
        remaining = [i for i in conversation.task.intents if i not in ruled_out]
        if not remaining:
            return replace(reading, ruled_out=ruled_out)
        return Reading(remaining[0], ruled_out)


__all__ = [
    "OPERATIONS",
    "AmbiguousOpsConversations",
    "AmbiguousOpsTask",
    "Conversation",
    "Decomposition",
    "Feedback",
    "IntentWords",
    "Reading",
]
