"""DeepChainSim: a deterministic simulator of deep compound chains for TextResNet vs TextGrad (no neural model).

A chain of ``depth`` components; component ``c_i`` holds an instruction naming one operation from a small vocabulary
of invertible string operations (reverse, rotations, swaps, Caesar shifts) and maps the latest value ``v_{i-1}`` to
``v_i = op_i(v_{i-1})``; ``v_0`` is a random lowercase word. The hidden correct chain ``p*`` gives the targets; 1–3
components start faulty (a different operation). Everything that would be a model call runs through one
:class:`~zoo.agents.ScriptedBackend` whose policy plays each role by rule:

* **component**: applies the operation its instruction names (none recognised: the value passes unchanged) and
  replies with the new value only. TextResNet appends it as a tagged delta, so its final state shows every step;
  TextGrad's replace-style chain passes it on as the next input, so its final output is the last value alone.
* **critic** (plain Python, deterministic, it knows ``p*``): judges every step the output shows. A residual state
  shows every step: one item per step whose value is not what the correct operation gives on the step's visible
  input, ``span c3: given 'abcdef' expected 'fedcba' got 'bcdefa'``, plus a ``global:`` item when the final answer is
  wrong (``global_items``). A replace-style output shows only the answer: ``output: expected 'T' got 'O'``.
* **TextGrad backward** (one call per node input, reading the node's conversation: its instruction, input, output
  and the feedback on its output): for the instruction, ``span c_i: given <input> expected <target> got <output>``
  for each feedback item whose target the output misses; for the input, the target pulled back through the node's
  *own* operation (:func:`pull_back`), which the node cannot know to be faulty. So a target is exact only above
  the last faulty node: each faulty node sends a wrong target upstream, and every node after a fault is handed an
  example (its actual, wrong input -> the right output) that its correct operation cannot meet. The optimizer
  updates every node that received feedback in the same step, so a correct node whose operation differs from
  another one by a shift that commutes with the upstream error is rewritten to absorb that error, while the
  faulty node is rewritten too. Deeper chains put more nodes on the path of each target.
* **projector** (TextResNet): routes the critic's items by span tag, as JSON.
* **optimizer**: picks the operation that meets most of the ``given -> expected`` examples in its feedback (the
  current one when it is among the best, else one at random among them); with no such example it keeps the
  instruction.

Optional per-call loss ``noise`` (q): each backward and projector call drops every feedback item it reads with
probability q and garbles it with probability q (a span item is moved to another component, any other item gets a
wrong expected value) [reconstruction of the notes' "lossy scripted backward"]; with q > 0 the item of ``c_i``
crosses ``L - i + 1`` such calls in TextGrad and one in TextResNet. Noise and choices draw from ``random.Random``
seeded by (seed, request text): same seed, same prompts, same replies. The simulator shows mechanisms; it does not
measure LLMs.
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
# every operation is a bijection on words of a given length: its inverse
INVERSES = {
    "reverse": lambda w: w[::-1],
    "rotate_left": lambda w: w[-1:] + w[:-1],
    "rotate_right": lambda w: w[1:] + w[:1],
    "swap_halves": lambda w: w[len(w) - len(w) // 2 :] + w[: len(w) - len(w) // 2],
    "swap_pairs": _swap_pairs,
    "shift_1": lambda w: _caesar(w, -1),
    "shift_3": lambda w: _caesar(w, -3),
    "unshift_1": lambda w: _caesar(w, 1),
}
_OPERATION = re.compile(r"operation '([a-z_0-9]+)'")
_SPAN_ID = re.compile(r"^span (?P<id>[^:\s]+):")
_GIVEN = re.compile(r"given '(?P<given>[a-z]*)'")
_EXPECTED = re.compile(r"expected '(?P<word>[a-z]*)'")
_FIELD = re.compile(r"^(Component|Target): (.*)$", re.MULTILINE)


def expected_of(item: str) -> str | None:
    """The value a feedback item says is expected (``expected '...'``), if it says one."""
    match = _EXPECTED.search(item)
    return match.group("word") if match else None


def pull_back(operation: str | None, target: str) -> str:
    """The input a component must receive for its output to be ``target`` under ``operation``: what a backward call
    that trusts its own instruction writes for its input (no recognised operation: the value passes unchanged)."""
    return INVERSES[operation](target) if operation else target


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
        record: TextGrad's replace-style components restate the text they received and append their new value, so its
            output shows every step as a residual state does, without tags, and its backward routes the critic's
            span items hop by hop (an ablation: the baseline gets the highway's visibility, not its routing).
        operations: the vocabulary the chain draws its operations from (default: all of :data:`OPERATIONS`;
            a smaller one gives the optimizer fewer operations to choose from).
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
        record: bool = False,
        operations: Sequence[str] | None = None,
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
        names = sorted(OPERATIONS) if operations is None else sorted(set(operations))
        unknown = [name for name in names if name not in OPERATIONS]
        if unknown or len(names) < 2:
            raise ConfigError(
                f"DeepChainSim operations={list(operations or [])}: give at least two of {sorted(OPERATIONS)}"
                + (f" (unknown: {unknown})" if unknown else "")
            )
        self.depth, self.noise, self.word_length, self.global_items, self.seed = (
            depth,
            noise,
            word_length,
            global_items,
            seed,
        )
        self.operations = names
        self.record = record
        rng = random.Random(f"deepchain/{seed}")
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
        """``[v_0, v_1, ...]`` read from a residual state (its input and visible deltas); a replace-style output shows
        only its last value."""
        if residual:
            return [state_input(output).strip(), *(text.strip() for _, text in visible_deltas(output))]
        return output.split() if self.record else output.split()[-1:]

    def answer(self, output: str, residual: bool) -> str:
        values = self.values(output, residual)
        return values[-1] if values else ""

    def is_correct(self, output: str, example: Example, residual: bool) -> bool:
        return self.answer(output, residual) == example.target

    def critique(
        self, output: str, example: Example, residual: bool, backend: Backend | None = None, log: CallLog | None = None
    ) -> list[str]:
        """The critic's items on what ``output`` shows: every step of a residual state, the answer of a replace-style
        output (module docstring)."""
        answer = self.answer(output, residual)
        if not (residual or self.record):
            return [] if answer == example.target else [f"output: expected '{example.target}' got '{answer}'"]
        values = self.values(output, residual)
        items = []
        for i, cid in enumerate(self.component_ids):
            if i + 1 >= len(values):
                items.append(f"span {cid}: given '{values[i] if i < len(values) else ''}' missing output")
                break
            expected = OPERATIONS[self.correct[cid]](values[i])
            if values[i + 1] != expected:
                items.append(f"span {cid}: given '{values[i]}' expected '{expected}' got '{values[i + 1]}'")
        if self.global_items and answer != example.target:
            items.append(f"global: the final answer '{answer}' is wrong")
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
        """Each item dropped with probability q, or garbled with probability q: a span item is moved to another
        component, any other item's expected value is replaced by a wrong one."""
        out = []
        for item in items:
            u = rng.random()
            if u < self.noise:
                continue
            if u < 2 * self.noise:
                span, expected = _SPAN_ID.match(item), _EXPECTED.search(item)
                if span and self.depth > 1:
                    other = rng.choice([c for c in self.component_ids if c != span.group("id")])
                    item = f"span {other}:{item[span.end() :]}"
                elif expected and expected.group("word"):
                    wrong = _caesar(expected.group("word"), rng.randint(1, 25))
                    item = f"{item[: expected.start('word')]}{wrong}{item[expected.end('word') :]}"
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
        values = self.values(state, RESIDUAL_NOTE in system)
        latest = values[-1] if values else ""
        new = OPERATIONS[operation](latest) if operation else latest
        return f"{state} {new}" if self.record and RESIDUAL_NOTE not in system else new

    def _backward(self, user: str, rng: random.Random) -> str:
        """One TextGrad backward call: feedback on the node's instruction, or on its input (module docstring)."""
        fields = dict(_FIELD.findall(user))
        cid = fields["Component"]
        position = self.component_ids.index(cid)
        operation = operation_of(_between(user, "INSTRUCTION"))
        given, got = _between(user, "INPUT").strip(), _between(user, "OUTPUT").strip()
        out = []
        for item in self.lossy(_items(_between(user, "FEEDBACK")), rng):
            span = _SPAN_ID.match(item)
            named = span.group("id") if span else None
            where = self.component_ids.index(named) if named in self.component_ids else None
            if where is not None:  # an item naming its component (a record): kept by it, passed on by later ones
                if where == position if fields["Target"] == "instruction" else where < position:
                    out.append(item)
                continue
            target = expected_of(item)
            if target is None:  # a remark on the whole output: every node passes it on
                out.append(item)
                continue
            if target == got:
                continue
            if fields["Target"] == "instruction":
                out.append(f"span {cid}: given '{given}' expected '{target}' got '{got}'")
                continue
            wanted = pull_back(operation, target)
            if wanted != given:
                out.append(f"input of {cid}: expected '{wanted}' got '{given}'")
        return "\n".join(out)

    def _optimize(self, user: str, rng: random.Random) -> str:
        current = _between(user, "VARIABLE")
        pairs = []
        for item in _items(_between(user, "FEEDBACK")):
            given, target = _GIVEN.search(item), expected_of(item)
            if given and target is not None:
                pairs.append((given.group("given"), target))
        if not pairs:
            return f"<IMPROVED_VARIABLE>{current}</IMPROVED_VARIABLE>"
        fits = {name: sum(OPERATIONS[name](g) == t for g, t in pairs) for name in self.operations}
        best = max(fits.values())
        candidates = [name for name, score in fits.items() if score == best]
        operation = operation_of(current)
        chosen = operation if operation in candidates else rng.choice(candidates)
        return f"<IMPROVED_VARIABLE>{instruction(chosen)}</IMPROVED_VARIABLE>"
