"""VaLR LightningModule (arXiv 2602.04476): stage 1 plain CoT SFT, stage 2 latents + alignment.

The mathematics lives in :mod:`zoo.multimodal.valr` (rewrite, recurrent latent forward, alignment loss,
latent decoding); this module wires it to a vision-language backbone and a frozen teacher:

* ``stage="cot"``: L = CE of the plain chain of thought (the image is an input; no latents).
* ``stage="latent"``: L = CE(latent-augmented sequence) + lambda * L_REPA (lambda = ``align_weight``, 0.5 in
  the paper); ``align_weight=0`` with ``teacher=None`` is the "latents without alignment" ablation.

The teacher is only called in :meth:`training_step`; validation, test, predict and :meth:`generate_latent`
use the MLLM alone. Generation goes through the decoder seam: the module decodes with
:class:`~zoo.multimodal.valr.LatentDecoder` (K = ``num_latents``; 0 in the CoT stage), which carries the processors
and forward hooks of the configured ``module/decoder`` (only ``sample`` has a latent version). Evaluation: loss,
generation, the task's verifier -> ``{split}/exact_match`` (:class:`~zoo.modules.generating.GeneratingModule`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torchmetrics import MeanMetric

from zoo.backbones.base import Backbone
from zoo.backbones.vlm import LATENT_END, LATENT_SLOT, LATENT_START
from zoo.errors import ConfigError, DataError
from zoo.generation.decoders import Decoder, SampleDecoder
from zoo.losses import masked_nll
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.generating import EVAL_SPLITS, GeneratingModule
from zoo.multimodal.valr import (
    FEEDBACK_MODES,
    AlignmentProjector,
    LatentBatch,
    LatentDecoder,
    LatentFeedback,
    LatentGenerationResult,
    latent_forward,
    packed_nll,
    rewrite_with_latents,
    step_row_targets,
    valr_alignment_loss,
)
from zoo.protocols import GenerationResult, Verifier
from zoo.quant.base import Quantizer

STAGES = ("cot", "latent")
ALIGN_TARGETS = ("image", "step_rows")
# the paper aligns layer 12 of Qwen2.5-VL-7B's 28 ("middle best" among 4/12/27)
PAPER_ALIGN_DEPTH = 12 / 28


def paper_align_layer(num_layers: int) -> int:
    """The paper's relative alignment depth on a ``num_layers``-layer LLM: ``round(num_layers * 12 / 28)`` (layer
    12 of Qwen2.5-VL-7B's 28), at least 1 (``hidden_states[0]`` is the embeddings)."""
    return max(1, round(num_layers * PAPER_ALIGN_DEPTH))


