"""Text utilities shared across methods: sentence encoders (:mod:`zoo.text.encoders`)."""

from zoo.text.encoders import (
    MINILM_SPEC,
    HashingEncoder,
    SentenceEncoder,
    SentenceTransformerEncoder,
    load_encoder,
    minilm_encoder,
    minilm_path,
)

__all__ = [
    "MINILM_SPEC",
    "HashingEncoder",
    "SentenceEncoder",
    "SentenceTransformerEncoder",
    "load_encoder",
    "minilm_encoder",
    "minilm_path",
]
