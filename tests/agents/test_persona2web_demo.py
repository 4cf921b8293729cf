"""The Persona2Web demo's arms through the normal app: the oracle arm scores 1 in both modes, the documented endpoint
command runs end to end against a local OpenAI-compatible test server (never the network) with the on-demand memory
tool, and the tiny-LM arm composes with its caps."""

from __future__ import annotations

import json

from fake_openai import serve
from hydra.utils import instantiate

from zoo.agents import run_episode
from zoo.backbones import TinyBackbone
from zoo.cli.train import run


def tool_call(name: str, arguments: dict) -> dict:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def trajectories(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]


def test_oracle_arm_scores_one_in_both_modes_through_the_app(train_cfg, tmp_path):
    cfg = train_cfg(["+demo=persona2web", "demo/persona2web/arm=oracle", "env.level=1", "datamodule.episodes=3"])
    metrics = run(cfg)
    assert metrics["test/score"] == 1.0 and metrics["test/committed"] == 1.0
    rows = trajectories(tmp_path)
    assert len(rows) == 3
    for row in rows:
        raw = row["report"]["raw"]
        assert raw["outcome"]["Success"] == raw["reasoning"]["Success"] == 1.0
        assert raw["memory_reads"] >= 1 and raw["scheme"] == "on-demand" and raw["level"] == 1


def test_documented_endpoint_arm_runs_against_a_local_server(train_cfg, tmp_path):
    with serve() as server:
        server.replies = [
            (200, server.reply("", [tool_call("memory_access", {"query": "apparel orders"})])),
            (200, server.reply("", [tool_call("search_engine", {"query": "courses"})])),
        ]  # then the default: plain text without a tool call (a failed step)
        cfg = train_cfg(
            [
                "+demo=persona2web",
                "demo/persona2web/arm=llm_endpoint",
                f"backend.base_url={server.base_url}",
                "backend.model=served-model",
                "demo.llm.max_steps=3",
                "demo.llm.max_tokens=64",
                "demo.llm.episodes=1",
            ]
        )
        metrics = run(cfg)
    assert cfg.datamodule.episodes == 1 and cfg.module.max_steps == 3
    assert [r["model"] for r in server.requests] == ["served-model"] * 3
    tool_names = {t["function"]["name"] for t in server.requests[0]["tools"]}
    assert {"memory_access", "site_search", "stop"} <= tool_names
    (row,) = trajectories(tmp_path)
    assert [s["tool"] for s in row["steps"]] == ["memory_access", "search_engine", None]
    assert row["report"]["raw"]["memory_reads"] == 1 and "no_commit" in row["tags"]
    assert metrics["test/score"] == 0.0 and metrics["test/failed_steps"] == 1.0


def test_tiny_lm_arm_composes_with_its_caps(train_cfg):
    tiny = train_cfg(["+demo=persona2web", "demo/persona2web/arm=llm_tiny"])
    assert tiny.backend._target_ == "zoo.agents.HFLocalBackend" and tiny.agent._target_ == "zoo.agents.LLMToolAgent"
    assert tiny.backend.path._target_ == "zoo.cli.artifacts.train_artifact"  # built through the artifact cache
    assert (tiny.datamodule.episodes, tiny.module.max_steps) == (tiny.demo.llm.episodes, tiny.demo.llm.max_steps)
    assert tiny.env.scheme == "on-demand"
    no_history = train_cfg(["+demo=persona2web", "demo/persona2web/arm=no_history"])
    assert no_history.env.scheme == "no-history" and no_history.agent._target_ == "zoo.agents.NoHistoryAgent"


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
    cfg = train_cfg(["+demo=persona2web", "demo/persona2web/arm=llm_tiny", "demo.llm.max_steps=2"])
    assert cfg.backend.overflow == "keep_recent"
    trajectory = tiny_arm_episode(cfg)
    assert trajectory.error is None and len(trajectory.steps) == 2
