"""ROSA: Optimum-Referenced One-Step Adaptation of a policy at test time (arXiv:2509.23166), the weights stream of
ROSA2 (arXiv:2603.01375). No public code: the exact forms below are reconstructions (research notes agents.md 2(a)).

At turn ``k`` the KL-regularised objective ``max_pi E_pi[r] - beta KL(pi || pi_k)`` has the closed-form optimum

    pi*(y | x) = pi_k(y | x) exp(r(x, y) / beta) / Z                                    (ROSA, optimum reference)

Over a finite candidate set ``Y`` (the responses the conversation observed plus the other candidates, whose reward is
``unobserved_reward`` [reconstruction]) the normaliser is a sum, and ``pi*`` is self-normalised on ``Y``. ROSA moves a
small parameter subset (LoRA adapters) with ONE step toward ``pi*``:

    theta_{k+1} = theta_k - lr * grad_theta [ - sum_{y in Y} pi*(y) log pi_theta(y | x) ]    (one step, no inner loop)

whose gradient equals that of ``KL(pi* || pi_theta)`` (``pi*`` is held fixed during the step). A step that leaves
the adapters non-finite is rolled back and reported.

Equation -> function:
    pi*(y) = pi(y) exp(r/beta) / Z      -> :func:`optimum_weights`
    KL(pi* || pi_theta)                 -> :func:`kl_to_optimum`
    - sum pi* log pi_theta (the step's loss) -> :func:`rosa_loss`
    one step, rollback on non-finite    -> :func:`rosa_step`
    log pi_theta(y | x) of candidates   -> :func:`candidate_logprobs`
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import encode_prompt, pad_token_id
from zoo.errors import ConfigError, DataError
from zoo.generation.sampling import context_length
from zoo.losses import IGNORE_INDEX, masked_sequence_logprobs


def optimum_weights(logp: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """``pi*(y_i) = pi(y_i) exp(r_i / beta) / sum_j pi(y_j) exp(r_j / beta)`` over a candidate set.

    ``beta = inf`` gives ``pi`` renormalised on the set; ``beta -> 0`` puts all mass on the highest-reward
    candidates (shared in proportion to ``pi``).

    Args:
        logp: ``[n]`` log-probabilities ``log pi(y_i | x)`` (need not be normalised on the set).
        rewards: ``[n]`` rewards.
        beta: KL strength, ``> 0`` (``math.inf`` allowed).

    Returns:
        ``[n]`` weights that sum to 1 (no gradient flows through them).
    """
    if logp.shape != rewards.shape or logp.dim() != 1 or logp.numel() == 0:
        raise ValueError(f"logp {tuple(logp.shape)} and rewards {tuple(rewards.shape)} must be equal non-empty [n]")
    if not beta > 0:
        raise ConfigError(f"rosa.beta={beta} must be > 0 (math.inf: no reward tilt)")
    logp = logp.detach().double()
    scores = logp if math.isinf(beta) else logp + rewards.detach().double() / beta
    return torch.softmax(scores, dim=0).to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def kl_to_optimum(weights: Tensor, logp: Tensor) -> Tensor:
    """``KL(pi* || pi_theta) = sum_i pi*(y_i) (log pi*(y_i) - log pi_theta(y_i | x))`` (terms with ``pi* = 0`` are 0).

    ``pi*`` lives on the candidate set, so this is the KL to the full sequence distribution ``pi_theta``.

    Args:
        weights: ``[n]`` ``pi*`` (sums to 1).
        logp: ``[n]`` ``log pi_theta(y_i | x)``.
    """
    positive = weights > 0
    w = weights[positive].double()
    return (w * (w.log() - logp[positive].double())).sum().to(logp.dtype)


def rosa_loss(weights: Tensor, logp: Tensor) -> Tensor:
    """``- sum_i pi*(y_i) log pi_theta(y_i | x)``: the cross-entropy to the fixed optimum (gradient of
    :func:`kl_to_optimum`). ``weights`` ``[n]`` is detached; ``logp`` ``[n]`` carries the gradient."""
    return -(weights.detach().to(logp.dtype) * logp).sum()


@dataclass(frozen=True)
class StepResult:
    """One ROSA step: whether it was applied, rolled back (non-finite), and the norm of the update it made."""

    applied: bool
    rolled_back: bool
    update_norm: float
    loss: float


def rosa_step(
    params: Sequence[nn.Parameter], loss: Tensor, lr: float, max_update_norm: float | None = None
) -> StepResult:
    """One gradient step ``theta <- theta - lr * grad loss`` on ``params`` (optionally the update scaled down to norm
    ``max_update_norm``); when any parameter becomes non-finite the old values are put back (``rolled_back``).

    Uses ``torch.autograd.grad`` (no ``.grad`` buffers are left behind). Needs autograd enabled: inside Lightning's
    predict/test loops run with ``trainer.inference_mode=false`` and ``torch.enable_grad()``.
    """
    params = list(params)
    if not params:
        raise ConfigError("ROSA step: no adapter parameters to update (inject LoRA adapters first)")
    if not loss.requires_grad:
        raise RuntimeError(
            "ROSA step: the loss has no gradient; autograd is off (Lightning inference_mode? set "
            "trainer.inference_mode=false) or the adapters do not require grad"
        )
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    updates = [torch.zeros_like(p) if g is None else -lr * g for p, g in zip(params, grads, strict=True)]
    norm = torch.sqrt(sum((u.double() ** 2).sum() for u in updates)).item()
    if max_update_norm is not None and math.isfinite(norm) and norm > max_update_norm:
        updates = [u * (max_update_norm / norm) for u in updates]
        norm = float(max_update_norm)
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, u in zip(params, updates, strict=True):
            p.add_(u)
        finite = all(bool(torch.isfinite(p).all()) for p in params)
        if not finite:
            for p, old in zip(params, saved, strict=True):
                p.copy_(old)
    return StepResult(finite, not finite, norm if finite else 0.0, float(loss.detach()))


def candidate_logprobs(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, candidates: Sequence[str]
) -> Tensor:
    """``log pi_theta(y + <eos> | <bos> prompt)`` of each candidate response, ``[n]`` (differentiable; the prompt is
    encoded as the zoo's datamodules and decoders encode it, :func:`~zoo.encoding.encode_prompt`).

    Raises:
        DataError: prompt + the longest candidate does not fit in the model's context (no silent truncation).
    """
    prompt_ids = encode_prompt(tokenizer, prompt)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    answers = [tokenizer(c, add_special_tokens=False)["input_ids"] + eos for c in candidates]
    width = len(prompt_ids) + max(len(a) for a in answers)
    limit = context_length(model)
    if limit is not None and width > limit:
        raise DataError(
            f"conversation prompt of {len(prompt_ids)} tokens + a {width - len(prompt_ids)}-token response exceeds the "
            f"model context ({limit} positions); shorten the instruction/context (it is not truncated)"
        )
    pad = pad_token_id(tokenizer)
    device = next(model.parameters()).device
    ids = torch.full((len(answers), width), pad, dtype=torch.long, device=device)
    labels = torch.full_like(ids, IGNORE_INDEX)
    mask = torch.zeros_like(ids)
    for row, answer in enumerate(answers):
        seq = prompt_ids + answer
        ids[row, : len(seq)] = torch.tensor(seq, device=device)
        labels[row, len(prompt_ids) : len(seq)] = torch.tensor(answer, device=device)
        mask[row, : len(seq)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    return masked_sequence_logprobs(logits.float(), labels)


__all__ = ["StepResult", "candidate_logprobs", "kl_to_optimum", "optimum_weights", "rosa_loss", "rosa_step"]
