"""NanoQuant: Efficient Sub-1-Bit Quantization of Large Language Models (Chong, Kim, Kim, Choi; ICML 2026,
arXiv 2602.06694; official code github.com/SamsungLabs/NanoQuant, Apache-2.0).

Every linear ``W [d_out, d_in]`` of the decoder blocks becomes ``diag(s_post) U diag(s_mid?) V diag(s_pre)`` with
binary ``U``, ``V`` of rank ``r`` chosen from the bit budget; the factors are initialized by a preconditioned ADMM
and tuned by block reconstruction (STE) and scales-only model reconstruction (KD). Pure torch; no Lightning/Hydra.

Paper component (Sec. 3 / App. F)                       -> function
-----------------------------------------------------------------------------------------------------------------
W_hat = diag(s_post) U diag(s_mid) V diag(s_pre), factored forward -> :class:`NanoQuantLinear` (``forward``,
                                                                     ``dequantize``, ``finalize``)
run-time forward: cached +-1 factors or bounded-workspace chunks -> :func:`set_forward_mode`, :data:`FORWARD_MODES`
bit budget r = bits a b / (a + b) - 16 (App. F Eq. 60)           -> :func:`rank_for_bits`, :func:`bits_for_rank`
measured bpw (stored bits / a b, quantized layers only)         -> ``NanoQuantLinear.bits_per_weight``,
                                                                   :func:`model_bits_per_weight`
packed binary storage                                           -> :func:`pack_signs`, :func:`unpack_signs`
i_norm = E[x^2], o_norm = E[g^2], robust clipping               -> :func:`collect_linear_stats`
shrinkage H <- (1 - g) H + g mean(H)                            -> :func:`shrink`, :func:`shrink_stats`
W~ = D_out W D_in, D = sqrt(H / mean H)                         -> :func:`preconditioner`,
                                                                   :func:`preconditioned_target`
ADMM over SVID sets (A/B solves, Z = SVID, dual update)         -> :func:`admm_factorize`, :func:`svid`
naive sign-of-SVD factors (ablation)                            -> :func:`naive_sign_svd_factorize`
STE sign (identity gradient, sign(0) = +1)                      -> :func:`ste_sign`
per-layer quantization                                          -> :func:`quantize_linear`
block reconstruction (error propagation + STE tuning)          -> :func:`reconstruct_block`
model reconstruction (scales-only forward-KL distillation)      -> :func:`distill_scales`, :func:`kl_to_teacher`
full pipeline (Alg. 1)                                          -> :func:`quantize_model`
packed export / strict load                                     -> :func:`save_quantized`, :func:`load_quantized`
"""

from zoo.quant.nanoquant.admm import BinaryFactorization, admm_factorize, fit_scales, naive_sign_svd_factorize, svid
from zoo.quant.nanoquant.budget import bits_for_rank, rank_for_bits, scale_floor_bits
from zoo.quant.nanoquant.calibration import (
    LinearStats,
    collect_linear_stats,
    default_layer_filter,
    preconditioned_target,
    preconditioner,
    shrink,
    shrink_stats,
    weighted_error,
)
from zoo.quant.nanoquant.export import load_quantized, save_quantized
from zoo.quant.nanoquant.linear import (
    FORWARD_MODES,
    NanoQuantLinear,
    hard_sign,
    model_bits_per_weight,
    quantized_layers,
    set_forward_mode,
    ste_sign,
)
from zoo.quant.nanoquant.packing import pack_signs, packed_width, unpack_signs
from zoo.quant.nanoquant.reconstruct import (
    BlockReconstructionResult,
    NanoQuantReport,
    block_output_error,
    capture_block_inputs,
    distill_scales,
    kl_to_teacher,
    quantize_linear,
    quantize_model,
    reconstruct_block,
    replace_linears,
    weighted_mse,
)

__all__ = [
    "FORWARD_MODES",
    "BinaryFactorization",
    "BlockReconstructionResult",
    "LinearStats",
    "NanoQuantLinear",
    "NanoQuantReport",
    "admm_factorize",
    "bits_for_rank",
    "block_output_error",
    "capture_block_inputs",
    "collect_linear_stats",
    "default_layer_filter",
    "distill_scales",
    "fit_scales",
    "hard_sign",
    "kl_to_teacher",
    "load_quantized",
    "model_bits_per_weight",
    "naive_sign_svd_factorize",
    "pack_signs",
    "packed_width",
    "preconditioned_target",
    "preconditioner",
    "quantize_linear",
    "quantize_model",
    "quantized_layers",
    "rank_for_bits",
    "reconstruct_block",
    "replace_linears",
    "save_quantized",
    "scale_floor_bits",
    "set_forward_mode",
    "shrink",
    "shrink_stats",
    "ste_sign",
    "svid",
    "unpack_signs",
    "weighted_error",
    "weighted_mse",
]
