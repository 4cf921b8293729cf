"""Token-level encoding every floor shares (ground floor, ``docs/architecture.md``): prompt ids, padding and the
tokenizer fingerprint that pre-tokenized data carries.

Plain Python + torch, so that the generation core, method cores and the datamodules tokenize prompts exactly the same
way without importing one another.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from zoo.errors import ConfigError

log = logging.getLogger(__name__)
_EOS_AS_PAD: set[int] = set()


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


def pad_width(values: torch.Tensor, width: int, value: float, side: str) -> torch.Tensor:
    """``values [B, W]`` padded with ``value`` on the ``left`` or ``right`` to ``[B, width]`` (``width >= W``)."""
    missing = width - values.shape[1]
    if missing < 0:
        raise ValueError(f"pad_width: tensor is wider ({values.shape[1]}) than {width}")
    if not missing:
        return values
    pad = torch.full((values.shape[0], missing), value, dtype=values.dtype, device=values.device)
    return torch.cat([pad, values] if side == "left" else [values, pad], dim=1)


def pad_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that pads batches: the tokenizer's pad token, else its EOS token (GPT-2 / Llama-3 style tokenizers have
    no pad token; padding is masked out, so any id works; said once per tokenizer in the log).

    Raises:
        ConfigError: the tokenizer has neither a pad nor an EOS token.
    """
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"the tokenizer {type(tokenizer).__name__} ({tokenizer.name_or_path or 'in memory'}) has neither a pad "
            "token nor an EOS token to pad batches with; set tokenizer.pad_token"
        )
    if id(tokenizer) not in _EOS_AS_PAD:
        _EOS_AS_PAD.add(id(tokenizer))
        log.info(
            "tokenizer %s has no pad token: padding with its EOS token %r (id %d), masked out of attention",
            tokenizer.name_or_path or type(tokenizer).__name__,
            tokenizer.eos_token,
            tokenizer.eos_token_id,
        )
    return int(tokenizer.eos_token_id)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Prompt token ids, with the tokenizer's BOS token first when it has one -- once: a text that already starts
    with it (a prompt rendered by a chat template, e.g. Llama-3's ``<|begin_of_text|>...``) is not given a second."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos = tokenizer.bos_token_id
    if bos is None or (ids and ids[0] == bos):
        return ids
    return [bos, *ids]


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(prompt_ids, attention_mask)``, both ``[B, P]``: :func:`encode_prompt` of every prompt, as the
    datamodules batch prompts for generation."""
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    ids = pad_sequences(encoded, pad_token_id(tokenizer), "left")
    mask = pad_sequences([[1] * len(e) for e in encoded], 0, "left")
    return ids.to(device), mask.to(device)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Short SHA-256 of the tokenizer's vocabulary (every ``token -> id`` pair, added tokens included).

    Token ids written to disk (pre-tokenized rows, ``completion_ids``) carry it, so that data made with one
    tokenizer is never read with another (ids would silently mean other tokens).
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


__all__ = ["encode_prompt", "encode_prompts", "pad_sequences", "pad_token_id", "pad_width", "tokenizer_fingerprint"]
