"""Scripted Persona2Web agents: random, no-history, pre-execution, on-demand and oracle (arXiv 2602.17003).

All but the random agent follow the same navigation plan (the web part of the paper's runners, scripted):
``search_engine(category) -> open_site -> set_location -> site_search(category, filters) -> item_details -> stop``,
relaxing one filter at a time when a search finds nothing. They differ in where the hidden fields come from:

* ``persona_no_history`` -- only what the query states; a hidden site is a random search result, hidden
  preferences are left unfiltered, a hidden location is left at the site's default.
* ``persona_pre_execution`` -- before the first web action, up to five memory queries (the released code lets the
  LLM write <= 5; here one per hidden field, from templates [reconstruction]); each hidden field is then the
  most frequent value among the retrieved entries of the domain (a frequency vote).
* ``persona_on_demand`` -- the same queries, but each one issued at the decision it serves (before choosing the
  site, the location, the filters), through the scheme's smaller top-k.
* ``persona_oracle`` -- the answer key (needs ``env.reveal_answer=true``); with ``read_evidence`` it first retrieves
  a supporting history entry per hidden field (the upper bound in both scoring modes); without, it is the "lucky"
  agent of the tests (right answer, no evidence).
* ``persona_random`` -- random site, location, filters and result.

The LLM agent is :class:`zoo.agents.LLMToolAgent` on the same tools (``agent=llm``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Generator
from typing import Any, ClassVar

from zoo.agents.envs.persona2web.world import site_domain
from zoo.agents.policies.base import Action, Agent, EpisodeInfo
from zoo.agents.types import ToolCall, ToolResult
from zoo.errors import ConfigError

Plan = Generator[ToolCall, None, None]
ENV_NAME = "persona2web"


def stated_fields(library: dict[str, Any]) -> dict[str, str]:
    """The fields a query states: the site (``At <site>,``), the location (``(<city> <zip>)``) and attribute values."""
    query = library["query"]
    out: dict[str, str] = {}
    site = re.search(r"At ([\w.-]+\.[a-z]+),", query)
    if site:
        out["site"] = site.group(1)
    for location in library["locations"]:
        if location in query:
            out["location"] = location
    bold = re.findall(r"\*\*(.+?)\*\*", query)
    for attr, values in library["attributes"].items():
        for value in values:
            if value in bold:
                out[attr] = value
    return out


def vote(entries: list[dict[str, Any]], library: dict[str, Any], field_name: str) -> str | None:
    """The most frequent value of a field among retrieved entries of the task's domain (ties: vocabulary order)."""
    domain = library["domain"]
    own = [e for e in entries if site_domain(str(e.get("website", ""))) == domain]
    counts: Counter = Counter()
    if field_name == "site":
        counts.update(e["website"] for e in own)
        return min(counts, key=lambda s: (-counts[s], s)) if counts else None
    values = library["locations"] if field_name == "location" else library["attributes"][field_name]
    for e in own:
        for value in values:
            if value.lower() in str(e.get("object", "")).lower():
                counts[value] += 1
    return min(counts, key=lambda v: (-counts[v], values.index(v))) if counts else None


def memory_queries(library: dict[str, Any], fields: list[str]) -> dict[str, str]:
    """One retrieval query per hidden field [reconstruction of the LLM-written queries]."""
    category = library["category"]
    templates = {
        "site": f"{library['domain']} {category} website visits and orders",
        "location": f"{category} delivered to venue location city",
    }
    return {f: templates.get(f, f"{category} {f} {' '.join(library['attributes'].get(f, []))}") for f in fields}


