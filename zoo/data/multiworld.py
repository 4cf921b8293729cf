"""Multi-world key-value recall: the synthetic task of the WET demo (research notes inference.md 2(d)).

Worlds ``W0..W{K-1}`` each map entities ``E00..`` to values ``V00..`` by a permutation ``pi_k``; the permutations
are the rows of a Latin square, so ``pi_k(i) != pi_k'(i)`` for every entity and every pair of worlds and any
wrong answer that is a value of another world is attributable to that world. A prompt names its world first,
then a span of distractor characters, then the query::

    W2:qhdkw E07=   ->   N            (N = pi_2(7): every value is one character, so one token)

``dominant_world`` makes up ``dominant_prob`` of the draws (the parametric prior a model learns); longer
distractor spans than seen in training and a late mention of a conflicting world (``" see W1"`` at the end of the
distractors, with ``conflict_prob``) induce drift at test time. Rows carry the ground truth for the demo's
metrics: ``world``, ``entity``, ``distance`` (distractor characters), ``conflict_world`` (-1 for none),
``world_values`` (the answer in every world) and ``counterfactual_prompt`` (the same query in world ``k + 1``, for
activation patching). :meth:`MultiWorldRecallTask.attribute` names the world an answer belongs to;
:meth:`MultiWorldRecallTask.parse_prompt` reads the world and entity back from a prompt (what an evaluation sees of a
row).
"""

from __future__ import annotations

import random
import re
from typing import Any

from zoo.answers import PlainAnswerVerifier
from zoo.data.tasks import Example, Task


