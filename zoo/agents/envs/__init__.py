"""Exploration environments and their registry (``name -> class``)."""

from __future__ import annotations

from zoo.agents.envs.base import CommitError, Environment, RubricItem, ScoreReport, judge_commit
from zoo.agents.envs.persona2web import PersonaWeb
from zoo.agents.envs.procworld import ProcWorld
from zoo.agents.envs.ultrahorizon import AlienGeneticsLab, MysteryGrid, SequenceExploration

ENVIRONMENTS: dict[str, type[Environment] | type[PersonaWeb]] = {
    cls.name: cls for cls in (MysteryGrid, SequenceExploration, AlienGeneticsLab, PersonaWeb, ProcWorld)
}

__all__ = [
    "ENVIRONMENTS",
    "AlienGeneticsLab",
    "CommitError",
    "Environment",
    "MysteryGrid",
    "PersonaWeb",
    "ProcWorld",
    "RubricItem",
    "ScoreReport",
    "SequenceExploration",
    "judge_commit",
]
