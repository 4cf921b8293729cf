"""Structure encoder pretraining (``+method=structure_encoder_pretrain``) and the cache of pretrained encoders.

Paper: "Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning", arXiv 2602.02780, stage (1) of
training (notes 4(a)): the all-atom EGNN is pretrained by masked reconstruction -- element type of masked atoms,
distance bin (64 bins, 0-20 Å) of held-out edges, and coordinate-noise prediction, weights 1/1/1 -- before it is
frozen under the connector.

Equation -> function:

- masked type + distance-bin cross-entropy -> :func:`zoo.multimodal.structure_encoder.structure_pretraining_loss`
- coordinate-noise term ``|| x_out(x + sigma eps) - x ||^2 / (3 sigma^2)`` (EGNN's equivariant coordinate output
  denoises the input) -> :func:`coordinate_noise_loss`
- the sum with weights ``type/dist/coord`` -> :func:`pretraining_objective`

Cache: a pretrained encoder lives under ``<cache_dir>/structure_encoder/<key>/`` (``encoder.safetensors`` +
``encoder.json``), the key hashing the encoder architecture and the pretraining recipe (:func:`encoder_cache_dir`).
The Lightning method writes there at the end of ``fit``; :func:`ensure_pretrained_encoder` (used by the
structure-LM module on first use) trains one with a plain torch loop on the same recipe when none exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.multimodal.structure_encoder import StructureEncoder, StructurePretrainHeads, structure_pretraining_loss

log = logging.getLogger("zoo")

ENCODER_WEIGHTS = "encoder.safetensors"
ENCODER_META = "encoder.json"


@dataclass(frozen=True)
class PretrainRecipe:
    """Everything that determines a pretrained encoder besides its architecture (part of the cache key).

    Attributes:
        steps, batch_size, lr: optimisation (AdamW, constant lr, grad-clip 1).
        num_structures, min_atoms, max_atoms, seed: the synthetic training structures
            (:class:`zoo.data.structures.StructureQADataset` with ``seed``).
        atom_mask_prob, edge_mask_prob: masking rates of the reconstruction objective.
        coord_noise: standard deviation (Å) of the coordinate noise; 0 disables the term.
        type_weight, dist_weight, coord_weight: loss weights (paper 1/1/1).
        num_dist_bins, dist_max: distance bins (paper 64 bins over 0-20 Å).
    """

    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    num_structures: int = 1024
    min_atoms: int = 6
    max_atoms: int = 300
    seed: int = 0
    atom_mask_prob: float = 0.15
    edge_mask_prob: float = 0.15
    coord_noise: float = 0.3
    type_weight: float = 1.0
    dist_weight: float = 1.0
    coord_weight: float = 1.0
    num_dist_bins: int = 64
    dist_max: float = 20.0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.num_structures < 1 or self.lr <= 0:
            raise ConfigError(f"bad encoder pretraining recipe: {self}")
        if self.coord_noise < 0:
            raise ConfigError(f"coord_noise must be >= 0, got {self.coord_noise}")


def encoder_cache_dir(cache_dir: str | Path, encoder: dict[str, Any], recipe: PretrainRecipe | dict[str, Any]) -> Path:
    """``<cache_dir>/structure_encoder/<key>``, the key hashing the encoder kwargs and the recipe."""
    recipe = recipe if isinstance(recipe, PretrainRecipe) else PretrainRecipe(**recipe)
    enc = {**_encoder_defaults(), **dict(encoder)}
    blob = json.dumps({"encoder": enc, "recipe": asdict(recipe)}, sort_keys=True, default=str)
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return (
        Path(cache_dir).expanduser().resolve() / "structure_encoder" / f"egnn{enc['hidden']}x{enc['num_layers']}-{key}"
    )


def _encoder_defaults() -> dict[str, Any]:
    return {"num_types": 5, "hidden": 256, "num_layers": 8, "num_rbf": 32, "rbf_cutoff": 10.0, "update_coords": True}


def save_encoder(encoder: StructureEncoder, directory: str | Path, kwargs: dict[str, Any], **meta: Any) -> Path:
    """Write ``encoder.safetensors`` and ``encoder.json`` (``{"encoder": kwargs, ...meta}``) to ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items()}
    save_file(state, str(directory / ENCODER_WEIGHTS))
    meta_blob = {"encoder": {**_encoder_defaults(), **dict(kwargs)}, **meta}
    (directory / ENCODER_META).write_text(json.dumps(meta_blob, indent=2, default=str))
    return directory


