"""Agents: random, early-commit, hypothesis-elimination, the LLM tool-calling agent, and the CRNR wrapper."""

from zoo.agents.policies.base import CRNR, Action, Agent, EpisodeInfo, commit_call
from zoo.agents.policies.hypotheses import EarlyCommitAgent, HypothesisEliminationAgent, SolverAgent
from zoo.agents.policies.llm import LLMToolAgent
from zoo.agents.policies.memory import ProcWorldMemoryAgent
from zoo.agents.policies.persona2web import (
    PERSONA_AGENTS,
    NoHistoryAgent,
    OnDemandAgent,
    OracleAgent,
    PersonaRandomAgent,
    PreExecutionAgent,
)
from zoo.agents.policies.random import RandomAgent
from zoo.agents.policies.solvers import HypothesisSet, Solver

AGENTS: dict[str, type[Agent]] = {
    cls.name: cls
    for cls in (
        RandomAgent,
        EarlyCommitAgent,
        HypothesisEliminationAgent,
        LLMToolAgent,
        ProcWorldMemoryAgent,
        *PERSONA_AGENTS,
    )
}

__all__ = [
    "AGENTS",
    "CRNR",
    "Action",
    "Agent",
    "EarlyCommitAgent",
    "EpisodeInfo",
    "HypothesisEliminationAgent",
    "HypothesisSet",
    "LLMToolAgent",
    "NoHistoryAgent",
    "OnDemandAgent",
    "OracleAgent",
    "PersonaRandomAgent",
    "PreExecutionAgent",
    "ProcWorldMemoryAgent",
    "RandomAgent",
    "Solver",
    "SolverAgent",
    "commit_call",
]
