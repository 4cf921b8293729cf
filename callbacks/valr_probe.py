"""``StepStateProbe``: what a VaLR model's states before each reasoning step encode (VaLR, arXiv 2602.04476).

For every evaluated row and every reasoning step ``i``, the callback takes the hidden state of one layer just before
step ``i`` under teacher forcing -- in the latent stage the mean of the ``K`` latent states of the step's segment
(:func:`zoo.multimodal.valr.latent_forward`), in the CoT stage the state of the position before the step's first
token -- and a per-step target (default: the number of cells of the queried colour in the grid row that step looks
up, ``task=visual_counting``). At the end of the epoch a linear probe (:class:`zoo.interp.probes.LinearProbe`) is
fitted on the first half of the collected steps and scored on the second half: ``<prefix>/step_accuracy``, next to
``<prefix>/step_majority`` (the most frequent target of the scored half).

It needs a :class:`zoo.modules.valr.VaLRModule`-like module (``stage``, ``model``, ``latent_batch``,
``align_layer``) and batches of :class:`zoo.datamodules.visual.VisualReasoningDataModule`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import EvaluationCallback
from zoo.errors import ConfigError
from zoo.interp.probes import LinearProbe

STAGES = ("validate", "test")
StepTargets = Callable[[dict[str, Any], int], list[int]]


def row_colour_counts(batch: dict[str, Any], row: int) -> list[int]:
    """Per step of batch row ``row``: how many cells of the queried colour the looked-up grid row holds."""
    meta = batch["meta"]
    cells = torch.as_tensor(meta["cells"][row])
    grid = math.isqrt(cells.shape[0])
    colour = int(meta["query_color"][row])
    return [int((cells[r * grid : (r + 1) * grid, 0] == colour).sum()) for r in meta["query_rows"][row]]


class StepStateProbe(EvaluationCallback):
    """Linear probe of a per-step target from the states just before each reasoning step.

    Args:
        layer: ``hidden_states`` index (0 = embeddings), or ``align`` for the module's alignment layer.
        targets: ``(batch, row) -> [target per step]`` (default :func:`row_colour_counts`).
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
        max_batches: probe at most this many batches per epoch.
    """

    def __init__(
        self,
        layer: int | str = "align",
        targets: StepTargets = row_colour_counts,
        stages: Sequence[str] = ("validate", "test"),
        prefix: str = "probe",
        max_batches: int | None = None,
    ) -> None:
        super().__init__(stages, max_batches, allowed=STAGES)
        if layer != "align" and (not isinstance(layer, int) or layer < 0):
            raise ConfigError(f"StepStateProbe: layer must be 'align' or an int >= 0, got {layer!r}")
        self.layer = layer
        self.targets = targets
        self.prefix = prefix
        self._x: list[torch.Tensor] = []
        self._y: list[int] = []
        self.last: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        missing = [n for n in ("stage", "model", "latent_batch") if not hasattr(pl_module, n)]
        if missing:
            raise ConfigError(f"StepStateProbe needs a VaLR module; {type(pl_module).__name__} lacks {missing}")

    def _layer(self, pl_module: Any) -> int:
        return int(pl_module.align_layer) if self.layer == "align" else int(self.layer)

    @torch.no_grad()
    def step_states(self, pl_module: Any, batch: dict[str, Any]) -> list[torch.Tensor]:
        """Per batch row, ``[num_steps, H]``: the states just before each step (see the module docstring)."""
        from zoo.multimodal.valr import latent_forward

        layer = self._layer(pl_module)
        if pl_module.stage == "latent":
            lb = pl_module.latent_batch(batch)
            out = latent_forward(pl_module.model, lb, batch["pixel_values"], layer, feedback=pl_module.feedback)
            states = out.latent_states.mean(2)  # [B, N, H]
            return [states[r, : len(seg["steps"])].float().cpu() for r, seg in enumerate(batch["segments"])]
        hidden = pl_module.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            output_hidden_states=True,
        ).hidden_states[layer]
        rows = []
        for r, seg in enumerate(batch["segments"]):
            offset, positions = len(seg["prompt"]) + len(seg["head"]), []
            for step in seg["steps"]:
                positions.append(offset - 1)
                offset += len(step)
            rows.append(hidden[r, positions].float().cpu())
        return rows

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._x, self._y = [], []

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        for r, states in enumerate(self.step_states(pl_module, batch)):
            targets = self.targets(batch, r)
            if len(targets) != states.shape[0]:
                raise ConfigError(f"StepStateProbe: {len(targets)} targets for {states.shape[0]} steps (row {r})")
            self._x.extend(states)
            self._y.extend(int(t) for t in targets)

    def measure(self) -> dict[str, float]:
        """Probe accuracy (second half) and majority rate of what was collected (empty with < 4 steps)."""
        if len(self._y) < 4:
            return {}
        # the states were collected under the evaluation loop's inference mode: fit on plain copies with autograd on
        with torch.inference_mode(False), torch.enable_grad():
            x, y = torch.stack(self._x).clone(), torch.tensor(self._y)
            half = len(y) // 2
            held = y[half:]
            majority = float(torch.bincount(held).max()) / len(held)
            probe = LinearProbe(num_classes=int(y.max()) + 1, l2=1e-2).fit(x[:half], y[:half])
            return {"step_accuracy": probe.accuracy(x[half:], held), "step_majority": majority}

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last = self.measure()
        for name, value in self.last.items():
            pl_module.log(f"{self.prefix}/{name}", value, batch_size=1)
        self._x, self._y = [], []


__all__ = ["StepStateProbe", "row_colour_counts"]
