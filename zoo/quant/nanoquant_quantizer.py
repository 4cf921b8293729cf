"""``quant=nanoquant`` / ``quant=sign`` / ``quant=onebit``: the zoo's binary quantizers behind the
:class:`~zoo.quant.base.Quantizer` seam (post-hoc, :meth:`Quantizer.apply`).

NanoQuant: Efficient Sub-1-Bit Quantization of Large Language Models (arXiv 2602.06694). The mathematics lives in
:mod:`zoo.quant.nanoquant` (``quantize_model`` = Alg. 1); this file only wires it to the configuration:

* :class:`NanoQuantQuantizer` -- ``apply(model)`` draws calibration token ids, runs
  :func:`zoo.quant.nanoquant.quantize_model` in place and keeps the :class:`~zoo.quant.nanoquant.NanoQuantReport`
  in ``self.report`` (the export callback :class:`zoo.callbacks.nanoquant.NanoQuantExport` writes it out);
* :class:`SignQuantizer` (sign + per-row scale) and :class:`OneBitQuantizer` (OneBit SVID,
  arXiv 2402.11295) -- the binary baselines, through :func:`zoo.quant.nanoquant.replace_linears`.

Calibration batches come from outside (paper: 128 x 2048 tokens of WikiText-2 *train*; notes 1(d)): the quantizer
receives ``calibration``, a callable ``model -> CalibrationSet`` (token ids ``[N, T]`` and the mask of real tokens),
or ready ``calib_input_ids`` / ``calib_mask``; it never reads a file or a task. The configs build the callable that
draws rows of the run's task (or a JSONL / text file) with the backbone's tokenizer:
:class:`zoo.data.calibration.Calibration` (sources and layouts are described there).

No Lightning or Hydra import here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.errors import ConfigError
from zoo.quant.base import Quantizer
from zoo.quant.baselines import quantize_onebit, quantize_sign
from zoo.quant.bnb import dequantize_bnb_layers
from zoo.quant.nanoquant import (
    FORWARD_MODES,
    NanoQuantReport,
    collect_linear_stats,
    default_layer_filter,
    load_quantized,
    model_bits_per_weight,
    quantize_model,
    quantized_layers,
    rank_for_bits,
    replace_linears,
    set_forward_mode,
    shrink_stats,
)


def _scale_dtype(value: str | torch.dtype) -> torch.dtype:
    dt = value if isinstance(value, torch.dtype) else getattr(torch, str(value), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ConfigError(f"quant.scale_dtype={value!r} is not a floating torch dtype (float16, bfloat16, float32)")
    return dt


@dataclass
class CalibrationSet:
    """Calibration token ids ``input_ids [N, T]`` and, for right-padded rows, ``token_mask [N, T]`` (bool, True on
    real tokens; ``None`` when every position is real)."""

    input_ids: torch.Tensor
    token_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Real calibration tokens."""
        return int(self.input_ids.numel() if self.token_mask is None else self.token_mask.sum())


class _CalibratedQuantizer(Quantizer):
    """Shared calibration plumbing of the post-hoc binary quantizers: they receive calibration batches."""

    def __init__(
        self,
        calibration: Callable[[nn.Module], CalibrationSet] | None = None,
        calib_input_ids: torch.Tensor | None = None,
        calib_mask: torch.Tensor | None = None,
    ) -> None:
        if calibration is not None and not callable(calibration):
            raise ConfigError(
                f"quant.calibration must be a callable model -> CalibrationSet (the configs build "
                f"zoo.data.calibration.Calibration), got {type(calibration).__name__}"
            )
        self.calibration = calibration
        self.calib_input_ids = calib_input_ids
        self.calib_mask = calib_mask

    def calibration_record(self) -> dict[str, Any]:
        """What the calibration was, for reports: the callable's ``describe()`` (JSON-able values; others as
        ``repr``), ``{"source": "calib_input_ids"}`` for ready ids."""
        if self.calib_input_ids is not None or self.calibration is None:
            return {"source": "calib_input_ids"}
        describe = getattr(self.calibration, "describe", None)
        record = describe() if callable(describe) else {"callable": self.calibration}
        return {k: (v if isinstance(v, str | int | float | type(None)) else repr(v)) for k, v in record.items()}

    @staticmethod
    def full_precision(model: nn.Module) -> nn.Module:
        """The model whose linears the quantizer replaces: a model that loaded quantized by bitsandbytes (a QLoRA
        export carries its ``quantization_config``) is dequantized first (:func:`zoo.quant.bnb.dequantize_bnb_layers`),
        so the binary layers approximate the weights that model computes with."""
        return dequantize_bnb_layers(model)

    def calibration_set(self, model: nn.Module | None = None) -> CalibrationSet:
        """The calibration batches: ``calib_input_ids``/``calib_mask`` when given, else ``calibration(model)``."""
        if self.calib_input_ids is not None:
            return CalibrationSet(self.calib_input_ids, self.calib_mask)
        if self.calibration is None:
            raise ConfigError(
                f"quant={self.name} needs calibration batches: pass calibration=<callable model -> CalibrationSet> "
                "(e.g. zoo.data.calibration.Calibration, as the quant configs do) or calib_input_ids"
            )
        found = self.calibration(model)
        if not isinstance(found, CalibrationSet):
            raise ConfigError(f"quant.calibration returned {type(found).__name__}, not a CalibrationSet")
        return found


