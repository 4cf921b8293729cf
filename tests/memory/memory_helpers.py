"""Shared helpers of the memory tests: a ProcWorld oracle (knows the hidden procedure) to produce solved tasks."""

from __future__ import annotations

import json

from zoo.agents import ProcWorld, run_episode
from zoo.agents.policies.base import Action, Agent
from zoo.agents.types import ToolCall
from zoo.memory import TrajectoryData, trajectory_data


class OracleAgent(Agent):
    """Plays the true procedure of ``env`` (a test helper that reads the hidden rules, not a memory agent)."""

    name = "oracle"

    def __init__(self, env: ProcWorld, skip_sign_fix: bool = False) -> None:
        super().__init__(0)
        f = env.family
        calls = [ToolCall("use", {"op": f.procedure[0], "unit": ""})]
        if env.value < 0 and not skip_sign_fix:
            calls.append(ToolCall("use", {"op": f.sign_fix, "unit": ""}))
        calls.append(ToolCall("use", {"op": f.procedure[1], "unit": f.unit}))
        calls += [ToolCall("use", {"op": op, "unit": ""}) for op in f.procedure[2:]]
        calls.append(ToolCall("commit_final_result", {"content": json.dumps({"status": "done"})}))
        self.calls = calls

    def decide(self) -> Action:
        return Action(self.calls.pop(0) if self.calls else ToolCall("commit_final_result", {"content": "{}"}))


def find_task(family: int, negative: bool, start: int = 0, **env_kwargs) -> ProcWorld:
    """The first ProcWorld task (seed >= start) of the given family index and sign."""
    seed = start
    while True:
        env = ProcWorld(seed=seed, **env_kwargs)
        if env.family.name == env.world[family].name and (env.value < 0) == negative:
            return env
        seed += 1


def solved(family: int, negative: bool, start: int = 0) -> TrajectoryData:
    """The trajectory of a task of ``family`` solved by the oracle."""
    env = find_task(family, negative, start)
    trajectory = run_episode(env, OracleAgent(env))
    assert trajectory.score == 1.0
    return trajectory_data(trajectory, task=env.library())
