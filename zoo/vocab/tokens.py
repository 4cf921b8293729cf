"""Tokenizer side of a vocabulary extension: new token strings get contiguous ids after the model's old ones.

Works with any Hugging Face tokenizer that has ``add_tokens`` (the zoo's character tokenizer, fast BPE/WordPiece
tokenizers). The new tokens are ordinary added tokens (``special_tokens=False`` by default), matched before
pre-tokenization, so ``"a<zork>b"`` encodes to ``[a, <zork>, b]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from zoo.errors import ConfigError

RESERVED_TOKEN = "<|zoo_reserved_{}|>"


def register_new_tokens(
    tokenizer: PreTrainedTokenizerBase,
    tokens: Sequence[str],
    first_id: int | None = None,
    pad_to_first_id: bool = False,
    special: bool = False,
) -> list[int]:
    """Add ``tokens`` to ``tokenizer`` and return their ids, which are contiguous.

    Args:
        tokenizer: modified in place.
        tokens: new token strings (non-empty, distinct, not yet in the vocabulary).
        first_id: the id the first new token must get: the model's number of embedding rows ``V``
            (:attr:`~zoo.vocab.VocabularyExtension.first_new_id`). ``None``: whatever follows the tokenizer.
        pad_to_first_id: when the tokenizer is shorter than the model's embedding (models with padded vocabularies),
            fill the gap with reserved special tokens ``<|zoo_reserved_k|>`` so that the ids line up; otherwise
            such a gap is an error.
        special: add them as special tokens (dropped by ``decode(skip_special_tokens=True)``).

    Raises:
        ConfigError: an empty, duplicated or already known token; a tokenizer longer than ``first_id``, or
            shorter without ``pad_to_first_id``; a token that does not encode to its own single id.
    """
    tokens = list(tokens)
    if not tokens:
        raise ConfigError("no new tokens given")
    vocab = tokenizer.get_vocab()
    for token in tokens:
        if not isinstance(token, str) or not token:
            raise ConfigError(f"new token {token!r} must be a non-empty string")
        if token in vocab:
            raise ConfigError(
                f"new token {token!r} is already in the vocabulary (id {vocab[token]}); pick a new string"
            )
    duplicated = sorted({t for t in tokens if tokens.count(t) > 1})
    if duplicated:
        raise ConfigError(f"new tokens listed more than once: {duplicated}")
    if first_id is not None:
        size = len(tokenizer)
        if size > first_id:
            raise ConfigError(
                f"the tokenizer has {size} tokens but the model {first_id} embedding rows; resize the model (or use "
                "the matching tokenizer) before extending the vocabulary"
            )
        if size < first_id:
            if not pad_to_first_id:
                raise ConfigError(
                    f"the tokenizer has {size} tokens but the model {first_id} embedding rows (a padded vocabulary): "
                    f"new tokens would get ids inside the existing matrix; pass pad_to_first_id=True to reserve ids "
                    f"{size}..{first_id - 1}"
                )
            tokenizer.add_tokens([RESERVED_TOKEN.format(i) for i in range(size, first_id)], special_tokens=True)
    tokenizer.add_tokens(tokens, special_tokens=special)
    ids = [int(i) for i in tokenizer.convert_tokens_to_ids(tokens)]
    start = ids[0] if first_id is None else first_id
    if ids != list(range(start, start + len(tokens))):
        raise ConfigError(f"new tokens got ids {ids}, expected the contiguous ids {start}..{start + len(tokens) - 1}")
    for token, token_id in zip(tokens, ids):
        encoded = tokenizer(token, add_special_tokens=False)["input_ids"]
        if list(encoded) != [token_id]:
            raise ConfigError(f"new token {token!r} encodes to {list(encoded)}, not to its id {token_id}")
    return ids


def dictionary_token_ids(
    tokenizer: PreTrainedTokenizerBase, dictionaries: Sequence[Sequence[str]], num_old_tokens: int | None = None
) -> list[list[int]]:
    """Map dictionaries given as token strings to old token ids.

    Every entry must be one token of the vocabulary (a key of ``tokenizer.get_vocab()``) and, with
    ``num_old_tokens``, an old one (id below it). Raises :class:`ConfigError` naming the dictionary and entry.
    """
    vocab = tokenizer.get_vocab()
    out: list[list[int]] = []
    for j, entries in enumerate(dictionaries):
        if isinstance(entries, str):
            raise ConfigError(f"dictionaries[{j}] = {entries!r} must be a list of token strings, not a string")
        ids = []
        for i, token in enumerate(entries):
            if token not in vocab:
                pieces = tokenizer.tokenize(token) if isinstance(token, str) else "not a string"
                raise ConfigError(
                    f"dictionaries[{j}][{i}] = {token!r} is not a token of the vocabulary (it tokenizes to {pieces})"
                )
            if num_old_tokens is not None and vocab[token] >= num_old_tokens:
                raise ConfigError(f"dictionaries[{j}][{i}] = {token!r} is a new token; dictionaries name old tokens")
            ids.append(int(vocab[token]))
        out.append(ids)
    return out


__all__ = ["RESERVED_TOKEN", "dictionary_token_ids", "register_new_tokens"]
