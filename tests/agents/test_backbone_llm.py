"""The run's composed backbone as the LLM of the agent and text-optimisation methods, in process
(``zoo.agents.backbone_llm``, ``HFLocalBackend`` without ``path``): ``+method=ultrahorizon agent=llm backbone=tiny``
(the backend selected automatically), ``backend=hf_local`` without ``path`` to tune it, and one model per run."""

from __future__ import annotations

import re

import pytest
from hydra.errors import InstantiationException

from zoo.agents import HFLocalBackend, ScriptedBackend, backbone_llm
from zoo.backbones import TinyBackbone
from zoo.cli.train import build, check_methods, run, user_message
from zoo.errors import ConfigError

CHAT = [{"role": "system", "content": "Explore."}, {"role": "user", "content": "Next step."}]
EPISODE = ["datamodule.episodes=1", "env.required_steps=5", "module.max_steps=2"]
TINY_LLM = ["backend=hf_local", "backend.overflow=keep_recent", "backend.max_tokens=4"]


def test_an_unset_backend_becomes_the_backbone_in_process():
    backbone = TinyBackbone(seed=0)
    backend = backbone_llm(None, backbone)
    assert isinstance(backend, HFLocalBackend) and backend.bound and backend.path is None
    assert backend.identity() == {"kind": "hf_local", "model": "TinyBackbone (fresh)"}
    reply = backend.complete(CHAT, seed=0, max_tokens=3)
    assert 0 < reply.usage.completion_tokens <= 3
    model = backend._model
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    # the same weights as the backbone builds them (seeded init), greedy: the reply of a model built directly
    direct = HFLocalBackend(model=TinyBackbone(seed=0).build_model().eval(), tokenizer=backbone.tokenizer)
    assert direct.complete(CHAT, seed=0, max_tokens=3).content == reply.content
    assert backend.identity()["model"] == "TinyBackbone (fresh)"  # the cache key does not change once it is built


def test_a_pathless_hf_local_backend_keeps_its_settings_and_binds_the_backbone_once():
    backbone = TinyBackbone(seed=0)
    backend = HFLocalBackend(overflow="keep_recent", max_tokens=2)
    assert not backend.bound
    assert backbone_llm(backend, backbone) is backend and backend.overflow == "keep_recent"
    assert backbone_llm(backend, backbone) is backend  # the same backbone again: no-op
    with pytest.raises(ConfigError, match="already names its model"):
        backend.bind_backbone(TinyBackbone(seed=1))


def test_one_model_per_run():
    backbone = TinyBackbone(seed=0)
    with pytest.raises(ConfigError, match=r"backend=scripted names another model; use one: backbone=none"):
        backbone_llm(ScriptedBackend(responses=["hi"]), backbone)
    with pytest.raises(ConfigError, match=r"backend=hf_local has no model: set backend.path=.*compose a backbone"):
        backbone_llm(HFLocalBackend(), None)
    scripted = ScriptedBackend(responses=["hi"])
    assert backbone_llm(scripted, None) is scripted and backbone_llm(None, None) is None


def test_ultrahorizon_with_agent_llm_and_a_backbone_selects_the_in_process_backend(train_cfg):
    cfg = train_cfg(["+method=ultrahorizon", "agent=llm", "backbone=tiny", *EPISODE])
    assert cfg.backend is None and cfg.backbone is not None
    check_methods(cfg)  # declared: no warning, no refusal
    module, _, _ = build(cfg)
    backend = module.make_agent.keywords["backend"]
    assert isinstance(backend, HFLocalBackend) and backend.identity()["model"] == "TinyBackbone (fresh)"
    assert backend.overflow == "error"  # the hf_local defaults


def test_ultrahorizon_runs_episodes_with_the_tiny_backbone_as_its_agent(train_cfg):
    metrics = run(train_cfg(["+method=ultrahorizon", "agent=llm", "backbone=tiny", *TINY_LLM, *EPISODE]))
    # the model replied at every step (no failed episode), with at most 4 tokens a reply
    assert metrics["test/failed"] == 0 and metrics["test/failed_steps"] == 2 and metrics["test/tokens"] > 0


def test_a_scripted_agent_with_a_backbone_or_two_models_are_refused(train_cfg):
    """One message each (what train.py prints before exiting with status 2)."""
    cases = [
        (["+method=ultrahorizon", "backbone=tiny"], r"agent=hypothesis_elimination uses no model.*add agent=llm"),
        (
            ["+method=ultrahorizon", "agent=llm", "backend=scripted", "backend.responses=[hi]", "backbone=tiny"],
            r"backend=scripted names another",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(InstantiationException) as err:
            build(train_cfg([*overrides, *EPISODE]))
        assert re.search(message, user_message(err.value) or ""), user_message(err.value)


def test_text_optimisers_and_the_memevolve_designer_take_the_backbone(train_cfg):
    module, _, _ = build(train_cfg(["+method=textgrad", "backbone=tiny", *TINY_LLM, "datamodule.steps=1"]))
    assert isinstance(module.method.backend, HFLocalBackend) and module.method.backend.overflow == "keep_recent"
    module, _, _ = build(train_cfg(["+method=textresnet", "datamodule.steps=1"]))
    assert isinstance(module.method.backend, ScriptedBackend)  # no backbone: the simulator's scripted roles
    module, _, _ = build(train_cfg(["+method=memevolve", "backbone=tiny", *TINY_LLM]))
    designer = module.evolver.designer
    assert isinstance(designer.backend, HFLocalBackend)
    assert designer.backend.identity()["model"] == "TinyBackbone (fresh)"
    module, _, _ = build(train_cfg(["+method=memevolve"]))
    assert module.evolver.designer is None  # rule-based only
