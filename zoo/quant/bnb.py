"""bitsandbytes load-time quantization (``quant=bnb_nf4`` / ``quant=bnb_int8``).

The baselines of NanoQuant's comparison (arXiv 2602.06694, notes 1(c)): NF4 (QLoRA, Dettmers et al. 2023; 4 bits +
one absmax per 64-weight block = 4.5 bpw, ~4.127 with double quantization) and LLM.int8() (Dettmers et al. 2022;
8 bits per weight + fp16 outlier columns at run time).

Both act inside ``from_pretrained`` through a ``transformers.BitsAndBytesConfig``: Hugging Face backbones quantize at
load time, and the tiny backbone takes the same path (``TinyBackbone`` saves its random init to a temporary directory
and reloads it with these keyword arguments). bitsandbytes >= 0.50 runs both on CPU (its fast CPU 4-bit GEMM needs
the optional ``kernels`` package; without it a slower reference path is used, with a warning).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from zoo.errors import ConfigError
from zoo.quant.base import Quantizer

MODES = ("nf4", "fp4", "int8")


def compute_dtype_of_precision(precision: str | int) -> torch.dtype | None:
    """The matmul dtype of a Lightning ``trainer.precision`` (``bf16-mixed``/``bf16-true`` -> bfloat16,
    ``16-mixed``/``16-true`` -> float16, ``32-true``/``64-true`` -> float32); ``None`` for anything else."""
    text = str(precision).strip().lower()
    if text.startswith("bf16"):
        return torch.bfloat16
    if text.startswith("16"):
        return torch.float16
    if text.startswith(("32", "64")):
        return torch.float32
    return None


def _dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    dt = getattr(torch, str(value), None)
    if isinstance(dt, torch.dtype) and dt.is_floating_point:
        return dt
    dt = compute_dtype_of_precision(value)
    if dt is None:
        raise ConfigError(
            f"quant.compute_dtype={value!r} is not a floating torch dtype (float32, bfloat16, float16) nor a "
            "trainer.precision (bf16-mixed, 16-mixed, 32-true, ...)"
        )
    return dt


def local_device_index() -> int:
    """This process's GPU: ``LOCAL_RANK`` (Lightning, torchrun), else ``SLURM_LOCALID``, else the current device."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return torch.cuda.current_device()


