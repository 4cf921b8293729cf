"""Persona2Web (arXiv 2602.17003) offline: a simulated web, persona histories, level-1/2/3 queries, rubric scoring."""

from zoo.agents.envs.persona2web.env import SCHEMES, PersonaWeb
from zoo.agents.envs.persona2web.scoring import Grade, grade, supports
from zoo.agents.envs.persona2web.world import (
    DOMAINS,
    HIDDEN_FIELDS,
    HISTORY_FIELDS,
    LEVELS,
    HistoryEntry,
    PersonaWorld,
    Task,
    load_history,
    site_counts,
    write_history,
)

__all__ = [
    "DOMAINS",
    "HIDDEN_FIELDS",
    "HISTORY_FIELDS",
    "LEVELS",
    "SCHEMES",
    "Grade",
    "HistoryEntry",
    "PersonaWeb",
    "PersonaWorld",
    "Task",
    "grade",
    "load_history",
    "site_counts",
    "supports",
    "write_history",
]
