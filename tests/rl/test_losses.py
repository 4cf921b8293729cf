"""Clipped policy loss, k3 KL, aggregation / micro-batch invariance, masked log-probs (research/rl.md §1(e))."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo.errors import ConfigError
from zoo.rl import (
    AGGREGATION_MODES,
    ClippedPolicyLoss,
    LossAggregator,
    aggregate,
    clipped_policy_loss,
    compute_normalizer,
    k3_kl,
    masked_token_entropy,
    masked_token_logprobs,
)

L_MAX = 7


def _batch(seed: int = 0, batch: int = 6, vocab: int = 5):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, L_MAX, vocab, generator=g, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, L_MAX), generator=g)
    lengths = torch.tensor([7, 1, 3, 5, 2, 6][:batch])
    mask = torch.arange(L_MAX)[None, :] < lengths[:, None]
    labels = labels.masked_fill(~mask, -100)
    advantages = torch.randn(batch, generator=g)
    return logits, labels, mask, advantages


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_on_policy_gradient_equals_reinforce_surrogate(mode):
    logits, labels, _, adv = _batch()
    logp, mask = masked_token_logprobs(logits, labels, shift=False)
    norm = compute_normalizer(mask, mode, max_length=L_MAX)
    per_token, metrics = clipped_policy_loss(logp, logp.detach(), adv, mask)
    (grad_loss,) = torch.autograd.grad(aggregate(per_token, mask, mode, norm), logits, retain_graph=True)
    surrogate = aggregate(-adv[:, None] * logp, mask, mode, norm)
    (grad_surrogate,) = torch.autograd.grad(surrogate, logits)
    assert torch.allclose(grad_loss, grad_surrogate, atol=1e-6)
    assert grad_loss.abs().sum() > 0
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert metrics["clip_frac"].item() == 0.0


def test_on_policy_grpo_loss_value_is_zero_for_zero_mean_advantages():
    logits, labels, _, _ = _batch()
    logp, mask = masked_token_logprobs(logits, labels, shift=False)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    per_token, _ = clipped_policy_loss(logp, logp.detach(), adv, mask)
    loss = aggregate(per_token, mask, "seq_mean_token_mean", compute_normalizer(mask, "grpo"))
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_clipped_tokens_get_zero_gradient():
    ratios = torch.tensor([[1.5, 0.5, 1.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    logp = torch.zeros(1, 4, requires_grad=True)
    old = -ratios.log()
    per_token, metrics = clipped_policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.2)
    (grad,) = torch.autograd.grad(per_token.sum(), logp)
    # token 0: rho > 1+eps, A > 0 -> clipped; token 1: rho < 1-eps, A < 0 -> clipped;
    # token 2 (rho > 1+eps, A < 0) and token 3 (rho < 1-eps, A > 0) stay unclipped: d(-rho A)/dlogp = -rho A
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 1.5, -0.5]]))
    assert metrics["clip_frac_high"].item() == pytest.approx(0.25)
    assert metrics["clip_frac_low"].item() == pytest.approx(0.25)
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)


def test_clip_higher_widens_the_upper_band_only():
    logp = torch.zeros(1, 2, requires_grad=True)
    old = -torch.tensor([[1.25, 0.75]]).log()
    adv = torch.tensor([[1.0, -1.0]])
    (g_sym,) = torch.autograd.grad(ClippedPolicyLoss(eps_low=0.2)(logp, old, adv)[0].sum(), logp)
    (g_high,) = torch.autograd.grad(ClippedPolicyLoss(eps_low=0.2, eps_high=0.28)(logp, old, adv)[0].sum(), logp)
    assert torch.allclose(g_sym, torch.zeros(1, 2))
    assert torch.allclose(g_high, torch.tensor([[-1.25, 0.0]]))


def test_dual_clip_caps_the_loss_of_negative_advantage_tokens():
    logp = torch.zeros(1, 1, requires_grad=True)
    old = -torch.tensor([[5.0]]).log()
    adv = torch.tensor([[-1.0]])
    plain, _ = clipped_policy_loss(logp, old, adv)
    dual, metrics = clipped_policy_loss(logp, old, adv, clip_ratio_c=3.0)
    assert plain.item() == pytest.approx(5.0)
    assert dual.item() == pytest.approx(3.0)
    assert torch.autograd.grad(dual.sum(), logp)[0].item() == 0.0
    assert metrics["clip_frac_dual"].item() == 1.0


def test_k3_kl_is_non_negative_and_zero_iff_equal():
    torch.manual_seed(0)
    a, b = torch.randn(100), torch.randn(100)
    kl = k3_kl(a, b)
    assert (kl >= 0).all()
    assert (kl > 0).all()
    assert torch.equal(k3_kl(a, a), torch.zeros(100))


def test_beta_adds_k3_kl_to_the_loss():
    torch.manual_seed(1)
    logp, ref = torch.randn(2, 3), torch.randn(2, 3)
    adv = torch.tensor([0.5, -1.0])
    base, _ = clipped_policy_loss(logp, logp, adv)
    with_kl, metrics = clipped_policy_loss(logp, logp, adv, beta=0.1, ref_logp=ref)
    assert torch.allclose(with_kl - base, 0.1 * k3_kl(logp, ref), atol=1e-6)
    assert metrics["kl_mean"].item() == pytest.approx(k3_kl(logp, ref).mean().item(), rel=1e-5)
    with pytest.raises(ConfigError, match="ref_logp"):
        clipped_policy_loss(logp, logp, adv, beta=0.1)


def test_masked_positions_have_zero_loss():
    logp = torch.randn(2, 3)
    mask = torch.tensor([[True, False, True], [False, False, True]])
    loss, _ = clipped_policy_loss(logp, logp - 0.1, torch.tensor([1.0, -2.0]), mask)
    assert torch.equal(loss[~mask], torch.zeros(3))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batches_reproduce_the_full_batch_gradient(mode):
    logits, labels, _, adv = _batch(seed=3)
    old = (masked_token_logprobs(logits, labels, shift=False)[0] + 0.3 * torch.randn(6, L_MAX)).detach()

    def micro_loss(rows: slice, width: int, norm: torch.Tensor) -> torch.Tensor:
        lp, m = masked_token_logprobs(logits[rows, :width], labels[rows, :width], shift=False)
        per_token, _ = clipped_policy_loss(lp, old[rows, :width], adv[rows], m, eps_high=0.28)
        return aggregate(per_token, m, mode, norm)

    full_mask = labels != -100
    full_norm = compute_normalizer(full_mask, mode, max_length=L_MAX)
    (g_full,) = torch.autograd.grad(micro_loss(slice(0, 6), L_MAX, full_norm), logits)

    # three micro-batches, each trimmed to its own padded width (as a collator would)
    splits = [(slice(0, 2), 7), (slice(2, 3), 3), (slice(3, 6), 6)]
    micro_masks = [full_mask[rows, :w] for rows, w in splits]
    norm = compute_normalizer(micro_masks, mode, max_length=L_MAX)
    assert torch.equal(norm, full_norm)
    total = sum(micro_loss(rows, w, norm) for rows, w in splits)
    (g_micro,) = torch.autograd.grad(total, logits)
    assert torch.allclose(g_micro, g_full, atol=1e-6)

    # a per-micro-batch normalizer (the grad-accumulation bug) does change the gradient
    naive = sum(
        micro_loss(rows, w, compute_normalizer(m, mode, max_length=L_MAX)) for (rows, w), m in zip(splits, micro_masks)
    )
    (g_naive,) = torch.autograd.grad(naive, logits)
    assert not torch.allclose(g_naive, g_full, atol=1e-4)


def test_per_token_weights_of_each_mode():
    lengths = torch.tensor([1, 2, 4])
    mask = torch.arange(4)[None, :] < lengths[:, None]
    per_token = torch.zeros(3, 4, requires_grad=True)
    weights = {}
    for mode in AGGREGATION_MODES:
        norm = compute_normalizer(mask, mode, max_length=10)
        (weights[mode],) = torch.autograd.grad(aggregate(per_token, mask, mode, norm), per_token)
    expected_grpo = (1.0 / (lengths.float() * 3))[:, None] * mask
    assert torch.allclose(weights["seq_mean_token_mean"], expected_grpo)  # proportional to 1/|o_i|
    assert torch.allclose(weights["token_mean"], mask / 7.0)
    assert torch.allclose(weights["seq_mean_token_sum_norm"], mask / 30.0)  # independent of |o_i|


def test_normalizer_values_aliases_and_errors():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert compute_normalizer(mask, "token_mean").item() == 3.0
    assert compute_normalizer(mask, "dapo").item() == 3.0
    assert compute_normalizer(mask, "grpo").item() == 2.0
    assert compute_normalizer(mask, "dr_grpo", max_length=16).item() == 32.0
    assert compute_normalizer(torch.zeros(2, 3), "token_mean").item() == 1.0
    with pytest.raises(ConfigError, match="max_length"):
        compute_normalizer(mask, "seq_mean_token_sum_norm")
    with pytest.raises(ConfigError, match="unknown loss aggregation mode"):
        compute_normalizer(mask, "bnpo")
    agg = LossAggregator("seq-mean-token-sum-norm", max_length=4)
    assert agg.mode == "seq_mean_token_sum_norm"
    assert agg.normalizer(mask).item() == 8.0


def test_masked_token_logprobs_matches_cross_entropy_and_shift_convention():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, :2] = -100
    logp, mask = masked_token_logprobs(logits, labels, shift=False)
    ce = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)
    assert torch.allclose(logp, -ce, atol=1e-6)
    assert torch.equal(mask, labels != -100)
    assert torch.equal(logp[~mask], torch.zeros(2))
    # HF convention: logits[:, t] scores labels[:, t + 1]
    shifted, shifted_mask = masked_token_logprobs(logits, labels)
    assert shifted.shape == (2, 4)
    manual, _ = masked_token_logprobs(logits[:, :-1], labels[:, 1:], shift=False)
    assert torch.equal(shifted, manual)
    assert torch.equal(shifted_mask, labels[:, 1:] != -100)
    half, _ = masked_token_logprobs(logits.bfloat16(), labels, shift=False)
    assert torch.allclose(half, logp, atol=0.05)


def test_masked_token_entropy():
    logits = torch.zeros(1, 3, 8)
    logits[0, 1, 2] = 100.0
    labels = torch.tensor([[1, 2, -100]])
    entropy, mask = masked_token_entropy(logits, labels, shift=False)
    assert entropy[0, 0].item() == pytest.approx(math.log(8), abs=1e-6)
    assert entropy[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert entropy[0, 2].item() == 0.0
    assert mask.tolist() == [[True, True, False]]
