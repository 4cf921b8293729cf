"""DeepChainSim: a deterministic simulator of deep compound chains for TextResNet vs TextGrad (no neural model).

A chain of ``depth`` components; component ``c_i`` holds an instruction naming one operation from a small vocabulary
of string operations (reverse, rotations, Caesar shifts, ...) and maps the latest value ``v_{i-1}`` to
``v_i = op_i(v_{i-1})``; ``v_0`` is a random lowercase word. The hidden correct chain ``p*`` gives the targets; 1–3
components start faulty (a different operation). Everything that would be a model call runs through one
:class:`~zoo.agents.ScriptedBackend` whose policy plays each role by rule:

* **component**: applies the operation its instruction names (none recognised: the value passes unchanged); with
  TextResNet's residual note it replies with the new value only (a delta), otherwise with the text it received plus
  the new value (a replace-style node that carries the record forward);
* **critic** (plain Python, deterministic): one item per step whose output is not what the correct operation gives
  on the step's visible input, ``span c3: given 'abcde' expected 'edcba' got 'bcdea'``, plus a ``global:`` item when
  the final answer is wrong (``global_items``);
* **TextGrad backward** (one call per node input): keeps the items for the node's instruction (its span, and global
  items) or passes the upstream ones on (earlier spans, global items); **every call is lossy**: each item is dropped
  with probability ``noise`` and garbled (its span moved to another component) with probability ``noise``
  [reconstruction of the notes' "lossy scripted backward"];
* **projector** (TextResNet): the same per-call loss on the items, then routing by span tag, as JSON;
* **optimizer**: picks an operation consistent with the ``given → expected`` examples in its feedback (the current one
  when it fits, else one at random among the consistent ones); with no such example it keeps the instruction.

Noise and choices draw from ``random.Random`` seeded by (seed, request text): same seed, same prompts, same replies.
Depth thus only enters through how many lossy calls an item crosses: one projector call in TextResNet, ``L - i + 1``
backward calls for the item of ``c_i`` in TextGrad. The simulator shows that mechanism; it does not measure LLMs.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections.abc import Sequence
from typing import Any

from zoo.agents.backends import ScriptedBackend
from zoo.agents.backends.base import Backend
from zoo.errors import ConfigError
from zoo.textopt.calls import CallLog
from zoo.textopt.deltas import state_input, visible_deltas
from zoo.textopt.problem import Example
from zoo.textopt.textgrad import BACKWARD_SYSTEM, OPTIMIZER_SYSTEM
from zoo.textopt.textresnet import PROJECTOR_SYSTEM, RESIDUAL_NOTE, route_by_pattern

DEPTHS = (2, 5, 10, 20)


def _caesar(word: str, k: int) -> str:
    return "".join(chr((ord(ch) - 97 + k) % 26 + 97) for ch in word)


def _swap_pairs(word: str) -> str:
    chars = list(word)
    for i in range(0, len(chars) - 1, 2):
        chars[i], chars[i + 1] = chars[i + 1], chars[i]
    return "".join(chars)


OPERATIONS = {
    "reverse": lambda w: w[::-1],
    "rotate_left": lambda w: w[1:] + w[:1],
    "rotate_right": lambda w: w[-1:] + w[:-1],
    "swap_halves": lambda w: w[len(w) // 2 :] + w[: len(w) // 2],
    "swap_pairs": _swap_pairs,
    "shift_1": lambda w: _caesar(w, 1),
    "shift_3": lambda w: _caesar(w, 3),
    "unshift_1": lambda w: _caesar(w, -1),
}
_OPERATION = re.compile(r"operation '([a-z_0-9]+)'")
_SPAN_ITEM = re.compile(r"^span (?P<id>[^:\s]+): given '(?P<given>[a-z]*)' expected '(?P<expected>[a-z]*)'")
_SPAN_ID = re.compile(r"^span (?P<id>[^:\s]+):")
_FIELD = re.compile(r"^(Component|Target): (.*)$", re.MULTILINE)


def instruction(operation: str) -> str:
    return f"Apply the operation '{operation}' to the latest value."


def operation_of(text: str) -> str | None:
    """The operation an instruction names (``None``: none of the vocabulary)."""
    match = _OPERATION.search(text)
    return match.group(1) if match and match.group(1) in OPERATIONS else None


def _between(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.DOTALL)
    return match.group(1) if match else ""


def _items(block: str) -> list[str]:
    return [line.strip() for line in block.splitlines() if line.strip()]


class DeepChainSim:
    """The simulated chain problem (a :class:`~zoo.textopt.problem.ChainProblem`).

    Args:
        depth: number of components L (the paper's sweep: 2, 5, 10, 20).
        faulty: ``[lo, hi]``: the number of faulty components is drawn uniformly in this range (capped at L).
        noise: per-call drop and garble probability q of the lossy backward / projector calls (``2q <= 1``).
        word_length: length of the words the chain transforms.
        test_size: held-out inputs for the test accuracy.
        global_items: the critic adds a ``global:`` item when the final answer is wrong.
        seed: the instance (correct chain, faults, test words) and the simulator's draws.
    """

    def __init__(
        self,
        depth: int = 5,
        faulty: Sequence[int] = (1, 3),
        noise: float = 0.1,
        word_length: int = 6,
        test_size: int = 16,
        global_items: bool = True,
        seed: int = 0,
    ) -> None:
        if depth < 1:
            raise ConfigError(f"DeepChainSim depth={depth}: need at least one component")
        if len(faulty) != 2 or not 0 <= faulty[0] <= faulty[1]:
            raise ConfigError(f"DeepChainSim faulty={list(faulty)}: give [lo, hi] with 0 <= lo <= hi")
        if not 0.0 <= noise <= 0.5:
            raise ConfigError(f"DeepChainSim noise={noise}: the drop/garble probability must be in [0, 0.5]")
        if word_length < 2:
            raise ConfigError(f"DeepChainSim word_length={word_length}: use at least 2")
        self.depth, self.noise, self.word_length, self.global_items, self.seed = (
            depth,
            noise,
            word_length,
            global_items,
            seed,
        )
        rng = random.Random(f"deepchain/{seed}")
        names = sorted(OPERATIONS)
        self.component_ids = [f"c{i + 1}" for i in range(depth)]
        self.correct = {cid: rng.choice(names) for cid in self.component_ids}
        count = min(rng.randint(faulty[0], faulty[1]), depth)
        self.initially_faulty = sorted(rng.sample(self.component_ids, count), key=self.component_ids.index)
        self.initial = dict(self.correct)
        for cid in self.initially_faulty:
            self.initial[cid] = rng.choice([n for n in names if n != self.correct[cid]])
        self.test = [self.example(f"test/{i}") for i in range(test_size)]

    # ------------------------------------------------------------------ the problem protocol
    def initial_instructions(self) -> list[str]:
        return [instruction(self.initial[cid]) for cid in self.component_ids]

    def role(self, component_id: str) -> str:
        return f"instruction of component {component_id}"

    def example(self, key: str) -> Example:
        rng = random.Random(f"deepchain/{self.seed}/{key}")
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(self.word_length))
        value = word
        for cid in self.component_ids:
            value = OPERATIONS[self.correct[cid]](value)
        return Example(word, value)

    def train_examples(self, indices: list[int]) -> list[Example]:
        return [self.example(f"train/{i}") for i in indices]

    def test_examples(self) -> list[Example]:
        return list(self.test)

    def values(self, output: str, residual: bool) -> list[str]:
        """``[v_0, v_1, ...]`` read from an output (residual: the input and the visible deltas)."""
        if residual:
            return [state_input(output).strip(), *(text.strip() for _, text in visible_deltas(output))]
        return output.split()

    def answer(self, output: str, residual: bool) -> str:
        values = self.values(output, residual)
        return values[-1] if values else ""

    def is_correct(self, output: str, example: Example, residual: bool) -> bool:
        return self.answer(output, residual) == example.target

    def critique(
        self, output: str, example: Example, residual: bool, backend: Backend | None = None, log: CallLog | None = None
    ) -> list[str]:
        values = self.values(output, residual)
        items = []
        for i, cid in enumerate(self.component_ids):
            if i + 1 >= len(values):
                items.append(f"span {cid}: given '{values[i] if i < len(values) else ''}' missing output")
                break
            expected = OPERATIONS[self.correct[cid]](values[i])
            if values[i + 1] != expected:
                items.append(f"span {cid}: given '{values[i]}' expected '{expected}' got '{values[i + 1]}'")
        if self.global_items and self.answer(output, residual) != example.target:
            items.append(f"global: the final answer '{self.answer(output, residual)}' is wrong")
        return items

    def faulty(self, instructions: dict[str, str]) -> set[str]:
        return {cid for cid in self.component_ids if operation_of(instructions[cid]) != self.correct[cid]}

    def default_backend(self) -> Backend:
        return ScriptedBackend(policy=self.policy, name=f"deepchain-sim/q={self.noise}")

    # ------------------------------------------------------------------ the scripted roles
    def _rng(self, messages: list[dict[str, Any]]) -> random.Random:
        digest = hashlib.sha256(json.dumps([self.seed, messages], sort_keys=True).encode()).hexdigest()
        return random.Random(digest)

    def lossy(self, items: Sequence[str], rng: random.Random) -> list[str]:
        """Each item dropped with probability q, or garbled (span moved to another component) with probability q."""
        out = []
        for item in items:
            u = rng.random()
            if u < self.noise:
                continue
            match = _SPAN_ID.match(item)
            if u < 2 * self.noise and match and self.depth > 1:
                other = rng.choice([c for c in self.component_ids if c != match.group("id")])
                item = f"span {other}:{item[match.end() :]}"
            out.append(item)
        return out

    def policy(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        system, user = messages[0]["content"], messages[-1]["content"]
        rng = self._rng(messages)
        if system == BACKWARD_SYSTEM:
            return self._backward(user, rng)
        if system == PROJECTOR_SYSTEM:
            items = self.lossy(_items(_between(user, "FEEDBACK")), rng)
            projection = route_by_pattern(items, self.component_ids, _SPAN_ID)
            return json.dumps({**projection.components, "global": projection.global_items})
        if system == OPTIMIZER_SYSTEM:
            return self._optimize(user, rng)
        return self._component(system, user)

    def _component(self, system: str, state: str) -> str:
        operation = operation_of(system)
        residual = RESIDUAL_NOTE in system
        values = self.values(state, residual)
        latest = values[-1] if values else ""
        new = OPERATIONS[operation](latest) if operation else latest
        return new if residual else f"{state} {new}"

    def _backward(self, user: str, rng: random.Random) -> str:
        fields = dict(_FIELD.findall(user))
        position = self.component_ids.index(fields["Component"])
        kept = []
        for item in self.lossy(_items(_between(user, "FEEDBACK")), rng):
            match = _SPAN_ID.match(item)
            where = (
                self.component_ids.index(match.group("id"))
                if match and match.group("id") in self.component_ids
                else None
            )
            if where is None or (where == position if fields["Target"] == "instruction" else where < position):
                kept.append(item)
        return "\n".join(kept)

    def _optimize(self, user: str, rng: random.Random) -> str:
        current = _between(user, "VARIABLE")
        pairs = [
            (m.group("given"), m.group("expected"))
            for m in map(_SPAN_ITEM.match, _items(_between(user, "FEEDBACK")))
            if m
        ]
        if not pairs:
            return f"<IMPROVED_VARIABLE>{current}</IMPROVED_VARIABLE>"
        fits = {name: sum(fn(g) == e for g, e in pairs) for name, fn in sorted(OPERATIONS.items())}
        best = max(fits.values())
        candidates = [name for name, score in fits.items() if score == best]
        operation = operation_of(current)
        chosen = operation if operation in candidates else rng.choice(candidates)
        return f"<IMPROVED_VARIABLE>{instruction(chosen)}</IMPROVED_VARIABLE>"
