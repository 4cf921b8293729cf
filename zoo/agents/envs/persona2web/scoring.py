"""Deterministic rubric of Persona2Web (arXiv 2602.17003): P_web, P_pref, Intent, Success, and error tags.

The paper grades with a GPT-5-mini judge and a rubric that reads the whole trajectory ("reasoning-aware"); the
rubric text is not public. Offline, the zoo scores against the generator's answer key [reconstruction]:

* **P_web** -- the answer item is on the site the history points to (the preferred site).
* **P_pref** -- the share of the domain's preference attributes the answer item matches (``pref_mode="binary"``:
  1 only when all match).
* **Intent** -- task correctness apart from the preferences: a real item of the requested category, on a site the
  agent opened, available at the user's location.
* **Success** -- P_web = 1, every preference matched, and Intent = 1.

Two modes. *Outcome-only* looks at the answer alone. *Reasoning-aware* credits a hidden field (site, location, an
attribute) only when it is stated in the query or a history entry supporting it was actually retrieved: an entry
of the domain's sites (for the site: an entry *on* that site) whose ``object`` mentions the value. So an agent that
guesses right without consulting the history (a "lucky" agent) scores 1 outcome-only and 0 reasoning-aware.

Error tags (per episode): ``navigation_failure`` (Intent = 0), ``retrieval_failure`` (a hidden field is wrong and
no retrieved entry supports its true value), ``utilization_failure`` (a hidden field is wrong although a retrieved
entry supports its true value), ``hallucinated_preference`` (a filter or location the agent applied that neither the
query nor any retrieved entry mentions), ``no_answer`` (no item given).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from zoo.agents.envs.persona2web.world import DOMAINS, HistoryEntry, Item, Task, site_domain
from zoo.errors import ConfigError

PREF_MODES = ("fraction", "binary")
METRICS = ("P_web", "P_pref", "Intent", "Success")


def supports(entry: HistoryEntry, domain: str, field_name: str, value: str) -> bool:
    """Whether a history entry is evidence for ``field_name = value`` in ``domain``."""
    if site_domain(entry.website) != domain:
        return False
    if field_name == "site":
        return entry.website == value
    return value.lower() in entry.object.lower()


def supported(entries: Iterable[HistoryEntry], domain: str, field_name: str, value: str) -> bool:
    return any(supports(e, domain, field_name, value) for e in entries)


@dataclass
class Grade:
    """Both modes' metrics and the tags of one episode."""

    outcome: dict[str, float]
    reasoning: dict[str, float]
    tags: list[str] = field(default_factory=list)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def metrics(self, mode: str) -> dict[str, float]:
        return self.outcome if mode == "outcome" else self.reasoning


def grade(
    task: Task,
    item: Item | None,
    opened: Iterable[str],
    retrieved: list[HistoryEntry],
    applied: dict[str, list[str]],
    pref_mode: str = "fraction",
) -> Grade:
    """Grade one episode.

    Args:
        task: the task (answer key, hidden fields, query).
        item: the answered catalogue item (``None``: no answer or an id that does not exist).
        opened: sites the agent opened.
        retrieved: every history entry the agent's memory reads returned.
        applied: values the agent applied, per field (``location`` and attribute names: filters, set_location).
        pref_mode: ``fraction`` (share of attributes matched) or ``binary`` (all or nothing).
    """
    if pref_mode not in PREF_MODES:
        raise ConfigError(f"pref_mode must be one of {PREF_MODES}, got {pref_mode!r}")
    spec = DOMAINS[task.domain]
    valid = item is not None and item.site in set(opened) and site_domain(item.site) == task.domain
    given: dict[str, str | None] = {"site": item.site if valid else None, "location": item.location if valid else None}
    for attr in spec.attributes:
        given[attr] = item.attributes.get(attr) if valid else None

    fields: dict[str, dict[str, Any]] = {}
    for name, truth in task.truth.items():
        hidden = name in task.hidden
        evidence = (not hidden) or supported(retrieved, task.domain, name, truth)
        correct = given[name] == truth
        fields[name] = {"hidden": hidden, "correct": correct, "evidence": evidence, "given": given[name]}

    def credited(name: str, reasoning: bool) -> bool:
        f = fields[name]
        return f["correct"] and (f["evidence"] or not reasoning)

    def metrics(reasoning: bool) -> dict[str, float]:
        attrs = [credited(a, reasoning) for a in spec.attributes]
        p_pref = sum(attrs) / len(attrs) if pref_mode == "fraction" else float(all(attrs))
        p_web = float(credited("site", reasoning))
        intent = float(valid and item.category == task.category and credited("location", reasoning))
        success = float(p_web == 1.0 and all(attrs) and intent == 1.0)
        return {"P_web": p_web, "P_pref": p_pref, "Intent": intent, "Success": success}

    tags = []
    if item is None:
        tags.append("no_answer")
    outcome = metrics(False)
    if outcome["Intent"] == 0.0:
        tags.append("navigation_failure")
    if valid:
        wrong = [n for n, f in fields.items() if f["hidden"] and not f["correct"]]
        if any(not supported(retrieved, task.domain, n, task.truth[n]) for n in wrong):
            tags.append("retrieval_failure")
        if any(supported(retrieved, task.domain, n, task.truth[n]) for n in wrong):
            tags.append("utilization_failure")
    query = task.query.lower()
    mentioned = [e.object.lower() for e in retrieved]
    invented = [
        value
        for values in applied.values()
        for value in values
        if value.lower() not in query and not any(value.lower() in text for text in mentioned)
    ]
    if invented:
        tags.append("hallucinated_preference")
    return Grade(outcome, metrics(True), tags, fields)
