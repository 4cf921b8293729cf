"""EvolveLab memory systems (``+method=evolvelab``, zoo.memory): the design space, the provider interface rules,
the persistent stores and their bad inputs, ProcWorld and the scripted memory agent."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

import pytest
from memory_helpers import OracleAgent, find_task, solved
from omegaconf import OmegaConf

from zoo.agents import ProcWorld, ProcWorldMemoryAgent, run_episode
from zoo.cli.train import run
from zoo.errors import ConfigError
from zoo.memory import (
    MODULES,
    Genotype,
    MemoryRequest,
    MemoryStatus,
    ModularMemory,
    StoreError,
)
from zoo.memory.memevolve import run_stream
from zoo.text.encoders import HashingEncoder

from conftest import REPO_ROOT

ENV = {"name": "procworld", "family_ids": [0, 1, 2, 3]}
BASELINES = ["expel", "voyager", "dynamic_cheatsheet", "agent_workflow_memory", "generative_agents", "agent_kb"]


def memory(tmp_path: Path, name: str = "store", **fields) -> ModularMemory:
    return ModularMemory(Genotype(**fields), tmp_path / name, encoder="hashing:64")


def filled(tmp_path: Path, tasks: int = 10, name: str = "store", **fields) -> ModularMemory:
    provider = memory(tmp_path, name, **fields)
    run_stream(provider, ENV, list(range(tasks)), seed=3)
    return provider


def items_file(provider: ModularMemory) -> list[dict]:
    return [json.loads(line) for line in (provider.store.directory / "items.jsonl").read_text().splitlines()]


# -- the design space -------------------------------------------------------------------------------------------
def test_every_encode_store_retrieve_manage_combination_passes_the_smoke_run(tmp_path):
    combos = list(itertools.product(*MODULES.values()))
    assert len(combos) == 3 * 3 * 4 * 4
    for encode, store, retrieve, manage in combos:
        g = Genotype(encode, store, retrieve, manage, top_k=2, consolidate_every=2)
        provider = ModularMemory(g, tmp_path / g.describe().replace("/", "_"), encoder="hashing:64")
        result = run_stream(provider, ENV, list(range(5)), seed=0)
        assert len(result["episodes"]) == 5, g.describe()
        # every request answered at most top_k items; a solved-task encoding stored something
        assert result["memory"]["items"] <= 2 * result["memory"]["requests"], g.describe()
        assert json.loads((provider.store.directory / "manifest.json").read_text())["genotype"]["encode"] == encode
        reopened = ModularMemory(g, provider.store.directory, encoder="hashing:64")
        reopened.initialize()
        assert len(reopened.store.items) == len(provider.store.items)


@pytest.mark.parametrize("store", ["list", "vector", "graph"])
@pytest.mark.parametrize("retrieve", ["recency", "bm25", "cosine", "hybrid"])
def test_provide_memory_returns_at_most_top_k_sorted_and_deterministic(tmp_path, store, retrieve):
    provider = filled(tmp_path, encode="insight", store=store, retrieve=retrieve, top_k=4)
    assert len(provider.store.active()) > 4
    queries = [ProcWorld(seed=s, family_ids=[0, 1, 2, 3]).query for s in range(100, 104)]
    for query in queries:
        first = provider.provide_memory(MemoryRequest(query))
        scores = [m.score for m in first.memories]
        assert 0 < len(first.memories) <= 4
        assert scores == sorted(scores, reverse=True)
        again = provider.provide_memory(MemoryRequest(query))
        assert [(m.id, m.score) for m in again.memories] == [(m.id, m.score) for m in first.memories]
        reopened = ModularMemory(provider.genotype, provider.store.directory, encoder="hashing:64")
        assert [m.id for m in reopened.provide_memory(MemoryRequest(query)).memories] == [m.id for m in first.memories]


def test_relevance_retrievers_find_the_task_family_and_recency_does_not(tmp_path):
    hits = {}
    for retrieve in ("recency", "bm25", "cosine"):
        provider = filled(tmp_path, 16, retrieve, encode="insight", retrieve=retrieve, top_k=3)
        hit = total = 0
        for seed in range(200, 220):
            env = ProcWorld(seed=seed, family_ids=[0, 1, 2, 3])
            items = provider.provide_memory(MemoryRequest(env.query)).memories
            hit += sum(m.metadata["group"] == env.family.name for m in items)
            total += len(items)
        hits[retrieve] = hit / total
    assert hits["bm25"] > 0.9 and hits["cosine"] > 0.9
    assert hits["recency"] < 0.7


def test_begin_only_providers_return_nothing_for_in(tmp_path):
    begin_only = filled(tmp_path, name="begin", phases=("begin",))
    both = filled(tmp_path, name="both")
    query = ProcWorld(seed=500, family_ids=[0, 1, 2, 3]).query
    assert begin_only.provide_memory(MemoryRequest(query, status=MemoryStatus.BEGIN)).memories
    assert begin_only.provide_memory(MemoryRequest(query, "x fails", MemoryStatus.IN)).memories == []
    assert both.provide_memory(MemoryRequest(query, "x fails", MemoryStatus.IN)).memories


# -- Manage ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("manage", ["dedup", "decay", "consolidate"])
def test_adding_the_same_trajectory_twice_is_idempotent_and_keeps_the_original(tmp_path, manage):
    provider = memory(tmp_path, encode="insight", manage=manage, consolidate_every=100)
    data = solved(0, negative=False)
    provider.take_in_memory(data)
    before = items_file(provider)
    provider.take_in_memory(data)
    after = items_file(provider)
    assert [i["id"] for i in after] == [i["id"] for i in before] and len(before) >= 4
    assert all(i["count"] == 2 and i["superseded_by"] is None for i in after)


def test_without_manage_duplicates_pile_up(tmp_path):
    provider = memory(tmp_path, encode="insight", manage="none")
    data = solved(0, negative=False)
    provider.take_in_memory(data)
    provider.take_in_memory(data)
    contents = [i["content"] for i in provider.store.active()]
    assert len(contents) == 2 * len(set(contents))


def test_a_contradicting_skill_supersedes_the_old_one_without_dropping_it(tmp_path):
    provider = memory(tmp_path, encode="skill", manage="dedup")
    provider.take_in_memory(solved(1, negative=False))
    provider.take_in_memory(solved(1, negative=True))
    stored = items_file(provider)
    assert len(stored) == 2
    old, new = stored
    assert old["superseded_by"] == new["id"] and new["superseded_by"] is None
    assert "negative input" in new["content"] and "negative input" not in old["content"]
    query = find_task(1, negative=True).query
    assert [m.id for m in provider.provide_memory(MemoryRequest(query)).memories] == [new["id"]]
    none = memory(tmp_path, "none", encode="skill", manage="none")
    none.take_in_memory(solved(1, negative=False))
    none.take_in_memory(solved(1, negative=True))
    assert len(none.store.active()) == 2


def test_consolidate_merges_a_family_and_keeps_the_originals(tmp_path):
    provider = memory(tmp_path, encode="insight", manage="consolidate", consolidate_every=2)
    provider.take_in_memory(solved(2, negative=False))
    provider.take_in_memory(solved(2, negative=True, start=50))
    active = provider.store.active()
    assert len(active) == 1 and active[0]["kind"] == "consolidated"
    originals = [i for i in items_file(provider) if i["kind"] == "insight"]
    assert originals and all(i["consolidated_into"] == active[0]["id"] for i in originals)
    facts = {f["type"] for f in active[0]["facts"]}
    assert facts == {"step", "unit", "sign_fix"}


def test_decay_scales_relevance_by_age(tmp_path):
    """decay: min-max relevance x exp(-age / tau); the family's items are the most relevant (1) and 4 tasks old."""
    decayed = memory(tmp_path, "decay", encode="insight", retrieve="bm25", manage="decay", decay_tau=2.0, top_k=1)
    decayed.take_in_memory(solved(3, negative=False))
    for family in (0, 1, 2):
        decayed.take_in_memory(solved(family, negative=False))
    query = find_task(3, negative=False).query
    [item] = decayed.provide_memory(MemoryRequest(query)).memories
    assert item.metadata["group"] == find_task(3, negative=False).family.name
    assert item.score == pytest.approx(math.exp(-4 / 2.0), rel=1e-5)
    # the newest task's items are 1 task old: a relevance of at least exp(-1.5) / exp(-0.5) beats them
    scores = decayed.scores(query, decayed.store.active())
    newest = [i for i, it in enumerate(decayed.store.active()) if it["created"] == 3]
    assert all(float(scores[i]) <= math.exp(-1 / 2.0) + 1e-6 for i in newest)


