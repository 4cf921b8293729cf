"""PersonaWebSim: the offline stand-in for Persona2Web's live-web tasks (arXiv 2602.17003).

"Persona2Web: Benchmarking personalized web agents for contextual reasoning with user history". The released
benchmark runs AgentOccam / browser-use on the open web and grades with an LLM judge; this environment is a
deterministic **substitute, not a replica**: a simulated web of 3-5 sites per domain (:mod:`.world`), one persona
per episode seed, a query at ambiguity level 1, 2 or 3, and the rubric of :mod:`.scoring`.

History-access schemes (``scheme``), as in the released ``access_scheme.py``:

* ``no-history`` -- no memory tool.
* ``pre-execution`` -- ``memory_access(query)`` returns the top-20 entries, at most 5 queries, and only before the
  first web action (the released code writes <= 5 memory queries, retrieves top-20 each, then rewrites the
  objective and runs the agent with memory off).
* ``on-demand`` -- ``memory_access(query)`` is an action like any other; top-20 entries, as AgentOccam's
  ``process_memory_query`` and browser-use's ``PersonalizationService`` (the LLM answer the release builds from them
  is left to the agent [reconstruction]).

Both schemes keep only entries whose score reaches ``threshold``, as the released ``MemoryBankRetriever.retrieve``
(``threshold=0.5`` on stella cosine scores, called by both ``process_memory_request`` paths). ``threshold="auto"``
(the default) applies that 0.5 where the scores are a sentence encoder's cosine (``minilm`` or a local
sentence-transformers directory with the ``cosine``/``faiss`` retriever) and no threshold on the hashing encoder or
the BM25/hybrid scores, which live on other scales (hashing cosines stay below 0.3, so 0.5 would drop every entry).

Retrieval goes through :mod:`zoo.text.retrieval` over the entries' text (``encoder``: ``hashing`` by default,
``minilm`` for the real sentence encoder; ``retriever``: cosine | faiss | bm25 | hybrid).

Tools: ``search_engine``, ``open_site``, ``set_location``, ``site_search`` (with attribute filters),
``item_details``, ``memory_access`` (schemes with history), ``stop`` (the answer: an item id). The environment follows
the harness protocol of :class:`zoo.agents.envs.base.Environment` (``prompt``, ``tools()``, ``library()``,
``committed``, ``report``, ...); ``report`` also exists when the agent never stopped (everything 0).

Rule -> function map: world generation -> :meth:`PersonaWeb.__init__` (:class:`.world.PersonaWorld`); access
schemes -> :meth:`PersonaWeb.memory_access`; rubric and error tags -> :meth:`PersonaWeb.grade`
(:func:`.scoring.grade`).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from typing import Any, ClassVar

from zoo.agents.envs.base import RubricItem, ScoreReport
from zoo.agents.envs.persona2web.scoring import METRICS, PREF_MODES, Grade, grade, supports
from zoo.agents.envs.persona2web.world import (
    DOMAINS,
    LEVELS,
    LOCATIONS,
    PersonaWorld,
    domain_spec,
    location_text,
)
from zoo.agents.tools import ToolRegistry, agent_tool
from zoo.errors import ConfigError
from zoo.text import build_retriever, load_encoder

SCHEMES = ("no-history", "pre-execution", "on-demand")
MODES = ("outcome", "reasoning")
#: released settings: pre-execution <= 5 queries x top-20 (``access_scheme.py`` ``retrieve_memories``); on-demand
#: top-20 too (AgentOccam ``process_memory_query`` ``top_k=20``; browser-use ``PersonalizationService``
#: ``retrieval_top_k=20``); ``retrieve``'s own default of 10 is used only by the retriever's example script
PRE_EXECUTION_QUERIES = 5
SCHEME_TOP_K = {"pre-execution": 20, "on-demand": 20}
#: released ``MemoryBankRetriever.retrieve(threshold=0.5)``: stella cosine scores, both schemes
RELEASED_THRESHOLD = 0.5
RESULTS_SHOWN = 10


def resolve_threshold(threshold: float | str | None, encoder: str, retriever: str) -> float | None:
    """The score threshold of memory reads: a number, ``None`` (none), or ``"auto"`` -- the released 0.5 on a
    sentence encoder's cosine scores (``cosine``/``faiss`` retriever, encoder not ``hashing``), else none."""
    if threshold is None:
        return None
    if isinstance(threshold, str):
        if threshold != "auto":
            raise ConfigError(f"env.threshold={threshold!r}; use a number, null (no threshold) or auto")
        dense = retriever in ("cosine", "faiss") and not str(encoder).startswith("hashing")
        return RELEASED_THRESHOLD if dense else None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ConfigError(f"env.threshold={threshold!r}; use a number, null (no threshold) or auto")
    return float(threshold)


