"""Clipped policy-gradient loss, micro-batch-invariant loss aggregation (notes ``rl.md`` §1(a), §0.2) and the
masked DPO loss (``rl.md`` §4: ThoughtFold's span-masked pairs; the ``PreferenceModule`` family).

Per-token loss (GRPO/PPO with DAPO clip-higher; verl dual clip optional):

- (PG-1) ``rho_{i,t} = exp(logp_{i,t} - old_logp_{i,t})``
- (PG-2) ``l_{i,t} = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_k3``
- (PG-3) ``KL_k3 = exp(ref - logp) - (ref - logp) - 1 >= 0``                                -> :func:`k3_kl`

Aggregation over an optimizer step (masked tokens excluded; ``N`` = sequences in the *whole* step, ``n_i`` =
valid tokens of sequence ``i``):

====================================  ===========  ===============================================  ============
mode                                   TRL name     loss                                             normalizer
====================================  ===========  ===============================================  ============
``seq_mean_token_mean`` (GRPO)         ``grpo``     ``sum_i (sum_t l_it / n_i) / N``                 ``N``
``token_mean`` (DAPO)                  ``dapo``     ``sum_{i,t} l_it / sum_i n_i``                   ``sum_i n_i``
``seq_mean_token_sum_norm`` (Dr.GRPO)  ``dr_grpo``  ``sum_{i,t} l_it / (N * L_max)``                 ``N * L_max``
====================================  ===========  ===============================================  ============

Masked DPO (Rafailov et al., arXiv 2305.18290, eq. 7), per pair ``i`` with each side's log-probability summed over
that side's label mask (``-100`` = not scored; :func:`zoo.losses.masked_sequence_logprobs`):

- (DPO-1) ``z_i = beta * ((c_i - rc_i) - (r_i - rr_i))`` (``c``/``r``: policy chosen/rejected; ``rc``/``rr``: reference)
- (DPO-2) ``L = sum_i -log sigmoid(z_i) / N``, ``N`` = number of pairs       -> :func:`masked_dpo_loss`

Call :func:`compute_normalizer` once per optimizer step on the masks of *all* its micro-batches, then
:func:`aggregate` each micro-batch with that normalizer and ``backward`` without further scaling: the sum of
the micro-batch losses is exactly the full-batch loss, so the accumulated gradient does not depend on how the
step was split. Under DDP (gradients averaged over ``W`` ranks) pass the all-reduced normalizer divided by ``W``:
compute each rank's value with ``minimum=0``, all-reduce it (sum), floor it at 1 and divide by ``W``
(``zoo.modules.GRPOModule`` does); the averaged gradient is then the single-process gradient of the union of the
ranks' batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from zoo.errors import ConfigError
from zoo.losses import IGNORE_INDEX, masked_sequence_logprobs

AggregationMode = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]

AGGREGATION_MODES: tuple[str, ...] = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")

#: Library names accepted as aliases (TRL ``loss_type``, verl ``loss_agg_mode``).
AGGREGATION_ALIASES: dict[str, str] = {
    "grpo": "seq_mean_token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "dapo": "token_mean",
    "token-mean": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}

_LOG_RATIO_CLAMP = 20.0


def resolve_aggregation_mode(mode: str) -> str:
    """Canonical mode name for ``mode`` or one of :data:`AGGREGATION_ALIASES`; raises ``ConfigError`` otherwise."""
    canonical = AGGREGATION_ALIASES.get(mode, mode)
    if canonical not in AGGREGATION_MODES:
        raise ConfigError(
            f"unknown loss aggregation mode {mode!r}; choose one of {AGGREGATION_MODES} "
            f"(aliases: {sorted(AGGREGATION_ALIASES)})"
        )
    return canonical


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(PG-3) Schulman's k3 estimator of ``KL(pi || pi_ref)`` per token: ``exp(ref - logp) - (ref - logp) - 1``.

    Shapes ``[B, T]`` (any matching shapes). Non-negative; exactly 0 where ``logp == ref_logp``.
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1.0


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(PG-1, PG-2) Per-token clipped surrogate ``-min(rho A, clip(rho, 1-eps_low, 1+eps_high) A) + beta KL_k3``.

    ``old_logp``, ``ref_logp`` and ``advantages`` are detached. ``log rho`` is clamped to ``[-20, 20]`` (as verl)
    so that far-off-policy tokens do not overflow.

    Args:
        logp: ``[B, T]`` log-probs of the sampled tokens under the current policy (requires grad).
        old_logp: ``[B, T]`` log-probs under the sampling policy (``logp.detach()`` on-policy).
        advantages: ``[B]`` (one per sequence) or ``[B, T]``.
        mask: ``[B, T]`` bool/0-1, True on completion tokens; masked positions get loss 0.
        eps_low, eps_high: clip band ``[1 - eps_low, 1 + eps_high]``; ``eps_high=None`` means ``eps_low``
            (DAPO clip-higher: 0.2 / 0.28).
        beta: k3 KL coefficient; needs ``ref_logp`` when > 0.
        ref_logp: ``[B, T]`` reference-model log-probs.
        clip_ratio_c: verl dual-clip lower bound for ``A < 0`` (e.g. 3.0): loss ``<= -A * c``. None disables.

    Returns:
        ``(per_token_loss [B, T], metrics)``; metrics are detached scalars averaged over valid tokens of this
        call: ``clip_frac_low`` (``rho < 1 - eps_low`` and ``A < 0``), ``clip_frac_high`` (``rho > 1 + eps_high``
        and ``A > 0``), ``clip_frac`` (either), ``ratio_mean``, ``kl_mean`` (0 without ``ref_logp``) and, with dual
        clip, ``clip_frac_dual``.
    """
    if eps_high is None:
        eps_high = eps_low
    if eps_low < 0 or eps_high < 0:
        raise ConfigError(f"clip epsilons must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if beta < 0:
        raise ConfigError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logp is None:
        raise ConfigError("beta > 0 needs ref_logp (reference-model log-probs)")
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ConfigError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    if logp.shape != old_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and old_logp {tuple(old_logp.shape)} differ in shape")
    adv = advantages.detach().to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(logp)
    valid = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask.bool()

    log_ratio = (logp - old_logp.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(ratio * adv, clipped_ratio * adv)
    metrics: dict[str, Tensor] = {}
    if clip_ratio_c is not None:
        dual = -adv * clip_ratio_c
        dual_active = (adv < 0) & (loss > dual)
        loss = torch.where(adv < 0, torch.minimum(loss, dual), loss)
        metrics["clip_frac_dual"] = _masked_mean(dual_active.float(), valid)

    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp.detach())
        if beta > 0:
            loss = loss + beta * kl
    loss = torch.where(valid, loss, torch.zeros_like(loss))

    with torch.no_grad():
        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)
        metrics.update(
            clip_frac_low=_masked_mean(low.float(), valid),
            clip_frac_high=_masked_mean(high.float(), valid),
            clip_frac=_masked_mean((low | high).float(), valid),
            ratio_mean=_masked_mean(ratio.detach(), valid),
            kl_mean=_masked_mean(kl.detach(), valid),
        )
    return loss, metrics


