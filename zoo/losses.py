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

from zoo.errors import ConfigError

IGNORE_INDEX = -100

#: Largest number of half-precision logits upcast to float32 at once by :func:`masked_token_logprobs` (64M: 256 MiB).
UPCAST_BLOCK_ELEMENTS = 1 << 26


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
    logits: Tensor,
    labels: Tensor,
    *,
    shift: bool = True,
    ignore_index: int = IGNORE_INDEX,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Log-probability of each label token, ``log softmax(logits / temperature)[label]``, with ignored positions set
    to 0.

    Computed as ``logit[label] - logsumexp(logits)`` (no ``[B, T, V]`` log-softmax copy); half-precision
    logits are upcast to float32 in blocks of rows of at most :data:`UPCAST_BLOCK_ELEMENTS` logits, and the
    temperature divides the float32 values (after the upcast, as the sampler divides its float32 logits: dividing
    bf16 logits first rounds them to bf16 again).

    Args:
        logits: ``[B, T, V]``.
        labels: ``[B, T]`` token ids, ``ignore_index`` where no loss is taken.
        shift: Hugging Face convention (see module docstring); outputs are ``[B, T - 1]`` when True.
        temperature: the sampling temperature of the distribution scored (``1``: the model's own).

    Returns:
        ``(logp, mask)``: ``logp [B, T']`` float (0 at masked positions) and ``mask [B, T']`` bool.
    """
    logits, labels = _align(logits, labels, shift)
    mask = labels != ignore_index
    safe = labels.masked_fill(~mask, 0).long()
    scaled = float(temperature) != 1.0
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1).float()
    if scaled:
        picked = picked / temperature
    if logits.dtype in (torch.float16, torch.bfloat16):
        block = max(1, UPCAST_BLOCK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
        parts = (part.float() / temperature if scaled else part.float() for part in logits.split(block))
        normalizer = torch.cat([torch.logsumexp(part, dim=-1) for part in parts])
    else:
        normalizer = torch.logsumexp(logits / temperature if scaled else logits, dim=-1)
    logp = picked - normalizer
    return logp.masked_fill(~mask, 0.0), mask


def masked_sequence_logprobs(
    logits: Tensor, labels: Tensor, *, shift: bool = True, ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """``log p(sequence)`` over its labelled positions: ``sum_t m_t log p_t``, ``[B]`` (0 for a row with no label).

    The per-side term of DPO-style pair losses (span masks are just other labels). Same alignment as
    :func:`masked_token_logprobs`.
    """
    return masked_token_logprobs(logits, labels, shift=shift, ignore_index=ignore_index)[0].sum(dim=-1)


def masked_token_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    shift: bool = True,
    ignore_index: int = IGNORE_INDEX,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Entropy ``H_t = -sum_v p_t(v) log p_t(v)`` of the predictive distribution ``p = softmax(logits /
    temperature)`` (temperature applied to the float32 values) at every labelled position.

    Same alignment as :func:`masked_token_logprobs`. Returns ``(entropy [B, T'], mask [B, T'])`` with
    entropy 0 at masked positions. Uniform logits over ``V`` give ``log V``; one-hot-like logits give ~0.
    Only the labelled positions are computed (a float32 ``[n_labelled, V]`` copy, not ``[B, T', V]``).
    """
    logits, labels = _align(logits, labels, shift)
    mask = labels != ignore_index
    logp = torch.log_softmax(logits[mask].float() / float(temperature), dim=-1)
    entropy = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
    entropy[mask] = -(logp.exp() * logp).sum(-1)
    return entropy, mask


def masked_token_logprobs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    shift: bool = True,
    ignore_index: int = IGNORE_INDEX,
    with_entropy: bool = True,
    temperature: float = 1.0,
    block_elements: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`masked_token_logprobs` and the summed entropy :func:`masked_token_entropy` of the labelled positions in
    one pass over the logits, chunked over the sequence.

    The sequence is cut into column blocks of at most ``block_elements`` logits (default
    :data:`UPCAST_BLOCK_ELEMENTS`); per block the logits are upcast once, their ``logsumexp`` gives the log-probs
    (``logit[label] - logsumexp``, with gradient) and, without gradient, ``H_t = sum_v entr(softmax(z_t)_v)`` (0 for
    a ``-inf`` logit), weighted by the label mask (no host synchronisation). The float32 workspace is a few blocks,
    instead of several ``[n_labelled, V]`` copies (about 2.5 GB for 1k labelled tokens at V = 152k).

    ``temperature`` divides the float32 values after the upcast (as :func:`masked_token_logprobs` does).

    Returns:
        ``(logp [B, T'], mask [B, T'], entropy_sum)``; ``entropy_sum`` is a detached scalar (``None`` without
        ``with_entropy``). Same alignment as :func:`masked_token_logprobs`.
    """
    logits, labels = _align(logits, labels, shift)
    mask = labels != ignore_index
    safe = labels.masked_fill(~mask, 0).long()
    scaled = float(temperature) != 1.0
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1).float()
    if scaled:
        picked = picked / temperature
    budget = UPCAST_BLOCK_ELEMENTS if block_elements is None else int(block_elements)
    columns = max(1, budget // max(1, logits.shape[0] * logits.shape[2]))
    normalizers: list[Tensor] = []
    entropy = torch.zeros((), dtype=torch.float32, device=logits.device) if with_entropy else None
    for part, part_mask in zip(logits.split(columns, dim=1), mask.split(columns, dim=1)):
        upcast = part.float() / temperature if scaled else part.float()
        normalizers.append(torch.logsumexp(upcast, dim=-1))
        if with_entropy:  # no host sync: unlabelled positions are computed and weighted 0
            with torch.no_grad():
                per_position = torch.special.entr(torch.softmax(upcast.detach(), dim=-1)).sum(-1)
                entropy = entropy + (per_position * part_mask).sum()
    logp = picked - torch.cat(normalizers, dim=1)
    return logp.masked_fill(~mask, 0.0), mask, entropy


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is true (0 where nothing is selected)."""
    m = mask.to(values.dtype)
    if dim is None:
        return (values * m).sum() / m.sum().clamp(min=1.0)
    return (values * m).sum(dim) / m.sum(dim).clamp(min=1.0)


#: Per-sequence reductions of the token NLL (``module.sample_reduction`` of the SFT family).
SAMPLE_REDUCTIONS: tuple[str, ...] = ("token_sum", "token_mean")

#: Batch normalizations of the weighted per-sequence losses (``module.normalizer`` of the SFT family).
NLL_NORMALIZERS: tuple[str, ...] = ("tokens", "sequences", "self_normalised")


def masked_nll(
    logits: torch.Tensor,
    labels: torch.Tensor,
    sequence_weights: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
    *,
    sample_reduction: str = "token_sum",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted masked negative log-likelihood ``sum_i w_i l_i / normalizer``.

    ``l_i`` is the loss of sequence ``i`` over its labelled positions ``m_it`` (labels ``!= -100``):

    - ``token_sum``: ``l_i = sum_t m_it (-log p_it)``;
    - ``token_mean``: ``l_i = sum_t m_it (-log p_it) / n_i`` with ``n_i = sum_t m_it`` (DRIFT's per-sample mean
      token CE; a sequence with no labelled token contributes 0).

    Args:
        logits: ``[B, T, V]``; labels: ``[B, T]`` (``-100`` = no loss).
        sequence_weights: ``[B]`` per-sequence weights (weighted SFT); ``None`` = 1. Weights of exactly 1 give
            bit-identical results to ``None``.
        normalizer: divisor fixed by the caller (e.g. the token count of the whole optimizer step, or see
            :func:`nll_normalizer`); ``None`` = number of loss tokens in this batch.
        sample_reduction: ``token_sum`` | ``token_mean`` (see above).

    Returns:
        ``(loss, num_tokens)``.
    """
    if sample_reduction not in SAMPLE_REDUCTIONS:
        raise ConfigError(f"sample_reduction must be one of {SAMPLE_REDUCTIONS}, got {sample_reduction!r}")
    logprobs, mask = masked_token_logprobs(logits, labels)
    per_token = -logprobs
    if sample_reduction == "token_mean":
        per_token = per_token / mask.sum(dim=-1, keepdim=True).clamp(min=1).to(per_token.dtype)
    if sequence_weights is not None:
        per_token = per_token * sequence_weights.to(per_token.dtype)[:, None]
    num_tokens = mask.sum()
    denominator = num_tokens.clamp(min=1) if normalizer is None else normalizer
    return per_token.sum() / denominator, num_tokens


def nll_normalizer(
    mode: str, batch_size: int, sequence_weights: torch.Tensor | None = None
) -> float | torch.Tensor | None:
    """The divisor ``N`` of :func:`masked_nll` for a batch normalization mode:

    - ``tokens``: ``None``, i.e. the number of labelled tokens in the batch, ``N = sum_i n_i``;
    - ``sequences``: ``N = B`` (the batch size), so the loss is ``sum_i w_i l_i / B``;
    - ``self_normalised``: ``N = sum_i w_i`` (``B`` without weights; 1 when every weight is 0, so such a batch
      has loss 0), so the loss is the weighted mean ``sum_i w_i l_i / sum_i w_i``.

    Raises:
        ConfigError: an unknown mode.
    """
    if mode == "tokens":
        return None
    if mode == "sequences" or (mode == "self_normalised" and sequence_weights is None):
        return float(batch_size)
    if mode == "self_normalised":
        total = sequence_weights.sum()
        return torch.where(total > 0, total, torch.ones_like(total))
    raise ConfigError(f"the NLL normalizer must be one of {NLL_NORMALIZERS}, got {mode!r}")
