"""A scripted ProcWorld agent that reads an EvolveLab memory provider: no LLM, so memory is its only teacher.

At the start of a task it asks the provider (status ``BEGIN``, query = the task text), takes the facts of the items
about its own task family (a scripted reader: the family name is in the item) and replays what it knows; where it
knows nothing it explores the op pool in a seeded random order, skipping ops already proven elsewhere in the
procedure. On an error it may ask again (status ``IN``, the error as context; at most ``in_queries`` times per task).
The characters of injected memory are charged as prompt tokens (4 characters per token), the token proxy of the
MemEvolve demo. ``memory_log`` records per task: requests, items, items about the task's family (hits), duplicate
items in one answer, facts learned from memory, characters injected.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from zoo.agents.backends.base import approx_tokens
from zoo.agents.memory_interface import MemoryProvider, MemoryRequest, MemoryStatus
from zoo.agents.policies.base import Action, Agent, EpisodeInfo
from zoo.agents.types import ToolCall, ToolResult, Usage
from zoo.errors import ConfigError


class ProcWorldMemoryAgent(Agent):
    """Scripted ProcWorld agent with an optional memory provider.

    Args:
        seed: exploration order.
        memory: an EvolveLab provider (``None``: the no-memory agent).
        in_queries: IN-phase requests allowed per task (on errors).
    """

    name: ClassVar[str] = "procworld_memory"

    def __init__(self, seed: int = 0, memory: MemoryProvider | None = None, in_queries: int = 2) -> None:
        super().__init__(seed)
        if in_queries < 0:
            raise ConfigError(f"agent.in_queries must be >= 0, got {in_queries}")
        self.memory = memory
        self.in_queries = in_queries
        if memory is not None:
            memory.initialize()

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        task = info.library
        if "family" not in task:
            raise ConfigError(f"agent=procworld_memory plays env=procworld only, not {info.env_name!r}")
        self.task = task
        self.family = task["family"]
        self.order = list(task["ops"])
        self.rng.shuffle(self.order)
        self.units = list(task["units"])
        self.length = int(task["procedure_length"])
        self.negative = float(task["value"]) < 0
        self.known: dict[int, str] = {}
        self.unit: str | None = None
        self.sign_fix: str | None = None
        self.need_sign = False
        self.sign_fixed = False
        self.progress = 0
        self.tried: dict[int, set[str]] = {}
        self.units_tried: set[str] = set()
        self.sign_tried: set[str] = set()
        self.steps = 0
        self.in_left = self.in_queries
        self.pending_tokens = 0
        self.last_call: ToolCall | None = None
        self.memory_log = {"requests": 0, "items": 0, "hits": 0, "duplicates": 0, "facts": 0, "chars": 0}
        self.ask(MemoryStatus.BEGIN, "")

    # -- memory -----------------------------------------------------------------------------------------------
    def ask(self, status: MemoryStatus, context: str) -> None:
        if self.memory is None:
            return
        response = self.memory.provide_memory(MemoryRequest(self.task["query"], context, status))
        log = self.memory_log
        log["requests"] += 1
        log["items"] += len(response.memories)
        contents = [m.content for m in response.memories]
        log["duplicates"] += len(contents) - len(set(contents))
        log["chars"] += response.characters
        self.pending_tokens += approx_tokens("".join(contents))
        for item in response.memories:
            if item.metadata.get("group") != self.family:
                continue
            log["hits"] += 1
            for fact in item.metadata.get("facts") or []:
                log["facts"] += self.learn(fact)

    def learn(self, fact: dict[str, Any]) -> int:
        """Absorb one fact; 1 when it was new."""
        if fact["type"] == "step" and fact["index"] not in self.known:
            self.known[fact["index"]] = fact["op"]
            return 1
        if fact["type"] == "unit" and self.unit is None and fact.get("unit"):
            self.unit = fact["unit"]
            return 1
        if fact["type"] == "sign_fix" and self.sign_fix is None:
            self.sign_fix = fact["op"]
            return 1
        return 0

    # -- acting -----------------------------------------------------------------------------------------------
    def decide(self) -> Action:
        self.steps += 1
        assert self.info is not None
        if self.progress >= self.length or self.steps >= self.info.max_steps:
            call = ToolCall("commit_final_result", {"content": json.dumps({"status": "done"})})
        elif self.progress == 1 and self.negative and not self.sign_fixed and (self.need_sign or self.sign_fix):
            call = ToolCall("use", {"op": self.sign_fix or self.next_sign_candidate(), "unit": ""})
        else:
            op = self.known.get(self.progress) or self.next_candidate()
            unit = (self.unit or self.next_unit()) if self.progress == 1 else ""
            call = ToolCall("use", {"op": op, "unit": unit})
        self.last_call = call
        usage = Usage(prompt_tokens=self.pending_tokens)
        self.pending_tokens = 0
        return Action(call, usage=usage)

    def next_candidate(self) -> str:
        proven = set(self.known.values()) | ({self.sign_fix} if self.sign_fix else set())
        tried = self.tried.setdefault(self.progress, set())
        options = [op for op in self.order if op not in proven and op not in tried]
        return options[0] if options else self.order[self.steps % len(self.order)]

    def next_unit(self) -> str:
        options = [u for u in self.units if u not in self.units_tried]
        return options[0] if options else self.units[0]

    def next_sign_candidate(self) -> str:
        proven = set(self.known.values())
        options = [op for op in self.order if op not in proven and op not in self.sign_tried]
        return options[0] if options else self.order[0]

    def observe(self, observation: ToolResult) -> None:
        if observation.name != "use" or self.last_call is None:
            return
        content = observation.content if isinstance(observation.content, dict) else {}
        message = str(content.get("message", ""))
        op = str(observation.arguments.get("op", ""))
        if observation.ok:
            if message.endswith("(sign fixed)"):
                self.sign_fixed, self.sign_fix = True, op
            else:
                self.known[self.progress] = op
                if self.progress == 1:
                    self.unit = str(observation.arguments.get("unit", ""))
                self.progress += 1
            return
        if message.endswith("fails on negative input"):
            self.known[self.progress] = op
            self.need_sign = True
        elif "rejects unit" in message:
            self.known[self.progress] = op
            self.units_tried.add(str(observation.arguments.get("unit", "")))
        elif self.progress == 1 and self.need_sign and not self.sign_fixed:
            self.sign_tried.add(op)
        else:
            self.tried.setdefault(self.progress, set()).add(op)
        if self.in_left > 0:
            self.in_left -= 1
            self.ask(MemoryStatus.IN, message)