def _device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


class NanoQuantQuantizer(_CalibratedQuantizer):
    """NanoQuant post-training quantization of every linear inside the decoder layers (Alg. 1).

    Paper values are the defaults; where the official code differs, both are given (notes 1(a), 1(f)).

    Args:
        bits: target bits per weight of each quantized layer (App. F Eq. 60); 1.0, 0.8, 0.55 in the paper.
        block_reconstruction: error-propagation mitigation + STE tuning per block (False: ADMM init only).
        model_reconstruction: scales-only forward-KL distillation from the full-precision teacher.
        rank_multiple: rank rounding; code 32 (GPU kernels). Small models need 8 or 1 to reach low budgets.
        mid_scale: add the optional ``s_mid`` vector (the "DBF"-style third scale); paper default off.
        scale_dtype: stored scale dtype (fp16 as counted in Eq. 60).
        use_stats: diagonal preconditioner from calibration statistics (False: plain Frobenius ADMM).
        shrinkage: ``gamma`` of ``H <- (1 - gamma) H + gamma mean(H)``; paper 0.2 (Llama/Qwen), 0.6 (Gemma);
            code default 0.4.
        percentile: robust clipping percentile of token norms (code 0.999).
        admm: keyword arguments of :func:`zoo.quant.nanoquant.admm_factorize` (``outer_iters`` 400, ``inner_iters``
            5, ``reg`` 3e-2, ``rho_schedule`` "linear" = code CLI default, "cubic" = its function default).
        block: keyword arguments of :func:`zoo.quant.nanoquant.reconstruct_block` (``ep_epochs`` 8, ``ep_lr`` 1e-4,
            ``fact_epochs`` 8, ``binary_lr``/``scale_lr`` 1e-5, ...).
        kd_epochs, kd_lr, kd_batch_size, kd_schedule: model reconstruction. ``kd_lr`` default 1e-4: the value that
            moves the fp16 scales at the scale the zoo runs at; paper stage value 1e-6 (replicators' quote), code
            1e-5 (both leave the rounded scales unchanged on tiny models, so keep-best returns the ADMM scales).
            ``kd_schedule`` "cosine" (code: ``CosineAnnealingLR`` to 1e-4 x lr) or "constant".
        batch_size: forward batch size while calibrating/reconstructing.
        calibration: a callable ``model -> CalibrationSet`` (module docstring; the configs build
            :class:`zoo.data.calibration.Calibration`).
        calib_input_ids, calib_mask: ready calibration ids ``[N, T]`` and real-token mask (Python use).
        seed: seed of ADMM init and of the reconstruction shuffles.
        forward, chunk_size: run-time forward of the quantized layers once quantization is done: ``"cached"``
            (unpacked +-1 factors kept, as large as the dense weight at ~1 bpw) or ``"chunked"`` (``chunk_size``
            rows unpacked at a time into a bounded workspace; the memory win kept at run time).

    After :meth:`apply`, ``self.report`` holds the :class:`~zoo.quant.nanoquant.NanoQuantReport`.
    """

    name = "nanoquant"

    def __init__(
        self,
        bits: float = 1.0,
        block_reconstruction: bool = True,
        model_reconstruction: bool = True,
        rank_multiple: int = 32,
        mid_scale: bool = False,
        scale_dtype: str | torch.dtype = "float16",
        use_stats: bool = True,
        shrinkage: float = 0.2,
        percentile: float = 0.999,
        admm: Mapping[str, Any] | None = None,
        block: Mapping[str, Any] | None = None,
        kd_epochs: int = 8,
        kd_lr: float = 1e-4,
        kd_batch_size: int = 1,
        kd_schedule: str = "cosine",
        batch_size: int = 8,
        calibration: Callable[[nn.Module], CalibrationSet] | None = None,
        calib_input_ids: torch.Tensor | None = None,
        calib_mask: torch.Tensor | None = None,
        seed: int = 0,
        forward: str = "cached",
        chunk_size: int = 256,
    ) -> None:
        super().__init__(calibration, calib_input_ids, calib_mask)
        if forward not in FORWARD_MODES:
            raise ConfigError(f"quant.forward={forward!r}; use one of {FORWARD_MODES}")
        if int(chunk_size) < 1:
            raise ConfigError(f"quant.chunk_size={chunk_size} must be >= 1")
        self.forward = str(forward)
        self.chunk_size = int(chunk_size)
        if kd_schedule not in ("cosine", "constant"):
            raise ConfigError(f"quant.kd_schedule={kd_schedule!r}; use 'cosine' or 'constant'")
        if not float(bits) > 0:
            raise ConfigError(f"quant.bits={bits} must be positive")
        if not 0.0 <= float(shrinkage) <= 1.0:
            raise ConfigError(f"quant.shrinkage={shrinkage} must lie in [0, 1]")
        self.bits = float(bits)
        self.block_reconstruction = bool(block_reconstruction)
        self.model_reconstruction = bool(model_reconstruction)
        self.rank_multiple = int(rank_multiple)
        self.mid_scale = bool(mid_scale)
        self.scale_dtype = _scale_dtype(scale_dtype)
        self.use_stats = bool(use_stats)
        self.shrinkage = float(shrinkage)
        self.percentile = float(percentile)
        self.admm = dict(admm or {})
        self.block = dict(block or {})
        self.kd_epochs = int(kd_epochs)
        self.kd_lr = float(kd_lr)
        self.kd_batch_size = int(kd_batch_size)
        self.kd_schedule = str(kd_schedule)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.report: NanoQuantReport | None = None

    def check_budget(self, model: nn.Module) -> dict[str, int]:
        """Ranks of every selected layer at ``bits`` (App. F Eq. 60); a ``ConfigError`` names the first layer that
        cannot meet the target and its minimum bpw (checked before any calibration work)."""
        ranks: dict[str, int] = {}
        for name, mod in model.named_modules():
            if default_layer_filter(name, mod):
                try:
                    ranks[name] = rank_for_bits(
                        mod.out_features,
                        mod.in_features,
                        self.bits,
                        self.rank_multiple,
                        mid_scale=self.mid_scale,
                        layer_name=name,
                    )
                except ValueError as err:
                    raise ConfigError(f"quant.bits={self.bits:g}: {err}") from None
        if not ranks:
            raise ConfigError("quant=nanoquant: the model has no linear layers inside decoder layers to quantize")
        return ranks

    def apply(self, model: nn.Module) -> nn.Module:
        """Quantize ``model`` in place with :func:`zoo.quant.nanoquant.quantize_model` and return it."""
        model = self.full_precision(model)
        self.check_budget(model)
        calib = self.calibration_set(model)
        ids = calib.input_ids.to(_device_of(model))
        self.report = quantize_model(
            model,
            self.bits,
            ids,
            calib_mask=calib.token_mask,
            block_reconstruction=self.block_reconstruction,
            model_reconstruction=self.model_reconstruction,
            rank_multiple=self.rank_multiple,
            mid_scale=self.mid_scale,
            scale_dtype=self.scale_dtype,
            use_stats=self.use_stats,
            shrinkage=self.shrinkage,
            percentile=self.percentile,
            admm=self.admm,
            block=self.block,
            kd_epochs=self.kd_epochs,
            kd_lr=self.kd_lr,
            kd_batch_size=self.kd_batch_size,
            kd_schedule=self.kd_schedule,
            batch_size=self.batch_size,
            seed=self.seed,
        )
        self.report.config.update(
            {
                "block_reconstruction": self.block_reconstruction,
                "model_reconstruction": self.model_reconstruction,
                "percentile": self.percentile,
                "admm": self.admm,
                "block": self.block,
                "kd_epochs": self.kd_epochs,
                "kd_lr": self.kd_lr,
                "calibration": self.calibration_record(),
                "calibration_shape": list(ids.shape),
                "calibration_real_tokens": calib.num_tokens,
            }
        )
        freeze_quantized_layers(model)
        set_forward_mode(model, self.forward, self.chunk_size)
        return model