class MultiWorldRecallTask(PlainAnswerVerifier, Task):
    """``W<k>:<distractors> E<i>=`` -> ``V<pi_k(i)>`` (the completion is the answer: no reasoning block).

    Args:
        num_worlds: ``K`` (at most ``num_entities``).
        num_entities: entities and values per world (at most ``len(value_alphabet)``).
        value_alphabet: the value names, one character each (so an answer is a single token).
        dominant_world: the over-represented world.
        dominant_prob: probability of drawing ``dominant_world`` (others share the rest uniformly).
        min_distractors, max_distractors: distractor span length (characters).
        conflict_prob: probability of a late mention of another world in the distractors.
        alphabet: distractor characters.
        permutation_seed: seed of the worlds' permutations (fixed across splits and runs).
    """

    name = "multiworld"

    def __init__(
        self,
        num_worlds: int = 4,
        num_entities: int = 20,
        dominant_world: int = 0,
        dominant_prob: float = 0.7,
        min_distractors: int = 0,
        max_distractors: int = 8,
        conflict_prob: float = 0.0,
        alphabet: str = "abcdefghijklmnopqrstuvwxyz",
        permutation_seed: int = 0,
        value_alphabet: str = "ABCDFGHIJKLMNOPQRSTU",
    ) -> None:
        if not 2 <= num_worlds <= num_entities <= min(100, len(value_alphabet)):
            raise ValueError(
                f"need 2 <= num_worlds <= num_entities <= min(100, len(value_alphabet)={len(value_alphabet)}), "
                f"got {num_worlds}, {num_entities}"
            )
        if len(set(value_alphabet)) != len(value_alphabet) or set(value_alphabet) & set(alphabet + "WE0123456789:= "):
            raise ValueError(
                "value_alphabet must be distinct characters outside the distractor alphabet, 'W', 'E', digits"
            )
        if not 0 <= dominant_world < num_worlds:
            raise ValueError(f"dominant_world={dominant_world} must be in [0, {num_worlds})")
        if not 0 <= min_distractors <= max_distractors:
            raise ValueError(f"need 0 <= min_distractors <= max_distractors, got {min_distractors}, {max_distractors}")
        for name, p in (("dominant_prob", dominant_prob), ("conflict_prob", conflict_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name}={p} must be in [0, 1]")
        if not alphabet or any(c in alphabet for c in "WE0123456789:= "):
            raise ValueError("alphabet must be non-empty and avoid the characters 'W', 'E', digits, ':', '=', ' '")
        self.num_worlds = num_worlds
        self.num_entities = num_entities
        self.dominant_world = dominant_world
        self.dominant_prob = dominant_prob
        self.min_distractors = min_distractors
        self.max_distractors = max_distractors
        self.conflict_prob = conflict_prob
        self.alphabet = alphabet
        self.permutation_seed = permutation_seed
        self.value_alphabet = value_alphabet
        rng = random.Random(permutation_seed)
        values = rng.sample(range(num_entities), num_entities)
        offsets = rng.sample(range(num_entities), num_entities)
        self._table = [
            [values[(offsets[i] + k) % num_entities] for i in range(num_entities)] for k in range(num_worlds)
        ]

    def value(self, world: int, entity: int) -> int:
        """``pi_world(entity)``."""
        return self._table[world][entity]

    def value_text(self, value: int) -> str:
        """The answer text of a value id (one character of ``value_alphabet``)."""
        return self.value_alphabet[value]

    def prompt(self, world: int, entity: int, distractors: str) -> str:
        """The prompt text of a query."""
        return f"W{world}:{distractors} E{entity:02d}="

    def parse_prompt(self, prompt: str) -> tuple[int, int] | None:
        """``(world, entity)`` of a prompt written by :meth:`prompt` (``None`` when ``prompt`` is not one; a late
        conflicting mention does not change the world, which is the one named first)."""
        match = re.fullmatch(r"W(\d+):.* E(\d+)=", prompt, flags=re.DOTALL)
        if match is None:
            return None
        world, entity = int(match.group(1)), int(match.group(2))
        return (world, entity) if world < self.num_worlds and entity < self.num_entities else None

    def describe_prompt(self, prompt: str) -> dict[str, int] | None:
        """``world``, ``entity``, ``distance`` (distractor characters, a late mention included) and
        ``conflict_world`` (the world of a late ``" see W<k>"`` mention, -1 for none) of a prompt written by
        :meth:`prompt`, as :meth:`sample` records them (``None`` when ``prompt`` is not one)."""
        parsed = self.parse_prompt(prompt)
        if parsed is None:
            return None
        world, entity = parsed
        distractors = prompt[len(f"W{world}:") : -len(f" E{entity:02d}=")]
        conflict = re.search(r" see W(\d+)$", distractors)
        return {
            "world": world,
            "entity": entity,
            "distance": len(distractors),
            "conflict_world": int(conflict.group(1)) if conflict else -1,
        }

    def sample(self, rng: random.Random) -> Example:
        if rng.random() < self.dominant_prob:
            world = self.dominant_world
        else:
            world = rng.choice([k for k in range(self.num_worlds) if k != self.dominant_world])
        entity = rng.randrange(self.num_entities)
        distractors = "".join(
            rng.choice(self.alphabet) for _ in range(rng.randint(self.min_distractors, self.max_distractors))
        )
        conflict = -1
        if rng.random() < self.conflict_prob:
            conflict = rng.choice([k for k in range(self.num_worlds) if k != world])
            distractors += f" see W{conflict}"
        answer = self.value_text(self.value(world, entity))
        meta: dict[str, Any] = {
            "world": world,
            "entity": entity,
            "distance": len(distractors),
            "conflict_world": conflict,
            "world_values": [self.value_text(self.value(k, entity)) for k in range(self.num_worlds)],
            "counterfactual_prompt": self.prompt((world + 1) % self.num_worlds, entity, distractors),
        }
        return Example(self.prompt(world, entity, distractors), answer, answer, meta)

    def attribute(self, entity: int, answer: str) -> int | None:
        """The world whose value of ``entity`` is ``answer`` (``None`` if no world's)."""
        answer = answer.strip()
        for world in range(self.num_worlds):
            if self.value_text(self.value(world, entity)) == answer:
                return world
        return None

    def misattributed(self, world: int, entity: int, answer: str) -> bool:
        """World misattribution: the answer is the value of ``entity`` in another world."""
        attributed = self.attribute(entity, answer)
        return attributed is not None and attributed != world
