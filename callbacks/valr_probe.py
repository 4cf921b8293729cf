"""Probes of a VaLR model (arXiv 2602.04476): ``StepStateProbe`` and ``VisionFeatureProbe``.

``StepStateProbe``: what the states before each reasoning step encode. For every evaluated row and every reasoning
step ``i``, the callback takes the hidden state of one layer just before
step ``i`` under teacher forcing -- in the latent stage the mean of the ``K`` latent states of the step's segment
(:func:`zoo.multimodal.valr.latent_forward`), in the CoT stage the state of the position before the step's first
token -- and a per-step target (default: the number of cells of the queried colour in the grid row that step looks
up, ``task=visual_counting``). At the end of the epoch a linear probe (:class:`zoo.interp.probes.LinearProbe`) is
fitted on the first half of the collected steps and scored on the second half: ``<prefix>/step_accuracy``, next to
``<prefix>/step_majority`` (the most frequent target of the scored half); the same probe scored on the second half's
steps at place ``late`` or later of their chain gives ``<prefix>/step_accuracy_late`` and
``<prefix>/step_majority_late`` (does the state still know the image late in a long chain?).

``VisionFeatureProbe`` asks whether the frozen teacher knows more about the image than the student's own vision path
(the premise of VaLR's alignment): linear probes of every grid cell's colour (empty = class 0), fitted on the first
half of the evaluated images and scored on the second, from (a) the student's image tokens as the LLM receives them
(vision tower -> pooling -> projector, flattened) and (b) the teacher's patch features (flattened):
``<prefix>/student_cell_accuracy``, ``<prefix>/teacher_cell_accuracy`` and ``<prefix>/cell_majority``.

Both need a :class:`zoo.modules.valr.VaLRModule`-like module (``stage``, ``model``, ``latent_batch``,
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


def cell_colour_classes(batch: dict[str, Any]) -> torch.Tensor:
    """``[B, P]`` colour class of every grid cell of the batch's images: 0 = empty, ``1 + colour index`` otherwise."""
    cells = torch.stack([torch.as_tensor(c) for c in batch["meta"]["cells"]])
    return (cells[..., 0] + 1).long()


def fit_cell_probes(features: torch.Tensor, classes: torch.Tensor, num_classes: int, l2: float = 1e-2) -> float:
    """Mean held-out accuracy of one linear probe per cell: ``features [N, F] -> classes[:, p]``.

    Each probe (:class:`~zoo.interp.probes.LinearProbe`) is fitted on the first half of the rows and scored on the
    second; a cell whose training half holds one class predicts that class.
    """
    half = features.shape[0] // 2
    scores = []
    for p in range(classes.shape[1]):
        train, held = classes[:half, p], classes[half:, p]
        if train.unique().numel() < 2:
            scores.append(float((held == train[0]).float().mean()))
            continue
        probe = LinearProbe(num_classes=num_classes, l2=l2).fit(features[:half], train)
        scores.append(probe.accuracy(features[half:], held))
    return sum(scores) / len(scores)