def freeze_quantized_layers(model: nn.Module) -> int:
    """Freeze the parameters of the layers a binary quantizer replaced (their scales and biases; the packed bits are
    buffers) and leave the rest of the model (embeddings, norms, output head) as it was: the rule of the
    bitsandbytes quantizers, whose quantized layers are frozen while the other weights train (the trainable-parameter
    report says so). A fit on a NanoQuant, sign or OneBit model then trains those weights and writes checkpoints
    that resume, instead of failing with an empty optimizer. Returns how many layers were frozen."""
    layers = quantized_layers(model)
    for layer in layers.values():
        for p in layer.parameters():
            p.requires_grad_(False)
    return len(layers)


class _BaselineQuantizer(_CalibratedQuantizer):
    """Replace every decoder-layer linear by a binary baseline layer (no reconstruction)."""

    _fn: Any = None

    def __init__(
        self,
        use_stats: bool = False,
        shrinkage: float = 0.2,
        scale_dtype: str | torch.dtype = "float16",
        calibration: Callable[[nn.Module], CalibrationSet] | None = None,
        calib_input_ids: torch.Tensor | None = None,
        calib_mask: torch.Tensor | None = None,
    ) -> None:
        super().__init__(calibration, calib_input_ids, calib_mask)
        self.use_stats = bool(use_stats)
        self.shrinkage = float(shrinkage)
        self.scale_dtype = _scale_dtype(scale_dtype)
        self.bits_per_weight: float | None = None

    def apply(self, model: nn.Module) -> nn.Module:
        model = self.full_precision(model)
        stats = None
        if self.use_stats:
            calib = self.calibration_set(model)
            ids = calib.input_ids.to(_device_of(model))
            stats = shrink_stats(collect_linear_stats(model, ids, token_mask=calib.token_mask), self.shrinkage)
        replace_linears(model, type(self)._fn, None, stats=stats, scale_dtype=self.scale_dtype)
        freeze_quantized_layers(model)
        self.bits_per_weight = model_bits_per_weight(model)
        return model