def _masked_mean(x: Tensor, valid: Tensor) -> Tensor:
    v = valid.to(x.dtype)
    return ((x * v).sum() / v.sum().clamp(min=1.0)).detach()


class ClippedPolicyLoss:
    """Configured :func:`clipped_policy_loss` (Hydra ``loss/`` group).

    Args:
        eps_low: lower clip ``epsilon`` (TRL ``epsilon``, 0.2).
        eps_high: upper clip; ``None`` = ``eps_low`` (symmetric PPO clip); 0.28 = DAPO clip-higher.
        beta: k3 KL coefficient (TRL default 0.0 = no reference model).
        clip_ratio_c: verl dual-clip constant (3.0) or None.
    """

    def __init__(
        self, eps_low: float = 0.2, eps_high: float | None = None, beta: float = 0.0, clip_ratio_c: float | None = None
    ) -> None:
        if eps_low < 0 or (eps_high is not None and eps_high < 0):
            raise ConfigError(f"clip epsilons must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
        if beta < 0:
            raise ConfigError(f"beta must be >= 0, got {beta}")
        if clip_ratio_c is not None and clip_ratio_c <= 1.0:
            raise ConfigError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
        self.eps_low = float(eps_low)
        self.eps_high = float(eps_low if eps_high is None else eps_high)
        self.beta = float(beta)
        self.clip_ratio_c = clip_ratio_c

    @property
    def needs_reference(self) -> bool:
        """Whether the module must compute reference-model log-probs (``beta > 0``)."""
        return self.beta > 0

    def __call__(
        self,
        logp: Tensor,
        old_logp: Tensor,
        advantages: Tensor,
        mask: Tensor | None = None,
        ref_logp: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return clipped_policy_loss(
            logp,
            old_logp,
            advantages,
            mask,
            eps_low=self.eps_low,
            eps_high=self.eps_high,
            beta=self.beta,
            ref_logp=ref_logp,
            clip_ratio_c=self.clip_ratio_c,
        )

    def __repr__(self) -> str:
        return (
            f"ClippedPolicyLoss(eps_low={self.eps_low}, eps_high={self.eps_high}, beta={self.beta}, "
            f"clip_ratio_c={self.clip_ratio_c})"
        )


def compute_normalizer(
    mask_full_step: Tensor | Sequence[Tensor], mode: str, max_length: int | None = None, *, minimum: float = 1.0
) -> Tensor:
    """Normalizer of one optimizer step (see the module table), computed once over *all* its micro-batches.

    Args:
        mask_full_step: ``[N, T]`` completion mask of the whole step, or a sequence of micro-batch masks
            ``[N_k, T_k]`` (widths may differ).
        mode: aggregation mode or alias.
        max_length: ``L_max`` (the generation budget), required for ``seq_mean_token_sum_norm`` (Dr.GRPO uses a
            constant, never the padded width).
        minimum: the floor of the value (1: an empty step gives 1 so nothing divides by zero). Under data
            parallelism pass ``minimum=0`` on each rank: every mode's value is a sum over sequences, so the
            all-reduced (summed) values are the normalizer of the whole step, floored at 1 after the reduction.

    Returns:
        0-dim float32 tensor, ``>= minimum``.
    """
    canonical = resolve_aggregation_mode(mode)
    masks = [mask_full_step] if isinstance(mask_full_step, Tensor) else list(mask_full_step)
    if not masks:
        raise ValueError("compute_normalizer: no masks given")
    for m in masks:
        if m.dim() != 2:
            raise ValueError(f"compute_normalizer: masks must be [num_sequences, T], got {tuple(m.shape)}")
    device = masks[0].device
    num_seq = sum(m.shape[0] for m in masks)
    if canonical == "token_mean":
        value = sum(m.bool().sum().to(device=device, dtype=torch.float32) for m in masks)
        value = torch.as_tensor(value, dtype=torch.float32, device=device)
    elif canonical == "seq_mean_token_mean":
        value = torch.tensor(float(num_seq), device=device)
    else:
        if max_length is None or max_length <= 0:
            raise ConfigError(
                f"seq_mean_token_sum_norm (Dr.GRPO) needs max_length = the generation budget L_max; got {max_length}"
            )
        value = torch.tensor(float(num_seq * max_length), device=device)
    return value.clamp(min=minimum)


def aggregate(per_token_loss: Tensor, mask: Tensor, mode: str, normalizer: Tensor | float) -> Tensor:
    """Aggregate a micro-batch's ``per_token_loss [B, T]`` under ``mask [B, T]`` into a scalar (module table).

    ``normalizer`` must come from :func:`compute_normalizer` over the whole optimizer step; then the sum of
    ``aggregate`` over the step's micro-batches equals the full-batch value (and so does its gradient).
    """
    canonical = resolve_aggregation_mode(mode)
    if per_token_loss.shape != mask.shape:
        raise ValueError(f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} differ")
    m = mask.to(per_token_loss.dtype)
    masked = per_token_loss * m
    if canonical == "seq_mean_token_mean":
        per_seq = masked.sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)
        return per_seq.sum() / normalizer
    return masked.sum() / normalizer


class LossAggregator:
    """Configured aggregation (Hydra ``agg/`` group): ``normalizer(masks)`` once per step, then ``agg(loss, mask, n)``.

    Args:
        mode: ``seq_mean_token_mean`` | ``token_mean`` | ``seq_mean_token_sum_norm`` (or TRL/verl aliases).
        max_length: ``L_max`` for ``seq_mean_token_sum_norm``; may also be given to :meth:`normalizer`.
    """

    def __init__(self, mode: str = "token_mean", max_length: int | None = None) -> None:
        self.mode = resolve_aggregation_mode(mode)
        self.max_length = max_length

    def normalizer(
        self, mask_full_step: Tensor | Sequence[Tensor], max_length: int | None = None, *, minimum: float = 1.0
    ) -> Tensor:
        """See :func:`compute_normalizer`; ``max_length`` defaults to the constructor's value."""
        length = self.max_length if max_length is None else max_length
        return compute_normalizer(mask_full_step, self.mode, length, minimum=minimum)

    def __call__(self, per_token_loss: Tensor, mask: Tensor, normalizer: Tensor | float) -> Tensor:
        return aggregate(per_token_loss, mask, self.mode, normalizer)

    def __repr__(self) -> str:
        return f"LossAggregator(mode={self.mode!r}, max_length={self.max_length})"


def masked_dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    *,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """(DPO-1, DPO-2) Mean over pairs of ``-log sigmoid(beta * ((c - rc) - (r - rr)))``.

    Each input is ``[B]``: the per-pair sum of token log-probs over that side's mask (policy chosen ``c``, policy
    rejected ``r``, frozen-reference chosen ``rc`` and rejected ``rr``; the reference terms are detached). Span
    masks (ThoughtFold) enter only through which tokens those sums cover.

    Identical sides (``c == r`` and ``rc == rr``) give ``log 2`` and zero gradient. ``normalizer`` (keyword only)
    replaces the divisor ``B``: pass the number of pairs of the whole optimizer step to every micro-batch and the
    summed micro-batch losses (and gradients) equal the full batch's.

    Raises:
        ConfigError: ``beta <= 0``. ValueError: inputs that are not four ``[B]`` tensors of one shape.
    """
    if not beta > 0:
        raise ConfigError(f"DPO beta must be > 0, got {beta}")
    shapes = {tuple(t.shape) for t in (chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps)}
    if len(shapes) != 1 or chosen_logps.dim() != 1:
        raise ValueError(
            "masked_dpo_loss: chosen_logps, rejected_logps, ref_chosen_logps and ref_rejected_logps must be [B] "
            f"tensors of one shape, got {sorted(shapes)}"
        )
    chosen_ratio = chosen_logps - ref_chosen_logps.detach()
    rejected_ratio = rejected_logps - ref_rejected_logps.detach()
    losses = -torch.nn.functional.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    denominator = chosen_logps.shape[0] if normalizer is None else normalizer
    return losses.sum() / denominator


def pair_side_logprobs(model: torch.nn.Module, batch: dict[str, Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """(DPO-1 terms) ``(chosen [B], rejected [B])``: each side's log-probability over its label mask, both sides in
    one forward.

    ``batch`` holds ``{side}_input_ids``, ``{side}_attention_mask`` and ``{side}_labels`` (``[B, T_side]``,
    right-padded; ``-100`` = not scored) for ``side`` in ``chosen`` / ``rejected``; the two sides are padded to one
    width and stacked (``[2B, T]``), so a span mask is only a matter of labels.
    """
    sides = ("chosen", "rejected")
    width = max(batch[f"{side}_input_ids"].shape[1] for side in sides)

    def padded(key: str, value: int) -> Tensor:
        tensors = [batch[f"{side}_{key}"] for side in sides]
        return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])

    logits = model(input_ids=padded("input_ids", pad_id), attention_mask=padded("attention_mask", 0)).logits
    logps = masked_sequence_logprobs(logits, padded("labels", IGNORE_INDEX))
    size = batch["chosen_input_ids"].shape[0]
    return logps[:size], logps[size:]
