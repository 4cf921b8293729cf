"""The UltraHorizon demo's LLM arms: the endpoint command documented on the results page runs end to end against a
local OpenAI-compatible test server (never the network), and the tiny-LM arm's caps replace the shared settings."""

from __future__ import annotations

import json

from fake_openai import serve
from hydra.utils import instantiate

from zoo.agents import run_episode
from zoo.backbones import TinyBackbone
from zoo.cli.train import run


def tool_call(name: str, arguments: dict) -> dict:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_documented_endpoint_arm_runs_against_a_local_server(train_cfg, tmp_path):
    with serve() as server:
        server.replies = [
            (200, server.reply("", [tool_call("get_current_state", {})])),
            (200, server.reply("", [tool_call("move", {"direction": "up"})])),
        ]  # then the default: plain text without a tool call (a failed step)
        cfg = train_cfg(
            [
                "+demo=ultrahorizon",
                "demo/ultrahorizon/arm=llm_endpoint",
                f"backend.base_url={server.base_url}",
                "backend.model=served-model",
                "demo.llm.max_steps=3",
                "demo.llm.max_tokens=64",
                "env.required_steps=2",
                "env.difficulty=easy",
            ]
        )
        metrics = run(cfg)
    assert cfg.datamodule.episodes == 1 and cfg.module.max_steps == 3  # the arm's caps, not the shared 4 episodes
    assert [r["model"] for r in server.requests] == ["served-model"] * 3
    assert all(r["max_tokens"] == 64 and r["temperature"] == 0.0 for r in server.requests)
    rows = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    steps = rows[0]["steps"]
    assert [s["tool"] for s in steps] == ["get_current_state", "move", None]
    assert [s["ok"] for s in steps] == [True, True, False]
    assert metrics["test/failed_steps"] == 1.0 and metrics["test/tool_calls"] == 2.0
    assert metrics["test/tokens"] == 3 * 18  # the server's usage, summed


def test_tiny_lm_and_scripted_arms_compose_with_their_caps(train_cfg):
    tiny = train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=llm_tiny"])
    assert tiny.backend._target_ == "zoo.agents.HFLocalBackend" and tiny.agent._target_ == "zoo.agents.LLMToolAgent"
    assert tiny.backend.path._target_ == "zoo.cli.artifacts.train_artifact"  # built through the artifact cache
    assert (tiny.datamodule.episodes, tiny.module.max_steps) == (tiny.demo.llm.episodes, tiny.demo.llm.max_steps)
    crnr = train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=he_crnr"])
    assert crnr.backend is None and crnr.module.crnr_window == crnr.demo.crnr_window
    assert crnr.datamodule.episodes == 4 and crnr.module.max_steps is None


def tiny_arm_episode(cfg):
    """One episode of the composed llm_tiny arm (its env, agent and backend settings) on a tiny Llama of the
    architecture the arm's artifact trains (TinyBackbone: a 256-token context, shorter than the task prompt); the
    trained weights are not needed to show that the prompt fits."""
    backbone = TinyBackbone(seed=0)
    weights = {"path": None, "model": backbone.build_model(), "tokenizer": backbone.tokenizer}
    backend = instantiate(cfg.backend, **weights, _convert_="all")
    agent = instantiate(cfg.agent, backend=backend, _convert_="all")(seed=0)
    env = instantiate(cfg.env, _convert_="all")(seed=0)
    assert backend._model.config.max_position_embeddings == 256
    return run_episode(env, agent, max_steps=cfg.module.max_steps)


def test_tiny_lm_arm_keeps_the_most_recent_tokens_so_its_episodes_run(train_cfg):
    """The task prompt is longer than the tiny LM's context: with the HF backend's default overflow=error every
    episode of the arm failed; the arm sets keep_recent."""
    cfg = train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=llm_tiny", "demo.llm.max_steps=2"])
    assert cfg.backend.overflow == "keep_recent"
    trajectory = tiny_arm_episode(cfg)
    assert trajectory.error is None and len(trajectory.steps) == 2
