"""Textual-optimization family: TextResNet and TextGrad on the app (logging, checkpoints, multirun, catalogue).

A thin adapter over :mod:`zoo.textopt` (no tensors, ``automatic_optimization=False``): each ``training_step`` runs one
textual optimization step on the minibatch of example indices the datamodule yields (:class:`zoo.textopt.Tracker`),
``validation_step`` measures the test accuracy of the current instructions. Logged: ``train/accuracy`` (minibatch,
before the update), ``train/updates``, ``train/hits`` (updates of a faulty component; simulator only),
``train/faulty``, ``train/proxy_calls`` and ``train/proxy_tokens`` (cumulative backward + projector + optimizer),
``val/accuracy``. Written to ``output_dir``: ``textopt_history.jsonl`` (one row per step) and, after fit,
``textopt_summary.json`` (:meth:`zoo.textopt.Tracker.summary`). Checkpoints hold the instructions, the densities and
the history (``checkpoint["textopt"]``); ``export_pretrained`` writes ``instructions.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from zoo.agents.backends.base import Backend
from zoo.agents.backends.hf_local import backbone_llm
from zoo.textopt.problem import ChainProblem
from zoo.textopt.run import Tracker, evaluate, make_optimizer

LOGGED = {"accuracy": "accuracy", "updates": "updates", "hits": "hits", "faulty": "faulty"}


class TextOptModule(pl.LightningModule):
    """Optimize the instructions of a chain problem with a textual optimizer.

    Args:
        problem: a :class:`~zoo.textopt.problem.ChainProblem` (``DeepChainSim``, ``QAChain``).
        optimizer: ``textresnet`` | ``textgrad``.
        backend: the model of every call; ``None`` uses the problem's own (the simulator's scripted roles).
        options: keyword arguments of the optimizer (TextResNet: ``budget``, ``decay``, ``projector``, ...).
        seed: forwarded to every model call.
        output_dir: where the history and the summary go (``None``: not written).
        backbone, quantizer: the run's composed backbone and quantizer (``train.py`` passes them when ``backbone``
            is not ``none``): the model of every call, in process (:func:`zoo.agents.backbone_llm`).
    """

    def __init__(
        self,
        problem: ChainProblem,
        optimizer: str = "textresnet",
        backend: Backend | None = None,
        options: dict[str, Any] | None = None,
        seed: int = 0,
        output_dir: str | None = None,
        backbone: Any = None,
        quantizer: Any = None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.problem = problem
        backend = backbone_llm(backend, backbone, quantizer)
        self.method = make_optimizer(optimizer, problem, backend, seed, **(options or {}))
        self.tracker = Tracker(self.method)
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.run_config: dict[str, Any] | None = None

    def configure_optimizers(self) -> None:
        return None

    def on_fit_start(self) -> None:
        if self.output_dir is not None and self.trainer.is_global_zero:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "textopt_history.jsonl").write_text(
                "".join(json.dumps(row) + "\n" for row in self.tracker.history)
            )

    def training_step(self, batch: list[int], batch_idx: int) -> None:
        row = self.tracker.step(self.problem.train_examples([int(i) for i in batch]))
        values = {f"train/{name}": row[key] for name, key in LOGGED.items() if row.get(key) is not None}
        summary = self.tracker.summary()
        values["train/proxy_calls"] = summary["token_proxy_calls"]
        values["train/proxy_tokens"] = summary["token_proxy_tokens"]
        self.log_dict({k: float(v) for k, v in values.items()}, on_step=True, on_epoch=False, batch_size=len(batch))
        if self.output_dir is not None and self.trainer.is_global_zero:
            with (self.output_dir / "textopt_history.jsonl").open("a") as handle:
                handle.write(json.dumps(row) + "\n")

    def validation_step(self, batch: list[int], batch_idx: int) -> float:
        accuracy = evaluate(self.method, self.problem.test_examples())
        self.log("val/accuracy", accuracy, on_step=False, on_epoch=True, batch_size=1)
        return accuracy

    def on_fit_end(self) -> None:
        if self.output_dir is None or not self.trainer.is_global_zero:
            return
        summary = self.tracker.summary(evaluate(self.method, self.problem.test_examples()))
        (self.output_dir / "textopt_summary.json").write_text(json.dumps(summary, indent=2))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["textopt"] = {
            "state": self.method.state(),
            "history": self.tracker.history,
            "converged_at": self.tracker.converged_at,
            "calls": {"calls": dict(self.method.log.calls), "tokens": dict(self.method.log.tokens)},
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("textopt")
        if saved is None:
            return
        self.method.load_state(saved["state"])
        self.tracker.history = list(saved["history"])
        self.tracker.converged_at = saved["converged_at"]
        self.method.log.calls.update(saved["calls"]["calls"])
        self.method.log.tokens.update(saved["calls"]["tokens"])

    def export_pretrained(self, path: str | Path) -> Path:
        """The optimized instructions as ``<path>/instructions.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "instructions.json").write_text(json.dumps(self.method.instructions(), indent=2))
        return path