@functools.lru_cache(maxsize=4)
def _encoder(spec: str):
    return load_encoder(spec)


class PersonaWeb:
    """One Persona2Web task on a simulated web.

    Args:
        seed: the world seed (persona, sites, catalogues, history).
        level: query ambiguity, 1 (site, preferences and location hidden), 2 (site and location hidden), 3 (explicit).
        scheme: ``no-history`` | ``pre-execution`` | ``on-demand``.
        domain: ``apparel`` | ``events`` | ``courses``; ``None`` draws one from the seed.
        mode: the score of the episode: ``reasoning`` (reasoning-aware, the paper's judge) or ``outcome``.
        pref_mode: P_pref as the share of matched attributes (``fraction``) or all-or-nothing (``binary``).
        sites_per_domain: 3-5.
        distractors: distractor seeds (gifts, one-off visits on other sites) per domain.
        encoder: sentence encoder spec for retrieval (``hashing``, ``hashing:<dim>``, ``minilm``, a local dir).
        retriever: ``cosine`` | ``faiss`` | ``bm25`` | ``hybrid``.
        threshold: score threshold of memory reads in both schemes: a number, ``None`` (none) or ``"auto"`` (the
            released 0.5 on a sentence encoder's cosine scores, none on hashing/BM25/hybrid scores; see above).
        max_steps: step cap of the episode (AgentOccam: 20).
        reveal_answer: publish the answer key in :meth:`library` (only for the oracle agent).
    """

    name: ClassVar[str] = "persona2web"

    def __init__(
        self,
        seed: int = 0,
        level: int = 1,
        scheme: str = "pre-execution",
        domain: str | None = None,
        mode: str = "reasoning",
        pref_mode: str = "fraction",
        sites_per_domain: int = 4,
        distractors: int = 6,
        encoder: str = "hashing",
        retriever: str = "cosine",
        threshold: float | str | None = "auto",
        max_steps: int = 20,
        reveal_answer: bool = False,
    ) -> None:
        if int(level) not in LEVELS:
            raise ConfigError(f"env.level must be one of {LEVELS}, got {level!r}")
        if scheme not in SCHEMES:
            raise ConfigError(f"env.scheme must be one of {SCHEMES}, got {scheme!r}")
        if mode not in MODES:
            raise ConfigError(f"env.mode must be one of {MODES}, got {mode!r}")
        if pref_mode not in PREF_MODES:
            raise ConfigError(f"env.pref_mode must be one of {PREF_MODES}, got {pref_mode!r}")
        if int(max_steps) < 1:
            raise ConfigError(f"env.max_steps must be >= 1, got {max_steps}")
        self.seed = seed
        self.world = PersonaWorld.generate(seed, sites_per_domain, distractors)
        domain = domain if domain is not None else random.Random(f"{seed}/domain").choice(sorted(DOMAINS))
        domain_spec(domain)
        self.level, self.scheme, self.mode, self.pref_mode = int(level), scheme, mode, pref_mode
        self.task = self.world.task(domain, self.level)
        self.difficulty = f"level{self.level}"
        self.required_steps = 0
        self.free = True
        self.max_steps = int(max_steps)
        self.reveal_answer = bool(reveal_answer)
        self.threshold = resolve_threshold(threshold, encoder, retriever)
        self.hidden_tools: tuple[str, ...] = ("memory_access",) if scheme == "no-history" else ()
        self._retriever = None
        self._encoder_spec, self._retriever_kind = encoder, retriever
        if scheme != "no-history":
            self._retriever = build_retriever(retriever, None if retriever == "bm25" else _encoder(encoder))
            self._retriever.add([e.text() for e in self.world.history])
        # episode state
        self.web_actions = 0
        self.reads: list[dict[str, Any]] = []
        self.retrieved: list[int] = []
        self.opened: list[str] = []
        self.current_site: str | None = None
        self.location: str | None = None
        self.applied: dict[str, list[str]] = {}
        self.committed = False
        self.commit_content: str | None = None
        self.answer_item = None
        self._report: ScoreReport | None = None

    # -- what agents see --------------------------------------------------------------------------------------
    @property
    def prompt(self) -> str:
        lines = [
            f"You are a web agent acting for a user on a simulated web. {self.task.query}",
            "Find the one item that fits the request and answer with stop(answer=<item id>, reasoning=...). Do not "
            "log in, buy or pay: stop before any irreversible step.",
            "Navigate with search_engine, open_site, set_location, site_search (attribute filters) and item_details.",
        ]
        if self.scheme == "pre-execution":
            lines.append(
                f"Before your first web action you may read the user's browsing history with memory_access(query) "
                f"(at most {PRE_EXECUTION_QUERIES} queries, top {SCHEME_TOP_K['pre-execution']} entries each); "
                "after it the history is closed."
            )
        elif self.scheme == "on-demand":
            lines.append(
                f"Whenever the request is ambiguous, read the user's browsing history with memory_access(query) "
                f"(top {SCHEME_TOP_K['on-demand']} entries)."
            )
        else:
            lines.append("The user's history is not available.")
        return "\n".join(lines)

    @property
    def max_agent_steps(self) -> int:
        return self.max_steps

    def library(self) -> dict[str, Any]:
        """The public vocabulary (domain, category, filters, locations, scheme); the answer key only when revealed."""
        spec = DOMAINS[self.task.domain]
        data: dict[str, Any] = {
            "domain": self.task.domain,
            "level": self.level,
            "scheme": self.scheme,
            "query": self.task.query,
            "category": self.task.category,
            "attributes": {k: list(v) for k, v in spec.attributes.items()},
            "locations": [location_text(loc) for loc in LOCATIONS],
        }
        if self.reveal_answer:
            data["answer_key"] = {"truth": dict(self.task.truth), "evidence": self._evidence()}
        return data

    def _evidence(self) -> dict[str, str]:
        """Per hidden field, the text of one history entry supporting the true value (for the oracle)."""
        out = {}
        for name in self.task.hidden:
            value = self.task.truth[name]
            entry = next((e for e in self.world.history if supports(e, self.task.domain, name, value)), None)
            if entry is not None:
                out[name] = entry.text()
        return out

    def tools(self) -> ToolRegistry:
        return ToolRegistry.from_object(self, exclude=self.hidden_tools)

    def _web_action(self) -> None:
        self.web_actions += 1

    # -- web tools -------------------------------------------------------------------------------------------
    @agent_tool
    def search_engine(self, query: str) -> dict[str, Any]:
        """Search the web: the sites whose offer matches the query, with a snippet each.

        Args:
            query: search words.
        """
        self._web_action()
        words = set(re.findall(r"[\w-]+", query.lower()))
        hits = []
        for spec in DOMAINS.values():
            vocab = {w for c in spec.categories for w in c.split()} | {spec.name}
            if words & vocab:
                hits += self.world.domain_sites(spec.name)
        hits = hits or [s.name for s in self.world.sites.values()]
        order = sorted(hits, key=lambda s: (hash_rank(self.seed, s), s))
        return {
            "results": [
                {"site": s, "snippet": f"{s}: {', '.join(DOMAINS[self.world.sites[s].domain].categories)}"}
                for s in order
            ]
        }

    @agent_tool
    def open_site(self, site: str) -> dict[str, Any]:
        """Open a website's home page.

        Args:
            site: the site name, e.g. as returned by search_engine.
        """
        self._web_action()
        site = site.strip().lower().removeprefix("https://").removeprefix("www.").rstrip("/")
        if site not in self.world.sites:
            return {"error": f"site {site!r} not found; known sites: {sorted(self.world.sites)}"}
        self.current_site = site
        self.opened.append(site)
        return {"page": self.world.sites[site].home_page(self._location_of(site))}

    def _location_of(self, site: str) -> str:
        return self.location or self.world.sites[site].default_location

    @agent_tool
    def set_location(self, location: str) -> dict[str, Any]:
        """Set the delivery / venue location used by every site (a zip code or 'City, ST').

        Args:
            location: a zip code, a city or 'City, ST zip'.
        """
        self._web_action()
        text = location.lower()
        for city, zip_code in LOCATIONS:
            if zip_code in text or city.lower() in text or city.split(",")[0].lower() == text.strip():
                self.location = location_text((city, zip_code))
                self.applied.setdefault("location", []).append(self.location)
                return {"success": True, "location": self.location}
        known = [location_text(loc) for loc in LOCATIONS]
        return {"error": f"no site serves {location!r}; served locations: {known}"}

    @agent_tool
    def site_search(self, query: str, filters: dict | None = None) -> dict[str, Any]:
        """Search the open site's catalogue at the current location, optionally with attribute filters.

        Args:
            query: what to look for (a category).
            filters: attribute -> value, e.g. {"color": "navy"} (see the site's filters).
        """
        self._web_action()
        if self.current_site is None:
            return {"error": "no site is open; call open_site first"}
        site = self.world.sites[self.current_site]
        spec = DOMAINS[site.domain]
        filters = dict(filters or {})
        for key, value in filters.items():
            if key not in spec.attributes:
                return {"error": f"unknown filter {key!r} on {site.name}; filters: {sorted(spec.attributes)}"}
            if value not in spec.attributes[key]:
                return {"error": f"filter {key}={value!r} is not offered; values: {list(spec.attributes[key])}"}
        for key, value in filters.items():
            self.applied.setdefault(key, []).append(value)
        words = set(re.findall(r"[\w/&-]+", query.lower()))
        categories = [c for c in spec.categories if set(c.split()) <= words]
        categories = categories or [c for c in spec.categories if set(c.split()) & words] or list(spec.categories)
        location = self._location_of(site.name)
        items = [
            i
            for i in site.items
            if i.category in categories
            and i.location == location
            and all(i.attributes[k] == v for k, v in filters.items())
        ]
        items.sort(key=lambda i: (i.rank, i.id))
        return {
            "site": site.name,
            "location": location,
            "count": len(items),
            "results": [
                {"id": i.id, "title": i.title(), "price": i.price, "rating": i.rating} for i in items[:RESULTS_SHOWN]
            ],
        }

    @agent_tool
    def item_details(self, item_id: str) -> dict[str, Any]:
        """The page of one item of the open site.

        Args:
            item_id: the item id from site_search.
        """
        self._web_action()
        item = self.world.item(item_id.strip())
        if item is None or item.site != self.current_site:
            return {"error": f"no item {item_id!r} on {self.current_site or 'the current page'}"}
        return {"page": item.page()}

    @agent_tool
    def memory_access(self, query: str) -> dict[str, Any]:
        """Read the user's browsing history: the entries most related to the query.

        Args:
            query: what to look up (e.g. 'apparel purchases and their sizes').
        """
        if self.scheme == "no-history":  # hidden in this scheme; kept for direct calls
            return {"error": "the no-history scheme has no memory access"}
        if self.scheme == "pre-execution":
            if self.web_actions > 0:
                return {"error": "pre-execution scheme: the history is read only before the first web action"}
            if len(self.reads) >= PRE_EXECUTION_QUERIES:
                return {"error": f"pre-execution scheme: at most {PRE_EXECUTION_QUERIES} memory queries"}
        hits = self._retriever.search(query, SCHEME_TOP_K[self.scheme])
        if self.threshold is not None:  # released: both schemes go through retrieve(threshold=0.5)
            hits = [(i, s) for i, s in hits if s >= self.threshold]
        indices = [i for i, _ in hits]
        self.reads.append({"query": query, "web_actions_before": self.web_actions, "entries": indices})
        self.retrieved += [i for i in indices if i not in self.retrieved]
        history = self.world.history
        return {"entries": [{**vars(history[i]), "score": round(s, 4)} for i, s in hits]}

    @agent_tool
    def stop(self, answer: str, reasoning: str = "") -> dict[str, Any]:
        """Give the final answer and end the episode.

        Args:
            answer: the id of the item that fits the request ('N/A' if none).
            reasoning: why this item fits (which history entries or query parts support it).
        """
        if self.committed:
            return {"success": False, "message": "already stopped"}
        self._web_action()
        self.committed = True
        self.commit_content = answer
        self.answer_item = self.world.item(answer.strip())
        self._report = self.grade_report()
        return {"success": True, "message": "Answer recorded; the episode is over.", "points": self._report.total}

    # -- grading ---------------------------------------------------------------------------------------------
    def grade(self) -> Grade:
        retrieved = [self.world.history[i] for i in self.retrieved]
        return grade(self.task, self.answer_item, self.opened, retrieved, self.applied, self.pref_mode)

    def grade_report(self) -> ScoreReport:
        """Score (Success of ``mode``) as a :class:`ScoreReport`; items: both modes' metrics in percent."""
        result = self.grade()
        items = [
            RubricItem(f"{metric}/{mode}", 100, round(100 * result.metrics(mode)[metric]))
            for mode in MODES
            for metric in METRICS
        ]
        raw = {
            "task_id": self.task.task_id,
            "domain": self.task.domain,
            "level": self.level,
            "scheme": self.scheme,
            "mode": self.mode,
            "outcome": result.outcome,
            "reasoning": result.reasoning,
            "fields": result.fields,
            "memory_reads": len(self.reads),
            "reads": self.reads,
            "web_actions": self.web_actions,
            "stopped": self.committed,
        }
        total = 100.0 * result.metrics(self.mode)["Success"]
        return ScoreReport(items, f"rubric:{self.mode}", total, raw, tags=list(result.tags))

    @property
    def report(self) -> ScoreReport:
        """The grade: of the answer after ``stop``, of "no answer" before (so unfinished episodes count as 0)."""
        return self._report if self._report is not None else self.grade_report()

    def ground_truth(self) -> dict[str, str]:
        return dict(self.task.truth)


def hash_rank(seed: int, name: str) -> int:
    """A stable per-world order of search results (not the preferred site first)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:4], "big")


__all__ = ["SCHEMES", "PersonaWeb"]
