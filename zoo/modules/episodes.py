"""Episode runner family: agents and environments on the same app as the trained methods.

``test_step``/``predict_step`` run a batch of episodes through :func:`zoo.agents.run_episodes` (plain Python,
no gradients), write one JSON line per episode (the full trajectory) to ``<trajectory_dir>/trajectories.jsonl``
and aggregate with torchmetrics: ``test/score`` (mean in [0, 1]), ``test/score_ci95`` (95% t-interval
half-width), ``test/tool_calls``, ``test/failed_steps``, ``test/tokens``, ``test/committed``, ``test/failed`` (share
of episodes a model error ended; they score 0 and the run goes on). ``predict_step``
returns the generation-protocol dict (``texts`` = the commits, ``meta`` = per-episode numbers), so
``stage=predict`` writes ``predictions.jsonl``. Used with ``backbone: none`` (no model, no tokenizer), or with a
composed backbone as the model of the LLM agent (``agent=llm backbone=tiny``; :func:`zoo.agents.backbone_llm`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torchmetrics import CatMetric, MeanMetric

from zoo.agents.backends.hf_local import backbone_llm
from zoo.agents.envs.base import Environment
from zoo.agents.evaluate import run_episodes
from zoo.agents.policies.base import Agent
from zoo.agents.runner import Trajectory
from zoo.errors import ConfigError
from zoo.stats import mean_ci95

SUMMARY = ("score", "tool_calls", "failed_steps", "tokens", "committed", "failed")


def agent_with_backbone(agent: Callable[..., Agent], backbone: Any, quantizer: Any = None) -> Callable[..., Agent]:
    """The agent factory with the run's backbone as its model (:func:`zoo.agents.backbone_llm`): only an agent that
    takes a model backend (``agent=llm``) can use one; a scripted agent with a backbone is an error naming both ways
    out."""
    keywords = getattr(agent, "keywords", None)
    if not isinstance(agent, functools.partial) or keywords is None or "backend" not in keywords:
        func = getattr(agent, "func", agent)
        name = getattr(func, "name", getattr(func, "__name__", type(agent).__name__))
        raise ConfigError(
            f"the run composes a backbone ({type(backbone).__name__}) but agent={name} uses no model; the backbone "
            "is the model of the LLM agent (agent=llm): add agent=llm, or run the scripted agent with backbone=none"
        )
    return functools.partial(agent, backend=backbone_llm(keywords["backend"], backbone, quantizer))


class EpisodeModule(pl.LightningModule):
    """Run episodes of ``env`` x ``agent``; the datamodule yields episode indices.

    Args:
        env: factory ``env(seed=...) -> Environment`` (a Hydra ``_partial_``).
        agent: factory ``agent(seed=...) -> Agent``.
        seed: base seed; episode ``i`` uses :func:`zoo.agents.derive_seed` ``(seed, i, ...)``.
        max_steps: step cap per episode (``None``: the environment's).
        crnr_window: wrap the agent in CRNR with this context window (``None``: no refresh).
        code_tool: give the agent the sandboxed Python tool.
        entropy_window: steps per window of the action-entropy curve.
        max_unusable_replies: end an episode (recorded as failed) after this many consecutive replies that are not
            executable tool calls (``None``: off, as in the official harness).
        trajectory_dir: where ``trajectories.jsonl`` goes (``None``: not written).
        backbone, quantizer: the run's composed backbone and quantizer (``train.py`` passes them when
            ``backbone`` is not ``none``): the model of the LLM agent, in process (:func:`agent_with_backbone`).
    """

    def __init__(
        self,
        env: Callable[..., Environment],
        agent: Callable[..., Agent],
        seed: int = 0,
        max_steps: int | None = None,
        crnr_window: int | None = None,
        code_tool: bool = False,
        entropy_window: int = 10,
        max_unusable_replies: int | None = None,
        trajectory_dir: str | None = None,
        backbone: Any = None,
        quantizer: Any = None,
    ) -> None:
        super().__init__()
        if max_unusable_replies is not None and int(max_unusable_replies) < 1:
            raise ConfigError(
                f"module.max_unusable_replies={max_unusable_replies}: give a number of replies >= 1, or null (off)"
            )
        if backbone is not None:
            agent = agent_with_backbone(agent, backbone, quantizer)
        env(seed=seed), agent(seed=seed)  # surface configuration errors when the run is built, not mid-test
        self.make_env = env
        self.make_agent = agent
        self.seed = seed
        self.harness = {
            "max_steps": max_steps,
            "crnr_window": crnr_window,
            "code_tool": code_tool,
            "entropy_window": entropy_window,
            "max_unusable_replies": max_unusable_replies,
        }
        self.trajectory_dir = trajectory_dir
        self.means = torch.nn.ModuleDict({name: MeanMetric() for name in SUMMARY})
        self.all_scores = CatMetric()
        self.run_config: dict[str, Any] | None = None
        self._trajectory_file: Path | None = None
        #: the trajectories of the last batch (read by callbacks such as MemoryIngestCallback)
        self.last_trajectories: list[Trajectory] = []

    def configure_optimizers(self) -> None:
        return None

    def _open_trajectories(self) -> None:
        self._trajectory_file = None
        if self.trajectory_dir is None:
            return
        world = self.trainer.world_size if self._trainer is not None else 1
        name = "trajectories.jsonl" if world == 1 else f"trajectories.rank{self.global_rank}.jsonl"
        self._trajectory_file = Path(self.trajectory_dir) / name
        self._trajectory_file.parent.mkdir(parents=True, exist_ok=True)
        self._trajectory_file.write_text("")

    def on_test_start(self) -> None:
        self._open_trajectories()

    def on_predict_start(self) -> None:
        self._open_trajectories()

    def run_batch(self, batch: list[int]) -> list[Trajectory]:
        """Run the episodes of a batch (indices) and append their trajectories to the JSONL file."""
        trajectories = run_episodes(self.make_env, self.make_agent, [int(i) for i in batch], self.seed, **self.harness)
        self.last_trajectories = trajectories
        if self._trajectory_file is not None:
            with self._trajectory_file.open("a") as handle:
                for trajectory in trajectories:
                    handle.write(json.dumps(trajectory.to_dict(), default=str) + "\n")
        return trajectories

    def test_step(self, batch: list[int], batch_idx: int) -> dict[str, float]:
        trajectories = self.run_batch(batch)
        values = {name: [float(getattr(t, name)) for t in trajectories] for name in SUMMARY if name != "tokens"}
        values["tokens"] = [float(t.usage.total_tokens) for t in trajectories]
        for name, metric in self.means.items():
            metric.update(torch.tensor(values[name]))
            self.log(f"test/{name}", metric, on_step=False, on_epoch=True, batch_size=len(trajectories))
        self.all_scores.update(torch.tensor(values["score"]))
        return {name: sum(v) / len(v) for name, v in values.items()}

    def on_test_epoch_end(self) -> None:
        scores = self.all_scores.compute().flatten().tolist()
        self.log("test/score_ci95", mean_ci95(scores)[1], sync_dist=False)
        self.all_scores.reset()

    def predict_step(self, batch: list[int], batch_idx: int) -> dict[str, Any]:
        trajectories = self.run_batch(batch)
        return {
            "texts": [t.commit or "" for t in trajectories],
            "meta": {
                "episode": [t.episode for t in trajectories],
                "score": [t.score for t in trajectories],
                "tool_calls": [t.tool_calls for t in trajectories],
                "committed": [t.committed for t in trajectories],
                "tags": [t.tags for t in trajectories],
            },
        }
