"""Pretraining of VaLR's synthetic frozen teacher (``+method=valr_teacher``) and the cached teacher it builds.

Paper: "Vision-aligned Latent Reasoning" (VaLR), arXiv 2602.04476: the latent states are aligned to a frozen
vision encoder phi that knows more about the image than the MLLM's own vision path (the paper uses DINOv3). With no
pretrained encoder available offline, the synthetic teacher is a small patch encoder trained here, on the shape grids
of ``task=visual_counting``, to classify every cell's colour and shape; frozen, its patch features expose those
attributes linearly. It knows more than the student only when the student's vision path is weaker (e.g. pooled to a
few tokens with ``backbone.image_pool``); :class:`zoo.callbacks.VisionFeatureProbe` measures whether it does.
[reconstruction: a stand-in for DINOv3 at toy scale, not part of the paper]

Equation -> function:

- phi: patch MLP + one self-attention layer, ``[B, 3, H, W] -> [B, P, D]``
  -> :class:`zoo.multimodal.teacher.PatchEncoder`
- pretraining objective ``CE(colour) + CE(shape)`` over the cells -> :func:`zoo.multimodal.teacher.cell_attribute_loss`
- the training loop -> :class:`VaLRTeacherModule` run by ``train.py``
- the frozen teacher of ``+method=valr`` (built through the artifact cache on first use) -> :func:`synthetic_teacher`
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.artifacts import Plan, Prerequisite, prerequisite
from zoo.errors import ConfigError, DataError
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooBaseModule
from zoo.multimodal.teacher import (
    CellAttributeHeads,
    PatchEncoder,
    cell_attribute_loss,
    load_teacher,
    save_teacher,
)


class VaLRTeacherModule(ZooBaseModule):
    """``+method=valr_teacher``: train a :class:`~zoo.multimodal.teacher.PatchEncoder` to classify every grid cell.

    Batches are those of :class:`zoo.datamodules.visual.VisualReasoningDataModule` (one image per row;
    ``pixel_values`` ``[B, 3, H, W]`` and the ``cells`` column in ``meta``). Logs ``{train,val}/loss`` and
    ``{train,val}/{colour,shape,cell}_accuracy``. The export is ``teacher.safetensors`` + ``teacher.json``
    (:func:`zoo.multimodal.teacher.load_teacher`), with the last validation cell accuracy.

    Args:
        grid, cell: cells per image side and pixels per cell side (one patch per cell).
        colors, shapes: the task's attribute vocabularies (their sizes set the heads).
        dim: feature width D of the teacher.
        seed: initialisation seed.
        optimizer, scheduler: partials as in the other family modules.
        backbone, quantizer: accepted and ignored (``train.py`` passes them to every module).
    """

    def __init__(
        self,
        grid: int = 4,
        cell: int = 8,
        colors: Sequence[str] = ("red", "green", "blue"),
        shapes: Sequence[str] = ("square", "circle", "cross"),
        dim: int = 64,
        seed: int = 0,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        backbone: Any = None,
        quantizer: Any = None,
    ) -> None:
        super().__init__(optimizer, scheduler)
        if grid < 1 or cell < 1 or dim < 1 or dim % 4:
            raise ConfigError(
                f"module.grid, cell and dim must be positive (dim a multiple of 4), got {grid}, {cell}, {dim}"
            )
        self.encoder_kwargs = {"patch": cell, "dim": dim, "image_size": grid * cell}
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler"])
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.encoder = PatchEncoder(**self.encoder_kwargs)
            self.heads = CellAttributeHeads(dim, len(colors), len(shapes))

    def _cells(self, batch: dict[str, Any]) -> Tensor:
        cells = batch.get("meta", {}).get("cells")
        pixels = batch.get("pixel_values")
        if cells is None or pixels is None or len(cells) != pixels.shape[0]:
            raise DataError(
                "valr_teacher batches need one image per row and the rows' 'cells' column (datamodule=visual_reasoning "
                "on task=visual_counting)"
            )
        return torch.as_tensor(np.stack([np.asarray(c) for c in cells]), device=pixels.device)

    def _step(self, batch: dict[str, Any], split: str) -> Tensor:
        out = cell_attribute_loss(self.encoder(batch["pixel_values"]), self.heads, self._cells(batch))
        self.check_finite(out["loss"])
        size = batch["pixel_values"].shape[0]
        for name, value in out.items():
            self.log(f"{split}/{name}", value, prog_bar=name in ("loss", "cell_accuracy"), batch_size=size)
        return out["loss"]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._step(batch, "val")

    def export_pretrained(self, directory: str | Path) -> Path:
        """Write the patch encoder (safetensors), its kwargs and the last validation cell accuracy."""
        accuracy = None
        if self._trainer is not None and "val/cell_accuracy" in self.trainer.callback_metrics:
            accuracy = float(self.trainer.callback_metrics["val/cell_accuracy"])
        return save_teacher(self.encoder, directory, self.encoder_kwargs, accuracy=accuracy)


@prerequisite
def synthetic_teacher(
    grid: int = 4,
    cell: int = 8,
    colors: Sequence[str] = ("red", "green", "blue"),
    shapes: Sequence[str] = ("square", "circle", "cross"),
    fill_prob: float = 0.6,
    num_images: int = 4000,
    steps: int = 400,
    batch_size: int = 64,
    dim: int = 64,
    seed: int = 1234,
    image_mean: Sequence[float] = (0.5, 0.5, 0.5),
    image_std: Sequence[float] = (0.5, 0.5, 0.5),
    cache_dir: str | Path | None = None,
) -> Plan:
    """The frozen synthetic teacher: the export of a ``+method=valr_teacher`` run, built by the CLI through the
    artifact cache before the job (a prerequisite plan); the plan returns the config node that loads it
    (:func:`zoo.multimodal.teacher.load_teacher` on the export directory).

    Args:
        grid, cell, colors, shapes, fill_prob: the shape grids (``task.*`` of the run; match the VaLR task's).
        num_images: training images (``datamodule.source.num_train``; at least ``batch_size``).
        steps: optimizer steps (``trainer.max_steps``).
        batch_size: images per step (``datamodule.batch_size``).
        dim: feature width D (``module.dim``).
        seed: the run's seed (data and initialisation).
        image_mean, image_std: pixel normalisation (``datamodule.image_mean/std``; match the student's).
        cache_dir: artifact cache root (default ``$ZOO_CACHE_DIR`` or ``./.zoo_cache``).
    """
    if num_images < batch_size:
        raise ConfigError(
            f"module.teacher.num_images={num_images} is smaller than the teacher's batch size {batch_size}: an epoch "
            "would have no full batch (raise num_images or set +module.teacher.batch_size)"
        )
    values = {
        "task.grid": grid,
        "task.cell": cell,
        "task.colors": list(colors),
        "task.shapes": list(shapes),
        "task.fill_prob": fill_prob,
        "datamodule.source.num_train": num_images,
        "datamodule.batch_size": batch_size,
        "datamodule.image_size": grid * cell,
        "datamodule.image_mean": list(image_mean),
        "datamodule.image_std": list(image_std),
        "trainer.max_steps": steps,
        "module.dim": dim,
        "seed": seed,
    }
    directory = yield Prerequisite(
        "valr_teacher",
        ("+method=valr_teacher",),
        values,
        name=f"patch{dim}",
        reason=f"module.teacher asks for the synthetic VaLR teacher ({steps} steps of +method=valr_teacher)",
        cache_dir=cache_dir,
    )
    return {"_target_": f"{load_teacher.__module__}.load_teacher", "directory": str(Path(directory) / "export")}


__all__ = ["VaLRTeacherModule", "synthetic_teacher"]