# -- stores: persistence, isolation, bad input ---------------------------------------------------------------------
def test_two_systems_cannot_read_each_others_store(tmp_path):
    a, b = memory(tmp_path, "a"), memory(tmp_path, "b")
    a.take_in_memory(solved(0, negative=False))
    before = (tmp_path / "a" / "items.jsonl").read_text()
    query = find_task(0, negative=False).query
    assert b.provide_memory(MemoryRequest(query)).memories == []
    b.take_in_memory(solved(1, negative=False))
    assert (tmp_path / "a" / "items.jsonl").read_text() == before
    assert {m.metadata["group"] for m in b.provide_memory(MemoryRequest(query)).memories} == {
        find_task(1, negative=False).family.name
    }


def test_a_foreign_or_corrupt_store_directory_is_one_clear_error(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="no manifest.json"):
        memory(tmp_path, "foreign").initialize()
    assert (foreign / "notes.txt").read_text() == "mine"
    provider = filled(tmp_path, 3, "good")
    (provider.store.directory / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="manifest.json: corrupt"):
        memory(tmp_path, "good").initialize()
    provider = filled(tmp_path, 3, "lines")
    path = provider.store.directory / "items.jsonl"
    path.write_text(path.read_text() + "garbage\n")
    lines = len(path.read_text().splitlines())
    with pytest.raises(StoreError, match=rf"items.jsonl, line {lines}"):
        memory(tmp_path, "lines").initialize()
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"format": "something-else/2"}))
    with pytest.raises(StoreError, match="foreign"):
        memory(tmp_path, "other").initialize()