class PersonaAgent(Agent):
    """Base of the scripted Persona2Web agents: a generator plan fed with observations.

    Args:
        seed: seed of the agent's random generator (random choices of the no-history and random agents).
    """

    name: ClassVar[str] = ""
    #: ``None``: never reads; ``"upfront"``: every query before the first web action; ``"on_demand"``: at decisions
    reads: ClassVar[str | None] = None

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        if info.env_name != ENV_NAME:
            raise ConfigError(f"agent={self.name} plays the {ENV_NAME} environment, not {info.env_name!r}")
        tool_names = {t["function"]["name"] for t in info.tools}
        if self.reads is not None and "memory_access" not in tool_names:
            raise ConfigError(
                f"agent={self.name} reads the user's history: use env.scheme=pre-execution or on-demand "
                f"(this environment's scheme is {info.library.get('scheme')!r})"
            )
        self.library = info.library
        self.last: ToolResult | None = None
        self.entries: list[dict[str, Any]] = []
        self.plan = self.steps()

    def observe(self, observation: ToolResult) -> None:
        self.last = observation
        if observation.name == "memory_access" and observation.ok:
            self.entries += observation.content.get("entries", [])

    def decide(self) -> Action:
        try:
            return Action(next(self.plan))
        except StopIteration:
            return Action(ToolCall("stop", {"answer": "N/A", "reasoning": "plan exhausted"}))

    # -- the plan ----------------------------------------------------------------------------------------------
    def hidden(self) -> list[str]:
        stated = stated_fields(self.library)
        return [f for f in ("site", "location", *self.library["attributes"]) if f not in stated]

    def recall(self, fields: list[str]) -> Plan:
        """Memory reads for ``fields`` (none for agents that do not read)."""
        if self.reads is None:
            return
        for query in memory_queries(self.library, fields).values():
            yield ToolCall("memory_access", {"query": query})

    def resolve(self, field_name: str) -> str | None:
        """The value of a field: stated in the query, else voted from retrieved entries (``None``: unknown)."""
        stated = stated_fields(self.library)
        if field_name in stated:
            return stated[field_name]
        return vote(self.entries, self.library, field_name) if self.reads is not None else None

    def choose_site(self, results: list[str]) -> str:
        return self.rng.choice(results)

    def steps(self) -> Plan:
        hidden = self.hidden()
        if self.reads == "upfront":
            yield from self.recall(hidden)
        category = self.library["category"]
        yield ToolCall("search_engine", {"query": category})
        results = [r["site"] for r in (self.content().get("results") or [])]
        if self.reads == "on_demand" and "site" in hidden:
            yield from self.recall(["site"])
        site = self.resolve("site") or self.choose_site(results)
        yield ToolCall("open_site", {"site": site})
        if self.reads == "on_demand" and "location" in hidden:
            yield from self.recall(["location"])
        location = self.resolve("location")
        if location:
            yield ToolCall("set_location", {"location": location})
        if self.reads == "on_demand":
            yield from self.recall([f for f in hidden if f in self.library["attributes"]])
        filters = {a: v for a in self.library["attributes"] if (v := self.resolve(a))}
        yield from self.search_and_stop(category, filters)

    def content(self) -> dict[str, Any]:
        last = self.last
        return last.content if last is not None and last.ok and isinstance(last.content, dict) else {}

    def search_and_stop(self, category: str, filters: dict[str, str]) -> Plan:
        while True:
            yield ToolCall("site_search", {"query": category, "filters": dict(filters)})
            found = self.content().get("results") or []
            if found or not filters:
                break
            filters.pop(list(filters)[-1])
        if not found:
            yield ToolCall("stop", {"answer": "N/A", "reasoning": "no item found"})
            return
        item = found[0]["id"]
        yield ToolCall("item_details", {"item_id": item})
        reasoning = json.dumps({"filters": filters, "evidence_entries": len(self.entries)}, sort_keys=True)
        yield ToolCall("stop", {"answer": item, "reasoning": reasoning})


class NoHistoryAgent(PersonaAgent):
    """Uses only what the query states (random site when the site is hidden)."""

    name: ClassVar[str] = "persona_no_history"


class PreExecutionAgent(PersonaAgent):
    """Reads the history for every hidden field before the first web action, then votes."""

    name: ClassVar[str] = "persona_pre_execution"
    reads: ClassVar[str | None] = "upfront"


class OnDemandAgent(PersonaAgent):
    """Reads the history at each decision that needs a hidden field, then votes."""

    name: ClassVar[str] = "persona_on_demand"
    reads: ClassVar[str | None] = "on_demand"


class OracleAgent(PersonaAgent):
    """Acts on the answer key (``env.reveal_answer=true``).

    Args:
        seed: unused randomness (kept for the common signature).
        read_evidence: retrieve one supporting history entry per hidden field first (when the scheme allows);
            ``False`` gives the "lucky" agent: the right answer with no evidence.
    """

    name: ClassVar[str] = "persona_oracle"

    def __init__(self, seed: int = 0, read_evidence: bool = True) -> None:
        super().__init__(seed)
        self.read_evidence = read_evidence

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        if "answer_key" not in info.library:
            raise ConfigError(f"agent={self.name} needs the answer key: set env.reveal_answer=true")
        self.key = info.library["answer_key"]

    def resolve(self, field_name: str) -> str | None:
        return self.key["truth"][field_name]

    def steps(self) -> Plan:
        can_read = any(t["function"]["name"] == "memory_access" for t in self.info.tools)
        if self.read_evidence and can_read:
            for text in self.key["evidence"].values():
                yield ToolCall("memory_access", {"query": text})
        category = self.library["category"]
        yield ToolCall("open_site", {"site": self.resolve("site")})
        yield ToolCall("set_location", {"location": self.resolve("location")})
        filters = {a: self.resolve(a) for a in self.library["attributes"]}
        yield from self.search_and_stop(category, filters)


class PersonaRandomAgent(PersonaAgent):
    """Random site, location, filters and result (chance level)."""

    name: ClassVar[str] = "persona_random"

    def steps(self) -> Plan:
        category = self.library["category"]
        yield ToolCall("search_engine", {"query": category})
        results = [r["site"] for r in (self.content().get("results") or [])]
        yield ToolCall("open_site", {"site": self.rng.choice(results)})
        yield ToolCall("set_location", {"location": self.rng.choice(self.library["locations"])})
        attrs = self.library["attributes"]
        filters = {a: self.rng.choice(v) for a, v in attrs.items() if self.rng.random() < 0.5}
        yield ToolCall("site_search", {"query": category, "filters": filters})
        found = self.content().get("results") or []
        answer = self.rng.choice(found)["id"] if found else "N/A"
        yield ToolCall("stop", {"answer": answer, "reasoning": "random"})


PERSONA_AGENTS: tuple[type[PersonaAgent], ...] = (
    PersonaRandomAgent,
    NoHistoryAgent,
    PreExecutionAgent,
    OnDemandAgent,
    OracleAgent,
)
