"""Text retrieval shared by memory systems and history-grounded agents: dense, BM25 and hybrid scoring.

One small protocol, :class:`Retriever` (``add`` texts, ``scores`` / ``search`` a query), three implementations:

* :class:`DenseRetriever` -- cosine similarity of sentence-encoder embeddings (:mod:`zoo.text.encoders`), exact
  search by default (one matrix product), ``index="faiss"`` for FAISS's flat inner-product index
  (``pip install paperzoo[retrieval]``); both return the same ranking.
* :class:`BM25Retriever` -- Okapi BM25 through the maintained ``bm25s`` library (``k1``, ``b`` exposed); the corpus
  is re-indexed lazily after ``add``.
* :class:`HybridRetriever` -- ``alpha * dense + (1 - alpha) * bm25`` after min-max normalising each score vector over
  the corpus for that query (the usual convex fusion; ``alpha = 1`` is pure dense, ``0`` pure BM25).

``search`` returns at most ``top_k`` ``(index, score)`` pairs sorted by score (descending), ties broken by the lower
index, so results are deterministic. Indices are insertion positions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from zoo.errors import ConfigError
from zoo.text.encoders import SentenceEncoder

_TOKEN = re.compile(r"\w+")


def word_tokens(text: str) -> list[str]:
    """Lower-cased word tokens (``\\w+``; single characters and digits kept) -- BM25's tokenizer."""
    return _TOKEN.findall(text.lower())