def test_a_vector_store_refuses_an_encoder_of_another_dimension(tmp_path):
    g = Genotype("insight", "vector", "cosine", "dedup")
    provider = ModularMemory(g, tmp_path / "v", encoder=HashingEncoder(64))
    run_stream(provider, ENV, [0, 1], seed=0)
    with pytest.raises(StoreError, match="64-dimensional.*gives 32"):
        ModularMemory(g, tmp_path / "v", encoder=HashingEncoder(32)).initialize()
    with pytest.raises(StoreError, match="holds a insight/vector store.*this system is insight/list"):
        ModularMemory(g.mutate(store="list"), tmp_path / "v").initialize()  # another architecture
    assert (
        ModularMemory(g, tmp_path / "v", encoder=HashingEncoder(64))
        .provide_memory(MemoryRequest(find_task(0, False).query))
        .memories
    )


def test_bad_genotypes_are_config_errors():
    with pytest.raises(ConfigError, match=r"memory.retrieve='tfidf'"):
        Genotype(retrieve="tfidf")
    with pytest.raises(ConfigError, match="top_k"):
        Genotype(top_k=0)
    with pytest.raises(ConfigError, match="phases"):
        Genotype(phases=("during",))


# -- ProcWorld and the memory agent ------------------------------------------------------------------------------
def test_procworld_is_seeded_and_its_quirks_recur_within_a_family():
    a, b = ProcWorld(seed=7), ProcWorld(seed=7)
    assert (a.family, a.value, a.query) == (b.family, b.value, b.query)
    assert ProcWorld(seed=1, world_seed=1).world != a.world
    same_family = [ProcWorld(seed=s) for s in range(40) if ProcWorld(seed=s).family == a.family]
    assert len({e.value for e in same_family}) > 1 and {e.family.procedure for e in same_family} == {a.family.procedure}
    assert len({f.procedure for f in a.world}) == len(a.world)


