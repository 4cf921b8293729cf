"""Synthetic verifiable reasoning tasks.

Each task draws examples deterministically from a seed, has difficulty knobs, an exact verifier and answer
extraction (:class:`~zoo.answers.AnswerVerifier`, the single verifier of a task, used by modules and callbacks).
Completions share the format of :mod:`zoo.answers` (``<think>steps</think>ANSWER``).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from zoo.answers import AnswerVerifier, format_reasoning
from zoo.errors import ConfigError


@dataclass(frozen=True)
class Example:
    """One task instance: ``prompt`` + ``completion`` is the training text; ``answer`` is verified exactly."""

    prompt: str
    completion: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def as_row(self) -> dict[str, Any]:
        """The row form used by data sources (``prompt``, ``completion``, ``answer`` and meta columns)."""
        return {"prompt": self.prompt, "completion": self.completion, "answer": self.answer, **self.meta}


class Task(AnswerVerifier, ABC):
    """A synthetic task with an exact verifier (:meth:`verify`, inherited from :class:`AnswerVerifier`).

    ``distinct_prompts``: held-out splits hold prompts never trained on (the default). A task whose prompts are a
    small fixed set by design (a model organism: the same prompts with sampled completions) sets it to ``False``;
    its held-out splits are then fresh draws of the same prompts (:class:`~zoo.data.sources.TaskSource`).
    """

    name: str = "task"
    distinct_prompts: bool = True

    @abstractmethod
    def sample(self, rng: random.Random) -> Example:
        """Draw one example."""

    def examples(self, n: int, seed: int, exclude_prompts: set[str] | None = None) -> list[Example]:
        """``n`` examples drawn deterministically from ``seed``, skipping prompts in ``exclude_prompts``.

        When the task space is too small to find ``n`` new prompts, duplicates of allowed prompts are kept
        (never an excluded one), so held-out splits stay held out.
        """
        rng = random.Random(seed)
        exclude = exclude_prompts or set()
        out: list[Example] = []
        attempts = 0
        while len(out) < n:
            ex = self.sample(rng)
            attempts += 1
            if ex.prompt in exclude:
                if attempts > 1000 * max(n, 1):
                    raise ValueError(f"task {self.name}: cannot draw prompts outside the held-out set")
                continue
            out.append(ex)
        return out

    def describe(self) -> dict[str, Any]:
        """JSON-able description (name and knobs), used in cache keys."""
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


class Addition(Task):
    """Multi-digit addition with column-wise steps and carries.

    ``"47+85="`` -> ``<think>7+5=12\n4+8+1=13</think>132``

    Args:
        digits: maximum number of digits of each operand.
        min_digits: minimum number of digits of each operand.
    """

    name = "addition"

    def __init__(self, digits: int = 2, min_digits: int = 1) -> None:
        if not 1 <= min_digits <= digits:
            raise ValueError(f"need 1 <= min_digits <= digits, got {min_digits}, {digits}")
        self.digits = digits
        self.min_digits = min_digits

    def _operand(self, rng: random.Random) -> int:
        n = rng.randint(self.min_digits, self.digits)
        return rng.randint(0 if n == 1 else 10 ** (n - 1), 10**n - 1)

    def sample(self, rng: random.Random) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        steps, carry = [], 0
        da, db = str(a)[::-1], str(b)[::-1]
        for i in range(max(len(da), len(db))):
            x = int(da[i]) if i < len(da) else 0
            y = int(db[i]) if i < len(db) else 0
            total = x + y + carry
            steps.append(f"{x}+{y}+{carry}={total}" if carry else f"{x}+{y}={total}")
            carry = total // 10
        answer = str(a + b)
        return Example(f"{a}+{b}=", format_reasoning(steps, answer), answer, {"num_steps": len(steps)})


class MultiSum(Task):
    """Sum of several operands, optionally with redundant (re-verification) steps.

    Three layouts of the partial results (``partials``):

    - ``"chain"``: a running sum, one line per operand after the first; the last line states the answer.
      ``"3+5+2="`` -> ``<think>3+5=8\n8+2=10</think>10``.
    - ``"pairs"``: the operands are summed in disjoint consecutive pairs, one line per pair, and the answer (the sum
      of the pair sums) has no line of its own: ``"3+5+2+4="`` -> ``<think>3+5=8\n2+4=6</think>14``. Every pair line
      carries information no other line has, so dropping any of them loses something the answer needs.
    - ``"products"``: a sum of products of disjoint consecutive pairs, one line per product, and the answer (the sum
      of the products) has no line of its own: ``"3*2+1*3="`` -> ``<think>3*2=6\n1*3=3</think>9``. A product is not a
      linear function of the operands, so an answer cannot be read off the prompt's operands without the lines
      (with ``"pairs"`` it can: the answer is the sum of the prompt's operands). The pairs of a row are distinct, so
      no essential line repeats another.

    A redundant step re-checks the line before it and carries ``redundant=True`` in the ``step_redundant`` meta list
    (ground truth for the length/redundancy methods). By default it restates that line's value (``check 8``), so the
    value is then on two lines and either one can go; with ``check_states_value=False`` it is ``check ok`` and carries
    no value, so that an essential line is the only place its value appears and removing it removes information.

    Args:
        min_operands, max_operands: number of operands (``"pairs"``: both even and at least 4, i.e. 2 or more pairs;
            the count is drawn as a number of pairs).
        max_value: operands are drawn from ``[min_value, max_value]``.
        redundant_prob: probability of inserting a redundant step after each real step.
        partials: ``"chain"`` (running sum, the default), ``"pairs"`` (disjoint pair sums) or ``"products"``
            (disjoint pair products).
        min_value: the smallest operand (``"pairs"``: 1 keeps every pair sum from repeating an operand of the
            prompt, as ``3+0=3`` does).
        check_states_value: whether a redundant step restates the value it checks (``check 8``) or is a bare
            ``check ok``.
    """

    name = "multisum"
    PARTIALS = ("chain", "pairs", "products")
    #: the operator of a pair line of each pair layout
    PAIR_OPERATORS = {"pairs": "+", "products": "*"}

    def __init__(
        self,
        min_operands: int = 3,
        max_operands: int = 5,
        max_value: int = 9,
        redundant_prob: float = 0.0,
        partials: str = "chain",
        min_value: int = 0,
        check_states_value: bool = True,
    ) -> None:
        if not 2 <= min_operands <= max_operands:
            raise ConfigError(f"need 2 <= min_operands <= max_operands, got {min_operands}, {max_operands}")
        if not 0.0 <= redundant_prob <= 1.0:
            raise ConfigError(f"redundant_prob must be in [0, 1], got {redundant_prob}")
        if not 0 <= min_value <= max_value:
            raise ConfigError(f"need 0 <= task.min_value <= task.max_value, got {min_value}, {max_value}")
        if partials not in self.PARTIALS:
            raise ConfigError(f"task.partials must be one of {list(self.PARTIALS)}, got {partials!r}")
        if partials in self.PAIR_OPERATORS and (min_operands % 2 or max_operands % 2 or min_operands < 4):
            raise ConfigError(
                f"task.partials={partials} combines the operands in disjoint pairs: task.min_operands and "
                f"task.max_operands must be even and at least 4 (2 pairs; with one pair its line states the answer), "
                f"got {min_operands}, {max_operands}"
            )
        self.min_operands = min_operands
        self.max_operands = max_operands
        self.max_value = max_value
        self.min_value = min_value
        self.redundant_prob = redundant_prob
        self.partials = partials
        self.check_states_value = bool(check_states_value)

    def sample(self, rng: random.Random) -> Example:
        if self.partials in self.PAIR_OPERATORS:
            return self._sample_pairs(rng)
        ops = [
            rng.randint(self.min_value, self.max_value)
            for _ in range(rng.randint(self.min_operands, self.max_operands))
        ]
        steps: list[str] = []
        redundant: list[bool] = []
        total = ops[0]
        for x in ops[1:]:
            new = total + x
            steps.append(f"{total}+{x}={new}")
            redundant.append(False)
            total = new
            self._maybe_check(rng, total, steps, redundant)
        return self._example(ops, steps, redundant, str(total))

    def _sample_pairs(self, rng: random.Random) -> Example:
        num_pairs = rng.randint(self.min_operands // 2, self.max_operands // 2)
        op = self.PAIR_OPERATORS[self.partials]
        ops = [rng.randint(self.min_value, self.max_value) for _ in range(2 * num_pairs)]
        while op == "*" and len(set(zip(ops[0::2], ops[1::2]))) < num_pairs and self.min_value < self.max_value:
            # products: distinct pairs, so that no essential line repeats another (each one is needed once)
            ops = [rng.randint(self.min_value, self.max_value) for _ in range(2 * num_pairs)]
        steps: list[str] = []
        redundant: list[bool] = []
        values: list[int] = []
        for a, b in zip(ops[0::2], ops[1::2]):
            values.append(a * b if op == "*" else a + b)
            steps.append(f"{a}{op}{b}={values[-1]}")
            redundant.append(False)
            self._maybe_check(rng, values[-1], steps, redundant)
        prompt = "+".join(f"{a}{op}{b}" for a, b in zip(ops[0::2], ops[1::2])) + "="
        return self._example(ops, steps, redundant, str(sum(values)), prompt)

    def _maybe_check(self, rng: random.Random, value: int, steps: list[str], redundant: list[bool]) -> None:
        """Append a redundant ``check <value>`` (or ``check ok``) step with probability ``redundant_prob``."""
        if rng.random() < self.redundant_prob:
            steps.append(f"check {value}" if self.check_states_value else "check ok")
            redundant.append(True)

    @staticmethod
    def _example(
        ops: list[int], steps: list[str], redundant: list[bool], answer: str, prompt: str | None = None
    ) -> Example:
        """The row; ``prompt`` defaults to the operands' sum ``"3+5+2="``."""
        meta = {"num_steps": len(steps), "step_redundant": redundant, "num_redundant": sum(redundant)}
        prompt = "+".join(map(str, ops)) + "=" if prompt is None else prompt
        return Example(prompt, format_reasoning(steps, answer), answer, meta)


class Reverse(Task):
    """String reversal, one character per step: ``"rev abc="`` -> ``<think>c\nb\na</think>cba``.

    Args:
        min_length, max_length: length of the string.
        alphabet: characters to draw from.
    """

    name = "reverse"

    def __init__(self, min_length: int = 3, max_length: int = 8, alphabet: str = "abcdefghij") -> None:
        if not 1 <= min_length <= max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        self.min_length = min_length
        self.max_length = max_length
        self.alphabet = alphabet

    def sample(self, rng: random.Random) -> Example:
        s = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_length, self.max_length)))
        answer = s[::-1]
        return Example(f"rev {s}=", format_reasoning(list(answer), answer), answer, {"num_steps": len(s)})
