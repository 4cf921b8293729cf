"""Masked token losses with an explicit normalizer (shared by every family module).

``-100`` in ``labels`` marks tokens without loss. Functions return *sums* and counts so that the caller
chooses the normalizer once per optimizer step (micro-batch invariant), or use :func:`masked_nll` with
``normalizer=None`` for the per-batch token mean.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def shifted_token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the next-token labels.

    Args:
        logits: ``[B, T, V]`` model outputs over the full sequence.
        labels: ``[B, T]`` token ids aligned with the inputs (``-100`` = no loss).

    Returns:
        ``(logprobs [B, T-1], mask [B, T-1])``: ``log p(labels[:, t+1] | x_{<=t})`` and 1 where the label is
        not ``-100`` (``logprobs`` is 0 there).
    """
    target = labels[:, 1:]
    mask = target.ne(IGNORE_INDEX)
    safe = target.masked_fill(~mask, 0)
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return logprobs * mask, mask.long()


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
    logprobs, mask = shifted_token_logprobs(logits, labels)
    per_token = -logprobs
    if sequence_weights is not None:
        per_token = per_token * sequence_weights.to(per_token.dtype)[:, None]
    num_tokens = mask.sum()
    denominator = num_tokens.clamp(min=1) if normalizer is None else normalizer
    return per_token.sum() / denominator, num_tokens
