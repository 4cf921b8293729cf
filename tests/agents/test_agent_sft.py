"""agent_sft: a scripted agent's actions, demonstrated in the exact chat the LLM tool-calling agent sends its model.

The demonstrations are the LLM agent's own requests (replayed through LLMToolAgent they are the same messages), their
prompt tokens are the tokens the HF local backend gives a real model for the same state, the text replies round-trip
to the teacher's calls, rows the evaluation would cut are left out, and the demo arm builds the model with the
evaluation's harness."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.agents import HFLocalBackend, HypothesisEliminationAgent, LLMToolAgent, MysteryGrid, ScriptedBackend
from zoo.agents.cloning import Demonstrator, collect_demonstrations, demonstration_text, reply_text
from zoo.agents.evaluate import derive_seed, run_episodes
from zoo.agents.parsing import parse_tool_calls
from zoo.agents.types import ToolCall
from zoo.backbones import TinyBackbone
from zoo.cli.train import run
from zoo.data.samplers import WeightedDomainSampler
from zoo.datamodules import AgentDemonstrationSource, AgentSFTDataModule

HARNESS = {"crnr_window": 4, "code_tool": True}


def grid(**kwargs):
    return partial(MysteryGrid, difficulty="easy", required_steps=3, **kwargs)


def datamodule(tokenizer, max_length=8192, reply_tokens=256):
    source = AgentDemonstrationSource(grid(), HypothesisEliminationAgent, num_train=1, num_val=0, **HARNESS)
    dm = AgentSFTDataModule(tokenizer, source, batch_size=1, max_length=max_length, reply_tokens=reply_tokens)
    dm.set_context_length(8192)
    return dm


@pytest.fixture(scope="module")
def demonstrations():
    return collect_demonstrations(grid(), HypothesisEliminationAgent, 1, seed=0, role="test", **HARNESS)


def replay(rows):
    """The LLM agent of the evaluation (LLMToolAgent, same harness, same worlds) answering with the demonstrated
    replies; returns the requests it sent and its trajectory."""
    requests = []

    def policy(messages, tools):
        requests.append((messages, tools))
        return rows[len(requests) - 1]["completion"]

    make_agent = lambda seed: LLMToolAgent(ScriptedBackend(policy=policy), seed=seed)
    (trajectory,) = run_episodes(grid(), make_agent, [0], derive_seed(0, 0, "test"), **HARNESS)
    return requests, trajectory


def test_demonstrations_are_the_requests_the_llm_agent_sends(demonstrations):
    rows, (taught,) = demonstrations
    requests, trajectory = replay(rows)
    assert len(requests) == len(rows) == len(taught.steps) and taught.refreshes >= 1  # a CRNR refresh is inside
    assert [messages for messages, _ in requests] == [row["chat"] for row in rows]
    assert [tools for _, tools in requests] == [row["tools"] for row in rows]
    assert [s.tool for s in trajectory.steps] == [s.tool for s in taught.steps] and trajectory.score == taught.score


def test_an_episodes_first_request_is_marked_and_can_be_drawn_more_often(demonstrations):
    """The ``request`` column names the episode's first request (no earlier call in its chat); the weighted sampler
    reads it, so a run can train on first requests more often than their share of the rows."""
    rows, _ = demonstrations
    assert [r["request"] for r in rows] == ["first"] + ["later"] * (len(rows) - 1)
    # the teacher's tool of each row is the tool its reply calls
    assert [r["tool"] for r in rows] == [parse_tool_calls(r["completion"]).calls[0].name for r in rows]
    assert len({r["tool"] for r in rows}) >= 2
    assert not any(m["role"] == "assistant" for m in rows[0]["chat"])
    assert any(m["role"] == "assistant" for m in rows[1]["chat"])
    source = AgentDemonstrationSource(grid(), HypothesisEliminationAgent, num_train=2, num_val=0, **HARNESS)
    backbone = TinyBackbone(max_position_embeddings=8192, seed=0)
    sampler = WeightedDomainSampler("request", weights={"first": 0.5, "later": 0.5})
    dm = AgentSFTDataModule(
        backbone.tokenizer, source, batch_size=1, max_length=8192, reply_tokens=256, sampler=sampler
    )
    dm.set_context_length(8192)
    dm.setup("fit")
    loader = dm.train_dataloader()
    drawn = []
    for epoch in range(20):
        sampler.set_epoch(epoch)
        drawn += [value for batch in loader for value in batch["columns"]["request"]]
    assert {"tool", "request"} <= set(next(iter(loader))["columns"])  # both reach the batch
    natural = sum(r["request"] == "first" for r in dm.dataset_rows["train"]) / len(dm.dataset_rows["train"])
    assert natural < 0.2 and abs(drawn.count("first") / len(drawn) - 0.5) < 0.1


def test_training_tokens_equal_what_the_backend_gives_the_model(demonstrations):
    rows, _ = demonstrations
    requests, _ = replay(rows)
    backbone = TinyBackbone(max_position_embeddings=8192, seed=0)
    backend = HFLocalBackend(model=backbone.build_model(), tokenizer=backbone.tokenizer, max_tokens=1)
    dm = datamodule(backbone.tokenizer)
    tokenizer = backbone.tokenizer
    after_refresh = next(i for i, r in enumerate(rows) if "context has been cleared" in str(r["chat"][-1]))
    for index in (0, 1, after_refresh):
        messages, tools = requests[index]
        item = dm.encode(rows[index], index, "train")
        assert item["prompt_ids"] == backend.encode(messages, tools)
        # the real backend's request: the prompt it ran the model on has exactly these tokens (nothing dropped)
        assert backend.complete(messages, tools).usage.prompt_tokens == len(item["prompt_ids"])
        reply = rows[index]["completion"]
        assert item["completion_ids"] == tokenizer(reply, add_special_tokens=False)["input_ids"] + [
            tokenizer.eos_token_id
        ]
    batch = dm.collate([dm.encode(rows[0], 0, "train")])
    labelled = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert labelled == dm.encode(rows[0], 0, "train")["completion_ids"]  # the loss covers the reply and EOS only


def test_a_reply_text_parses_back_to_the_teachers_call():
    call = ToolCall("commit_final_result", {"content": '{"A": {"score": "2 if steps % 3 == 0 else -1"}}'})
    parsed = parse_tool_calls(reply_text(call), known_tools=["commit_final_result"])
    assert [(c.name, c.arguments) for c in parsed.calls] == [(call.name, call.arguments)] and not parsed.errors


def test_the_teacher_acts_through_the_chat_as_it_acts_scripted():
    """Without CRNR the demonstrator's episode is the scripted agent's own episode, call for call."""
    scripted = run_episodes(grid(), HypothesisEliminationAgent, [0], 3)[0]
    taught = run_episodes(grid(), lambda seed: Demonstrator(HypothesisEliminationAgent(seed=seed), seed=seed), [0], 3)
    steps = [(s.tool, s.arguments) for s in taught[0].steps]
    assert steps == [(s.tool, s.arguments) for s in scripted.steps] and taught[0].score == scripted.score


def test_rows_the_evaluation_would_cut_are_left_out(demonstrations):
    rows, _ = demonstrations
    tokenizer = TinyBackbone(seed=0).tokenizer
    dm = datamodule(tokenizer, reply_tokens=256)
    lengths = [len(dm.prompt_ids(r)) for r in rows]
    dm.max_length = sorted(lengths)[len(lengths) // 2] + 256  # the shorter half of the prompts fits beside a reply
    dataset = dm.build_dataset("train", rows)
    kept = sum(n <= dm.max_length - 256 for n in lengths)
    assert 0 < len(dataset) == kept < len(rows) and dm.kept["train"] == (kept, len(rows))


def test_with_the_backends_overflow_long_chats_are_trained_on_as_the_backend_cuts_them(demonstrations):
    rows, _ = demonstrations
    requests, _ = replay(rows)
    tokenizer = TinyBackbone(seed=0).tokenizer
    dm = datamodule(tokenizer, reply_tokens=256)
    lengths = [len(dm.prompt_ids(r)) for r in rows]
    context = sorted(lengths)[len(lengths) // 2] + 256  # the longer half of the chats overflows
    dm.max_length = context
    dm.overflow, dm.rendering.overflow = "keep_recent", "keep_recent"
    short_replies = sum(len(tokenizer(r["completion"])["input_ids"]) < 256 for r in rows)  # EOS fits beside it
    assert len(dm.build_dataset("train", rows)) == short_replies == dm.kept["train"][0]  # no chat left out
    assert dm.kept["train"][0] > sum(n <= context - 256 for n in lengths)  # the default would leave out more
    backbone = TinyBackbone(max_position_embeddings=context, seed=0)
    backend = HFLocalBackend(
        model=backbone.build_model(), tokenizer=backbone.tokenizer, max_tokens=256, overflow="keep_recent"
    )
    longest = max(range(len(rows)), key=lengths.__getitem__)
    for index in (0, longest):
        ids = dm.prompt_ids(rows[index])
        messages, tools = requests[index]
        assert ids == backend.fit_context(messages, tools, context, 256)[0]
        assert backend.complete(messages, tools).usage.prompt_tokens == len(ids) <= context - 256
    assert len(dm.prompt_ids(rows[longest])) < lengths[longest]  # cut, not whole
    assert dm.prompt_ids(rows[0]) == dm.rendering.encode(rows[0]["chat"], rows[0]["tools"])  # a short chat: whole


def test_the_demo_arm_builds_its_model_with_the_evaluations_harness(train_cfg):
    cfg = train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=llm_sft", "env=ultrahorizon/sequence"])
    assert cfg.agent._target_ == "zoo.agents.LLMToolAgent" and cfg.backend._target_ == "zoo.agents.HFLocalBackend"
    node = OmegaConf.to_container(cfg.backend.path, resolve=True)
    assert node["_target_"] == "zoo.cli.artifacts.train_artifact" and "+method=agent_sft" in node["overrides"]
    assert node["values"]["env"] == OmegaConf.to_container(cfg.env, resolve=True)  # the evaluated environment
    overrides = dict(o.split("=", 1) for o in node["overrides"] if "=" in o and not o.startswith("+"))
    assert int(overrides["datamodule.source.crnr_window"]) == cfg.module.crnr_window == cfg.demo.crnr_window
    assert overrides["datamodule.source.code_tool"] == str(cfg.module.code_tool)
    assert int(overrides["datamodule.reply_tokens"]) == cfg.backend.max_tokens
    # the teacher's training episodes have their own cap; the evaluation's is the environment's own (scripted arms')
    assert int(overrides["datamodule.source.max_steps"]) == cfg.demo.sft.teacher_max_steps >= cfg.env.required_steps
    assert cfg.module.max_steps is None and cfg.demo.sft.max_steps is None


def test_the_method_composes_with_a_context_for_the_prompt(train_cfg):
    cfg = train_cfg(["+method=agent_sft"])
    assert cfg.backbone.max_position_embeddings == 8192 and cfg.datamodule._target_.endswith("AgentSFTDataModule")
    assert cfg.datamodule.source.env._target_ == "zoo.agents.MysteryGrid" and cfg.methods.agent_sft.paper == "sft"


def test_a_bpe_of_the_train_demonstrations_fits_a_whole_episode_and_is_built_once(train_cfg, tmp_path):
    """+preset=demonstration_bpe: the backbone's tokenizer is a BPE trained on the run's train-split demonstrations
    (artifact cache, built once), the datamodule's prompt tokens are still exactly the backend's for the same chat,
    and an episode's requests take a fraction of the character tokenizer's positions."""
    overrides = ["+method=agent_sft", "+preset=demonstration_bpe", "env.required_steps=3"]
    overrides += ["datamodule.source.num_train=1", "datamodule.source.crnr_window=4"]
    cfg = train_cfg(overrides, cache_dir=tmp_path / "cache")
    backbone = instantiate(cfg.backbone, _convert_="all")
    folder = backbone.tokenizer_dir
    assert folder.startswith(str(tmp_path / "cache" / "tokenizer")) and len(backbone.tokenizer) == 1024
    meta = json.loads((Path(folder) / "artifact.json").read_text())
    source = instantiate(cfg.datamodule.source)
    train_rows = source.rows("train")
    assert meta["rows"] == len(train_rows) and meta["spec"]["source"]["num_train"] == 1
    assert instantiate(cfg.backbone, _convert_="all").tokenizer_dir == folder  # cached: the same artifact
    assert json.loads((Path(folder) / "artifact.json").read_text())["built_at"] == meta["built_at"]
    dm = instantiate(cfg.datamodule, tokenizer=backbone.tokenizer, _convert_="all")
    dm.set_context_length(backbone.context_length())
    model = backbone.build_model()
    backend = HFLocalBackend(model=model, tokenizer=backbone.tokenizer, max_tokens=1)
    char = TinyBackbone(max_position_embeddings=8192).tokenizer
    for row in (train_rows[0], train_rows[-1], source.rows("val")[-1]):  # the validation episode is unseen
        ids = dm.encode(row, 0, "train")["prompt_ids"]
        assert ids == backend.encode(row["chat"], row["tools"])
        assert backbone.tokenizer.decode(ids[1:]) == demonstration_text(row)[: -len(row["completion"])]
        assert len(ids) < len(char(demonstration_text(row))["input_ids"]) / 2


@pytest.mark.slow
def test_a_short_training_run_makes_parseable_tool_calls_more_often(train_cfg, tmp_path):
    """60 SFT steps (a 2-layer, width-64 model of the method's context, on one short Mystery Grid episode) through the
    normal path and export; then both models answer the demonstrated requests through the HF local backend. Measured
    on a shared CPU: the untrained model's replies parse as no tool call, the trained one's first replies do (the
    tool names are not yet right: see docs/methods/agent_sft.md)."""
    overrides = [
        "+method=agent_sft",
        "env.required_steps=3",
        "datamodule.source.num_train=1",
        "datamodule.source.num_val=0",
        "trainer.limit_val_batches=0",
        "trainer.max_steps=60",
        "backbone.hidden_size=64",
        "backbone.intermediate_size=192",
        "backbone.num_hidden_layers=2",
        "module.optimizer.lr=1e-2",
    ]
    cfg = train_cfg(overrides)
    run(cfg)
    source = instantiate(cfg.datamodule.source, _convert_="all")
    rows = source.rows("train")
    trained = HFLocalBackend(path=str(tmp_path / "run" / "export"), max_tokens=96)
    backbone = instantiate(cfg.backbone, _convert_="all")
    untrained = HFLocalBackend(model=backbone.build_model(), tokenizer=backbone.tokenizer, max_tokens=96)
    fitting = [r for r in rows if len(untrained.encode(r["chat"], r["tools"])) <= 8192 - 96][:4]

    def parsed(backend):
        return sum(bool(backend.complete(r["chat"], r["tools"]).tool_calls) for r in fitting)

    assert parsed(trained) > parsed(untrained)
