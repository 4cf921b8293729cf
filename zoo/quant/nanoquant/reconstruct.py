"""Per-layer quantization, block reconstruction and model reconstruction of NanoQuant (Sec. 3, Alg. 1;
``compress_block.py``, ``compress_model.py``).

Pipeline per decoder block (sequential, one linear at a time in module order, as in the code):

1. error-propagation mitigation: tune the block's still full-precision target linears so that the block, fed the
   *quantized-model* inputs, matches the full-precision model's block outputs;
2. ADMM-initialize that linear and swap in a latent :class:`NanoQuantLinear`;
3. STE-tune the latent factors, scales and biases of the block's quantized linears.

The block loss is the importance-weighted MSE (importance = output Fisher diagonal ``o_norm`` of ``mlp.down_proj``).
Inputs of block ``i + 1`` are the outputs of quantized block ``i``. Finally, model reconstruction distills the
full-precision logits into the quantized model by tuning the scales only (binary factors frozen, bit-identical).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.quant.nanoquant.admm import admm_factorize
from zoo.quant.nanoquant.budget import rank_for_bits
from zoo.quant.nanoquant.calibration import (
    LinearStats,
    collect_linear_stats,
    default_layer_filter,
    preconditioner,
    shrink_stats,
)
from zoo.quant.nanoquant.linear import NanoQuantLinear, model_bits_per_weight


# ---------------------------------------------------------------------------------------------- single layer
def quantize_linear(
    linear: nn.Linear,
    bits: float,
    stats: LinearStats | None = None,
    *,
    rank: int | None = None,
    rank_multiple: int = 32,
    mid_scale: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    latent: bool = False,
    layer_name: str | None = None,
    **admm: Any,
) -> NanoQuantLinear:
    """Quantize one ``nn.Linear`` to a :class:`NanoQuantLinear` at ``bits`` per weight (Sec. 3 + App. F Eq. 60).

    The rank comes from :func:`rank_for_bits` unless ``rank`` is given; ``stats`` (already shrunk) define the
    diagonal preconditioner (``None`` -> identity, plain Frobenius ADMM). ``admm`` is forwarded to
    :func:`zoo.quant.nanoquant.admm.admm_factorize` (``outer_iters``, ``reg``, ``rho_schedule``, ...).
    ``latent=True`` keeps the real-valued latents for STE tuning (call ``finalize()`` afterwards).
    """
    W = linear.weight.detach()
    d_out, d_in = W.shape
    if rank is None:
        rank = rank_for_bits(d_out, d_in, bits, rank_multiple, mid_scale=mid_scale, layer_name=layer_name)
    d_o, d_i = preconditioner(stats, d_out, d_in)
    fac = admm_factorize(W, rank, d_out=d_o.to(W.device), d_in=d_i.to(W.device), mid_scale=mid_scale, **admm)
    bias = linear.bias.detach().clone() if linear.bias is not None else None
    return NanoQuantLinear.from_factors(
        fac.U,
        fac.V,
        fac.s_pre,
        fac.s_post,
        fac.s_mid,
        bias,
        u_latent=fac.u_latent if latent else None,
        v_latent=fac.v_latent if latent else None,
        scale_dtype=scale_dtype,
    ).to(W.device)


def _get(module: nn.Module, name: str) -> nn.Module:
    return module.get_submodule(name)


def _set(module: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, child, new)


# ---------------------------------------------------------------------------------------------- block utilities
def _block_forward(block: nn.Module, x: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    out = block(x, **kwargs)
    return out[0] if isinstance(out, tuple | list) else out


def weighted_mse(
    pred: torch.Tensor,
    target: torch.Tensor,
    importance: torch.Tensor | None,
    token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Importance-weighted MSE ``mean_{tokens} mean_h imp_h (y_h - t_h)^2`` (block loss, Sec. 3).

    ``pred``/``target`` ``[B, T, H]``; ``token_mask [B, T]`` (bool) restricts the mean to real tokens (padding of
    row-shaped calibration data is excluded); ``None`` averages over every position.
    """
    err = (pred.float() - target.float()).square()
    if importance is not None:
        err = err * importance.to(err.device, err.dtype)
    if token_mask is None:
        return err.mean()
    keep = token_mask.to(err.device, torch.bool)
    return err[keep].sum() / (keep.sum().clamp_min(1) * err.shape[-1])


