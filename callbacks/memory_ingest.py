"""``MemoryIngestCallback``: feed each finished episode of the episode runner to an EvolveLab memory provider.

For agents run inside :class:`zoo.modules.EpisodeModule` (``stage=test`` or ``predict``): after every batch, each
trajectory of the batch goes to ``provider.take_in_memory`` (MemEvolve's inner loop: tasks run in order and the
memory learns from each before the next; use ``datamodule.batch_size=1``). The provider is the one given, or, by
default, the ``memory`` the agent factory was built with (``agent.memory=${memory}``; the scripted memory agent
or ``agent=llm``, whose factory a run with a backbone wraps once more), so the agent reads the same
store the callback writes. The ingestion outcome of every episode is appended to ``<output>/memory_ingest.jsonl``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from zoo.agents.memory_interface import MemoryProvider, trajectory_data
from zoo.errors import ConfigError


class MemoryIngestCallback(pl.Callback):
    """Args:
    memory: the provider (``None``: the agent factory's ``memory`` keyword).
    log_file: JSONL of ``{"episode", "ok", "stored"}`` per episode (``None``: not written).
    """

    def __init__(self, memory: MemoryProvider | None = None, log_file: str | None = None) -> None:
        self.memory = memory
        self.log_file = Path(log_file) if log_file else None

    def provider(self, pl_module: pl.LightningModule) -> MemoryProvider:
        if self.memory is not None:
            return self.memory
        factory, memory = getattr(pl_module, "make_agent", None), None
        while memory is None and isinstance(factory, functools.partial):  # the backbone's partial wraps Hydra's
            memory, factory = factory.keywords.get("memory"), factory.func
        if not isinstance(memory, MemoryProvider):
            raise ConfigError(
                "MemoryIngestCallback found no memory provider: give callbacks.memory_ingest.memory, or an agent "
                "with a memory (agent=procworld_memory agent.memory=${memory})"
            )
        return memory

    def _ingest(self, pl_module: pl.LightningModule) -> None:
        memory = self.provider(pl_module)
        rows = []
        for trajectory in getattr(pl_module, "last_trajectories", []):
            ok, stored = memory.take_in_memory(trajectory_data(trajectory))
            rows.append({"episode": trajectory.episode, "ok": ok, "stored": stored})
        if self.log_file is not None and rows:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with self.log_file.open("a") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in rows)

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any) -> None:
        self._ingest(pl_module)

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        self._ingest(pl_module)
