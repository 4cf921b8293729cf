"""Text utilities shared across methods: sentence encoders (:mod:`zoo.text.encoders`) and retrieval
(:mod:`zoo.text.retrieval`)."""

from zoo.text.encoders import (
    MINILM_SPEC,
    HashingEncoder,
    SentenceEncoder,
    SentenceTransformerEncoder,
    load_encoder,
    minilm_encoder,
    minilm_path,
)
from zoo.text.retrieval import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    Retriever,
    build_retriever,
    rank_top_k,
    word_tokens,
)

__all__ = [
    "MINILM_SPEC",
    "BM25Retriever",
    "DenseRetriever",
    "HashingEncoder",
    "HybridRetriever",
    "Retriever",
    "SentenceEncoder",
    "SentenceTransformerEncoder",
    "build_retriever",
    "load_encoder",
    "minilm_encoder",
    "minilm_path",
    "rank_top_k",
    "word_tokens",
]
