"""Special-token names every floor shares (ground floor, ``docs/architecture.md``).

The zoo's completion format (``<think>steps</think>ANSWER<eos>``, :mod:`zoo.answers`) and the character-level
tokenizer (:mod:`zoo.backbones.tokenizer`) use these strings; decoders, rewards and tasks read them from here, so that
none of them imports the backbone that builds a tokenizer.
"""

from __future__ import annotations

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
BASE_SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, THINK_OPEN, THINK_CLOSE, UNK)

__all__ = ["BASE_SPECIAL_TOKENS", "BOS", "EOS", "PAD", "THINK_CLOSE", "THINK_OPEN", "UNK"]