def test_procworld_errors_never_name_the_right_op():
    env = find_task(0, negative=True)
    f = env.family
    wrong = next(op for op in f.ops if op not in f.procedure and op != f.sign_fix)
    message = env.use(wrong)["message"]
    assert f.procedure[0] not in message and not env.done
    env.use(f.procedure[0])
    assert env.use(f.procedure[1], f.unit)["message"] == f"{f.procedure[1]} fails on negative input"
    assert env.use(f.sign_fix)["success"]
    bad_unit = next(u for u in ("kg", "lb", "oz") if u != f.unit)
    assert "rejects unit" in env.use(f.procedure[1], bad_unit)["message"]
    trajectory = run_episode(find_task(0, negative=True), OracleAgent(find_task(0, negative=True)))
    assert trajectory.score == 1.0 and len(trajectory.steps) == len(f.procedure) + 2
    skipped = find_task(0, negative=True)
    assert run_episode(skipped, OracleAgent(skipped, skip_sign_fix=True)).score == 0.0


def test_memory_is_the_route_to_improvement():
    """Over the second half of a 40-task stream, the insight-memory agent beats the same agent without memory."""
    tasks = list(range(40))
    none = run_stream(None, ENV, tasks, seed=11)
    with_memory = run_stream(
        ModularMemory(Genotype("insight", "list", "bm25", "dedup", top_k=6), Path(tmp_dir()) / "m"), ENV, tasks, 11
    )
    late = slice(20, 40)

    def rate(result):
        return sum(e["score"] for e in result["episodes"][late]) / 20

    assert rate(with_memory) >= rate(none) + 0.3
    assert none["tokens"] == 0 and with_memory["tokens"] > 0


def tmp_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="zoo_memory_test_")


def test_the_agent_injects_memory_only_about_its_family_into_its_plan(tmp_path):
    provider = memory(tmp_path, encode="skill", retrieve="bm25")
    provider.take_in_memory(solved(0, negative=True))
    env = find_task(0, negative=True, start=300)
    agent = ProcWorldMemoryAgent(seed=0, memory=provider)
    trajectory = run_episode(env, agent)
    # the remembered skill replays the procedure with the sign fix: no exploration
    assert trajectory.score == 1.0 and len(trajectory.steps) == len(env.family.procedure) + 2
    assert agent.memory_log["hits"] == 1 and agent.memory_log["facts"] >= 6
    assert trajectory.usage.prompt_tokens == pytest.approx(agent.memory_log["chars"] / 4, abs=1)
    other = find_task(1, negative=False, start=300)
    agent = ProcWorldMemoryAgent(seed=0, memory=provider)
    run_episode(other, agent)
    assert agent.memory_log["hits"] == 0 and agent.memory_log["facts"] == 0


