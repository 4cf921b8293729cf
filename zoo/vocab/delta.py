"""The delta of a vocabulary extension alone: one small safetensors file (new rows + tokenizer additions).

Layout: the tensors of :meth:`~zoo.vocab.VocabularyExtension.state_dict` (``input.rows`` or
``input.mixing_logits``/``input.dictionary_ids``, ``output.*`` for untied output rows, ``output_bias.*``) and
string metadata: ``format``, ``mode``, ``num_new_tokens``, ``base_vocab_size`` (``V``), ``hidden_size``,
``output_rows``, ``tied_output_rows``, ``dictionaries`` and ``new_tokens`` (JSON), ``base_fingerprint`` (SHA-256 of
the base input embedding, so that a delta is not loaded onto another base model by mistake).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.vocab.extension import VocabularyExtension
from zoo.vocab.tokens import register_new_tokens

DELTA_FORMAT = "zoo.vocab.delta/1"
DELTA_FILE = "vocab_delta.safetensors"


def embedding_fingerprint(weight: Tensor) -> str:
    """SHA-256 of a weight's shape, dtype and bytes (identifies the base model a delta belongs to)."""
    data = weight.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{tuple(data.shape)}|{data.dtype}|".encode())
    digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def delta_path(path: str | Path) -> Path:
    """``path`` itself, or ``path / vocab_delta.safetensors`` when ``path`` is a directory."""
    path = Path(path).expanduser()
    return path / DELTA_FILE if path.is_dir() else path


@dataclass
class Delta:
    """A delta read from disk: ``tensors`` for :meth:`VocabularyExtension.load_state_dict` and its metadata."""

    tensors: dict[str, Tensor]
    mode: str
    num_new_tokens: int
    base_vocab_size: int
    hidden_size: int
    output_rows: bool
    tied_output_rows: bool
    dictionaries: list[list[int]] | None
    new_tokens: list[str] | None
    base_fingerprint: str
    path: Path


def save_delta(extension: VocabularyExtension, path: str | Path, new_tokens: list[str] | None = None) -> Path:
    """Write ``extension``'s new rows (and the new token strings, the tokenizer additions) to ``path``.

    ``path`` may be a directory, existing or a path without a suffix (the file is then ``vocab_delta.safetensors``
    inside it). Returns the file path.
    """
    if new_tokens is not None and len(new_tokens) != extension.num_new_tokens:
        raise ConfigError(f"{len(new_tokens)} token strings for {extension.num_new_tokens} new tokens")
    target = Path(path).expanduser()
    if target.is_dir() or not target.suffix:
        target = target / DELTA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    base_weight = extension.embedding.weight
    metadata = {
        "format": DELTA_FORMAT,
        "mode": extension.mode,
        "num_new_tokens": str(extension.num_new_tokens),
        "base_vocab_size": str(extension.first_new_id),
        "hidden_size": str(extension.embedding.embedding_dim),
        "output_rows": json.dumps(extension.output_rows),
        "tied_output_rows": json.dumps(extension.tied_output_rows),
        "dictionaries": json.dumps(extension.dictionaries),
        "new_tokens": json.dumps(None if new_tokens is None else list(new_tokens)),
        "base_fingerprint": embedding_fingerprint(base_weight),
    }
    tensors = {k: v.detach().cpu().contiguous() for k, v in extension.state_dict().items()}
    save_file(tensors, str(target), metadata=metadata)
    return target


def read_delta(path: str | Path) -> Delta:
    """Read a delta file (or the one in a directory).

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        ConfigError: the file is not a zoo vocabulary delta.
    """
    file = delta_path(path)
    if not file.is_file():
        raise CheckpointNotFoundError(f"no vocabulary delta at {file.resolve()}")
    try:
        with safe_open(str(file), framework="pt") as handle:
            meta: dict[str, Any] = handle.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for a file that is not safetensors
        raise ConfigError(f"{file}: not a safetensors file ({err})") from None
    if meta.get("format") != DELTA_FORMAT:
        raise ConfigError(
            f"{file}: not a vocabulary delta (metadata format={meta.get('format')!r}, expected {DELTA_FORMAT})"
        )
    return Delta(
        tensors=load_file(str(file)),
        mode=meta["mode"],
        num_new_tokens=int(meta["num_new_tokens"]),
        base_vocab_size=int(meta["base_vocab_size"]),
        hidden_size=int(meta["hidden_size"]),
        output_rows=bool(json.loads(meta["output_rows"])),
        tied_output_rows=bool(json.loads(meta["tied_output_rows"])),
        dictionaries=json.loads(meta["dictionaries"]),
        new_tokens=json.loads(meta["new_tokens"]),
        base_fingerprint=meta["base_fingerprint"],
        path=file,
    )


def check_delta_base(delta: Delta, model: nn.Module, check_fingerprint: bool = True) -> None:
    """Raise :class:`ConfigError` when ``delta`` was made for another base model than ``model``."""
    embedding = model.get_input_embeddings()
    rows, width = int(embedding.num_embeddings), int(embedding.embedding_dim)
    if rows != delta.base_vocab_size:
        raise ConfigError(
            f"{delta.path}: made for a base model with {delta.base_vocab_size} tokens, this model has {rows} "
            "(another base model, or one that is already extended)"
        )
    if width != delta.hidden_size:
        raise ConfigError(f"{delta.path}: made for hidden size {delta.hidden_size}, this model has {width}")
    if check_fingerprint and embedding_fingerprint(embedding.weight) != delta.base_fingerprint:
        raise ConfigError(
            f"{delta.path}: made for another base model (its input embedding differs from this model's; same shape). "
            "Load the base it was trained on, or pass check_fingerprint=False to load it anyway"
        )


def apply_delta(
    model: nn.Module,
    path: str | Path,
    tokenizer: PreTrainedTokenizerBase | None = None,
    check_fingerprint: bool = True,
    pad_to_first_id: bool = False,
) -> VocabularyExtension:
    """Extend ``model`` with the delta at ``path`` (and ``tokenizer`` with its token strings); return the extension.

    Loading onto a fresh copy of the base model reproduces the extended model's outputs exactly.

    Raises:
        ConfigError: the delta belongs to another base model (vocabulary size, hidden size or embedding
            fingerprint differ), or ``tokenizer`` is given but the delta has no token strings.
    """
    delta = read_delta(path)
    check_delta_base(delta, model, check_fingerprint)
    if tokenizer is not None and delta.new_tokens is None:
        raise ConfigError(f"{delta.path}: holds no token strings; load it without a tokenizer")
    extension = VocabularyExtension(
        model,
        delta.num_new_tokens,
        delta.dictionaries,
        delta.mode,
        delta.output_rows,
        tie_output_rows=delta.tied_output_rows if delta.output_rows else None,
    )
    try:
        extension.load_state_dict(delta.tensors)
        if tokenizer is not None:
            register_new_tokens(
                tokenizer, delta.new_tokens, first_id=extension.first_new_id, pad_to_first_id=pad_to_first_id
            )
    except Exception:
        extension.remove()
        raise
    return extension


__all__ = [
    "DELTA_FILE",
    "DELTA_FORMAT",
    "Delta",
    "apply_delta",
    "check_delta_base",
    "delta_path",
    "embedding_fingerprint",
    "read_delta",
    "save_delta",
]
