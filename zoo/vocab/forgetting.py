"""Forgetting on old-only contexts: how far a model's next-token predictions moved from the base model's.

"No forgetting" in the Markov-matrix reading of arXiv 2605.04308 means the old ``T x T`` transition block is
preserved. On a real LM the state is the whole context, so it is measured on held-out contexts that contain old
tokens only, at every position.
"""

from __future__ import annotations

import torch
from torch import Tensor


def forgetting_metrics(reference_logits: Tensor, logits: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
    """Compare a model's logits with the base model's on old-only contexts.

    Args:
        reference_logits: ``[N, T, V]`` the base model's logits (old vocabulary ``V``).
        logits: ``[N, T, V']`` the current model's logits, ``V' >= V`` (new output rows are the last ``V' - V``
            columns; masked new logits are ``-inf``).
        mask: ``[N, T]`` positions to compare (e.g. the attention mask); ``None``: all.

    Returns:
        ``max_abs_logit_diff``: ``max |logits[..., :V] - reference|`` over compared positions and old tokens;
        ``kl_mean`` / ``kl_max``: ``KL(p_ref || p)`` per position, ``p_ref = softmax(reference)`` over ``V`` and
        ``p = softmax(logits)`` over all ``V'`` columns (so mass moved to new tokens counts as forgetting);
        ``new_token_mass``: mean probability ``p`` puts on the new tokens. Float64 scalars; all exactly 0 when
        the old logits are bit-identical and there are no (or only masked) new columns.
    """
    vocab = reference_logits.shape[-1]
    if logits.shape[:-1] != reference_logits.shape[:-1] or logits.shape[-1] < vocab:
        raise ValueError(f"logits {tuple(logits.shape)} do not extend reference logits {tuple(reference_logits.shape)}")
    if mask is None:
        mask = torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    mask = mask.bool()
    ref = reference_logits[mask].double()  # [P, V]
    cur = logits[mask].double()  # [P, V']
    if ref.shape[0] == 0:
        raise ValueError("no positions to compare (the mask is empty)")
    log_ref = torch.log_softmax(ref, dim=-1)
    log_cur = torch.log_softmax(cur, dim=-1)
    kl = (log_ref.exp() * (log_ref - log_cur[:, :vocab])).sum(-1)
    return {
        "max_abs_logit_diff": (cur[:, :vocab] - ref).abs().max(),
        "kl_mean": kl.mean(),
        "kl_max": kl.max(),
        "new_token_mass": log_cur[:, vocab:].exp().sum(-1).mean(),
    }


__all__ = ["forgetting_metrics"]