class BnbQuantizer(Quantizer):
    """bitsandbytes quantization at load time.

    Args:
        mode: ``"nf4"`` (4-bit NormalFloat, ``Linear4bit``), ``"fp4"`` or ``"int8"`` (LLM.int8, ``Linear8bitLt``).
        compute_dtype: dtype of the 4-bit matmuls (``bnb_4bit_compute_dtype``): a torch dtype name, or a Lightning
            precision (the configs pass ``${trainer.precision}``: ``bf16-mixed`` -> bfloat16, ``16-mixed`` -> float16,
            ``32-true`` -> float32), so the quantized matmuls run in the run's precision.
        double_quant: quantize the per-block absmax constants too (``bnb_4bit_use_double_quant``, QLoRA).
        skip_modules: module names kept in full precision (``llm_int8_skip_modules``; applies to 4-bit too).
            ``lm_head`` by default, as in transformers and in NanoQuant's accounting.
        int8_threshold: outlier threshold of LLM.int8 (``llm_int8_threshold``, paper value 6.0).
        device_map: where ``from_pretrained`` places the quantized model (bitsandbytes needs a device map).
            ``None`` (the configs' default) follows the process: with CUDA the whole model on this process's GPU
            (``{"": local rank}``: under DDP each rank loads its replica on its own device, never ``"auto"``, which
            would spread every rank's copy over all GPUs), else ``"cpu"``; any explicit value (``"cpu"``, ``"auto"``,
            a dict) is passed through.
    """

    def __init__(
        self,
        mode: str = "nf4",
        compute_dtype: str | torch.dtype = "float32",
        double_quant: bool = True,
        skip_modules: Sequence[str] = ("lm_head",),
        int8_threshold: float = 6.0,
        device_map: str | dict[str, Any] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"quant.mode={mode!r}; use one of {MODES}")
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as err:  # no silent fallback to full precision
            raise ConfigError(
                f"quant=bnb_{mode} needs bitsandbytes, a core dependency of paperzoo: reinstall it "
                "(pip install -e .) or pip install 'bitsandbytes>=0.45'"
            ) from err
        self.mode = mode
        self.name = f"bnb_{mode}"
        self.compute_dtype = _dtype(compute_dtype)
        self.double_quant = bool(double_quant)
        self.skip_modules = list(skip_modules)
        self.int8_threshold = float(int8_threshold)
        self.device_map = device_map

    def quantization_config(self) -> Any:
        """The ``transformers.BitsAndBytesConfig`` of this quantizer."""
        from transformers import BitsAndBytesConfig

        if self.mode == "int8":
            return BitsAndBytesConfig(
                load_in_8bit=True,
                llm_int8_threshold=self.int8_threshold,
                llm_int8_skip_modules=self.skip_modules or None,
            )
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.mode,
            bnb_4bit_compute_dtype=self.compute_dtype,
            bnb_4bit_use_double_quant=self.double_quant,
            llm_int8_skip_modules=self.skip_modules or None,
        )

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """``{"quantization_config": BitsAndBytesConfig(...), "device_map": ...}`` for ``from_pretrained``."""
        return {"quantization_config": self.quantization_config(), "device_map": self.resolved_device_map()}

    def resolved_device_map(self) -> str | dict[str, Any]:
        """``device_map`` as given, or (``None``) ``{"": cuda:<local rank>}`` with CUDA and ``"cpu"`` without."""
        if self.device_map is not None:
            return self.device_map
        return {"": f"cuda:{local_device_index()}"} if torch.cuda.is_available() else "cpu"

    @classmethod
    def layer_bits(cls, layer: torch.nn.Module) -> tuple[int, int] | None:
        """Stored bits and weights of a bitsandbytes layer: stored weight bytes + its quantization state (4-bit: block
        absmax, or with double quantization the 8-bit absmax, their fp32 second-level absmax and offset; int8: the
        fp32 row scales ``SCB``). The code books (the NF4/FP4 table and the 8-bit dynamic map) are constants of the
        format, not per-layer data, and are not counted -- so NF4 at blocksize 64 gives 4.5 bpw, ~4.127 with double
        quantization (QLoRA's accounting). ``None`` for other modules (and whenever bitsandbytes was never imported:
        no layer of it can exist then)."""
        bnb = sys.modules.get("bitsandbytes")
        if bnb is None:
            return None
        if isinstance(layer, bnb.nn.Linear4bit):
            w = layer.weight
            qs = w.quant_state
            bits = w.numel() * w.element_size() * 8 + qs.absmax.numel() * qs.absmax.element_size() * 8
            if qs.nested and qs.state2 is not None:
                bits += qs.state2.absmax.numel() * qs.state2.absmax.element_size() * 8
                bits += 32  # the fp32 offset of the nested quantization
            return int(bits), int(torch.Size(qs.shape).numel())
        if isinstance(layer, bnb.nn.Linear8bitLt):
            w = layer.weight
            bits = w.numel() * w.element_size() * 8
            scb = getattr(w, "SCB", None)
            if scb is None:
                scb = getattr(layer.state, "SCB", None)
            if scb is not None:
                bits += scb.numel() * scb.element_size() * 8
            return int(bits), int(w.numel())
        return None

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Check that load-time quantization happened (no silent full-precision model) and prepare the 4-bit layers
        (:func:`prepare_4bit_layers`: checkpoints of the model resume and validate with the numbers of the run)."""
        if not is_bnb_quantized(model):
            raise ConfigError(
                f"quant={self.name}: the built model has no bitsandbytes layers; load-time quantization only acts "
                "inside from_pretrained (a backbone built without it, e.g. from a Lightning .ckpt, is not supported)"
            )
        prepare_4bit_layers(model)
        return model


def prepare_4bit_layers(model: torch.nn.Module) -> int:
    """Make every bitsandbytes ``Linear4bit`` of ``model`` load the state dict it saves and compute the same in
    training and evaluation; returns how many such layers there are. Idempotent. Two things:

    * **Checkpoints load.** ``Linear4bit._save_to_state_dict`` writes the packed weight plus its quantization state
      under ``<layer>.weight.<component>`` (``absmax``, ``quant_map``, ``nested_absmax``, ``nested_quant_map``,
      ``quant_state.bitsandbytes__nf4``: ``QuantState.as_dict(packed=True)``), but bitsandbytes (0.50) has no
      matching load: ``load_state_dict`` rejects those keys as unexpected, so a checkpoint of a 4-bit model could not
      be resumed or evaluated. A load pre-hook on each layer takes the components out of the state dict and rebuilds
      the weight from them with ``Params4bit.from_prequantized`` -- what transformers does when ``from_pretrained``
      reads a pre-quantized 4-bit checkpoint (``Bnb4bitDeserialize``) -- before the packed weight is copied in. Int8
      layers need no hook: ``Linear8bitLt._load_from_state_dict`` reads their ``SCB`` row scales.
    * **No CPU re-packing.** On a CPU with AVX512-BF16, bitsandbytes rewrites a layer's weight in place into a CPU
      layout with bf16 block scales at its first forward in eval mode (``_convert_weight_packed_for_cpu``), keeps
      using that layout afterwards -- in training too, where the layer then passes no gradient to its input -- and
      converts it back, lossily (the nested absmax is re-quantized), whenever a state dict is taken. A validation
      would thus change the training after it and the weights a checkpoint holds. The zoo keeps the layout that
      training uses (``support_avx512bf16_for_cpu = False``): the same numbers in every stage and checkpoints equal to
      the model, at the price of the bf16 CPU kernel in evaluation (GPUs are unaffected).
    """
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
        if not getattr(layer, "_zoo_loads_quant_state", False):
            layer._register_load_state_dict_pre_hook(_load_4bit_quant_state, with_module=True)
            layer._zoo_loads_quant_state = True
        if not getattr(layer, "_zoo_trains_through_matmul", False):
            layer.register_forward_pre_hook(_differentiable_4bit_forward)
            layer._zoo_trains_through_matmul = True
    return len(layers)


def _differentiable_4bit_forward(layer: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """Forward pre-hook of a ``Linear4bit`` (see :func:`prepare_4bit_layers`): a forward that may need gradients never
    runs bitsandbytes' inference kernel.

    ``bitsandbytes.matmul_4bit`` (0.50) calls ``gemv_4bit`` -- an op with no autograd kernel: no gradient reaches the
    input, so every adapter below the layer gets none or a wrong one ("an autograd kernel was not registered") --
    whenever the weight is in the CPU inference layout (``quant_state.packing_format_for_cpu``), whatever the number
    of rows; otherwise it takes ``MatMul4Bit`` (dequantize + matmul, whose backward is exact) when the input or bias
    requires grad and the ``gemm_4bit`` op when nothing does. (bitsandbytes < 0.50 took ``gemv_4bit`` for a single row
    only when the input required no grad, which no gradient crosses.) A layer that arrives in that layout with
    gradients enabled -- re-packed by an evaluation forward before the zoo prepared it -- is converted back to the
    training layout (``_convert_weight_packed_for_cpu_inverse``, what bitsandbytes does before a state dict or a move to
    CUDA) and kept there."""
    if torch.is_grad_enabled():
        _leave_cpu_inference_layout(layer)


def _leave_cpu_inference_layout(layer: torch.nn.Module) -> None:
    """Convert a ``Linear4bit`` in bitsandbytes' CPU inference layout back to the training layout
    (``_convert_weight_packed_for_cpu_inverse``) and keep it there; any other layer is left as it is."""
    weight = getattr(layer, "weight", None)
    state = getattr(weight, "quant_state", None)
    if state is not None and getattr(state, "packing_format_for_cpu", False):
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

        weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, state)
        layer.support_avx512bf16_for_cpu = False


def _load_4bit_quant_state(
    layer: torch.nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: dict[str, Any],
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load pre-hook of a ``Linear4bit`` (see :func:`prepare_4bit_layers`)."""
    import bitsandbytes as bnb

    head = prefix + "weight."
    stats = {key[len(head) :]: state_dict.pop(key) for key in [k for k in state_dict if k.startswith(head)]}
    if not stats:  # nothing quantized in this state dict for the layer (e.g. adapters only)
        return
    weight = state_dict.get(prefix + "weight")
    if weight is None:
        error_msgs.append(f"{prefix}weight: the 4-bit quantization state is there but the packed weight is missing")
        return
    layer.weight = bnb.nn.Params4bit.from_prequantized(
        data=weight, quantized_stats=stats, requires_grad=False, device=layer.weight.device, module=layer
    )


