"""The EvolveLab memory path on the UltraHorizon environments: their trajectories are encoded by the generic
distiller, stored and recalled; MemoryIngestCallback feeds an ``+method=ultrahorizon`` run to a given provider."""

from __future__ import annotations

import json

import pytest

from zoo.agents import HypothesisEliminationAgent, MysteryGrid, RandomAgent, run_episode
from zoo.callbacks import MemoryIngestCallback
from zoo.cli.train import build
from zoo.errors import ConfigError
from zoo.memory import Genotype, MemoryRequest, ModularMemory, trajectory_data


@pytest.mark.parametrize(
    ("encode", "agent", "seed"),
    [("raw", HypothesisEliminationAgent, 0), ("insight", RandomAgent, 1), ("skill", HypothesisEliminationAgent, 0)],
)
def test_ultrahorizon_trajectories_are_encoded_stored_and_recalled(tmp_path, encode, agent, seed):
    env = MysteryGrid(seed=seed, required_steps=6)
    trajectory = run_episode(env, agent(seed=seed))
    data = trajectory_data(trajectory, query=env.prompt)
    assert data.metadata["env"] == "ultrahorizon/grid" and data.trajectory
    memory = ModularMemory(Genotype(encode, "list", "bm25", "dedup"), tmp_path / "m", encoder="hashing:64")
    assert memory.take_in_memory(data)[0]
    items = memory.store.active()
    if encode == "skill":
        # a skill is the call sequence of a fully solved task; this one scored below 1, so nothing is stored
        assert data.result < 1.0 and items == []
        return
    failed = [s for s in data.trajectory if s["tool"] and not s["ok"]]
    assert len(items) == (1 if encode == "raw" else len(failed)) and items
    assert all(i["group"] == "ultrahorizon/grid" for i in items)
    if encode == "insight":
        assert items[0]["content"].startswith("In ultrahorizon/grid: avoid " + failed[0]["tool"])
    recalled = memory.provide_memory(MemoryRequest(env.prompt)).memories
    assert recalled and recalled[0].metadata["group"] == "ultrahorizon/grid"


def test_the_ingest_callback_feeds_an_ultrahorizon_run_to_a_given_provider(train_cfg, tmp_path):
    cfg = train_cfg(["+method=ultrahorizon", "datamodule.episodes=2", "env.required_steps=5"])
    module, _, _ = build(cfg)
    memory = ModularMemory(Genotype("raw", "list", "recency", "none"), tmp_path / "m", encoder="hashing:64")
    callback = MemoryIngestCallback(memory, log_file=str(tmp_path / "ingest.jsonl"))
    module.run_batch([0, 1])  # sets module.last_trajectories
    callback._ingest(module)
    rows = [json.loads(line) for line in (tmp_path / "ingest.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == [0, 1] and len(memory.store.items) == 2
    with pytest.raises(ConfigError, match="no memory provider"):
        MemoryIngestCallback()._ingest(module)