def rank_top_k(scores: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` best ``(index, score)`` pairs of a 1-D score vector: descending score, ties by lower index."""
    if k < 0:
        raise ConfigError(f"top_k must be >= 0, got {k}")
    if scores.numel() == 0 or k == 0:
        return []
    order = sorted(range(scores.numel()), key=lambda i: (-float(scores[i]), i))[:k]
    return [(i, float(scores[i])) for i in order]


@runtime_checkable
class Retriever(Protocol):
    """Scores a query against every stored text."""

    def add(self, texts: Sequence[str]) -> None:
        """Append texts; their indices continue from ``len(self)``."""
        ...

    def __len__(self) -> int: ...

    def scores(self, query: str) -> torch.Tensor:
        """float32 ``[len(self)]``: the query's score against every stored text (higher is better)."""
        ...

    def search(self, query: str, top_k: int) -> list[tuple[int, float]]:
        """At most ``top_k`` ``(index, score)`` pairs, best first, ties by lower index."""
        ...


class _SearchMixin:
    def search(self, query: str, top_k: int) -> list[tuple[int, float]]:
        return rank_top_k(self.scores(query), top_k)  # type: ignore[attr-defined]


class DenseRetriever(_SearchMixin):
    """Cosine similarity between encoder embeddings.

    Args:
        encoder: any :class:`~zoo.text.encoders.SentenceEncoder` (``load_encoder("hashing")``, MiniLM, a local model).
        index: ``"exact"`` (a matrix product over all rows, the default) or ``"faiss"`` (``faiss.IndexFlatIP``:
            the same exact search through FAISS, the interface larger indices plug into).
    """

    def __init__(self, encoder: SentenceEncoder, index: str = "exact") -> None:
        if index not in ("exact", "faiss"):
            raise ConfigError(f"DenseRetriever index must be 'exact' or 'faiss', got {index!r}")
        self.encoder = encoder
        self.index_kind = index
        self._rows = torch.zeros(0, encoder.dim)
        self._faiss = None
        if index == "faiss":
            try:
                import faiss
            except ImportError as err:  # pragma: no cover - depends on the environment
                raise ConfigError(
                    "index='faiss' needs the faiss-cpu package: pip install 'paperzoo[retrieval]'"
                ) from err
            self._faiss = faiss.IndexFlatIP(encoder.dim)

    def __len__(self) -> int:
        return self._rows.shape[0]

    def _embed(self, texts: Sequence[str]) -> torch.Tensor:
        vectors = self.encoder.encode(list(texts)).float()
        if vectors.ndim != 2 or vectors.shape[1] != self.encoder.dim:
            raise ConfigError(
                f"encoder {getattr(self.encoder, 'name', self.encoder)!r} returned shape {tuple(vectors.shape)}, "
                f"but the index holds {self.encoder.dim}-dimensional vectors"
            )
        return torch.nn.functional.normalize(vectors, dim=-1)

    def add(self, texts: Sequence[str]) -> None:
        if not texts:
            return
        vectors = self._embed(texts)
        self._rows = torch.cat([self._rows, vectors])
        if self._faiss is not None:
            self._faiss.add(vectors.numpy())

    def add_vectors(self, vectors: torch.Tensor) -> None:
        """Append precomputed embeddings (e.g. from the artifact cache); shape ``[n, dim]``."""
        if vectors.ndim != 2 or vectors.shape[1] != self.encoder.dim:
            raise ConfigError(
                f"vectors of shape {tuple(vectors.shape)} do not match the index dimension {self.encoder.dim}"
            )
        vectors = torch.nn.functional.normalize(vectors.float(), dim=-1)
        self._rows = torch.cat([self._rows, vectors])
        if self._faiss is not None:
            self._faiss.add(vectors.numpy())

    def scores(self, query: str) -> torch.Tensor:
        if len(self) == 0:
            return torch.zeros(0)
        q = self._embed([query])
        if self._faiss is not None:
            distances, ids = self._faiss.search(q.numpy(), len(self))
            out = torch.empty(len(self))
            out[torch.from_numpy(ids[0]).long()] = torch.from_numpy(distances[0]).float()
            return out
        return self._rows @ q[0]


class BM25Retriever(_SearchMixin):
    """Okapi BM25 (Robertson and Zaragoza, 2009) via ``bm25s``; ``k1`` and ``b`` are its usual parameters."""

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._docs: list[list[str]] = []
        self._model = None

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, texts: Sequence[str]) -> None:
        self._docs.extend(word_tokens(t) for t in texts)
        self._model = None

    def scores(self, query: str) -> torch.Tensor:
        if not self._docs:
            return torch.zeros(0)
        if self._model is None:
            try:
                import bm25s
            except ImportError as err:  # pragma: no cover - depends on the environment
                raise ConfigError("BM25 retrieval needs the bm25s package: pip install 'paperzoo[retrieval]'") from err
            # bm25s sets its logger to DEBUG on import and logs every index build; memory systems re-index often
            logging.getLogger("bm25s").setLevel(logging.WARNING)

            self._model = bm25s.BM25(k1=self.k1, b=self.b)
            self._model.index(self._docs, show_progress=False)
        tokens = [t for t in word_tokens(query) if t in self._model.vocab_dict]
        if not tokens:
            return torch.zeros(len(self._docs))
        return torch.as_tensor(self._model.get_scores(tokens), dtype=torch.float32)


def _min_max(scores: torch.Tensor) -> torch.Tensor:
    span = scores.max() - scores.min()
    return torch.zeros_like(scores) if span <= 0 else (scores - scores.min()) / span


class HybridRetriever(_SearchMixin):
    """Convex fusion ``alpha * minmax(dense) + (1 - alpha) * minmax(bm25)`` over the same stored texts."""

    def __init__(self, dense: DenseRetriever, bm25: BM25Retriever | None = None, alpha: float = 0.5) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"hybrid alpha must be in [0, 1], got {alpha}")
        self.dense, self.bm25, self.alpha = dense, bm25 or BM25Retriever(), alpha

    def __len__(self) -> int:
        return len(self.dense)

    def add(self, texts: Sequence[str]) -> None:
        self.dense.add(texts)
        self.bm25.add(texts)

    def scores(self, query: str) -> torch.Tensor:
        if len(self) == 0:
            return torch.zeros(0)
        return self.alpha * _min_max(self.dense.scores(query)) + (1 - self.alpha) * _min_max(self.bm25.scores(query))


def build_retriever(kind: str, encoder: SentenceEncoder | None = None, *, alpha: float = 0.5) -> Retriever:
    """One spec for configs: ``"cosine"`` / ``"faiss"`` (dense; need ``encoder``), ``"bm25"``, ``"hybrid"``."""
    if kind == "bm25":
        return BM25Retriever()
    if kind not in ("cosine", "faiss", "hybrid"):
        raise ConfigError(f"unknown retriever {kind!r}; choose one of cosine, faiss, bm25, hybrid")
    if encoder is None:
        raise ConfigError(f"retriever {kind!r} needs a sentence encoder (e.g. load_encoder('hashing'))")
    dense = DenseRetriever(encoder, index="faiss" if kind == "faiss" else "exact")
    return HybridRetriever(dense, alpha=alpha) if kind == "hybrid" else dense
