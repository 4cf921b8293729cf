"""Insertion of structure tokens into LLM input embeddings (Cuttlefish, arXiv 2602.02780; notes 4(a)).

- (P1, left half) instruction vector: mean of LLM input embeddings over prompt tokens -> :func:`instruction_embedding`
- (I1) tokens are *inserted* (not replacing) right after the ``<structure>`` placeholder, attention mask 1 for the
  ``k_g`` real tokens, labels -100                                                  -> :func:`insert_structure_tokens`
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from zoo.errors import DataError

IGNORE_INDEX = -100


def instruction_embedding(
    inputs_embeds: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None
) -> Tensor:
    """Eq. (P1): mean of ``inputs_embeds [B, T, H]`` over prompt positions -> ``[B, H]``.

    Prompt positions are attended (``attention_mask == 1``) and, when ``labels`` are given, unsupervised
    (``labels == -100``), as in the official code. These are static (context-free) embeddings and include any
    chat-template tokens (notes 4(f)).
    """
    keep = torch.ones(inputs_embeds.shape[:2], dtype=torch.bool, device=inputs_embeds.device)
    if attention_mask is not None:
        keep &= attention_mask.bool()
    if labels is not None:
        keep &= labels == IGNORE_INDEX
    w = keep[..., None].to(inputs_embeds.dtype)
    return (inputs_embeds * w).sum(1) / w.sum(1).clamp_min(1.0)


@dataclass
class InsertedInputs:
    """Result of :func:`insert_structure_tokens` (all ``[B, L]`` with ``L = T + max_b k_b``).

    Attributes:
        inputs_embeds: ``[B, L, H]``.
        attention_mask: ``[B, L]`` long.
        labels: ``[B, L]`` (``-100`` at inserted and padding positions) or ``None`` if no labels were given.
        position_ids: ``[B, L]`` = cumulative attention mask - 1 (clamped at 0), valid for both padding sides.
        structure_positions: ``[B, max_b k_b]`` long index of each inserted token in the new sequence, -1 if none.
    """

    inputs_embeds: Tensor
    attention_mask: Tensor
    labels: Tensor | None
    position_ids: Tensor
    structure_positions: Tensor


def insert_structure_tokens(
    inputs_embeds: Tensor,
    input_ids: Tensor,
    structure_tokens: Tensor,
    structure_mask: Tensor,
    placeholder_id: int,
    attention_mask: Tensor | None = None,
    labels: Tensor | None = None,
    *,
    padding_side: Literal["right", "left"] = "right",
    on_missing: Literal["error", "prepend"] = "error",
) -> InsertedInputs:
    """Eq. (I1): insert each sample's real structure tokens right after its placeholder token.

    Args:
        inputs_embeds: ``[B, T, H]`` LLM input embeddings of the text (placeholder included).
        input_ids: ``[B, T]`` ids, used to find ``placeholder_id``.
        structure_tokens: ``[B, K, H]`` connector tokens; ``structure_mask [B, K]`` marks the real ones (a variable
            number ``k_b`` per sample).
        attention_mask, labels: ``[B, T]`` (``None``: all ones / no labels).
        padding_side: where the ``max_b k_b - k_b`` extra pad positions of a sample go (``left`` for generation).
        on_missing: a sample without the placeholder raises (default) or gets its tokens prepended before its
            first attended position (the official code's fallback).

    Each sample's real length grows by exactly ``k_b``; inserted positions have attention mask 1 and label -100.
    Raises :class:`~zoo.errors.DataError` naming the batch row when the placeholder count is not one.
    """
    bsz, t, hidden = inputs_embeds.shape
    if structure_tokens.shape[0] != bsz or structure_tokens.shape[-1] != hidden:
        raise ValueError(
            f"structure_tokens {tuple(structure_tokens.shape)} do not match inputs_embeds {tuple(inputs_embeds.shape)}"
        )
    if padding_side not in ("right", "left") or on_missing not in ("error", "prepend"):
        raise ValueError(f"bad padding_side={padding_side!r} or on_missing={on_missing!r}")
    device = inputs_embeds.device
    if attention_mask is None:
        attention_mask = torch.ones(bsz, t, dtype=torch.long, device=device)
    counts = structure_mask.sum(1)
    k_max = int(counts.max()) if bsz else 0
    length = t + k_max
    out_e = inputs_embeds.new_zeros(bsz, length, hidden)
    out_m = attention_mask.new_zeros(bsz, length)
    out_l = None if labels is None else labels.new_full((bsz, length), IGNORE_INDEX)
    struct_pos = torch.full((bsz, k_max), -1, dtype=torch.long, device=device)
    for b in range(bsz):
        hits = ((input_ids[b] == placeholder_id) & attention_mask[b].bool()).nonzero().flatten()
        if hits.numel() == 1:
            at = int(hits[0]) + 1
        elif hits.numel() == 0 and on_missing == "prepend":
            attended = attention_mask[b].nonzero().flatten()
            at = int(attended[0]) if attended.numel() else 0
        else:
            raise DataError(
                f"batch row {b}: expected exactly one <structure> placeholder (id {placeholder_id}) among attended "
                f"tokens, found {hits.numel()}"
            )
        k = int(counts[b])
        toks = structure_tokens[b][structure_mask[b]].to(inputs_embeds.dtype)
        start = length - (t + k) if padding_side == "left" else 0
        sl = slice(start, start + t + k)
        out_e[b, sl] = torch.cat([inputs_embeds[b, :at], toks, inputs_embeds[b, at:]])
        ones = attention_mask.new_ones(k)
        out_m[b, sl] = torch.cat([attention_mask[b, :at], ones, attention_mask[b, at:]])
        if out_l is not None and labels is not None:
            fill = labels.new_full((k,), IGNORE_INDEX)
            out_l[b, sl] = torch.cat([labels[b, :at], fill, labels[b, at:]])
        struct_pos[b, :k] = torch.arange(start + at, start + at + k, device=device)
    position_ids = (out_m.long().cumsum(-1) - 1).clamp_min(0)
    return InsertedInputs(out_e, out_m, out_l, position_ids, struct_pos)