def load_encoder(directory: str | Path, expected: dict[str, Any] | None = None) -> StructureEncoder:
    """Load an encoder written by :func:`save_encoder`; ``expected`` kwargs must match the saved ones."""
    directory = Path(directory)
    if not (directory / ENCODER_WEIGHTS).is_file():
        raise CheckpointNotFoundError(f"no pretrained structure encoder at {directory / ENCODER_WEIGHTS}")
    kwargs = json.loads((directory / ENCODER_META).read_text())["encoder"]
    if expected is not None:
        want = {**_encoder_defaults(), **dict(expected)}
        diff = {k: (kwargs.get(k), v) for k, v in want.items() if kwargs.get(k) != v}
        if diff:
            raise ConfigError(f"{directory}: saved encoder differs from module.encoder in {diff} (saved, wanted)")
    encoder = StructureEncoder(**kwargs)
    encoder.load_state_dict(load_file(str(directory / ENCODER_WEIGHTS)))
    return encoder


# ----------------------------------------------------------------------------------------------------------------
# objective
# ----------------------------------------------------------------------------------------------------------------


def coordinate_noise_loss(
    encoder: StructureEncoder,
    atom_types: Tensor,
    pos: Tensor,
    edge_index: Tensor,
    sigma: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Coordinate-noise prediction: ``mean_i ||x_out_i - x_i||^2 / (3 sigma^2)`` with inputs ``x + sigma eps``.

    The EGNN's coordinate output is E(3)-equivariant, so predicting the clean positions is a well-posed denoising
    target; the loss is ~1 when the encoder leaves the noisy positions unchanged.
    """
    noise = torch.randn(pos.shape, generator=generator, device=pos.device, dtype=pos.dtype) * sigma
    out = encoder(atom_types, pos + noise, edge_index)
    return (out.pos - pos).pow(2).sum(-1).mean() / (3 * sigma**2)


def pretraining_objective(
    encoder: StructureEncoder,
    heads: StructurePretrainHeads,
    atom_types: Tensor,
    pos: Tensor,
    edge_index: Tensor,
    recipe: PretrainRecipe,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Masked type + distance-bin loss plus the weighted coordinate-noise term; returns the loss dict."""
    out = structure_pretraining_loss(
        encoder,
        heads,
        atom_types,
        pos,
        edge_index,
        atom_mask_prob=recipe.atom_mask_prob,
        edge_mask_prob=recipe.edge_mask_prob,
        dist_max=recipe.dist_max,
        type_weight=recipe.type_weight,
        dist_weight=recipe.dist_weight,
        generator=generator,
    )
    if recipe.coord_noise > 0 and recipe.coord_weight > 0 and encoder.layers and encoder.layers[0].update_coords:
        coord = coordinate_noise_loss(encoder, atom_types, pos, edge_index, recipe.coord_noise, generator)
        out["coord_loss"] = coord
        out["loss"] = out["loss"] + recipe.coord_weight * coord
    return out


def pretrain_encoder(
    encoder_kwargs: dict[str, Any], recipe: PretrainRecipe
) -> tuple[StructureEncoder, dict[str, float]]:
    """Plain torch loop of the recipe (no Lightning): returns the trained encoder and its final metrics."""
    from zoo.data.structures import StructureTaskConfig, collate_structures, make_structure_samples

    with torch.random.fork_rng():
        torch.manual_seed(recipe.seed)
        encoder = StructureEncoder(**encoder_kwargs)
        heads = StructurePretrainHeads(encoder.hidden, encoder.num_types, recipe.num_dist_bins)
    task = StructureTaskConfig(min_atoms=recipe.min_atoms, max_atoms=recipe.max_atoms)
    samples = make_structure_samples(recipe.num_structures, recipe.seed, task)
    params = [*encoder.parameters(), *heads.parameters()]
    opt = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(recipe.seed)
    order = torch.randperm(len(samples), generator=gen).tolist()
    running: dict[str, float] = {}
    start = time.monotonic()
    for step in range(recipe.steps):
        idx = [order[(step * recipe.batch_size + j) % len(order)] for j in range(recipe.batch_size)]
        b = collate_structures([samples[i] for i in idx])
        out = pretraining_objective(encoder, heads, b.atom_types, b.pos, b.edge_index, recipe, gen)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for k, v in out.items():
            value = float(v.detach())
            running[k] = 0.9 * running.get(k, value) + 0.1 * value
        if (step + 1) % max(recipe.steps // 5, 1) == 0:
            log.info(
                "encoder pretraining step %d/%d: %s (%.0fs)",
                step + 1,
                recipe.steps,
                " ".join(f"{k}={v:.3f}" for k, v in running.items()),
                time.monotonic() - start,
            )
    return encoder.eval(), running


def ensure_pretrained_encoder(
    cache_dir: str | Path, encoder_kwargs: dict[str, Any], recipe: PretrainRecipe | dict[str, Any]
) -> Path:
    """Directory of the pretrained encoder for these kwargs + recipe, pretraining it first if not cached."""
    recipe = recipe if isinstance(recipe, PretrainRecipe) else PretrainRecipe(**recipe)
    target = encoder_cache_dir(cache_dir, encoder_kwargs, recipe)
    if (target / ENCODER_WEIGHTS).is_file():
        log.info("using the cached pretrained structure encoder at %s", target)
        return target
    log.info(
        "no cached pretrained structure encoder for this architecture and recipe: pretraining it now (first use; "
        "%d steps of %d structures, masked type + distance bins + coordinate noise), it will be cached at %s",
        recipe.steps,
        recipe.batch_size,
        target,
    )
    encoder, metrics = pretrain_encoder(dict(encoder_kwargs), recipe)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    save_encoder(encoder, tmp, encoder_kwargs, recipe=asdict(recipe), metrics=metrics, trained_by="bootstrap")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, target)
    log.info("pretrained structure encoder ready at %s", target)
    return target


# ----------------------------------------------------------------------------------------------------------------
# Lightning method
# ----------------------------------------------------------------------------------------------------------------


class StructureEncoderPretrainModule(pl.LightningModule):
    """``+method=structure_encoder_pretrain``: masked-atom / distance-bin / coordinate-noise pretraining of the EGNN.

    Batches are those of :class:`zoo.datamodules.structures.StructureDataModule` (only ``structures`` is used).
    At the end of a (non fast-dev-run) fit the encoder is saved with safetensors to :func:`encoder_cache_dir`
    ``(cache_dir, encoder, recipe)``, where the structure-LM module (``module.encoder_init: pretrained``) finds it
    when its ``encoder`` and ``encoder_pretrain`` recipe match.

    Args:
        encoder: :class:`~zoo.multimodal.structure_encoder.StructureEncoder` kwargs.
        recipe: :class:`PretrainRecipe` fields (the method file ties ``steps``/``batch_size``/data fields to the
            trainer and datamodule so the key describes the run).
        cache_dir: root of the cache (``paths.cache_dir``); ``None`` disables saving to the cache.
        backbone, quantizer: accepted and ignored (``train.py`` passes them to every module).
    """

    def __init__(
        self,
        encoder: dict[str, Any] | None = None,
        recipe: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        backbone: Any = None,
        quantizer: Any = None,
    ) -> None:
        super().__init__()
        self.encoder_kwargs = {**_encoder_defaults(), **dict(encoder or {})}
        self.recipe = PretrainRecipe(**dict(recipe or {}))
        self.cache_dir = cache_dir
        self.save_hyperparameters(ignore=["backbone", "quantizer"])
        torch.manual_seed(self.recipe.seed)
        self.encoder = StructureEncoder(**self.encoder_kwargs)
        self.heads = StructurePretrainHeads(self.encoder.hidden, self.encoder.num_types, self.recipe.num_dist_bins)
        self.run_config: dict[str, Any] | None = None
        self.saved_to: Path | None = None

    def _step(self, batch: dict[str, Any], split: str, generator: torch.Generator | None = None) -> Tensor:
        s = batch["structures"]
        out = pretraining_objective(self.encoder, self.heads, s.atom_types, s.pos, s.edge_index, self.recipe, generator)
        if not torch.isfinite(out["loss"].detach()):
            raise FloatingPointError(f"non-finite encoder pretraining loss at step {self.global_step}")
        for k, v in out.items():
            self.log(f"{split}/{k}", v, prog_bar=k == "loss", batch_size=s.num_graphs)
        return out["loss"]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        gen = torch.Generator(device=batch["structures"].pos.device).manual_seed(1000 + batch_idx)
        self._step(batch, "val", gen)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.recipe.lr, weight_decay=0.01)

    def export_pretrained(self, directory: str | Path) -> Path:
        """Write the encoder (safetensors) and its kwargs/recipe to ``directory``."""
        return save_encoder(self.encoder, directory, self.encoder_kwargs, recipe=asdict(self.recipe))

    def on_fit_end(self) -> None:
        if self.cache_dir is None or self.trainer.fast_dev_run or not self.trainer.is_global_zero:
            return
        target = encoder_cache_dir(self.cache_dir, self.encoder_kwargs, self.recipe)
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        save_encoder(self.encoder, target, self.encoder_kwargs, recipe=asdict(self.recipe), metrics=metrics)
        self.saved_to = target
        log.info(
            "pretrained structure encoder saved to %s; +method=cuttlefish loads it when module.encoder and "
            "module.encoder_pretrain match (or set module.encoder_init=%s)",
            target,
            target,
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.run_config is not None:
            checkpoint["zoo_config"] = self.run_config
