"""The random baseline: valid experiments chosen at random, then a random structured commit.

It explores uniformly (random moves with the odd state query, random input pairs, random crosses among the
organisms it has seen), resets a finished grid round, frees lab space when the lab is full, and commits a random
draw from the environment's commit vocabulary once the step budget is spent (or, with ``free``, at a random
moment). Its score is the chance level of the rubric.
"""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.agents.policies.answers import answer_payload
from zoo.agents.policies.base import Action, Agent, EpisodeInfo, commit_call
from zoo.agents.policies.solvers.sequence import random_sequence
from zoo.agents.types import ToolCall, ToolResult
from zoo.errors import ConfigError

EXPERIMENT_TOOLS = {
    "ultrahorizon/grid": "move",
    "ultrahorizon/sequence": "input_sequences",
    "ultrahorizon/bio": "conduct_cross",
}


class RandomAgent(Agent):
    """Random valid experiments and a random commit."""

    name: ClassVar[str] = "random"

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        if info.env_name not in EXPERIMENT_TOOLS:
            raise ConfigError(
                f"agent=random does not know environment '{info.env_name}'; known: {sorted(EXPERIMENT_TOOLS)}"
            )
        self.successes = 0
        self.exhausted = False
        self.round_over = False
        self.lab_full = False
        self.organisms = [1, 2, 3]

    def observe(self, observation: ToolResult) -> None:
        content = observation.content if isinstance(observation.content, dict) else {}
        text = str(content.get("message", content.get("error", ""))).lower()
        if observation.name == EXPERIMENT_TOOLS[self.info.env_name]:
            if observation.ok:
                self.successes += 1
                self.round_over = bool(content.get("game_over", False))
                self.organisms += [o["id"] for o in content.get("offspring", [])]
            elif "round is over" in text:
                self.round_over = True
            elif "capacity" in text:
                self.lab_full = True
            elif "required" in text or "maximum" in text:
                self.exhausted = True
        elif observation.name == "reset" and observation.ok:
            self.round_over = False
        elif observation.name == "remove_organisms" and observation.ok:
            removed = set(observation.arguments["organism_ids"])
            self.organisms = [i for i in self.organisms if i not in removed]
            self.lab_full = False

    def decide(self) -> Action:
        info = self.info
        budget_spent = self.exhausted or self.successes >= info.required_steps
        if budget_spent or (info.free and self.rng.random() < 1.0 / info.required_steps):
            return Action(commit_call(answer_payload(info, random_commit(info, self.rng))))
        return Action(getattr(self, "_" + info.env_name.split("/")[1])())

    def _grid(self) -> ToolCall:
        if self.round_over:
            return ToolCall("reset", {})
        if self.rng.random() < 0.1:
            return ToolCall(self.rng.choice(["get_current_state", "get_full_map"]), {})
        return ToolCall("move", {"direction": self.rng.choice(["up", "down", "left", "right"])})

    def _sequence(self) -> ToolCall:
        return ToolCall(
            "input_sequences", {"main_sequence": random_sequence(self.rng), "vice_sequence": random_sequence(self.rng)}
        )

    def _bio(self) -> ToolCall:
        if self.lab_full:
            offspring = [i for i in self.organisms if i > 3]
            return ToolCall("remove_organisms", {"organism_ids": self.rng.sample(offspring, len(offspring) // 2 + 1)})
        if self.rng.random() < 0.1:
            return ToolCall(self.rng.choice(["get_lab_status", "query_organisms"]), {})
        parents = [self.rng.choice(self.organisms), self.rng.choice(self.organisms)]
        count = self.rng.randint(1, 30)
        return ToolCall("conduct_cross", {"parent1_id": parents[0], "parent2_id": parents[1], "num_offspring": count})


def random_commit(info: EpisodeInfo, rng) -> dict[str, Any]:
    """A uniformly random structured commit from the environment's commit vocabulary."""
    library = info.library
    if "keys" in library:
        return {key: rng.choice(sorted(library["rules"])) for key in library["keys"]}
    fields = library["fields"]
    size_alleles = rng.randint(1, 4)
    return {
        **{k: rng.choice(v) for k, v in fields.items() if v is not None},
        "size_alleles": size_alleles,
        "size_values": sorted(rng.sample([10, 20, 50, 100, 150, 200, 250, 300], size_alleles), reverse=True),
        "color_order": rng.sample(library["colors"], len(library["colors"])),
        "shell_order": rng.sample(library["shells"], len(library["shells"])),
        "lethal_set": sorted(rng.sample(library["shells"], rng.randint(0, len(library["shells"])))),
    }
