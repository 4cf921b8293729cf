"""DecodeStats (zoo.callbacks): per-problem decoding statistics (repetition rate, tokens, DTS branch events and active
hypotheses) from the generation protocol's meta, in a plain Lightning script without Hydra."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.callbacks import DecodeStats
from zoo.callbacks.decode_stats import batch_stats
from zoo.data.forked import ForkedTask
from zoo.data.sources import TaskSource
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError
from zoo.generation import DTSDecoder, SampleDecoder
from zoo.modules import CausalLMModule

torch.set_num_threads(1)


def _setup(decoder, tmp_path):
    backbone = TinyBackbone(seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    task = ForkedTask()
    module = CausalLMModule(
        backbone, generation={"max_new_tokens": 10, "do_sample": True}, decoder=decoder, verifier=task
    )
    source = TaskSource(task, num_train=16, num_val=12, num_test=12, seed=0)
    datamodule = SFTDataModule(backbone.tokenizer, source, batch_size=4, eval_batch_size=4, max_length=160)
    stats = DecodeStats()
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[stats],
    )
    return module, datamodule, trainer, stats


def _mean(outputs, key):
    values = [v for out in outputs for v in out["meta"][key]]
    return sum(float(v) for v in values) / len(values)


def test_predict_statistics_are_the_means_of_the_per_problem_meta(tmp_path):
    decoder = DTSDecoder(entropy_threshold=math.inf, varentropy_threshold=0.0, max_active=5)
    module, datamodule, trainer, stats = _setup(decoder, tmp_path)
    outputs = trainer.predict(module, datamodule)
    written = json.loads((tmp_path / "decode_stats_predict.json").read_text())
    assert written == stats.predict_stats()
    assert sum(len(out["texts"]) for out in outputs) == 12
    for name, key in [
        ("repetition_rate", None),
        ("tokens_per_problem", "completion_tokens"),
        ("decoded_tokens_per_problem", "decoded_tokens"),
        ("branch_events", "branch_events"),
        ("max_active", "max_active"),
        ("mean_active", "mean_active"),
        ("accuracy", "correct"),
    ]:
        expected = 1 - _mean(outputs, "finished") if key is None else _mean(outputs, key)
        assert written[f"predict/decode/{name}"] == pytest.approx(expected)
    assert written["predict/decode/branch_events"] > 0
    assert written["predict/decode/decoded_tokens_per_problem"] > written["predict/decode/tokens_per_problem"]


def test_validation_and_test_log_epoch_means_for_any_decoder(tmp_path):
    module, datamodule, trainer, _ = _setup(SampleDecoder(), tmp_path)
    validated = trainer.validate(module, datamodule)[0]
    tested = trainer.test(module, datamodule)[0]
    for split, metrics in (("val", validated), ("test", tested)):
        assert 0.0 <= metrics[f"{split}/decode/repetition_rate"] <= 1.0
        assert 1.0 <= metrics[f"{split}/decode/tokens_per_problem"] <= 10.0
        # one trace per problem: the decoding work is the completion
        assert metrics[f"{split}/decode/decoded_tokens_per_problem"] == metrics[f"{split}/decode/tokens_per_problem"]
        assert f"{split}/decode/branch_events" not in metrics


def test_batch_stats_and_bad_input():
    meta = {
        "finished": [True, False, False, True],
        "completion_tokens": [3, 10, 10, 5],
        "correct": [True, False, True, True],
    }
    assert batch_stats(meta) == {
        "accuracy": (3.0, 4),
        "repetition_rate": (2.0, 4),
        "tokens_per_problem": (28.0, 4),
        "decoded_tokens_per_problem": (28.0, 4),
    }
    with pytest.raises(ConfigError, match="DecodeStats: stages"):
        DecodeStats(stages=["fit"])
    with pytest.raises(ConfigError, match=r"meta\['finished'\]"):
        DecodeStats._meta(torch.nn.Module(), {"texts": ["a"], "meta": {"prompts": ["p"]}})
