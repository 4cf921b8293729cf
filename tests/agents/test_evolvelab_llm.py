"""EvolveLab with an LLM agent (``+method=evolvelab agent=llm backbone=tiny|hf``): the memory's guidance reaches the
model's prompt (``provide_memory``, BEGIN and IN, as FlashOAgents' ``_get_memory_guidance``) and each finished
episode is taken in by the memory (``take_in_memory`` through MemoryIngestCallback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.utils import instantiate

from zoo.agents import (
    HFLocalBackend,
    LLMToolAgent,
    ProcWorld,
    ProcWorldMemoryAgent,
    ScriptedBackend,
    backbone_llm,
    run_episode,
)
from zoo.agents.policies.llm import MEMORY_FOOTER, MEMORY_HEADER
from zoo.backbones import TinyBackbone
from zoo.callbacks import MemoryIngestCallback
from zoo.cli.train import build, check_methods, run
from zoo.errors import ConfigError
from zoo.memory import Genotype, MemoryRequest, MemoryStatus, ModularMemory, trajectory_data

TINY_LLM = ["backend=hf_local", "backend.overflow=keep_recent", "backend.max_tokens=4"]


def taught_memory(tmp_path, phases: tuple[str, ...] = ("begin", "in")) -> ModularMemory:
    """An ExpeL-like memory (insights, BM25, top 3) that has taken in three scripted ProcWorld episodes."""
    genotype = Genotype("insight", "list", "bm25", "dedup", top_k=3, phases=phases)
    memory = ModularMemory(genotype, store_dir=str(tmp_path / "store"))
    for episode in range(3):
        trajectory = run_episode(ProcWorld(seed=episode), ProcWorldMemoryAgent(seed=episode), episode=episode)
        memory.take_in_memory(trajectory_data(trajectory))
    return memory


def test_the_memory_guidance_is_in_the_tiny_models_prompt(tmp_path):
    """The real tiny model through the in-process backend: the token ids it reads hold the BEGIN guidance (in the
    system prompt, at every step) and, from the second step on, that step's IN guidance."""
    memory = taught_memory(tmp_path)
    env = ProcWorld(seed=7)
    expected = memory.provide_memory(MemoryRequest(env.library()["query"], status=MemoryStatus.BEGIN)).memories
    assert expected  # the store holds lessons for the task
    backbone = TinyBackbone(seed=0, max_position_embeddings=4096)  # the whole chat fits: nothing is cut
    backend = backbone_llm(None, backbone)
    backend._load()
    prompts: list[str] = []

    def read_prompt(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:  # the prompt's forward, not a cached decoding step
            prompts.append(backbone.tokenizer.decode(ids[0]))

    handle = backend._model.register_forward_pre_hook(read_prompt, with_kwargs=True)
    try:
        agent = LLMToolAgent(backend=backend, seed=0, max_tokens=4, memory=memory)
        run_episode(env, agent, max_steps=2, episode=7)
    finally:
        handle.remove()
    assert len(prompts) == 2 and agent.memory_requests == 2  # BEGIN, then IN before the second step
    guidance = "\n".join([MEMORY_HEADER, *(m.content for m in expected), MEMORY_FOOTER])
    assert agent.guidance == guidance
    assert all(guidance in prompt for prompt in prompts)
    assert prompts[0].count(MEMORY_HEADER) == 1
    assert prompts[1].count(MEMORY_HEADER) == 2  # the BEGIN guidance and this step's IN guidance


def test_a_begin_only_memory_and_in_queries_limit_the_requests(tmp_path):
    memory = taught_memory(tmp_path, phases=("begin",))
    seen: list[list[dict]] = []

    def policy(messages, tools):
        seen.append(messages)
        return "thinking"

    agent = LLMToolAgent(backend=ScriptedBackend(policy=policy), memory=memory, in_queries=1)
    run_episode(ProcWorld(seed=7), agent, max_steps=4)
    assert agent.memory_requests == 2  # BEGIN, and one IN (answered with nothing: BEGIN-only)
    assert MEMORY_HEADER in seen[0][0]["content"] and all(m[0]["content"] == seen[0][0]["content"] for m in seen)
    assert all(sum(MEMORY_HEADER in str(x.get("content")) for x in m) == 1 for m in seen)


def test_what_an_episode_taught_is_in_the_next_episodes_prompt(tmp_path):
    """The loop closes: episode 1's calls are taken in, and episode 2 (same task family) reads them."""
    memory = ModularMemory(Genotype("raw", "list", "bm25", "dedup", top_k=1), store_dir=str(tmp_path / "store"))
    seen: list[list[dict]] = []

    def policy(messages, tools):
        seen.append(messages)
        return {"content": "", "tool_calls": [{"name": "use", "arguments": {"op": "recipe_trim", "unit": ""}}]}

    agent = LLMToolAgent(backend=ScriptedBackend(policy=policy), memory=memory)
    env = ProcWorld(seed=0)
    first = run_episode(env, agent, max_steps=2)
    assert agent.guidance == "" and len(memory.store.active()) == 0
    ok, stored = memory.take_in_memory(trajectory_data(first))
    assert ok and len(memory.store.active()) == 1
    seen.clear()
    run_episode(ProcWorld(seed=0), agent, max_steps=1)
    assert "use(op=recipe_trim)" in agent.guidance and agent.guidance in seen[0][0]["content"]


def test_evolvelab_runs_with_the_tiny_backbone_as_its_llm_agent_and_the_store_grows(train_cfg):
    overrides = ["+method=evolvelab", "agent=llm", "backbone=tiny", *TINY_LLM, "memory=generative_agents"]
    overrides += ["datamodule.episodes=2", "module.max_steps=2"]
    cfg = train_cfg(overrides)
    check_methods(cfg)  # declared: no refusal
    module, _, _ = build(cfg)
    keywords = module.make_agent.keywords
    assert isinstance(keywords["backend"], HFLocalBackend) and keywords["backend"].bound
    agent = module.make_agent(seed=0)
    # the callback takes episodes into the store the agent reads, through the backbone's wrapper of the factory
    assert isinstance(agent, LLMToolAgent) and MemoryIngestCallback().provider(module) is agent.memory is not None
    metrics = run(cfg)
    assert metrics["test/failed"] == 0 and metrics["test/tokens"] > 0
    ingested = (Path(cfg.paths.output_dir) / "memory_ingest.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in ingested]
    assert [r["ok"] for r in rows] == [True, True]
    reopened = instantiate(cfg.memory)
    reopened.initialize()
    # one raw unit per episode in the run's store (the tiny model's two episodes read alike: the second is counted)
    assert reopened.store.ingests == 2 and sum(item["count"] for item in reopened.store.active()) == 2


def test_without_a_memory_the_prompt_is_unchanged():
    seen: list[list[dict]] = []
    agent = LLMToolAgent(backend=ScriptedBackend(policy=lambda m, t: seen.append(m) or "no call"), seed=0)
    env = ProcWorld(seed=0)
    run_episode(env, agent, max_steps=2)
    assert agent.guidance == "" and agent.memory_requests == 0
    assert all(m[0]["content"] == env.prompt and MEMORY_HEADER not in json.dumps(m) for m in seen)
    with pytest.raises(ConfigError, match="agent.in_queries must be >= 0"):
        LLMToolAgent(backend=ScriptedBackend(responses=["x"]), in_queries=-1)
