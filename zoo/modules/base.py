"""What the zoo's LightningModules share.

* :class:`ZooBaseModule` (every module, with or without a language backbone): optimizer/scheduler partials and
  ``configure_optimizers``, the trainable parameters, the NaN-loss stop, the run config stored in checkpoints, the
  one rule of what ``save_hyperparameters`` keeps (plain data only), and the export hook that ``train.py`` calls after
  ``fit`` (``export: true``).
* :class:`ZooModule` (the language-model families): adds the backbone built in ``configure_model``, generation and
  the ``save_pretrained`` export (generation itself: the generating family base,
  :mod:`zoo.modules.generating`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from lightning.pytorch.utilities.parsing import collect_init_args
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone
from zoo.backbones.sharding import sharded_root
from zoo.errors import NaNLossError
from zoo.lora import AdapterFreeReference, has_lora, lora_is_identity, merged_copy
from zoo.protocols import SamplingParams
from zoo.quant.base import NoQuantizer, Quantizer

log = logging.getLogger("zoo")

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., Any]
# the scalar types of a hyper-parameter; with lists, tuples and dicts of them: what a checkpoint may hold in its
# ``hyper_parameters`` (torch.load(weights_only=True), the zoo's only way to open a checkpoint, unpickles these)
PLAIN_SCALARS = (type(None), bool, int, float, str)


def is_plain_data(value: Any) -> bool:
    """Whether ``value`` is ``None``, a ``bool``/``int``/``float``/``str`` (exactly those types: an enum or a numpy
    scalar is not), or a list, tuple or dict (string or integer keys) of plain data."""
    if type(value) in PLAIN_SCALARS:
        return True
    if type(value) in (list, tuple):
        return all(is_plain_data(v) for v in value)
    if type(value) is dict:
        return all(type(k) in (str, int) and is_plain_data(v) for k, v in value.items())
    return False


class ZooBaseModule(pl.LightningModule):
    """Base of every zoo LightningModule (not a method by itself).

    Args:
        optimizer: partial ``torch.optim`` constructor taking the parameters (``None``: AdamW with its defaults).
        scheduler: partial taking ``(optimizer, total_steps)`` (see :mod:`zoo.optim`), or ``None``.
    """

    def __init__(self, optimizer: OptimizerFactory | None = None, scheduler: SchedulerFactory | None = None) -> None:
        super().__init__()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.run_config: dict[str, Any] | None = None  # the resolved Hydra config, set by train.py

    # -- hyper-parameters -----------------------------------------------------------------------------------
    def save_hyperparameters(
        self, *args: Any, ignore: Sequence[str] | str | None = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Lightning's ``save_hyperparameters`` under one rule for every zoo module: only plain data
        (:func:`is_plain_data`) is kept, whatever ``ignore`` names.

        Constructor arguments that are objects -- backbone, quantizer, decoder, verifier, optimizer partials, cores,
        anything injected -- are left out (and never deep-copied): a checkpoint's ``hyper_parameters`` must load with
        ``torch.load(weights_only=True)``, which refuses pickled objects (:func:`zoo.checkpoints.read_checkpoint`), and
        the objects are rebuilt from the resolved run config stored beside them (``zoo_config``). The arguments are
        collected as Lightning collects them (``collect_init_args`` over the ``__init__`` frames, ``**kwargs``
        included); hyper-parameters given otherwise (LightningCLI, ``self.hparams.update``) are filtered the same way
        when saved."""
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        names = [ignore] if isinstance(ignore, str) else list(ignore or [])
        if frame is not None:
            collected: dict[str, Any] = {}
            for local in collect_init_args(frame, [], classes=(HyperparametersMixin,)):
                collected.update(local)
            names += [name for name, value in collected.items() if not is_plain_data(value)]
        super().save_hyperparameters(*args, ignore=names, frame=frame, logger=logger)
        self._drop_objects(getattr(self, "_hparams", None))
        self._drop_objects(getattr(self, "_hparams_initial", None))

    @staticmethod
    def _drop_objects(hparams: Any) -> None:
        if hparams is None:
            return
        for name in [k for k, v in hparams.items() if not is_plain_data(v)]:
            del hparams[name]

    # -- export ---------------------------------------------------------------------------------------------
    def export_pretrained(self, directory: str | Path) -> Path:
        """Write what the module trained to ``directory`` (called by ``train.py`` after ``fit`` with ``export``)."""
        raise NotImplementedError(f"{type(self).__name__} does not define export_pretrained; run with export=false")

    # -- optimization ---------------------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def optimizer_parameters(self) -> list[torch.nn.Parameter] | list[dict[str, Any]]:
        """What the optimizer receives: the trainable parameters, or parameter groups (override for per-group lr)."""
        return self.trainable_parameters()

    def configure_optimizers(self) -> Any:
        factory = self.optimizer_factory or torch.optim.AdamW
        optimizer = factory(self.optimizer_parameters())
        if self.scheduler_factory is None:
            return optimizer
        total = self.trainer.estimated_stepping_batches if self._trainer is not None else 1
        scheduler = self.scheduler_factory(optimizer, total_steps=int(total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def check_finite(self, loss: torch.Tensor) -> None:
        """Stop with the step number when the loss is NaN/inf (checkpoints already written are kept; ``train.py``
        adds where the last good one is and what to change for the settings of the run)."""
        if not torch.isfinite(loss.detach()).all():
            raise NaNLossError(
                f"non-finite loss ({loss.item()}) at global step {self.global_step}; training stopped before the "
                "optimizer step"
            )

    def on_fit_start(self) -> None:
        """Say what trains: how many parameters of how many, and why the rest is frozen when a quantizer froze it."""
        self.report_trainable()

    def report_trainable(self) -> tuple[int, int]:
        """Log the trainable and total parameter counts; warn when quantized layers are frozen. Returns both counts."""
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in {id(p): p for p in self.trainable_parameters()}.values())
        names = sorted({n.split(".")[-2] for n, p in self.named_parameters() if p.requires_grad and "." in n})
        kinds = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        log.info(
            "%s trains %s of %s parameters (%.1f%%)%s",
            type(self).__name__,
            human_count(trainable),
            human_count(total),
            100.0 * trainable / max(total, 1),
            f": {kinds}" if kinds else "",
        )
        quantizer = getattr(self, "quantizer", None)
        frozen_by_quant = quantizer is not None and quantizer.name != "none" and trainable < total
        if frozen_by_quant and not has_lora(self):
            # peft's LoRA wraps the bitsandbytes layers, not the zoo's binary ones (NanoQuant, sign, OneBit)
            qlora = quantizer.name.startswith("bnb_")
            log.warning(
                "quant=%s: the quantized layers are frozen, so only %s of %s parameters train (%s)%s",
                quantizer.name,
                human_count(trainable),
                human_count(total),
                kinds or "none",
                ". To train adapters on the quantized model (QLoRA), add +preset=qlora (or set backbone.lora)"
                if qlora
                else "",
            )
        return trainable, total

    # -- checkpoints ----------------------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.run_config is not None:
            checkpoint["zoo_config"] = self.run_config
        if "hyper_parameters" in checkpoint:  # set after save_hyperparameters (self.hparams.update): same rule
            self._drop_objects(checkpoint["hyper_parameters"])


def human_count(n: int) -> str:
    """``1234567`` -> ``'1.23M'``, ``14208`` -> ``'14.2K'``."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


class ZooModule(ZooBaseModule):
    """Base of the language-model family modules (not a method by itself).

    Args:
        backbone: builds the tokenizer now and the model in :meth:`configure_model`.
        quantizer: applied when the model is built (``quant=...``).
        optimizer: partial ``torch.optim`` constructor taking the parameters.
        scheduler: partial taking ``(optimizer, total_steps)`` (see :mod:`zoo.optim`), or ``None``.
        generation: default :class:`~zoo.generation.SamplingParams` fields (``self.sampling``) of generation.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(optimizer, scheduler)
        self.backbone = backbone
        self.quantizer = quantizer or NoQuantizer()
        self.sampling = SamplingParams(**(generation or {}))
        self.model: PreTrainedModel | None = None

    # -- model ----------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.backbone.tokenizer

    def configure_model(self) -> None:
        """Build the backbone once (idempotent; runs inside the strategy's init context)."""
        if self.model is None:
            self.model = self.backbone.build_model(self.quantizer)

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's ``clip_gradients``, and when the policy is an FSDP root unit (a module that shards it in
        ``configure_model`` with :func:`zoo.backbones.sharding.shard`, e.g. the GRPO family) norm clipping through the
        root's ``clip_grad_norm_``: the global norm over every rank's shards (torch's FSDP documentation:
        ``torch.nn.utils.clip_grad_norm_`` on shards is wrong, and Lightning's FSDP precision plugin refuses
        ``gradient_clip_algorithm="norm"``). Every rank calls it (it all-reduces the norm)."""
        root = sharded_root(self.model)
        trainer = self._trainer
        if gradient_clip_val is None and trainer is not None:
            gradient_clip_val = trainer.gradient_clip_val
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = (trainer.gradient_clip_algorithm if trainer is not None else None) or "norm"
        if root is not None and gradient_clip_val and gradient_clip_algorithm == "norm":
            root.clip_grad_norm_(float(gradient_clip_val))
            return
        super().clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def export_pretrained(self, directory: str | Path) -> Path:
        """Write model and tokenizer with ``save_pretrained`` (safetensors); LoRA adapters (``backbone.lora``) are
        merged into the written weights."""
        self.configure_model()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model = merged_copy(self.model) if has_lora(self.model) else self.model
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        return directory

    def frozen_reference(self, init_from: str | None = None) -> torch.nn.Module:
        """A frozen copy of the policy for KL/DPO terms: the policy's current (initial) weights, or the weights at
        ``init_from`` (an export directory or a zoo ``.ckpt``), built with this module's backbone and quantizer.

        A LoRA policy (``backbone.lora``, QLoRA with ``quant=bnb_nf4``) whose adapters are still the identity
        (``B = 0``) gets no second model: its reference is the policy with the adapters disabled
        (:class:`zoo.lora.AdapterFreeReference`, peft's ``disable_adapter()``; what TRL does with a peft policy). A
        load-time quantized policy without LoRA gets a fresh build from the same source (its initial weights; a
        4-bit state dict does not load into a freshly built model).

        Keep it out of the module's children (``object.__setattr__``) so it is never saved nor optimized. Call it
        from ``configure_model`` after the policy is built. It is built on the host; callers move it next to the
        policy (:func:`zoo.backbones.placement.place_auxiliary`).
        """
        if init_from is None:
            if self.model is None:
                raise RuntimeError("frozen_reference(): build the policy first (call it after configure_model)")
            if has_lora(self.model) and lora_is_identity(self.model):
                return AdapterFreeReference(self.model)
            reference = self.backbone.build_model(self.quantizer)
            if not self.quantizer.needs_pretrained_load:
                reference.load_state_dict(self.model.state_dict())
        else:
            reference = self.backbone.with_init_from(init_from).build_model(self.quantizer)
        return reference.requires_grad_(False).eval()