class VaLRModule(GeneratingModule):
    """Vision-aligned latent reasoning on a vision-language backbone.

    Args:
        backbone: a VLM backbone (``backbone=tiny_vlm`` or ``hf_vlm``) whose tokenizer has the latent tokens.
        stage: ``cot`` (stage 1) or ``latent`` (stage 2).
        num_latents: K latent positions per reasoning step (paper: 16; demo: 4).
        align_weight: lambda of ``L_CE + lambda L_REPA`` (paper: 0.5).
        align_layer: ``hidden_states`` index of the aligned states (0 = embeddings), ``"paper"`` (the paper's
            relative depth, layer 12 of 28: ``round(num_layers * 12 / 28)``) or ``"middle"`` (``num_layers // 2``).
        align_targets: ``"image"`` -- every step aligned to the whole image (the paper); ``"step_rows"`` -- step
            ``i``'s latents aligned to the patches of the image row that step looks up (batch meta ``query_rows``;
            latent ``k`` <-> patch ``k`` of the row when ``K`` = patches per row) [option, not in the paper].
        teacher: a frozen encoder ``pixel_values -> [B, P, D]`` or a zero-argument factory of one (called in
            :meth:`setup` or :meth:`configure_model`, whichever comes first); ``None`` disables alignment.
        projector_hidden: width of psi's hidden layer.
        upsample: K -> P mode (``nearest`` / ``nearest1d`` / ``linear``).
        projector_lr: learning rate of psi; ``None`` = ``projector_lr_scale`` x the optimizer's.
        projector_lr_scale: psi's learning rate relative to the LLM's when ``projector_lr`` is ``None`` (paper:
            1e-5 vs 2e-6, i.e. 5).
        latent_feedback: ``f`` of ``E_{t+1} = [E_t; f(h_t)]`` (:class:`~zoo.multimodal.valr.LatentFeedback`):
            ``embedding_rms`` (default), ``raw`` (the paper's formula) or ``projection``.
        freeze_vision: keep the native vision tower frozen (paper: frozen in both stages).
        freeze_connector: keep the vision-language connector (LLaVA's ``multi_modal_projector``) frozen. Paper: trained
            (off). A random-init connector trained with the LM from scratch collapses: within ~250 steps its output
            turns into a large image-independent vector (RMS x50, the image-dependent share 0.47 -> 0.06) and the LM
            never learns to read the image; frozen, the random features stay informative [toy-scale choice].
        max_latent_segments: cap of latent segments per row at inference.
        generate_on_eval: generation + exact-match accuracy on eval (``meta["num_steps"]`` per row).
        verifier: ``(completion, answer) -> bool``, the task's (``verifier: ${task}``).
        decoder: ``module/decoder``; its processors and hooks move to the module's
            :class:`~zoo.multimodal.valr.LatentDecoder` (``None`` or ``sample``; other decoders have no latent loop).
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        stage: str = "latent",
        num_latents: int = 4,
        align_weight: float = 0.5,
        align_layer: int | str = "paper",
        teacher: nn.Module | Callable[[], nn.Module] | None = None,
        projector_hidden: int = 256,
        upsample: str = "nearest",
        projector_lr: float | None = None,
        projector_lr_scale: float = 5.0,
        align_targets: str = "image",
        latent_feedback: str = "embedding_rms",
        freeze_vision: bool = True,
        freeze_connector: bool = False,
        max_latent_segments: int = 8,
        generate_on_eval: bool = True,
        max_steps_logged: int = 8,
        verifier: Verifier | None = None,
        decoder: Decoder | None = None,
    ) -> None:
        super().__init__(
            backbone,
            quantizer,
            optimizer,
            scheduler,
            generation,
            verifier=verifier,
            generate_on_eval=generate_on_eval,
        )
        if decoder is not None and type(decoder) not in (SampleDecoder, LatentDecoder):
            raise ConfigError(
                "VaLR decodes with its latent loop (zoo.multimodal.valr.LatentDecoder), which takes the processors and "
                f"hooks of module.decoder; {type(decoder).__name__} has no latent version: use module/decoder=sample"
            )
        if stage not in STAGES:
            raise ConfigError(f"module.stage must be one of {STAGES}, got {stage!r}")
        if stage == "latent" and num_latents < 1:
            raise ConfigError(f"module.num_latents must be >= 1 in the latent stage, got {num_latents}")
        if align_weight < 0:
            raise ConfigError(f"module.align_weight must be >= 0, got {align_weight}")
        if align_targets not in ALIGN_TARGETS:
            raise ConfigError(f"module.align_targets must be one of {ALIGN_TARGETS}, got {align_targets!r}")
        if latent_feedback not in FEEDBACK_MODES:
            raise ConfigError(f"module.latent_feedback must be one of {FEEDBACK_MODES}, got {latent_feedback!r}")
        if projector_lr_scale <= 0:
            raise ConfigError(f"module.projector_lr_scale must be > 0, got {projector_lr_scale}")
        if stage == "latent" and align_weight > 0 and teacher is None:
            raise ConfigError("module.align_weight > 0 needs module.teacher (set align_weight=0 for latents only)")
        missing = [t for t in (LATENT_START, LATENT_END, LATENT_SLOT) if t not in self.tokenizer.get_vocab()]
        if stage == "latent" and missing:
            raise ConfigError(f"the backbone's tokenizer lacks {missing}; add them with backbone.extra_tokens")
        self.stage = stage
        self.num_latents = num_latents if stage == "latent" else 0
        self.align_weight = float(align_weight)
        self.align_layer_spec = align_layer
        self._teacher_spec = teacher
        self.teacher: nn.Module | None = None
        self.projector: AlignmentProjector | None = None
        self.projector_hidden = projector_hidden
        self.upsample = upsample
        self.projector_lr = projector_lr
        self.projector_lr_scale = float(projector_lr_scale)
        self.align_targets = align_targets
        self.latent_feedback = latent_feedback
        self.feedback: LatentFeedback | None = None
        self.freeze_vision = freeze_vision
        self.freeze_connector = freeze_connector
        self.max_latent_segments = max_latent_segments
        self.max_steps_logged = max_steps_logged
        configured = decoder if decoder is not None else self.decoder
        self.decoder = LatentDecoder(
            self.num_latents, max_latent_segments, processors=configured.processors, hooks=configured.hooks
        )
        ignore = ["backbone", "quantizer", "optimizer", "scheduler", "teacher", "verifier", "decoder"]
        self.save_hyperparameters(ignore=ignore)
        self.eval_loss = nn.ModuleDict({s: MeanMetric() for s in EVAL_SPLITS})

    # -- model ----------------------------------------------------------------------------------------------
    @property
    def token_ids(self) -> dict[str, int]:
        ids = self.tokenizer.convert_tokens_to_ids([LATENT_START, LATENT_END, LATENT_SLOT])
        return {"latent_start_id": ids[0], "latent_end_id": ids[1], "latent_slot_id": ids[2]}

    @property
    def align_layer(self) -> int:
        layers = int(self._text_config().num_hidden_layers)
        if self.align_layer_spec == "middle":
            return layers // 2
        if self.align_layer_spec == "paper":
            return paper_align_layer(layers)
        index = int(self.align_layer_spec)
        if not 0 <= index <= layers:
            raise ConfigError(f"module.align_layer={index} outside [0, {layers}] (0 = embeddings)")
        return index

    def _text_config(self) -> Any:
        config = self.model.config
        return getattr(config, "text_config", config)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        super().configure_model()
        self.feedback = LatentFeedback(self.latent_feedback, int(self._text_config().hidden_size))
        self.decoder.feedback = self.feedback
        if self.freeze_vision:
            for name in ("vision_tower", "vision_model"):
                tower = getattr(self.model.model, name, None) if hasattr(self.model, "model") else None
                if tower is not None:
                    tower.requires_grad_(False)
        if self.freeze_connector:
            connector = getattr(getattr(self.model, "model", None), "multi_modal_projector", None)
            if connector is None:
                raise ConfigError(
                    f"module.freeze_connector=true but {type(self.model).__name__} has no multi_modal_projector "
                    "(a LLaVA-style connector); set module.freeze_connector=false"
                )
            connector.requires_grad_(False)
        teacher = self.resolve_teacher()
        if teacher is not None:
            dim = int(getattr(teacher, "feature_dim", 0)) or None
            if dim is None:
                raise ConfigError("module.teacher must expose feature_dim (use zoo.multimodal.teacher.FrozenTeacher)")
            self.projector = AlignmentProjector(int(self._text_config().hidden_size), dim, self.projector_hidden)
            _ = self.align_layer  # validate early

    def resolve_teacher(self) -> nn.Module | None:
        """The frozen teacher, built from the factory once (the synthetic one is trained and cached on first use)."""
        if self.teacher is None and self.stage == "latent" and self.align_weight > 0 and self._teacher_spec is not None:
            teacher = self._teacher_spec
            teacher = teacher if isinstance(teacher, nn.Module) else teacher()
            teacher.requires_grad_(False)
            teacher.eval()
            self.teacher = teacher
        return self.teacher

    def setup(self, stage: str) -> None:
        self.resolve_teacher()  # outside the strategy's init context: the teacher may be built on first use

    def train(self, mode: bool = True) -> VaLRModule:
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()
        return self

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        teacher = {id(p) for p in self.teacher.parameters()} if self.teacher is not None else set()
        return [p for p in self.parameters() if p.requires_grad and id(p) not in teacher]

    def base_lr(self) -> float:
        """The optimizer's learning rate (read from an optimizer the factory builds on a dummy parameter)."""
        factory = self.optimizer_factory or torch.optim.AdamW
        return float(factory([nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"])

    def projector_learning_rate(self) -> float:
        """psi's learning rate: ``projector_lr``, else ``projector_lr_scale`` x the LLM's (paper: 5x)."""
        return float(self.projector_lr) if self.projector_lr is not None else self.projector_lr_scale * self.base_lr()

    def optimizer_parameters(self) -> list[torch.nn.Parameter] | list[dict[str, Any]]:
        """psi gets its own learning rate (:meth:`projector_learning_rate`)."""
        if self.projector is None:
            return self.trainable_parameters()
        proj = {id(p) for p in self.projector.parameters()}
        return [
            {"params": [p for p in self.trainable_parameters() if id(p) not in proj]},
            {"params": list(self.projector.parameters()), "lr": self.projector_learning_rate()},
        ]

    # -- losses ---------------------------------------------------------------------------------------------
    def latent_batch(self, batch: dict[str, Any]) -> LatentBatch:
        """The VaLR data rewrite of a batch (on the batch's device)."""
        lb = rewrite_with_latents(
            batch["segments"], self.num_latents, pad_id=self.tokenizer.pad_token_id, **self.token_ids
        )
        device = batch["input_ids"].device
        return LatentBatch(*(getattr(lb, f).to(device) for f in LatentBatch.__dataclass_fields__))

    def _check_pixels(self, batch: dict[str, Any]) -> None:
        pixels = batch.get("pixel_values")
        vision = getattr(self.model.config, "vision_config", None)
        size = getattr(vision, "image_size", None)
        if pixels is not None and size is not None and tuple(pixels.shape[-2:]) != (size, size):
            raise DataError(
                f"batch pixel_values are {tuple(pixels.shape[-2:])} but the vision tower takes {size}x{size}; "
                f"set datamodule.image_size={size}"
            )

    def losses(self, batch: dict[str, Any], with_alignment: bool) -> dict[str, torch.Tensor]:
        """``{"loss", "lm_loss", "num_tokens"}`` (+ ``align_loss``, ``align_cos``, ``num_passes`` in stage 2)."""
        self._check_pixels(batch)
        if self.stage == "cot":
            logits = self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], pixel_values=batch["pixel_values"]
            ).logits
            lm, n = masked_nll(logits, batch["labels"])
            return {"loss": lm, "lm_loss": lm, "num_tokens": n}
        lb = self.latent_batch(batch)
        use_align = with_alignment and self.align_weight > 0 and self.teacher is not None
        layer = self.align_layer if use_align else None
        out = latent_forward(self.model, lb, batch["pixel_values"], layer, feedback=self.feedback)
        lm, n = packed_nll(out.logits, lb.labels, lb.attention_mask)
        result = {"loss": lm, "lm_loss": lm, "num_tokens": n, "num_passes": torch.tensor(float(out.num_passes))}
        if use_align:
            with torch.no_grad():
                feats = self.teacher(batch["pixel_values"])
                if self.align_targets == "step_rows":
                    feats = step_row_targets(feats, self.step_rows(batch, lb.num_segments), self._patch_grid(feats))
            align = valr_alignment_loss(out.latent_states, feats, self.projector, self.upsample, lb.segment_mask)
            result.update(loss=lm + self.align_weight * align, align_loss=align, align_cos=-align.detach())
        return result

    @staticmethod
    def _patch_grid(feats: torch.Tensor) -> int:
        grid = int(round(feats.shape[1] ** 0.5))
        if grid * grid != feats.shape[1]:
            raise ConfigError(
                f"module.align_targets=step_rows needs a square teacher patch grid, got P={feats.shape[1]}"
            )
        return grid

    @staticmethod
    def step_rows(batch: dict[str, Any], num_segments: int) -> torch.Tensor:
        """``[B, N]`` image row looked up by each reasoning step (batch meta ``query_rows``; -1 = no step)."""
        rows = (batch.get("meta") or {}).get("query_rows")
        if rows is None:
            raise DataError(
                "module.align_targets=step_rows needs the rows each step looks up: a 'query_rows' column in the data "
                "(the visual_counting task has it) kept by datamodule.meta_fields"
            )
        out = torch.full((len(rows), num_segments), -1, dtype=torch.long)
        for b, r in enumerate(rows):
            r = list(r)[:num_segments]
            out[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        return out.to(batch["input_ids"].device)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        out = self.losses(batch, with_alignment=True)
        self.check_finite(out["loss"])
        size = batch["input_ids"].shape[0]
        self.log("train/loss", out["loss"], prog_bar=True, batch_size=size)
        self.log("train/lm_loss", out["lm_loss"], batch_size=size)
        if "align_loss" in out:
            self.log("train/align_loss", out["align_loss"], batch_size=size)
            self.log("train/align_cos", out["align_cos"], prog_bar=True, batch_size=size)
        if "num_passes" in out:
            self.log("train/forward_passes", out["num_passes"], batch_size=size)
        return out["loss"]

    # -- inference (teacher never used) -----------------------------------------------------------------------
    def generate_latent(self, batch: dict[str, Any], hidden_layer: int | None = None) -> LatentGenerationResult:
        """Decode a batch with latent segments (K = ``num_latents``; plain decoding in the CoT stage) and the
        evaluation sampling (greedy by default); ``hidden_layer`` also returns that layer's latent states."""
        self.configure_model()
        decoder = self.decoder if hidden_layer is None else self.decoder.recording(hidden_layer)
        return decoder(
            self.model,
            self.tokenizer,
            batch["prompt_ids"],
            batch["prompt_attention_mask"],
            params=self.eval_sampling,
            pixel_values=batch.get("pixel_values"),
        )

    def generate_batch(self, batch: dict[str, Any]) -> tuple[GenerationResult, dict[str, list[Any]]]:
        return self.generate_latent(batch), {"num_steps": batch["num_steps"].tolist()}

    def eval_losses(self, batch: dict[str, Any], split: str) -> None:
        size = batch["input_ids"].shape[0]
        loss = self.losses(batch, with_alignment=False)["lm_loss"]
        self.eval_loss[split].update(loss)
        self.log(f"{split}/loss", self.eval_loss[split], prog_bar=split == "val", batch_size=size)

    def export_pretrained(self, directory: Any) -> Any:
        """Model + processor (or tokenizer) with ``save_pretrained``; loads back with ``backbone=hf_vlm``."""
        path = super().export_pretrained(directory)
        saver = getattr(self.backbone, "save_processor", None)
        if saver is not None:
            saver(path)
        return path


__all__ = ["VaLRModule"]