def is_bnb_quantized(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds at least one bitsandbytes ``Linear4bit``/``Linear8bitLt`` layer."""
    import bitsandbytes as bnb

    return any(isinstance(m, bnb.nn.Linear4bit | bnb.nn.Linear8bitLt) for m in model.modules())


def dequantize_bnb_layers(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every bitsandbytes layer replaced by an ``nn.Linear`` of its dequantized weight, in the dtype of
    the model's embeddings; ``model`` itself when it holds none.

    A model loads quantized without ``quant=bnb_*`` when its directory says so: a QLoRA export (``+preset=qlora``
    merges the adapters into the 4-bit weights and writes the ``quantization_config``) loads as that 4-bit model. A
    post-hoc quantizer (NanoQuant, sign, OneBit) starts from full-precision ``nn.Linear`` weights: it receives the
    weights the 4-bit model computes with. Uses transformers' ``PreTrainedModel.dequantize`` (which also drops the
    ``quantization_config``, so a later ``save_pretrained`` does not claim a 4-bit model); a layer re-packed into
    bitsandbytes' CPU inference layout by an evaluation forward is converted back first (as in
    :func:`_differentiable_4bit_forward`).
    """
    if "bitsandbytes" not in sys.modules or not is_bnb_quantized(model):  # never imported: no layer of it exists
        return model
    if getattr(model, "hf_quantizer", None) is None:
        raise ConfigError(
            "the model holds bitsandbytes layers that transformers did not load (no hf_quantizer): load it with "
            "from_pretrained from its directory to dequantize it before a post-hoc quantizer"
        )
    for layer in model.modules():
        _leave_cpu_inference_layout(layer)
    return model.dequantize(dtype=model.get_input_embeddings().weight.dtype)
