"""Hydra callbacks of the app (``hydra.callbacks`` in ``conf/hydra/default.yaml``)."""

from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class HydraConfigForSweeps(Callback):
    """Make ``${hydra:...}`` resolvable while a multirun's sweeper resolves ``hydra.sweep.dir``.

    Hydra sets its global ``HydraConfig`` for each job, but not before the sweeper reads ``hydra.sweep.dir``; the
    app's directories derive from ``paths.root_dir: ${hydra:runtime.cwd}``, so without this ``python train.py -m ...``
    stops with "HydraConfig was not set" unless ``paths.log_dir`` is given explicitly.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