class VisionFeatureProbe(EvaluationCallback):
    """Cell-colour probes of the student's image tokens vs the frozen teacher's patch features (module docstring).

    Args:
        teacher: a frozen encoder ``pixel_values [B, 3, H, W] -> [B, P, D]`` or a zero-argument factory of one (the
            node of ``module.teacher``, e.g. the synthetic teacher from the artifact cache); ``None`` uses the
            module's teacher when it has one, else only the student is probed.
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
        max_batches: probe at most this many batches per epoch.
        l2: the probes' L2 penalty.
    """

    def __init__(
        self,
        teacher: Any = None,
        stages: Sequence[str] = ("validate", "test"),
        prefix: str = "vision_probe",
        max_batches: int | None = None,
        l2: float = 1e-2,
    ) -> None:
        super().__init__(stages, max_batches, allowed=STAGES)
        self._teacher_spec = teacher
        self.teacher: torch.nn.Module | None = None
        self.prefix = prefix
        self.l2 = l2
        self._data: dict[str, list[torch.Tensor]] = {}
        self.last: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        model = getattr(pl_module, "model", None)
        if model is None and not hasattr(pl_module, "configure_model"):
            raise ConfigError(f"VisionFeatureProbe needs a VLM module; {type(pl_module).__name__} has no model")
        spec = self._teacher_spec
        if self.teacher is None and spec is not None:
            self.teacher = spec if isinstance(spec, torch.nn.Module) else spec()
            self.teacher.requires_grad_(False)
            self.teacher.eval()

    def _teacher(self, pl_module: Any) -> torch.nn.Module | None:
        return self.teacher if self.teacher is not None else getattr(pl_module, "teacher", None)

    @torch.no_grad()
    def features(self, pl_module: Any, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"student": [B, T*H], "teacher": [B, P*D]}`` (``teacher`` only when there is one)."""
        images = pl_module.model.get_image_features(pixel_values=pixel_values, return_dict=True).pooler_output
        out = {"student": torch.stack([f.reshape(-1) for f in images]).float().cpu()}
        teacher = self._teacher(pl_module)
        if teacher is not None:
            teacher.to(pixel_values.device)
            out["teacher"] = teacher(pixel_values).flatten(1).float().cpu()
        return out

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._data = {}

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if batch["pixel_values"].shape[0] != len(batch["meta"]["cells"]):
            raise ConfigError("VisionFeatureProbe needs one image per row (task=visual_counting)")
        for name, value in {
            **self.features(pl_module, batch["pixel_values"]),
            "cells": cell_colour_classes(batch),
        }.items():
            self._data.setdefault(name, []).append(value)

    def measure(self) -> dict[str, float]:
        """Held-out cell-colour accuracy per feature set and the majority rate (empty with < 8 images)."""
        if not self._data or sum(len(c) for c in self._data["cells"]) < 8:
            return {}
        with torch.inference_mode(False):
            classes = torch.cat(self._data["cells"]).clone()
            num_classes = max(int(classes.max()) + 1, 2)
            held = classes[classes.shape[0] // 2 :]
            out = {"cell_majority": sum(majority_rate(held[:, p]) for p in range(held.shape[1])) / held.shape[1]}
            for name in ("student", "teacher"):
                if name in self._data:
                    x = torch.cat(self._data[name]).clone()
                    out[f"{name}_cell_accuracy"] = fit_cell_probes(x, classes, num_classes, self.l2)
        return out

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last = self.measure()
        for name, value in self.last.items():
            pl_module.log(f"{self.prefix}/{name}", value, batch_size=1)
        self._data = {}


class StepStateProbe(EvaluationCallback):
    """Linear probe of a per-step target from the states just before each reasoning step.

    Args:
        layer: ``hidden_states`` index (0 = embeddings), or ``align`` for the module's alignment layer.
        targets: ``(batch, row) -> [target per step]`` (default :func:`row_colour_counts`).
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
        max_batches: probe at most this many batches per epoch.
        late: the first place in a chain (1 = the first step) that the ``_late`` metrics score.
    """

    def __init__(
        self,
        layer: int | str = "align",
        targets: StepTargets = row_colour_counts,
        stages: Sequence[str] = ("validate", "test"),
        prefix: str = "probe",
        max_batches: int | None = None,
        late: int = 3,
    ) -> None:
        super().__init__(stages, max_batches, allowed=STAGES)
        if layer != "align" and (not isinstance(layer, int) or layer < 0):
            raise ConfigError(f"StepStateProbe: layer must be 'align' or an int >= 0, got {layer!r}")
        if isinstance(late, bool) or not isinstance(late, int) or late < 1:
            raise ConfigError(f"StepStateProbe: late must be a place in the chain >= 1, got {late!r}")
        self.layer = layer
        self.targets = targets
        self.prefix = prefix
        self.late = late
        self._x: list[torch.Tensor] = []
        self._y: list[int] = []
        self._place: list[int] = []
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
        self._x, self._y, self._place = [], [], []

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        for r, states in enumerate(self.step_states(pl_module, batch)):
            targets = self.targets(batch, r)
            if len(targets) != states.shape[0]:
                raise ConfigError(f"StepStateProbe: {len(targets)} targets for {states.shape[0]} steps (row {r})")
            self._x.extend(states)
            self._y.extend(int(t) for t in targets)
            self._place.extend(range(1, len(targets) + 1))

    def measure(self) -> dict[str, float]:
        """Probe accuracy (second half) and majority rate of what was collected (empty with < 4 steps), and both over
        the second half's steps at place :attr:`late` or later (when it has any)."""
        if len(self._y) < 4:
            return {}
        # the states were collected under the evaluation loop's inference mode: fit on plain copies with autograd on
        with torch.inference_mode(False), torch.enable_grad():
            x, y = torch.stack(self._x).clone(), torch.tensor(self._y)
            half = len(y) // 2
            held = y[half:]
            probe = LinearProbe(num_classes=int(y.max()) + 1, l2=1e-2).fit(x[:half], y[:half])
            out = {"step_accuracy": probe.accuracy(x[half:], held), "step_majority": majority_rate(held)}
            late = torch.tensor(self._place[half:]) >= self.late
            if late.any():
                out["step_accuracy_late"] = probe.accuracy(x[half:][late], held[late])
                out["step_majority_late"] = majority_rate(held[late])
            return out

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last = self.measure()
        for name, value in self.last.items():
            pl_module.log(f"{self.prefix}/{name}", value, batch_size=1)
        self._x, self._y, self._place = [], [], []


def majority_rate(labels: torch.Tensor) -> float:
    """Share of the most frequent label."""
    return float(torch.bincount(labels).max()) / len(labels)


__all__ = ["StepStateProbe", "VisionFeatureProbe", "cell_colour_classes", "fit_cell_probes", "row_colour_counts"]
