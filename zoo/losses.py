"""Masked token log-probabilities, entropies and losses with an explicit normalizer (shared by every family).

``-100`` in ``labels`` means "no loss on this position" (Hugging Face convention). SFT, GRPO (completion
tokens), DRIFT (last assistant turn), N-MARS (masked SFT) and ThoughtFold (span-masked DPO) differ only in
which positions carry a label, so they all go through :func:`masked_token_logprobs` (notes ``rl.md`` §0.6).

Alignment: with ``shift=True`` (default, the Hugging Face ``labels`` convention, ``labels`` aligned with
``input_ids``) the logits at position ``t`` score ``labels[:, t + 1]`` and the outputs have length ``T - 1``.
With ``shift=False`` the caller has aligned them already (``logits[:, t]`` scores ``labels[:, t]``).

Loss functions return sums divided by a normalizer the caller may fix once per optimizer step, so that
splitting a batch into micro-batches does not change the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def _align(logits: Tensor, labels: Tensor, shift: bool) -> tuple[Tensor, Tensor]:
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape [batch, seq, vocab], got {tuple(logits.shape)}")
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    if logits.shape[:2] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not align"
            f" (shift={shift}); expected logits[:, :, :] to match labels[:, :] in the first two dims"
        )
    return logits, labels


def masked_token_logprobs(
    logits: Tensor, labels: Tensor, *, shift: bool = True, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor]:
    """Log-probability of each label token, ``log softmax(logits)[label]``, with ignored positions set to 0.

    Computed as ``logit[label] - logsumexp(logits)`` (no ``[B, T, V]`` log-softmax copy); half-precision
    logits are upcast to float32 one row at a time.

    Args:
        logits: ``[B, T, V]``.
        labels: ``[B, T]`` token ids, ``ignore_index`` where no loss is taken.
        shift: Hugging Face convention (see module docstring); outputs are ``[B, T - 1]`` when True.

    Returns:
        ``(logp, mask)``: ``logp [B, T']`` float (0 at masked positions) and ``mask [B, T']`` bool.
    """
    logits, labels = _align(logits, labels, shift)
    mask = labels != ignore_index
    safe = labels.masked_fill(~mask, 0).long()
    if logits.dtype in (torch.float16, torch.bfloat16):
        rows = []
        for row_logits, row_labels in zip(logits, safe):
            lp = torch.log_softmax(row_logits.float(), dim=-1)
            rows.append(lp.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1))
        logp = torch.stack(rows)
    else:
        picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        logp = picked - torch.logsumexp(logits, dim=-1)
    return logp.masked_fill(~mask, 0.0), mask


def masked_token_entropy(
    logits: Tensor, labels: Tensor, *, shift: bool = True, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor]:
    """Entropy ``H_t = -sum_v p_t(v) log p_t(v)`` of the predictive distribution at every labelled position.

    Same alignment as :func:`masked_token_logprobs`. Returns ``(entropy [B, T'], mask [B, T'])`` with
    entropy 0 at masked positions. Uniform logits over ``V`` give ``log V``; one-hot-like logits give ~0.
    """
    logits, labels = _align(logits, labels, shift)
    mask = labels != ignore_index
    logp = torch.log_softmax(logits.float(), dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return entropy.masked_fill(~mask, 0.0), mask


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is true (0 where nothing is selected)."""
    m = mask.to(values.dtype)
    if dim is None:
        return (values * m).sum() / m.sum().clamp(min=1.0)
    return (values * m).sum(dim) / m.sum(dim).clamp(min=1.0)


def masked_nll(
    logits: torch.Tensor,
    labels: torch.Tensor,
    sequence_weights: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted masked negative log-likelihood: ``sum_i w_i sum_t m_it (-log p_it) / normalizer``.

    Args:
        logits: ``[B, T, V]``; labels: ``[B, T]`` (``-100`` = no loss).
        sequence_weights: ``[B]`` per-sequence weights (weighted SFT); ``None`` = 1.
        normalizer: divisor fixed by the caller (e.g. the token count of the whole optimizer step);
            ``None`` = number of loss tokens in this batch.

    Returns:
        ``(loss, num_tokens)``.
    """
    logprobs, mask = masked_token_logprobs(logits, labels)
    per_token = -logprobs
    if sequence_weights is not None:
        per_token = per_token * sequence_weights.to(per_token.dtype)[:, None]
    num_tokens = mask.sum()
    denominator = num_tokens.clamp(min=1) if normalizer is None else normalizer
    return per_token.sum() / denominator, num_tokens
