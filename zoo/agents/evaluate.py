"""``zoo.agents.evaluate``: run an agent on an environment for some episodes and summarize.

Episode ``i`` of a run with ``seed`` builds its environment with seed ``derive_seed(seed, i, "env")`` and its
agent with ``derive_seed(seed, i, "agent")`` (SHA-256 based: stable across processes and Python versions), so the
same arguments give the same result, and an episode does not depend on which other episodes ran.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

from zoo.agents.envs import ENVIRONMENTS, Environment
from zoo.agents.metrics import summarize
from zoo.agents.policies import AGENTS, CRNR, Agent
from zoo.agents.runner import Trajectory, run_episode
from zoo.errors import ConfigError

HARNESS_OPTIONS = ("max_steps", "crnr_window", "code_tool", "entropy_window")


def derive_seed(seed: int, episode: int, role: str) -> int:
    digest = hashlib.sha256(f"{seed}/{episode}/{role}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _parameters(cls: type) -> list[str]:
    return [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "seed")]


def env_class(name: str) -> type[Environment]:
    if name not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment {name!r}; available: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]


def agent_class(name: str) -> type[Agent]:
    if name not in AGENTS:
        raise ConfigError(f"unknown agent {name!r}; available: {sorted(AGENTS)}")
    return AGENTS[name]


def split_overrides(env: str, agent: str, overrides: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Route keyword overrides to the environment, the agent or the harness; unknown names are an error."""
    env_keys, agent_keys = _parameters(env_class(env)), _parameters(agent_class(agent))
    parts: tuple[dict, dict, dict] = ({}, {}, {})
    for key, value in overrides.items():
        if key in env_keys:
            parts[0][key] = value
        elif key in agent_keys:
            parts[1][key] = value
        elif key in HARNESS_OPTIONS:
            parts[2][key] = value
        else:
            raise ConfigError(
                f"unknown option {key!r} for env={env!r}, agent={agent!r}; environment options: {env_keys}, agent "
                f"options: {agent_keys}, harness options: {list(HARNESS_OPTIONS)}"
            )
    return parts


def run_episodes(
    make_env,
    make_agent,
    episodes: list[int],
    seed: int,
    *,
    max_steps: int | None = None,
    crnr_window: int | None = None,
    code_tool: bool = False,
    entropy_window: int = 10,
    max_unusable_replies: int | None = None,
) -> list[Trajectory]:
    """Episodes ``episodes`` of a run: ``make_env(seed=...)`` and ``make_agent(seed=...)`` build fresh instances."""
    out = []
    for episode in episodes:
        env = make_env(seed=derive_seed(seed, episode, "env"))
        agent = make_agent(seed=derive_seed(seed, episode, "agent"))
        if crnr_window is not None:
            agent = CRNR(agent, int(crnr_window))
        out.append(
            run_episode(
                env,
                agent,
                max_steps=max_steps,
                code_tool=code_tool,
                episode=episode,
                seed=seed,
                entropy_window=entropy_window,
                max_unusable_replies=max_unusable_replies,
            )
        )
    return out


def evaluate(env: str, agent: str, episodes: int, seed: int, **overrides: Any) -> dict[str, Any]:
    """Mean score of ``agent`` on ``env`` over ``episodes`` episodes; identical for identical arguments.

    Args:
        env: ``ultrahorizon/grid`` | ``ultrahorizon/sequence`` | ``ultrahorizon/bio`` | ``persona2web``.
        agent: ``random`` | ``early_commit`` | ``hypothesis_elimination`` | ``llm`` (needs ``backend=``); for
            ``persona2web``: ``persona_random`` | ``persona_no_history`` | ``persona_pre_execution`` |
            ``persona_on_demand`` | ``persona_oracle`` | ``llm``.
        episodes: number of episodes.
        seed: base seed of the run.
        overrides: environment options (``difficulty``, ``required_steps``, ``free``, ``corner_bonus``,
            ``rule1_split``, ``history_tools``, ``judge``), agent options (``note_every``, ``backend``, ...) and
            harness options (``max_steps``, ``crnr_window``, ``code_tool``, ``entropy_window``).

    Returns:
        ``score`` (mean in [0, 1]), ``score_ci95`` (half-width), ``scores`` (per episode), ``tool_calls``,
        ``failed_steps``, ``tokens``, ``committed``, ``refreshes`` (means), ``items`` (share of episodes earning each
        rubric item), ``error_tags`` (counts), ``entropy_curve``, and the settings.
    """
    if int(episodes) < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    env_kwargs, agent_kwargs, harness = split_overrides(env, agent, overrides)
    env_cls, agent_cls = env_class(env), agent_class(agent)
    trajectories = run_episodes(
        lambda seed: env_cls(seed=seed, **env_kwargs),
        lambda seed: agent_cls(seed=seed, **agent_kwargs),
        list(range(int(episodes))),
        seed,
        **harness,
    )
    return {"env": env, "agent": agent, "episodes": int(episodes), "seed": seed, **summarize(trajectories)}
