"""Frozen teacher vision encoders phi for VaLR's alignment loss (arXiv 2602.04476; the paper uses DINOv3).

Two sources, chosen by config (``module.teacher``):

* :func:`synthetic_teacher` -- a small patch encoder pretrained *here* on the synthetic shape grids to
  predict every cell's colour and shape, then frozen. Its patch features therefore encode the attributes
  linearly, which the student's frozen random-init vision tower does not (the paper's premise: the teacher
  knows more than the MLLM's own vision path). Pretraining takes seconds and is memoised per process (and
  on disk with ``cache_dir``).
* :func:`hf_teacher` -- any local ``transformers`` vision backbone (DINOv2/v3, SigLIP, CLIP vision...) via
  ``AutoModel.from_pretrained``; patch tokens of ``last_hidden_state`` (prefix tokens dropped).

Both return a :class:`FrozenTeacher`: parameters with ``requires_grad=False``, kept in eval mode, called
under ``torch.no_grad()``; output ``[B, P, D]``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zoo.data.visual import VisualCounting

log = logging.getLogger("zoo")


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


def _normalize(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32) / 255.0).permute(0, 3, 1, 2)
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def pretrain_patch_encoder(
    task: VisualCounting,
    num_images: int = 4000,
    steps: int = 400,
    batch_size: int = 64,
    dim: int = 64,
    lr: float = 3e-3,
    seed: int = 1234,
    image_mean: Sequence[float] = (0.5, 0.5, 0.5),
    image_std: Sequence[float] = (0.5, 0.5, 0.5),
) -> tuple[PatchEncoder, float]:
    """Train a :class:`PatchEncoder` to classify each cell's colour (incl. empty) and shape.

    Returns:
        ``(encoder, held-out per-cell accuracy of colour and shape jointly)``.
    """
    rng = random.Random(seed)
    cells = np.stack([task.sample_cells(rng) for _ in range(num_images + 256)])
    from zoo.data.visual import draw_grid

    images = np.stack([draw_grid(c, task.grid, task.cell, task.colors, task.shapes) for c in cells])
    x = _normalize(images, image_mean, image_std)
    colour = torch.from_numpy(cells[..., 0] + 1)  # 0 = empty
    shape = torch.from_numpy(np.where(cells[..., 0] < 0, 0, cells[..., 1] + 1))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        enc = PatchEncoder(task.cell, dim, task.grid * task.cell)
        heads = nn.ModuleDict(
            {"colour": nn.Linear(dim, len(task.colors) + 1), "shape": nn.Linear(dim, len(task.shapes) + 1)}
        )
        opt = torch.optim.AdamW([*enc.parameters(), *heads.parameters()], lr=lr)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            idx = torch.randint(0, num_images, (batch_size,), generator=gen)
            feats = enc(x[idx])
            loss = nn.functional.cross_entropy(heads["colour"](feats).flatten(0, 1), colour[idx].flatten())
            loss = loss + nn.functional.cross_entropy(heads["shape"](feats).flatten(0, 1), shape[idx].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        held = slice(num_images, None)
        feats = enc(x[held])
        ok = (heads["colour"](feats).argmax(-1) == colour[held]) & (heads["shape"](feats).argmax(-1) == shape[held])
    return enc, float(ok.float().mean())


@functools.lru_cache(maxsize=8)
def _cached_encoder(key: str, cache_dir: str | None) -> tuple[PatchEncoder, float]:
    spec = json.loads(key)
    task = VisualCounting(**spec.pop("task"))
    path = (
        Path(cache_dir).expanduser() / "valr_teacher" / f"{hashlib.sha256(key.encode()).hexdigest()[:12]}.pt"
        if cache_dir
        else None
    )
    if path is not None and path.is_file():
        blob = torch.load(path, map_location="cpu", weights_only=True)
        enc = PatchEncoder(task.cell, spec["dim"], task.grid * task.cell)
        enc.load_state_dict(blob["state_dict"])
        return enc, float(blob["accuracy"])
    log.info("pretraining the synthetic VaLR teacher (%d steps)", spec["steps"])
    enc, acc = pretrain_patch_encoder(task, **spec)
    log.info("synthetic teacher: held-out cell accuracy %.3f", acc)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": enc.state_dict(), "accuracy": acc}, path)
    return enc, acc


def synthetic_teacher(
    grid: int = 4,
    cell: int = 8,
    colors: Sequence[str] = ("red", "green", "blue"),
    shapes: Sequence[str] = ("square", "circle", "cross"),
    fill_prob: float = 0.6,
    num_images: int = 4000,
    steps: int = 400,
    dim: int = 64,
    seed: int = 1234,
    image_mean: Sequence[float] = (0.5, 0.5, 0.5),
    image_std: Sequence[float] = (0.5, 0.5, 0.5),
    cache_dir: str | None = None,
) -> FrozenTeacher:
    """The frozen synthetic teacher (pretrained on first use; memoised per process, and on disk with ``cache_dir``)."""
    spec = {
        "task": {"grid": grid, "cell": cell, "colors": list(colors), "shapes": list(shapes), "fill_prob": fill_prob},
        "num_images": num_images,
        "steps": steps,
        "dim": dim,
        "seed": seed,
        "image_mean": list(image_mean),
        "image_std": list(image_std),
    }
    enc, acc = _cached_encoder(json.dumps(spec, sort_keys=True), cache_dir)
    clone = PatchEncoder(cell, dim, grid * cell)
    clone.load_state_dict(enc.state_dict())
    teacher = FrozenTeacher(clone, dim, grid * grid)
    teacher.pretrain_accuracy = acc
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


__all__ = ["FrozenTeacher", "PatchEncoder", "hf_teacher", "pretrain_patch_encoder", "synthetic_teacher"]
