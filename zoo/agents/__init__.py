"""Agent substrate: model backends, tools, environments, agents and the episode harness (plain Python).

The seam for every method that is not trained by backprop (UltraHorizon, Persona2Web; TextResNet, ROSA2,
MemEvolve next). Nothing in this package imports Lightning or Hydra; the episode LightningModule
(:mod:`zoo.modules.episodes`) is a thin adapter over :func:`run_episodes` and :func:`summarize`.

Public API::

    from zoo.agents import evaluate
    evaluate("ultrahorizon/grid", "hypothesis_elimination", episodes=8, seed=0, difficulty="hard")
    # -> {"score": ..., "scores": [...], "tool_calls": ..., "score_ci95": ..., ...}
"""

from zoo.agents.backends import (
    Backend,
    HFLocalBackend,
    OpenAICompatBackend,
    ReplayCache,
    ScriptedBackend,
    backbone_llm,
)
from zoo.agents.context import Context, NoteBook
from zoo.agents.envs import (
    ENVIRONMENTS,
    AlienGeneticsLab,
    Environment,
    MysteryGrid,
    PersonaWeb,
    ProcWorld,
    SequenceExploration,
)
from zoo.agents.evaluate import derive_seed, evaluate, run_episodes
from zoo.agents.metrics import summarize
from zoo.agents.parsing import parse_native_tool_calls, parse_tool_calls
from zoo.agents.policies import (
    AGENTS,
    CRNR,
    Agent,
    EarlyCommitAgent,
    HypothesisEliminationAgent,
    LLMToolAgent,
    NoHistoryAgent,
    OnDemandAgent,
    OracleAgent,
    PersonaRandomAgent,
    PreExecutionAgent,
    ProcWorldMemoryAgent,
    RandomAgent,
)
from zoo.agents.runner import StepRecord, Trajectory, run_episode
from zoo.agents.sandbox import PythonSandbox
from zoo.agents.tools import Tool, ToolRegistry, agent_tool
from zoo.agents.types import Completion, ToolCall, ToolResult, Usage

__all__ = [
    "AGENTS",
    "CRNR",
    "ENVIRONMENTS",
    "Agent",
    "AlienGeneticsLab",
    "Backend",
    "Completion",
    "Context",
    "EarlyCommitAgent",
    "Environment",
    "HFLocalBackend",
    "HypothesisEliminationAgent",
    "LLMToolAgent",
    "MysteryGrid",
    "NoHistoryAgent",
    "NoteBook",
    "OnDemandAgent",
    "OpenAICompatBackend",
    "OracleAgent",
    "PersonaRandomAgent",
    "PersonaWeb",
    "PreExecutionAgent",
    "ProcWorld",
    "ProcWorldMemoryAgent",
    "PythonSandbox",
    "RandomAgent",
    "ReplayCache",
    "ScriptedBackend",
    "SequenceExploration",
    "StepRecord",
    "Tool",
    "ToolCall",
    "ToolRegistry",
    "ToolResult",
    "Trajectory",
    "Usage",
    "agent_tool",
    "backbone_llm",
    "derive_seed",
    "evaluate",
    "parse_native_tool_calls",
    "parse_tool_calls",
    "run_episode",
    "run_episodes",
    "summarize",
]
