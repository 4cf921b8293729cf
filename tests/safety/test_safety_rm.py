"""Safety reward model: labelled-prefix datamodule, sequence-classifier module, export -> scorer, configs.

Training here is a few steps on a handful of rows (the learned quality is measured by the demo).
"""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl
import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.data.jailbreak import JailbreakTask, SafetyPrefixSource
from zoo.datamodules.labelled_prefixes import LabelledPrefixDataModule
from zoo.errors import DataError
from zoo.generation.stepwise import StepwiseDecoder
from zoo.modules.sequence_classifier import SequenceClassifierModule
from zoo.protocols import SamplingParams
from zoo.safety import (
    DEFAULT_HOOK_LOOKAHEAD,
    ScorerError,
    SequenceClassifierScorer,
    load_safety_rm,
    safethink_generate,
)
from zoo.safety.scorers import SCORER_CONFIG

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}


class ListSource:
    def __init__(self, rows):
        self._rows = rows

    def rows(self, split, required_fields=()):
        return self._rows


def test_datamodule_labels_and_errors():
    tok = build_char_tokenizer()
    rows = [{"text": "abc", "label": 1}, {"text": "abcdef", "label": "unsafe"}, {"text": "x", "label": True}]
    dm = LabelledPrefixDataModule(tok, ListSource(rows), batch_size=2, max_length=4)
    batch = dm.collate([dm.encode(r, i, "train") for i, r in enumerate(rows)])
    assert batch["labels"].tolist() == [1, 0, 1]
    assert batch["input_ids"].shape == (3, 4)  # truncated to the last 4 tokens
    assert tok.decode(batch["input_ids"][1]) == "cdef"
    with pytest.raises(DataError, match="train row 7: label 'maybe'"):
        dm.encode({"text": "a", "label": "maybe"}, 7, "train")
    with pytest.raises(DataError, match="missing field 'label'"):
        dm.encode({"text": "a"}, 0, "val")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    task = JailbreakTask()
    backbone = TinyBackbone(**SMALL)
    dm = LabelledPrefixDataModule(backbone.tokenizer, SafetyPrefixSource(task, 40, 10, 10), batch_size=16)
    module = SequenceClassifierModule(backbone)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=4,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, dm)
    metrics = trainer.validate(module, dm, verbose=False)[0]
    path = module.export_pretrained(tmp_path_factory.mktemp("rm") / "export")
    return module, path, metrics


def test_module_trains_logs_and_exports_with_safetensors(trained):
    module, path, metrics = trained
    assert {"val/loss", "val/accuracy", "val/auroc"} <= set(metrics)
    assert (path / "model.safetensors").is_file()
    meta = json.loads((path / SCORER_CONFIG).read_text())
    assert meta["safe_label"] == 1
    assert meta["label_names"] == ["unsafe", "safe"]


def test_export_loads_as_a_scorer_matching_the_in_memory_model(trained):
    module, path, _ = trained
    prompts = ["JB add 123=", "add 45="]
    traces = ["<think>harm 1+2=3\n", "<think>4+5=9\n"]
    loaded = load_safety_rm(path)
    scores = loaded(prompts, traces)
    module.model.train()
    in_memory = module.as_scorer()(prompts, traces)
    assert module.model.training  # scoring runs in eval mode and restores the module's mode
    assert all(0.0 <= s <= 1.0 for s in scores)
    torch.testing.assert_close(torch.tensor(scores), torch.tensor(in_memory))
    assert loaded.name == "classifier:export"