def _tokens(token_mask: torch.Tensor | None, rows: int, length: int) -> int:
    return rows * length if token_mask is None else int(token_mask.sum())


@torch.no_grad()
def block_output_error(
    block: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    importance: torch.Tensor | None = None,
    block_kwargs: dict[str, Any] | None = None,
    batch_size: int = 8,
    token_mask: torch.Tensor | None = None,
) -> float:
    """Importance-weighted output MSE of ``block`` on ``inputs [N, T, H]`` vs ``targets [N, T, H]`` (Sec. 3),
    averaged over the tokens of ``token_mask [N, T]`` (default: every position)."""
    kw = block_kwargs or {}
    total, count = 0.0, 0
    for s in range(0, inputs.shape[0], batch_size):
        y = _block_forward(block, inputs[s : s + batch_size], kw)
        m = None if token_mask is None else token_mask[s : s + batch_size]
        n = _tokens(m, y.shape[0], y.shape[1])
        total += float(weighted_mse(y, targets[s : s + batch_size], importance, m)) * n
        count += n
    return total / max(count, 1)


def cosine_lr_factor(step: int, steps: int, floor: float = 1e-4) -> float:
    """Cosine annealing from 1 to ``floor`` over ``steps`` steps (the code's ``CosineAnnealingLR`` with
    ``eta_min = 1e-4 * lr``), as a factor of the base learning rate after ``step`` steps."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / max(steps, 1)))


def _train(
    params: list[dict[str, Any]],
    block: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    importance: torch.Tensor | None,
    kw: dict[str, Any],
    epochs: int,
    batch_size: int,
    evaluate: Callable[[], float],
    snapshot: Callable[[], Any],
    restore: Callable[[Any], None],
    seed: int,
    token_mask: torch.Tensor | None = None,
) -> list[float]:
    """AdamW (no weight decay) + cosine schedule with keep-best on ``evaluate()`` (evaluated before training and
    after every epoch). Returns the evaluated losses; the best state is restored at the end."""
    best_loss, best_state = evaluate(), snapshot()
    history = [best_loss]
    if epochs <= 0 or not params:
        return history
    n = inputs.shape[0]
    steps = math.ceil(n / batch_size) * epochs
    opt = torch.optim.AdamW(params, weight_decay=0.0)
    base = [g["lr"] for g in opt.param_groups]
    gen = torch.Generator().manual_seed(seed)
    step = 0
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = perm[s : s + batch_size]
            with torch.enable_grad():
                m = None if token_mask is None else token_mask[idx]
                loss = weighted_mse(_block_forward(block, inputs[idx], kw), targets[idx], importance, m)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            step += 1
            for g, lr in zip(opt.param_groups, base):  # cosine to 1e-4 * lr, as in the code
                g["lr"] = lr * cosine_lr_factor(step, steps)
        cur = evaluate()
        history.append(cur)
        if cur < best_loss:
            best_loss, best_state = cur, snapshot()
    restore(best_state)
    return history


@dataclass
class BlockReconstructionResult:
    """Outcome of :func:`reconstruct_block`: weighted output errors and per-stage histories."""

    admm_error: float | None
    final_error: float
    reverted: bool
    ranks: dict[str, int] = field(default_factory=dict)
    history: list[tuple[str, str, list[float]]] = field(default_factory=list)


def reconstruct_block(
    block: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    bits: float,
    *,
    names: Sequence[str] | None = None,
    stats: dict[str, LinearStats] | None = None,
    importance: torch.Tensor | None = None,
    block_kwargs: dict[str, Any] | None = None,
    rank_multiple: int = 32,
    mid_scale: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    error_propagation: bool = True,
    ep_epochs: int = 8,
    ep_lr: float = 1e-4,
    ep_batch_size: int = 4,
    fact_epochs: int = 8,
    binary_lr: float = 1e-5,
    scale_lr: float = 1e-5,
    bias_lr: float = 1e-5,
    fact_batch_size: int = 1,
    finalize_each: bool = True,
    guard: bool = True,
    seed: int = 0,
    name_prefix: str = "",
    admm: dict[str, Any] | None = None,
    token_mask: torch.Tensor | None = None,
) -> BlockReconstructionResult:
    """Quantize the linears of ``block`` in place with block reconstruction (Sec. 3, Alg. 1).

    ``inputs [N, T, H]`` are the block inputs produced by the *quantized* prefix of the model (error-propagation
    mitigation); ``targets [N, T, H]`` the full-precision model's block outputs. ``names`` are the linears to
    quantize (relative names; default: every ``nn.Linear``), processed in module order; ``stats`` maps the same
    names to (shrunk) :class:`LinearStats`; ``importance [H]`` weights the output MSE (normalized to mean 1).

    Defaults are the paper/code values: error-propagation AdamW lr 1e-4, batch 4, 8 epochs; STE tuning lr 1e-5
    (binary latents, scales, biases), batch 1, 8 epochs; cosine schedule to 1e-4 x lr.

    ``finalize_each=True`` (the official code, ``tune_fact`` ends with ``target_linear.finalize()``): each linear's
    latents are hardened into signs right after its own STE stage, so later stages tune only the newest linear's
    latents (plus the scales and biases of every quantized linear of the block [assumed: the code's optimizer takes
    every trainable tagged parameter of the block]). ``False`` keeps every latent of the block trainable until the
    block ends (an earlier reading of Alg. 1). ``token_mask [N, T]`` restricts every loss to real tokens (padded
    row-shaped calibration). Each stage keeps its best
    state by the *hardened* loss (signs of the latents, scales rounded to ``scale_dtype``), evaluated before and
    after every epoch, so no stage increases the block's weighted error. With ``guard=True`` the block is also
    quantized once by ADMM alone from the original weights; if the reconstructed block ends worse than that, the
    ADMM-only layers are used instead (``reverted=True``). Hence the final weighted error never exceeds the
    ADMM-initialization error.
    """
    kw = block_kwargs or {}
    admm = dict(admm or {})
    stats = stats or {}
    if names is None:
        names = [n for n, m in block.named_modules() if isinstance(m, nn.Linear)]
    names = list(names)
    for n in names:
        if not isinstance(_get(block, n), nn.Linear):
            raise TypeError(f"{name_prefix}{n} is not an nn.Linear (got {type(_get(block, n)).__name__})")
    if importance is not None:
        importance = importance.float() / importance.float().mean().clamp_min(1e-30)
    for p in block.parameters():
        p.requires_grad_(False)

    def q(n: str, lin: nn.Linear, latent: bool) -> NanoQuantLinear:
        return quantize_linear(
            lin,
            bits,
            stats.get(n),
            rank_multiple=rank_multiple,
            mid_scale=mid_scale,
            scale_dtype=scale_dtype,
            latent=latent,
            layer_name=name_prefix + n,
            seed=seed,
            **admm,
        )

    result = BlockReconstructionResult(admm_error=None, final_error=float("nan"), reverted=False)
    guard_layers: dict[str, NanoQuantLinear] = {}
    if guard:
        ref = copy.deepcopy(block)
        for n in names:
            guard_layers[n] = q(n, _get(block, n), latent=False)
            _set(ref, n, guard_layers[n])
        result.admm_error = block_output_error(ref, inputs, targets, importance, kw, token_mask=token_mask)
        del ref

    done: list[str] = []
    for i, n in enumerate(names):
        # (1) error-propagation mitigation on the still full-precision target linears
        remaining = [_get(block, m) for m in names[i:]]
        if error_propagation and ep_epochs > 0:
            weights = [lin.weight for lin in remaining]
            for w in weights:
                w.requires_grad_(True)
            hist = _train(
                [{"params": weights, "lr": ep_lr}],
                block,
                inputs,
                targets,
                importance,
                kw,
                ep_epochs,
                ep_batch_size,
                evaluate=lambda: block_output_error(block, inputs, targets, importance, kw, token_mask=token_mask),
                snapshot=lambda ws=weights: [w.detach().clone() for w in ws],
                restore=lambda st, ws=weights: [w.data.copy_(s) for w, s in zip(ws, st)],
                seed=seed + i,
                token_mask=token_mask,
            )
            for w in weights:
                w.requires_grad_(False)
            result.history.append((n, "error_propagation", hist))
        # (2) ADMM initialization, latent layer swapped in
        new = q(n, _get(block, n), latent=fact_epochs > 0)
        _set(block, n, new)
        result.ranks[n] = new.rank
        done.append(n)
        # (3) STE tuning of latents + scales (+ bias) of the block's quantized linears
        if fact_epochs > 0:
            layers = [_get(block, m) for m in done]
            hist = _ste_tune(
                layers,
                block,
                inputs,
                targets,
                importance,
                kw,
                fact_epochs,
                fact_batch_size,
                binary_lr,
                scale_lr,
                bias_lr,
                seed + i,
                token_mask,
            )
            result.history.append((n, "ste", hist))
        if finalize_each:
            _get(block, n).finalize()
    for m in done:
        _get(block, m).finalize()
    result.final_error = block_output_error(block, inputs, targets, importance, kw, token_mask=token_mask)
    if guard and result.admm_error is not None and result.final_error > result.admm_error:
        for n, lay in guard_layers.items():
            _set(block, n, lay)
        result.final_error = block_output_error(block, inputs, targets, importance, kw, token_mask=token_mask)
        result.reverted = True
    for p in block.parameters():
        p.requires_grad_(False)
    return result


def _ste_tune(
    layers: list[NanoQuantLinear],
    block: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    importance: torch.Tensor | None,
    kw: dict[str, Any],
    epochs: int,
    batch_size: int,
    binary_lr: float,
    scale_lr: float,
    bias_lr: float,
    seed: int,
    token_mask: torch.Tensor | None = None,
) -> list[float]:
    """STE tuning (Sec. 3): latents get the identity straight-through gradient; scales train in fp32."""
    latent = [lay for lay in layers if lay.is_latent]
    for lay in layers:
        for p in lay.scales():
            p.data = p.data.float()
    binaries = [p for lay in latent for p in (lay.u_latent, lay.v_latent)]
    scales = [p for lay in layers for p in lay.scales()]
    biases = [lay.bias for lay in layers if lay.bias is not None]
    for p in binaries + scales + biases:
        p.requires_grad_(True)
    groups = [
        {"params": binaries, "lr": binary_lr},
        {"params": scales, "lr": scale_lr},
        {"params": biases, "lr": bias_lr},
    ]
    groups = [g for g in groups if g["params"]]
    params = binaries + scales + biases

    def evaluate() -> float:
        saved = [p.detach().clone() for p in scales]
        for p, lay_dtype in zip(scales, [lay.scale_dtype for lay in layers for _ in lay.scales()]):
            p.data = p.data.to(lay_dtype).float()
        loss = block_output_error(block, inputs, targets, importance, kw, token_mask=token_mask)
        for p, s in zip(scales, saved):
            p.data = s
        return loss

    hist = _train(
        groups,
        block,
        inputs,
        targets,
        importance,
        kw,
        epochs,
        batch_size,
        evaluate,
        snapshot=lambda: [p.detach().clone() for p in params],
        restore=lambda st: [p.data.copy_(s) for p, s in zip(params, st)],
        seed=seed,
        token_mask=token_mask,
    )
    for p in params:
        p.requires_grad_(False)
    return hist


# ---------------------------------------------------------------------------------------------- model level
class _Stop(Exception):
    pass


@torch.no_grad()
def capture_block_inputs(model: nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run the embedding stage of a HF decoder-only LM and capture the first decoder layer's hidden states
    ``[N, T, H]`` and keyword arguments (causal mask, rotary embeddings, position ids)."""
    layers = model.model.layers
    box: dict[str, Any] = {}

    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        box["h"] = args[0] if args else kwargs.pop("hidden_states")
        box["kw"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        raise _Stop

    h = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model.model(input_ids=input_ids, use_cache=False)
    except _Stop:
        pass
    finally:
        h.remove()
    kw = box["kw"]
    kw["use_cache"] = False
    for k in ("past_key_values", "cache", "past_key_value"):
        kw.pop(k, None)
    return box["h"], kw


@torch.no_grad()
def _logits(model: nn.Module, input_ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    return torch.cat(
        [
            model(input_ids=input_ids[s : s + batch_size], use_cache=False).logits.float()
            for s in range(0, input_ids.shape[0], batch_size)
        ]
    )


def kl_to_teacher(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, token_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Forward KL ``KL(p_teacher || p_student)`` averaged over tokens (model reconstruction loss, Sec. 3).

    Logits ``[B, T, V]``; ``token_mask [B, T]`` (bool) averages over real tokens only (default: every position).
    """
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    s = F.log_softmax(student_logits.float(), dim=-1)
    kl = (t.exp() * (t - s)).sum(-1)
    if token_mask is None:
        return kl.mean()
    keep = token_mask.to(kl.device, torch.bool)
    return kl[keep].sum() / keep.sum().clamp_min(1)


def distill_scales(
    model: nn.Module,
    input_ids: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    epochs: int = 8,
    lr: float = 1e-4,
    batch_size: int = 1,
    schedule: str = "cosine",
    seed: int = 0,
    token_mask: torch.Tensor | None = None,
) -> tuple[float, float]:
    """Model reconstruction (Sec. 3): scales-only distillation of the teacher logits with the forward KL.

    Only ``s_pre``/``s_post``/``s_mid`` of the (finalized) :class:`NanoQuantLinear` layers are trained (in fp32,
    cast back to their ``scale_dtype`` at the end); packed binary factors and every other parameter are frozen, so
    ``U``/``V`` stay bit-identical. Keep-best: the KL with rounded scales is evaluated before training and after
    every epoch, and the best scales are kept. ``lr``: default 1e-4, the value that moves the fp16 scales at the
    scale the zoo runs at (tiny models, tens of calibration rows); paper stage value 1e-6 (as quoted by
    replicators), official code 1e-5 -- at CPU scale both leave the rounded fp16 scales unchanged, so keep-best
    returns the ADMM scales. ``schedule``: ``"cosine"`` to ``1e-4 * lr`` over all steps (the official code's
    ``CosineAnnealingLR``) or ``"constant"``. ``token_mask [N, T]``: real tokens of padded row-shaped calibration.
    Returns ``(kl_before, kl_after)``.
    """
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"distill_scales: schedule={schedule!r}; use 'cosine' or 'constant'")
    layers = [m for m in model.modules() if isinstance(m, NanoQuantLinear)]
    if not layers:
        raise ValueError("distill_scales: the model has no NanoQuantLinear layers")
    if any(lay.is_latent for lay in layers):
        raise ValueError("distill_scales needs finalized layers (call finalize() first)")
    flags = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    pairs = [(p, lay.scale_dtype) for lay in layers for p in lay.scales()]
    for p, _ in pairs:
        p.data = p.data.float()
        p.requires_grad_(True)
    params = [p for p, _ in pairs]

    def evaluate() -> float:
        saved = [p.detach().clone() for p in params]
        for p, dt in pairs:
            p.data = p.data.to(dt).float()
        kl = float(kl_to_teacher(_logits(model, input_ids, 8), teacher_logits, token_mask))
        for p, s in zip(params, saved):
            p.data = s
        return kl

    was_training = model.training
    model.eval()
    try:
        before = best = evaluate()
        best_state = [p.detach().clone() for p in params]
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        gen = torch.Generator().manual_seed(seed)
        n = input_ids.shape[0]
        steps, step = math.ceil(n / batch_size) * epochs, 0
        for _ in range(epochs):
            for idx in torch.randperm(n, generator=gen).split(batch_size):
                with torch.enable_grad():
                    out = model(input_ids=input_ids[idx], use_cache=False).logits
                    mask = None if token_mask is None else token_mask[idx]
                    loss = kl_to_teacher(out, teacher_logits[idx], mask)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                opt.step()
                step += 1
                if schedule == "cosine":
                    for g in opt.param_groups:
                        g["lr"] = lr * cosine_lr_factor(step, steps)
            cur = evaluate()
            if cur < best:
                best, best_state = cur, [p.detach().clone() for p in params]
        for p, s in zip(params, best_state):
            p.data = s
    finally:
        for p, dt in pairs:
            p.data = p.data.to(dt)
            p.requires_grad_(False)
        for p, f in flags.items():
            p.requires_grad_(f)
        model.train(was_training)
    return before, best


@dataclass
class NanoQuantReport:
    """What :func:`quantize_model` did: the (in-place) quantized model, measured bpw over the quantized layers,
    ranks, per-block results and the KL before/after scales-only distillation."""

    model: nn.Module
    bits_per_weight: float
    ranks: dict[str, int]
    blocks: list[BlockReconstructionResult]
    kl_before_distill: float | None = None
    kl_after_distill: float | None = None
    config: dict[str, Any] = field(default_factory=dict)


def quantize_model(
    model: nn.Module,
    bits: float,
    calib_input_ids: torch.Tensor,
    *,
    block_reconstruction: bool = True,
    model_reconstruction: bool = True,
    layer_filter: Callable[[str, nn.Module], bool] = default_layer_filter,
    rank_multiple: int = 32,
    mid_scale: bool = False,
    scale_dtype: torch.dtype = torch.float16,
    use_stats: bool = True,
    shrinkage: float = 0.2,
    percentile: float = 0.999,
    admm: dict[str, Any] | None = None,
    block: dict[str, Any] | None = None,
    kd_epochs: int = 8,
    kd_lr: float = 1e-4,
    kd_batch_size: int = 1,
    kd_schedule: str = "cosine",
    batch_size: int = 8,
    seed: int = 0,
    calib_mask: torch.Tensor | None = None,
) -> NanoQuantReport:
    """NanoQuant end to end on a HF Llama-style causal LM (``model.model.layers``), in place (Sec. 3, Alg. 1).

    1. Calibration statistics of all selected linears on ``calib_input_ids [N, T]`` (input moments, output-gradient
       Fisher, robust clipping), shrinkage ``shrinkage`` (paper 0.2 for Llama/Qwen, 0.6 Gemma; code default 0.4).
       ``use_stats=False`` uses the identity preconditioner.
    2. Block by block: full-precision targets from the full-precision trajectory, inputs from the quantized
       trajectory; :func:`reconstruct_block` (``block`` holds its keyword arguments) or, with
       ``block_reconstruction=False``, ADMM initialization only.
    3. ``model_reconstruction``: :func:`distill_scales` on the teacher logits (computed before any change).

    ``layer_filter(name, module)`` selects the quantized layers (default: every ``nn.Linear`` inside the decoder
    layers; embeddings, norms and ``lm_head`` stay in full precision and are not counted in the reported bpw).
    ``rank_multiple``: code 32 (GPU kernels); use 8 or 1 for small CPU models. ``admm`` goes to
    :func:`zoo.quant.nanoquant.admm.admm_factorize`. ``calib_mask [N, T]`` (bool) marks the real tokens of
    right-padded row-shaped calibration data: statistics, block losses and the KD loss use only those (right
    padding under causal attention leaves the real tokens' activations exactly as without padding).
    """
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    blk_kw = dict(block or {})
    if calib_mask is not None and calib_mask.shape != calib_input_ids.shape:
        raise ValueError(
            f"calib_mask {tuple(calib_mask.shape)} must have the shape of the ids {tuple(calib_input_ids.shape)}"
        )
    mask = None if calib_mask is None else calib_mask.to(calib_input_ids.device, torch.bool)
    teacher = _logits(model, calib_input_ids, batch_size) if model_reconstruction else None
    selected = {n: m for n, m in model.named_modules() if layer_filter(n, m)}
    if not selected:
        raise ValueError("layer_filter selected no layers")
    ranks = {
        n: rank_for_bits(m.out_features, m.in_features, bits, rank_multiple, mid_scale=mid_scale, layer_name=n)
        for n, m in selected.items()
    }
    stats: dict[str, LinearStats] = {}
    if use_stats:
        raw = collect_linear_stats(
            model,
            calib_input_ids,
            layer_filter=layer_filter,
            batch_size=batch_size,
            percentile=percentile,
            token_mask=mask,
        )
        stats = shrink_stats(raw, shrinkage)
    fp_h, kw = capture_block_inputs(model, calib_input_ids)
    q_h = fp_h
    mod_names = {id(m): n for n, m in model.named_modules()}
    results: list[BlockReconstructionResult] = []
    for layer in model.model.layers:
        prefix = mod_names[id(layer)] + "."
        names = [n[len(prefix) :] for n in selected if n.startswith(prefix)]
        with torch.no_grad():
            targets = torch.cat(
                [_block_forward(layer, fp_h[s : s + batch_size], kw) for s in range(0, fp_h.shape[0], batch_size)]
            )
        if names:
            local_stats = {n: stats[prefix + n] for n in names if prefix + n in stats}
            down = stats.get(prefix + "mlp.down_proj")
            importance = down.o_norm if down is not None else None
            if block_reconstruction:
                res = reconstruct_block(
                    layer,
                    q_h,
                    targets,
                    bits,
                    names=names,
                    stats=local_stats,
                    importance=importance,
                    block_kwargs=kw,
                    rank_multiple=rank_multiple,
                    mid_scale=mid_scale,
                    scale_dtype=scale_dtype,
                    seed=seed,
                    name_prefix=prefix,
                    admm=admm,
                    token_mask=mask,
                    **blk_kw,
                )
            else:
                for n in names:
                    new = quantize_linear(
                        _get(layer, n),
                        bits,
                        local_stats.get(n),
                        rank_multiple=rank_multiple,
                        mid_scale=mid_scale,
                        scale_dtype=scale_dtype,
                        layer_name=prefix + n,
                        seed=seed,
                        **(admm or {}),
                    )
                    _set(layer, n, new)
                err = block_output_error(layer, q_h, targets, None, kw, token_mask=mask)
                res = BlockReconstructionResult(admm_error=err, final_error=err, reverted=False)
            results.append(res)
        with torch.no_grad():
            q_h = torch.cat(
                [_block_forward(layer, q_h[s : s + batch_size], kw) for s in range(0, q_h.shape[0], batch_size)]
            )
        fp_h = targets
    report = NanoQuantReport(model=model, bits_per_weight=0.0, ranks=ranks, blocks=results)
    if model_reconstruction:
        report.kl_before_distill, report.kl_after_distill = distill_scales(
            model,
            calib_input_ids,
            teacher,
            epochs=kd_epochs,
            lr=kd_lr,
            batch_size=kd_batch_size,
            schedule=kd_schedule,
            seed=seed,
            token_mask=mask,
        )
    report.bits_per_weight = model_bits_per_weight(model)
    report.config = {
        "bits": bits,
        "rank_multiple": rank_multiple,
        "mid_scale": mid_scale,
        "shrinkage": shrinkage,
        "use_stats": use_stats,
        "scale_dtype": str(scale_dtype).replace("torch.", ""),
        "kd_schedule": kd_schedule,
        "calibration_tokens": _tokens(mask, *calib_input_ids.shape),
        "seed": seed,
    }
    model.train(was_training)
    return report


def replace_linears(
    model: nn.Module,
    quantize_fn: Callable[..., nn.Module],
    bits: float | None = None,
    *,
    stats: dict[str, LinearStats] | None = None,
    layer_filter: Callable[[str, nn.Module], bool] = default_layer_filter,
    **kwargs: Any,
) -> dict[str, nn.Module]:
    """Replace every selected linear by ``quantize_fn(linear, bits, stats[name], **kwargs)`` in place (no
    reconstruction); used for the baselines (:mod:`zoo.quant.baselines`) and the ADMM-only arm. Returns the new
    modules by name."""
    selected = [n for n, m in model.named_modules() if layer_filter(n, m)]
    new: dict[str, nn.Module] = {}
    for n in selected:
        new[n] = quantize_fn(model.get_submodule(n), bits, (stats or {}).get(n), **kwargs)
        _set(model, n, new[n])
    return new
