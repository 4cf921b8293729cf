"""MemEvolve's loop sizes are the released ones (github.com/bingreeky/MemEvolve at 6cddf33,
``Flash-Searcher-main/MemEvolve/config.py``): ``EVOLVE_TASK_BATCH_X = 20``, ``EVOLVE_TOP_T = 2``,
``EVOLVE_EXTRA_SAMPLE_Y = 5``, ``EVOLVE_GENERATED_M = 3``, ``SMOKE_TASK_LIMIT = 5``."""

from __future__ import annotations

import inspect

from omegaconf import OmegaConf

from zoo.memory.memevolve import MemEvolve

RELEASED = {"tasks": 20, "finalists": 2, "reused": 5, "candidates": 3, "smoke_tasks": 5}


def test_memevolve_defaults_are_the_released_loop_sizes():
    parameters = inspect.signature(MemEvolve.__init__).parameters
    assert {name: parameters[name].default for name in RELEASED} == RELEASED


def test_the_method_config_keeps_the_released_loop_sizes(train_cfg):
    module = OmegaConf.to_container(train_cfg(["+method=memevolve"]).module)
    assert {name: module[name] for name in RELEASED} == RELEASED
