"""Structure encoder pretraining (``+method=cuttlefish_encoder``) and the pretrained encoders it caches.

Paper: "Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning", arXiv 2602.02780, stage (1) of
training (notes 4(a)): the all-atom EGNN is pretrained by masked reconstruction -- element type of masked atoms,
distance bin (64 bins, 0-20 Å) of held-out edges, and coordinate-noise prediction, weights 1/1/1 -- before it is
frozen under the connector.

Equation -> function:

- masked type + distance-bin cross-entropy -> :func:`zoo.multimodal.structure_encoder.structure_pretraining_loss`
- coordinate-noise term ``|| x_out(x + sigma eps) - x ||^2 / (3 sigma^2)`` (EGNN's equivariant coordinate output
  denoises the input) -> :func:`coordinate_noise_loss`
- the sum with weights ``type/dist/coord`` -> :func:`pretraining_objective`
- the training loop -> :class:`StructureEncoderPretrainModule` run by ``train.py``

Pretrained encoders used by the structure-LM module (``module.encoder_init``, by default the prerequisite node of
:func:`pretrained_encoder`) are built by this method through the artifact cache, by the CLI before the job:
:func:`encoder_request` turns a :class:`PretrainRecipe` and the encoder kwargs into a
``+method=cuttlefish_encoder`` run (:meth:`PretrainRecipe.config_values`) whose export
(``encoder.safetensors`` + ``encoder.json``) lives at ``<cache_dir>/structure_encoder/egnn<hidden>x<layers>-<key>/``,
the key hashing that run's composed config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from zoo.artifacts import Plan, Prerequisite, prerequisite
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooBaseModule
from zoo.multimodal.structure_encoder import StructureEncoder, StructurePretrainHeads, structure_pretraining_loss

ENCODER_WEIGHTS = "encoder.safetensors"
ENCODER_META = "encoder.json"


@dataclass(frozen=True)
class PretrainObjective:
    """The pretraining objective (``module.objective`` of ``+method=cuttlefish_encoder``).

    Attributes:
        atom_mask_prob, edge_mask_prob: masking rates of the reconstruction objective.
        coord_noise: standard deviation (Å) of the coordinate noise; 0 disables the term.
        type_weight, dist_weight, coord_weight: loss weights (paper 1/1/1).
        num_dist_bins, dist_max: distance bins (paper 64 bins over 0-20 Å).
    """

    atom_mask_prob: float = 0.15
    edge_mask_prob: float = 0.15
    coord_noise: float = 0.3
    type_weight: float = 1.0
    dist_weight: float = 1.0
    coord_weight: float = 1.0
    num_dist_bins: int = 64
    dist_max: float = 20.0

    def __post_init__(self) -> None:
        if self.coord_noise < 0:
            raise ConfigError(f"coord_noise must be >= 0, got {self.coord_noise}")


# PretrainRecipe field -> option of the +method=cuttlefish_encoder run it sets
RECIPE_OPTIONS = {
    "steps": "trainer.max_steps",
    "batch_size": "datamodule.batch_size",
    "lr": "module.optimizer.lr",
    "num_structures": "datamodule.source.num_train",
    "min_atoms": "datamodule.source.task.min_atoms",
    "max_atoms": "datamodule.source.task.max_atoms",
    "seed": "seed",
}


@dataclass(frozen=True)
class PretrainRecipe(PretrainObjective):
    """How a pretrained encoder is made: the objective plus the run (``module.encoder_pretrain`` of the structure LM).

    Attributes:
        steps, batch_size, lr: optimisation (AdamW, weight decay 0.01, grad-clip 1).
        num_structures, min_atoms, max_atoms, seed: the synthetic training structures and the run's seed.
        (the :class:`PretrainObjective` fields): the objective.
    """

    steps: int = 200
    batch_size: int = 16
    lr: float = 1e-3
    num_structures: int = 1024
    min_atoms: int = 6
    max_atoms: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1 or self.batch_size < 1 or self.num_structures < 1 or self.lr <= 0:
            raise ConfigError(f"bad encoder pretraining recipe: {self}")

    def config_values(self, encoder: dict[str, Any]) -> dict[str, Any]:
        """The options of the ``+method=cuttlefish_encoder`` run this recipe describes (dotted key -> value)."""
        values: dict[str, Any] = {"module.encoder": {**_encoder_defaults(), **dict(encoder)}}
        for field in fields(PretrainObjective):
            values[f"module.objective.{field.name}"] = getattr(self, field.name)
        for field, option in RECIPE_OPTIONS.items():
            values[option] = getattr(self, field)
        return values


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
    objective: PretrainObjective,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Masked type + distance-bin loss plus the weighted coordinate-noise term; returns the loss dict."""
    out = structure_pretraining_loss(
        encoder,
        heads,
        atom_types,
        pos,
        edge_index,
        atom_mask_prob=objective.atom_mask_prob,
        edge_mask_prob=objective.edge_mask_prob,
        dist_max=objective.dist_max,
        type_weight=objective.type_weight,
        dist_weight=objective.dist_weight,
        generator=generator,
    )
    if objective.coord_noise > 0 and objective.coord_weight > 0 and encoder.layers and encoder.layers[0].update_coords:
        coord = coordinate_noise_loss(encoder, atom_types, pos, edge_index, objective.coord_noise, generator)
        out["coord_loss"] = coord
        out["loss"] = out["loss"] + objective.coord_weight * coord
    return out


