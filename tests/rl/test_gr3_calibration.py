"""GR3AlphaCalibration under binary (RLVR) rewards: constant groups, the alpha = 0 warning, the method config.

Test double: a LightningModule holding only what the callback reads (a GR3 shaper and the last rollout's rewards
and lengths); no language model is needed for the calibration logic.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate

from zoo.callbacks import GR3AlphaCalibration
from zoo.rl import GR3Shaper, calibrate_alpha


class FakeGRPO(pl.LightningModule):
    def __init__(self, rewards: torch.Tensor, lengths: torch.Tensor, alpha: float = 0.3) -> None:
        super().__init__()
        self.shaper = GR3Shaper(alpha=alpha)
        self.last_rollout = {"rewards": rewards, "lengths": lengths}
        self.logged: dict[str, float] = {}

    def log(self, name, value, **kw):
        self.logged[name] = float(value)


class StepTrainer:
    def __init__(self, step: int) -> None:
        self.global_step = step


def binary_window() -> tuple[torch.Tensor, torch.Tensor]:
    """RLVR groups: half mixed (one correct short answer), half all-correct with unequal lengths.

    The mixed groups satisfy GR3-4 for every alpha on the grid; the all-correct groups violate it for every
    alpha > 0 (Jensen) but carry no advantage (zero reward variance).
    """
    mixed = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(8, 1)
    all_correct = torch.ones(8, 4)
    lengths = torch.tensor([[10.0, 20.0, 30.0, 40.0]]).repeat(16, 1)
    return torch.cat([mixed, all_correct]), lengths


def test_binary_rewards_calibrate_a_positive_alpha_by_default():
    rewards, lengths = binary_window()
    module = FakeGRPO(rewards, lengths)
    callback = GR3AlphaCalibration(alpha_grid=(0.0, 0.1, 0.3, 0.6), target_fraction=0.999, adapt=True, every_n_steps=1)
    callback.setup(StepTrainer(1), module, "fit")
    callback.on_train_batch_end(StepTrainer(1), module, None, None, 0)
    # constant groups left out: every informative group satisfies the constraint, so the largest alpha wins
    assert module.shaper.alpha == 0.6
    assert module.logged["train/gr3_calibrated_alpha"] == 0.6
    assert module.logged["train/gr3_satisfaction"] == 1.0  # of the current alpha (0.3) over informative groups
    assert module.logged["train/gr3_calibration_groups"] == 8.0
    # the reference computation with the option spelled out agrees
    expected = calibrate_alpha(rewards, lengths, (0.0, 0.1, 0.3, 0.6), 0.999, exclude_constant_groups=True)
    assert expected.alpha == 0.6


def test_counting_constant_groups_switches_gr3_off_and_warns(caplog):
    rewards, lengths = binary_window()
    module = FakeGRPO(rewards, lengths)
    callback = GR3AlphaCalibration(
        alpha_grid=(0.0, 0.1, 0.3), target_fraction=0.999, adapt=True, every_n_steps=1, exclude_constant_groups=False
    )
    with caplog.at_level(logging.WARNING, logger="zoo.callbacks.gr3_calibration"):
        callback.on_train_batch_end(StepTrainer(1), module, None, None, 0)
    assert module.shaper.alpha == 0.0
    assert module.logged["train/gr3_satisfaction"] == 0.5  # the all-correct half fails at alpha = 0.3
    assert "calibrated alpha is 0" in caplog.text


def test_a_window_without_informative_groups_keeps_alpha():
    """All groups constant (e.g. every answer wrong early in training): nothing to calibrate on."""
    module = FakeGRPO(torch.zeros(4, 4), torch.tensor([[10.0, 20.0, 30.0, 40.0]] * 4), alpha=0.2)
    callback = GR3AlphaCalibration(alpha_grid=(0.0, 0.3, 0.6), adapt=True, every_n_steps=1)
    callback.on_train_batch_end(StepTrainer(1), module, None, None, 0)
    assert module.shaper.alpha == 0.2
    assert "train/gr3_calibrated_alpha" not in module.logged
    assert module.logged["train/gr3_calibration_groups"] == 0.0


def test_method_config_calibrates_online(train_cfg):
    """conf/method/gr3.yaml says alpha is 'calibrated online': the callback adapts it, on informative groups."""
    cfg = train_cfg(["+method=gr3"])
    callback = instantiate(cfg.callbacks.gr3_calibration)
    assert callback.adapt is True
    assert callback.exclude_constant_groups is True
    rewards, lengths = binary_window()
    module = FakeGRPO(rewards, lengths)
    callback.on_train_batch_end(StepTrainer(callback.every_n_steps), module, None, None, 0)
    assert module.shaper.alpha == max(callback.alpha_grid)


@pytest.mark.parametrize("bad", [{"window": 0}, {"target_fraction": 0.0}, {"alpha_grid": ()}])
def test_bad_arguments_are_config_errors(bad):
    from zoo.errors import ConfigError

    with pytest.raises(ConfigError):
        GR3AlphaCalibration(**bad)
