"""Token-level encoding shared by the datamodules and the generation core: prompt ids, padding and the tokenizer
fingerprint that pre-tokenized data carries.

Plain Python + torch (no Lightning), so that :mod:`zoo.generation` can tokenize prompts exactly as the
datamodules do without importing a Lightning layer. ``zoo.datamodules.base`` re-exports these functions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase


def pad_sequences(seqs: Sequence[Sequence[int]], pad_value: int, side: str = "right") -> torch.Tensor:
    """Pad lists of ints to a ``[B, max_len]`` long tensor on the given side (``right`` or ``left``)."""
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), pad_value, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            if side == "right":
                out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
            else:
                out[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
    return out


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Prompt token ids, with the tokenizer's BOS token first when it has one."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + list(ids)


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(prompt_ids, attention_mask)``, both ``[B, P]``: :func:`encode_prompt` of every prompt, as the
    datamodules batch prompts for generation."""
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    ids = pad_sequences(encoded, tokenizer.pad_token_id, "left")
    mask = pad_sequences([[1] * len(e) for e in encoded], 0, "left")
    return ids.to(device), mask.to(device)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Short SHA-256 of the tokenizer's vocabulary (every ``token -> id`` pair, added tokens included).

    Token ids written to disk (pre-tokenized rows, ``completion_ids``) carry it, so that data made with one
    tokenizer is never read with another (ids would silently mean other tokens).
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


__all__ = ["encode_prompt", "encode_prompts", "pad_sequences", "tokenizer_fingerprint"]