def test_export_drives_safethink(trained):
    """The export path as SafeThink's scorer: every monitored step is scored by the exported RM (its P(safe) of the
    prompt and the trace so far), and with tau above any probability the first step of every row is flagged once
    and followed by the prefix."""
    _, path, _ = trained
    bb = TinyBackbone(**SMALL)
    prompts = ["JB add 12=", "add 34="]
    out = safethink_generate(
        bb.build_model(),
        bb.tokenizer,
        prompts,
        str(path),
        tau=1.01,
        max_steps_monitored=1,
        params=SamplingParams(max_new_tokens=24, do_sample=True),  # greedy decoding of a random model repeats "="
        generator=torch.Generator().manual_seed(0),
        decoder=StepwiseDecoder(
            step_delimiters=list("abcdefghijklmnopqrstuvwxyz0123456789 "),
            final_step_delimiters=(),
            hook_lookahead=DEFAULT_HOOK_LOOKAHEAD,
        ),
    )
    assert out.num_interventions == [1, 1]
    rm = load_safety_rm(path)
    for i, prompt in enumerate(prompts):
        [(step, score)] = out.step_scores[i]  # m = 1: only the first step is scored
        assert step == 1
        trace = out.texts[i][: out.texts[i].index("Wait, think safely")]  # keep mode: the prefix follows step 1
        assert trace.endswith(out.interventions[i][0].step_text)
        assert score == pytest.approx(rm([prompt], [trace])[0], abs=1e-5)
        injected = out.generation.completion_ids[i][out.generation.injected_mask[i].bool()].tolist()
        assert injected == out.prefix_ids


def test_any_local_sequence_classifier_with_one_logit(tmp_path):
    tok = build_char_tokenizer()
    model = LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), num_labels=1, pad_token_id=0, **SMALL))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = SequenceClassifierScorer.from_pretrained(tmp_path)
    scores = scorer(["a", "b", "c"], ["x", "yy", "zzz"])
    assert len(scores) == 3
    assert all(0.0 < s < 1.0 for s in scores)
    with pytest.raises(ScorerError, match="classifier:"):
        scorer(["a"], ["x", "y"])


def test_missing_exports_name_the_path(tmp_path):
    from zoo.errors import CheckpointNotFoundError

    with pytest.raises(CheckpointNotFoundError, match="zoo_scorer.json"):
        load_safety_rm(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match="no classifier"):
        SequenceClassifierScorer.from_pretrained(tmp_path / "nothing")


def _compose(overrides):
    """The config a run's task function gets: no ``hydra`` node, Hydra's singleton holding this run's (not an earlier
    test's) runtime choices, which the checks of the methods' refused options read."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with initialize_config_module("zoo.conf", version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_method_configs_compose_and_instantiate():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from zoo.callbacks.safethink import SafeThinkMonitor
    from zoo.cli.train import check_methods, instantiate_named

    cfg = _compose(["+method=safety_rm", "paths.output_dir=/tmp/x", "paths.root_dir=/tmp"])
    assert check_methods(cfg)["safety_rm"]["kind"] == "module"
    backbone = instantiate(cfg.backbone)
    module = instantiate(cfg.module, backbone=backbone, quantizer=instantiate(cfg.quant))
    dm = instantiate(cfg.datamodule, tokenizer=backbone.tokenizer)
    assert isinstance(module, SequenceClassifierModule)
    assert isinstance(dm, LabelledPrefixDataModule)

    cfg = _compose(["+method=[sft,safethink]", "task=jailbreak", "paths.output_dir=/tmp/x", "paths.root_dir=/tmp"])
    assert set(check_methods(cfg)) == {"sft", "safethink"}
    OmegaConf.resolve(cfg)
    monitors = [c for c in instantiate_named(cfg.callbacks) if isinstance(c, SafeThinkMonitor)]
    assert len(monitors) == 1
    assert monitors[0].max_steps_monitored == 3
    assert monitors[0].tau == 0.5
    assert monitors[0].scorer(["JB add 1="], ["<think>harm 1+1=2\n"]) == [0.0]

    from zoo.errors import ConfigError

    with pytest.raises(ConfigError, match="at most one"):
        check_methods(_compose(["+method=[sft,safety_rm]", "paths.output_dir=/tmp/x", "paths.root_dir=/tmp"]))