# ----------------------------------------------------------------------------------------------------------------
# the cached pretrained encoder
# ----------------------------------------------------------------------------------------------------------------


def encoder_request(
    cache_dir: str | Path | None, encoder: dict[str, Any], recipe: PretrainRecipe | dict[str, Any]
) -> Prerequisite:
    """The ``+method=cuttlefish_encoder`` build run of the encoder ``encoder`` + ``recipe`` describe."""
    recipe = recipe if isinstance(recipe, PretrainRecipe) else PretrainRecipe(**recipe)
    values = recipe.config_values(encoder)
    kwargs = values["module.encoder"]
    return Prerequisite(
        "structure_encoder",
        ("+method=cuttlefish_encoder",),
        values,
        name=f"egnn{kwargs['hidden']}x{kwargs['num_layers']}",
        reason=(
            "module.encoder_init asks for a structure encoder pretrained with module.encoder_pretrain "
            f"({values['trainer.max_steps']} steps of +method=cuttlefish_encoder)"
        ),
        cache_dir=cache_dir,
    )


@prerequisite
def pretrained_encoder(
    encoder: dict[str, Any], recipe: PretrainRecipe | dict[str, Any], cache_dir: str | Path | None = None
) -> Plan:
    """The directory of the encoder pretrained with ``recipe`` (``encoder.safetensors``): a prerequisite plan, built by
    the CLI through the artifact cache before the job (the default ``module.encoder_init`` of ``+method=cuttlefish``).
    """
    directory = yield encoder_request(
        cache_dir, dict(encoder), recipe if isinstance(recipe, PretrainRecipe) else dict(recipe)
    )
    return str(Path(directory) / "export")


# ----------------------------------------------------------------------------------------------------------------
# Lightning method
# ----------------------------------------------------------------------------------------------------------------


class StructureEncoderPretrainModule(ZooBaseModule):
    """``+method=cuttlefish_encoder``: masked-atom / distance-bin / coordinate-noise pretraining of the EGNN.

    Batches are those of :class:`zoo.datamodules.structures.StructureDataModule` (only ``structures`` is used). The
    export (``export: true``) is the encoder (:func:`save_encoder`), loadable by the structure-LM module with
    ``module.encoder_init=<run>/export``.

    Args:
        encoder: :class:`~zoo.multimodal.structure_encoder.StructureEncoder` kwargs.
        objective: :class:`PretrainObjective` fields.
        seed: initialisation seed of the encoder and the pretraining heads.
        optimizer, scheduler: partials as in the other family modules.
        backbone, quantizer: accepted and ignored (``train.py`` passes them to every module).
    """

    def __init__(
        self,
        encoder: dict[str, Any] | None = None,
        objective: dict[str, Any] | None = None,
        seed: int = 0,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        backbone: Any = None,
        quantizer: Any = None,
    ) -> None:
        super().__init__(optimizer, scheduler)
        self.encoder_kwargs = {**_encoder_defaults(), **dict(encoder or {})}
        self.objective = PretrainObjective(**dict(objective or {}))
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler"])
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.encoder = StructureEncoder(**self.encoder_kwargs)
            self.heads = StructurePretrainHeads(
                self.encoder.hidden, self.encoder.num_types, self.objective.num_dist_bins
            )

    def _step(self, batch: dict[str, Any], split: str, generator: torch.Generator | None = None) -> Tensor:
        s = batch["structures"]
        out = pretraining_objective(
            self.encoder, self.heads, s.atom_types, s.pos, s.edge_index, self.objective, generator
        )
        self.check_finite(out["loss"])
        for k, v in out.items():
            self.log(f"{split}/{k}", v, prog_bar=k == "loss", batch_size=s.num_graphs)
        return out["loss"]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        gen = torch.Generator(device=batch["structures"].pos.device).manual_seed(1000 + batch_idx)
        self._step(batch, "val", gen)

    def export_pretrained(self, directory: str | Path) -> Path:
        """Write the encoder (safetensors), its kwargs, the objective and the last logged metrics to ``directory``."""
        metrics = {}
        if self._trainer is not None:
            metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if v.numel() == 1}
        return save_encoder(
            self.encoder, directory, self.encoder_kwargs, objective=asdict(self.objective), metrics=metrics
        )