# -- configs and the app -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", BASELINES)
def test_released_baselines_are_named_configs_citing_their_source(train_cfg, name):
    text = (REPO_ROOT / "conf" / "memory" / f"{name}.yaml").read_text()
    assert re.search(r"arXiv:\d{4}\.\d{5}", text.splitlines()[0]) and "EvolveLab providers/" in text.splitlines()[0]
    cfg = train_cfg(["+method=evolvelab", f"memory={name}"])
    g = Genotype.from_config(OmegaConf.to_container(cfg.memory, resolve=True))
    assert g.name == name
    expected = {
        "expel": ("insight", "hybrid", 0.7),
        "voyager": ("skill", "cosine", None),
        "dynamic_cheatsheet": ("insight", "recency", None),
        "agent_workflow_memory": ("skill", "bm25", None),
        "generative_agents": ("raw", "cosine", None),
        "agent_kb": ("insight", "hybrid", 0.5),
    }[name]
    assert (g.encode, g.retrieve) == expected[:2] and (expected[2] is None or g.alpha == expected[2])
    # EvolveLab's released providers: ExpeL answers at BEGIN and IN; the other five answer only at BEGIN
    assert g.phases == (("begin", "in") if name == "expel" else ("begin",))


def test_modules_are_config_groups(train_cfg):
    cfg = train_cfg(["+method=evolvelab", "memory=modular", "memory/encode@memory=skill", "memory/manage@memory=decay"])
    g = Genotype.from_config(OmegaConf.to_container(cfg.memory, resolve=True))
    assert (g.encode, g.manage, g.decay_tau) == ("skill", "decay", 20.0)


def test_evolvelab_runs_with_the_ingest_callback(train_cfg, tmp_path):
    cfg = train_cfg(["+method=evolvelab", "memory=voyager", "datamodule.episodes=6"])
    metrics = run(cfg)
    assert 0.0 <= metrics["test/score"] <= 1.0
    rows = [json.loads(line) for line in (tmp_path / "run" / "memory_ingest.jsonl").read_text().splitlines()]
    assert [r["episode"] for r in rows] == list(range(6)) and all(r["ok"] for r in rows)
    trajectories = (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()
    solved_tasks = [json.loads(line)["score"] for line in trajectories]
    stored = [json.loads(line) for line in (tmp_path / "run" / "memory" / "items.jsonl").read_text().splitlines()]
    # Voyager stores verified skills only: one per solved task (identical ones deduplicated)
    assert 0 < len(stored) <= sum(s == 1.0 for s in solved_tasks)
    assert all(i["kind"] == "skill" for i in stored)


def test_faiss_index_gives_the_exact_ranking(tmp_path):
    g = Genotype("insight", "vector", "cosine", "dedup", top_k=5)
    exact = ModularMemory(g, tmp_path / "exact", encoder="hashing:64")
    faiss_memory = ModularMemory(g, tmp_path / "faiss", encoder="hashing:64", index="faiss")
    for provider in (exact, faiss_memory):
        run_stream(provider, ENV, list(range(8)), seed=2)
    query = find_task(2, negative=True).query
    a = exact.provide_memory(MemoryRequest(query)).memories
    b = faiss_memory.provide_memory(MemoryRequest(query)).memories
    assert [m.id for m in a] == [m.id for m in b]
    assert [m.score for m in a] == pytest.approx([m.score for m in b], abs=1e-5)
    with pytest.raises(ConfigError, match="memory.index"):
        ModularMemory(g, tmp_path / "x", index="annoy")


def test_the_real_minilm_encoder_backs_a_vector_store_and_its_dimension_is_checked(tmp_path):
    g = Genotype("skill", "vector", "cosine", "dedup")
    provider = ModularMemory(g, tmp_path / "minilm", encoder="minilm")
    provider.take_in_memory(solved(0, negative=True))
    provider.take_in_memory(solved(1, negative=False))
    manifest = json.loads((tmp_path / "minilm" / "manifest.json").read_text())
    assert manifest["dim"] == 384 and provider.store.vectors.shape == (2, 384)
    [best, _] = provider.provide_memory(MemoryRequest(find_task(1, negative=False, start=400).query)).memories
    assert best.metadata["group"] == find_task(1, negative=False).family.name
    with pytest.raises(StoreError, match="384-dimensional.*gives 64"):
        ModularMemory(g, tmp_path / "minilm", encoder="hashing:64").initialize()
