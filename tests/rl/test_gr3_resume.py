"""GR3's alpha is the shaper's state and travels in the module's checkpoints: a run killed after N steps and resumed
from its checkpoint goes on with the calibrated alpha (the same alpha trajectory as an uninterrupted run).
Real tiny Llama, real Trainer and checkpoints."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.callbacks import GR3AlphaCalibration
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.errors import ConfigError
from zoo.modules import GRPOModule
from zoo.rl import GR3Shaper

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def text_hash_reward(prompts, completions, **kw):
    return [float(sum(map(ord, c)) % 13) for c in completions]


class AlphaTrace(pl.Callback):
    """The alpha in force at the start of every step."""

    def __init__(self) -> None:
        self.alphas: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.alphas[trainer.global_step] = pl_module.shaper.alpha


def run(tmp_path, max_steps: int, ckpt_path=None, save_to=None) -> dict[int, float]:
    pl.seed_everything(0)
    module = GRPOModule(
        TinyBackbone(seed=0, num_key_value_heads=2, **SMALL),
        rewards={"hash": text_hash_reward},
        shaper=GR3Shaper(alpha=0.0),
        group_size=3,
        generation={"max_new_tokens": 6},
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
    )
    # a low target so that the calibrated alpha (the grid's largest) differs from the configured 0
    calibration = GR3AlphaCalibration(alpha_grid=(0.0, 0.1, 0.2), target_fraction=0.01, adapt=True, every_n_steps=1)
    trace = AlphaTrace()
    trainer = pl.Trainer(
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[calibration, trace],
    )
    data = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=32, num_val=2), batch_size=2)
    trainer.fit(module, data, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return trace.alphas


def test_a_resumed_run_keeps_the_calibrated_alpha(tmp_path):
    uninterrupted = run(tmp_path / "a", max_steps=4)
    assert set(uninterrupted.values()) != {0.0}  # the calibration did move alpha off its configured value
    ckpt = tmp_path / "b.ckpt"
    first = run(tmp_path / "b", max_steps=2, save_to=ckpt)
    resumed = run(tmp_path / "c", max_steps=4, ckpt_path=ckpt)
    assert {**first, **resumed} == uninterrupted
    assert resumed[2] != 0.0


def test_shaper_state_round_trip_and_validation():
    shaper = GR3Shaper(alpha=0.3)
    shaper.set_alpha(0.1)
    other = GR3Shaper(alpha=0.3)
    other.load_state_dict(shaper.state_dict())
    assert other.alpha == 0.1
    with pytest.raises(ConfigError, match="alpha must be >= 0"):
        shaper.set_alpha(-0.5)
