"""Chain problems a textual optimizer runs on: components with instruction parameters, examples, a critic.

A :class:`ChainProblem` supplies the component ids and their initial instructions, the role description of each
instruction, train and test examples, and the critic (the textual loss: a list of critique items, empty when the
output is correct). ``residual`` says which forward produced the output: TextResNet's additive tagged deltas
(``True``) or TextGrad's replace-style chain (``False``).

Two problems: :class:`~zoo.textopt.deepchain.DeepChainSim` (the simulator; it knows the faulty components) and
:class:`QAChain` (the real path: examples from a JSONL file, components run by any backend).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from zoo.agents.backends.base import Backend
from zoo.errors import ConfigError, DataError
from zoo.textopt.calls import CallLog, llm_critique
from zoo.textopt.deltas import visible_deltas


@dataclass(frozen=True)
class Example:
    """One input of the chain and its reference answer."""

    input: str
    target: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepReport:
    """What one optimization step did.

    Attributes:
        accuracy: share of the minibatch answered correctly before the update.
        updated: component ids sent to the optimizer, in order.
        gradients: the critiques each component held when the optimizer ran (insertion order).
        extra: method-specific numbers (densities, projector failures, ...).
    """

    accuracy: float
    updated: list[str]
    gradients: dict[str, list[str]]
    extra: dict[str, Any]


@runtime_checkable
class ChainProblem(Protocol):
    component_ids: list[str]

    def initial_instructions(self) -> list[str]: ...

    def role(self, component_id: str) -> str: ...

    def train_examples(self, indices: list[int]) -> list[Example]: ...

    def test_examples(self) -> list[Example]: ...

    def answer(self, output: str, residual: bool) -> str: ...

    def is_correct(self, output: str, example: Example, residual: bool) -> bool: ...

    def critique(
        self, output: str, example: Example, residual: bool, backend: Backend | None = None, log: CallLog | None = None
    ) -> list[str]: ...

    def faulty(self, instructions: dict[str, str]) -> set[str] | None: ...

    def default_backend(self) -> Backend | None: ...


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


class QAChain:
    """A chain of LLM components answering questions from a JSONL file (``{"input": ..., "answer": ...}`` per line).

    The critic is exact match on the final answer (the last visible delta of a residual output, the whole output of
    a replace-style chain), one global critique item when it is wrong; with ``judge`` set, the critique items come
    from an LLM loss with that evaluation instruction (:func:`~zoo.textopt.calls.llm_critique`, TextGrad's ``TextLoss``;
    the reference answer is given).

    Args:
        path: JSONL with ``input`` and ``answer`` fields (``meta`` optional).
        instructions: initial instruction of each component, in chain order.
        roles: role description of each instruction (default: "instruction of component c<i>").
        test_path: held-out JSONL (default: the training file).
        judge: evaluation instruction of an LLM loss, or ``None`` for exact match.
    """

    def __init__(
        self,
        path: str,
        instructions: list[str],
        roles: list[str] | None = None,
        test_path: str | None = None,
        judge: str | None = None,
    ) -> None:
        if not instructions:
            raise ConfigError("QAChain instructions: give at least one component instruction")
        if roles is not None and len(roles) != len(instructions):
            raise ConfigError(f"QAChain roles has {len(roles)} entries for {len(instructions)} instructions")
        self.component_ids = [f"c{i + 1}" for i in range(len(instructions))]
        self.instructions = list(instructions)
        self.roles = list(roles) if roles else [f"instruction of component {c}" for c in self.component_ids]
        self.train = read_examples(path)
        self.test = read_examples(test_path) if test_path else self.train
        self.judge = judge

    def initial_instructions(self) -> list[str]:
        return list(self.instructions)

    def role(self, component_id: str) -> str:
        return self.roles[self.component_ids.index(component_id)]

    def train_examples(self, indices: list[int]) -> list[Example]:
        return [self.train[i % len(self.train)] for i in indices]

    def test_examples(self) -> list[Example]:
        return list(self.test)

    def answer(self, output: str, residual: bool) -> str:
        if not residual:
            return output
        deltas = visible_deltas(output)
        return deltas[-1][1] if deltas else output

    def is_correct(self, output: str, example: Example, residual: bool) -> bool:
        return normalize(self.answer(output, residual)) == normalize(example.target)

    def critique(
        self, output: str, example: Example, residual: bool, backend: Backend | None = None, log: CallLog | None = None
    ) -> list[str]:
        if self.judge is not None:
            if backend is None or log is None:
                raise ConfigError("QAChain judge needs a backend")
            instruction = f"{self.judge}\nQuestion: {example.input}\nReference answer: {example.target}"
            return llm_critique(backend, log, instruction, output)
        if self.is_correct(output, example, residual):
            return []
        return [f"global: the final answer {self.answer(output, residual)!r} is wrong; expected {example.target!r}"]

    def faulty(self, instructions: dict[str, str]) -> set[str] | None:
        return None

    def default_backend(self) -> Backend | None:
        return None


def read_examples(path: str | Path) -> list[Example]:
    """Examples from a JSONL file; a bad line is a :class:`~zoo.errors.DataError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"QAChain data file {path} does not exist")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(Example(str(row["input"]), str(row["answer"]), dict(row.get("meta") or {})))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(f"{path}:{number}: need a JSON object with 'input' and 'answer' ({err})") from None
    if not out:
        raise DataError(f"{path} holds no examples")
    return out