class SignQuantizer(_BaselineQuantizer):
    """``quant=sign``: ``W ~ diag(alpha) sign(W)`` per decoder-layer linear (``1 + 16 / d_in`` bpw).

    ``use_stats=True`` weights the row scale by the calibration input moments (default off: data-free).
    """

    name = "sign"
    _fn = staticmethod(quantize_sign)


class OneBitQuantizer(_BaselineQuantizer):
    """``quant=onebit``: OneBit's sign-value-independent decomposition ``diag(a) sign(W) diag(b)`` (SVID init of
    arXiv 2402.11295, without its QAT/KD stage); ``1 + 16 (d_out + d_in) / (d_out d_in)`` bpw."""

    name = "onebit"
    _fn = staticmethod(quantize_onebit)


def load_nanoquant_causal_lm(
    directory: str | Path, dtype: torch.dtype = torch.float32, forward: str = "cached", chunk_size: int = 256
) -> tuple[Any, Any]:
    """Rebuild ``(model, tokenizer)`` from a ``NanoQuantExport`` directory (``+method=nanoquant``): the
    architecture from its ``config.json`` (no weights are read from anywhere else), every tensor strictly from the
    packed file (:func:`zoo.quant.nanoquant.load_quantized`; a missing or mismatched tensor raises, naming it).
    ``forward``/``chunk_size``: the run-time forward of the quantized layers (see :class:`NanoQuantQuantizer`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(directory)
    config = AutoConfig.from_pretrained(path, local_files_only=True)

    def build() -> torch.nn.Module:
        return AutoModelForCausalLM.from_config(config, dtype=dtype)

    model = load_quantized(path, build).eval()
    set_forward_mode(model, forward, chunk_size)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer
