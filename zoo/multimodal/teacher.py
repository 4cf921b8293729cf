"""Frozen teacher vision encoders phi for VaLR's alignment loss (arXiv 2602.04476; the paper uses DINOv3).

Two sources, chosen by config (``module.teacher``):

* the synthetic teacher -- a small :class:`PatchEncoder` pretrained *here* on the synthetic shape grids to predict
  every cell's colour and shape (:func:`cell_attribute_loss`), then frozen; its patch features encode the attributes
  linearly, one feature per cell. Whether that is *more* than the student sees (the paper's premise: the teacher
  knows more than the MLLM's own vision path) depends on the student: the tiny VLM's frozen random CLIP tower at full
  resolution also lets a linear probe read every cell, so there the teacher adds no visual information; pooled to a
  few image tokens (``backbone.image_pool``) it does not. :class:`zoo.callbacks.VisionFeatureProbe` measures both
  sides (held-out cell-colour probes) instead of assuming either. Its pretraining is the method
  ``+method=valr_teacher``
  (:mod:`zoo.modules.valr_teacher`), built once through the artifact cache by
  :func:`zoo.modules.valr_teacher.synthetic_teacher` and loaded with :func:`load_teacher`.
* :func:`hf_teacher` -- any local ``transformers`` vision backbone (DINOv2/v3, SigLIP, CLIP vision...) via
  ``AutoModel.from_pretrained``; patch tokens of ``last_hidden_state`` (prefix tokens dropped).

Both return a :class:`FrozenTeacher`: parameters with ``requires_grad=False``, kept in eval mode, called
under ``torch.no_grad()``; output ``[B, P, D]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from zoo.errors import CheckpointNotFoundError

TEACHER_WEIGHTS = "teacher.safetensors"
TEACHER_META = "teacher.json"


class FrozenTeacher(nn.Module):
    """Wrap an encoder ``pixel_values [B, 3, H, W] -> [B, P, D]``: frozen, always eval, no autograd."""

    def __init__(self, encoder: nn.Module, feature_dim: int, num_patches: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.feature_dim = feature_dim
        self.num_patches = num_patches
        for p in self.encoder.parameters():
            p.requires_grad_(False)
        self.encoder.eval()

    def train(self, mode: bool = True) -> FrozenTeacher:
        return super().train(False)

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.encoder(pixel_values)


class PatchEncoder(nn.Module):
    """Per-patch MLP over non-overlapping ``patch x patch`` cells plus one self-attention mixing layer.

    ``[B, 3, H, W] -> [B, (H/patch)*(W/patch), dim]``.
    """

    def __init__(self, patch: int = 8, dim: int = 64, image_size: int = 32) -> None:
        super().__init__()
        self.patch = patch
        self.mlp = nn.Sequential(nn.Linear(3 * patch * patch, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.pos = nn.Parameter(torch.zeros((image_size // patch) ** 2, dim))
        self.mix = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim, batch_first=True, dropout=0.0)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        b, c, _, _ = pixel_values.shape
        p = self.patch
        x = pixel_values.unfold(2, p, p).unfold(3, p, p)  # [B, C, gh, gw, p, p]
        x = x.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
        return self.mix(self.mlp(x) + self.pos)


def cell_targets(cells: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cell class targets of a shape grid.

    Args:
        cells: ``[B, P, 2]`` colour index and shape index per cell, ``-1`` for an empty cell
            (the ``cells`` column of :class:`zoo.data.visual.VisualCounting` rows).

    Returns:
        ``(colour [B, P], shape [B, P])`` long tensors with class 0 = empty and ``index + 1`` otherwise.
    """
    empty = cells[..., 0] < 0
    colour = torch.where(empty, 0, cells[..., 0] + 1)
    shape = torch.where(empty, 0, cells[..., 1] + 1)
    return colour.long(), shape.long()


class CellAttributeHeads(nn.Module):
    """Linear colour and shape classifiers on patch features: ``[B, P, D] -> ([B, P, C+1], [B, P, S+1])``."""

    def __init__(self, dim: int, num_colors: int, num_shapes: int) -> None:
        super().__init__()
        self.colour = nn.Linear(dim, num_colors + 1)
        self.shape = nn.Linear(dim, num_shapes + 1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.colour(features), self.shape(features)


def cell_attribute_loss(
    features: torch.Tensor, heads: CellAttributeHeads, cells: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Pretraining objective of the synthetic teacher: ``CE(colour) + CE(shape)`` over all cells (empty = class 0).

    Args:
        features: ``[B, P, D]`` patch features (one patch per grid cell).
        heads: the colour/shape classifiers.
        cells: ``[B, P, 2]`` (see :func:`cell_targets`).

    Returns:
        ``loss``, ``colour_accuracy``, ``shape_accuracy`` and ``cell_accuracy`` (colour and shape both right).
    """
    colour, shape = cell_targets(cells)
    colour_logits, shape_logits = heads(features)
    loss = nn.functional.cross_entropy(colour_logits.flatten(0, 1), colour.flatten()) + nn.functional.cross_entropy(
        shape_logits.flatten(0, 1), shape.flatten()
    )
    colour_ok = colour_logits.argmax(-1) == colour
    shape_ok = shape_logits.argmax(-1) == shape
    return {
        "loss": loss,
        "colour_accuracy": colour_ok.float().mean(),
        "shape_accuracy": shape_ok.float().mean(),
        "cell_accuracy": (colour_ok & shape_ok).float().mean(),
    }


def save_teacher(encoder: PatchEncoder, directory: str | Path, kwargs: dict[str, Any], **meta: Any) -> Path:
    """Write ``teacher.safetensors`` and ``teacher.json`` (``{"encoder": PatchEncoder kwargs, ...meta}``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items()}, str(directory / TEACHER_WEIGHTS)
    )
    (directory / TEACHER_META).write_text(json.dumps({"encoder": dict(kwargs), **meta}, indent=2, default=str))
    return directory


def load_teacher(directory: str | Path) -> FrozenTeacher:
    """The frozen teacher written by :func:`save_teacher`; ``pretrain_accuracy`` holds its held-out cell accuracy."""
    directory = Path(directory)
    if not (directory / TEACHER_WEIGHTS).is_file():
        raise CheckpointNotFoundError(f"no pretrained teacher at {directory / TEACHER_WEIGHTS}")
    meta = json.loads((directory / TEACHER_META).read_text())
    kwargs = meta["encoder"]
    encoder = PatchEncoder(**kwargs)
    encoder.load_state_dict(load_file(str(directory / TEACHER_WEIGHTS)))
    grid = kwargs["image_size"] // kwargs["patch"]
    teacher = FrozenTeacher(encoder, kwargs["dim"], grid * grid)
    teacher.pretrain_accuracy = meta.get("accuracy")
    return teacher


class _HFPatches(nn.Module):
    def __init__(self, model: nn.Module, num_prefix_tokens: int) -> None:
        super().__init__()
        self.model = model
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.model(pixel_values=pixel_values).last_hidden_state
        return hidden[:, self.num_prefix_tokens :]


def hf_teacher(name_or_path: str, num_prefix_tokens: int | None = None, local_files_only: bool = True) -> FrozenTeacher:
    """A frozen ``transformers`` vision encoder (DINOv2/DINOv3/SigLIP/CLIP vision) from a local directory.

    Args:
        name_or_path: directory written by ``save_pretrained`` (or a hub id with ``local_files_only=False``).
        num_prefix_tokens: tokens before the patches in ``last_hidden_state`` (CLS + registers); ``None``
            infers ``1 + num_register_tokens`` for ViT/DINO-like configs and ``0`` for SigLIP.
    """
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(name_or_path, local_files_only=local_files_only)
    model = AutoModel.from_pretrained(name_or_path, local_files_only=local_files_only)
    if hasattr(model, "vision_model") and not hasattr(model, "embeddings"):
        model = model.vision_model
        config = getattr(config, "vision_config", config)
    if num_prefix_tokens is None:
        siglip = "siglip" in str(getattr(config, "model_type", ""))
        num_prefix_tokens = 0 if siglip else 1 + int(getattr(config, "num_register_tokens", 0) or 0)
    patches = (int(config.image_size) // int(config.patch_size)) ** 2
    return FrozenTeacher(_HFPatches(model, num_prefix_tokens), int(config.hidden_size), patches)


__all__ = [
    "CellAttributeHeads",
    "FrozenTeacher",
    "PatchEncoder",
    "cell_attribute_loss",
    "cell_targets",
    "hf_teacher",
    "load_teacher",
    "save_teacher",
]
