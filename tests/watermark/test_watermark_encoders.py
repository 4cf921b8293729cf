"""Sentence encoders: the hashing bag of words, encoder specs, and the real MiniLM from its installed files."""

from __future__ import annotations

import os

import pytest
import torch
from wm_helpers import GRAMMAR

from zoo.errors import ConfigError
from zoo.watermark import (
    BalancedPartitioner,
    HashingEncoder,
    SentenceEncoder,
    WatermarkScheme,
    detect,
    load_encoder,
    load_partitioner,
    minilm_encoder,
    minilm_path,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def test_hashing_encoder_is_a_deterministic_bag_of_words():
    enc = HashingEncoder(64)
    assert isinstance(enc, SentenceEncoder)
    sentences = ["The cat sat on the mat.", "the MAT, the cat sat on!", "A dog ran."]
    a = enc.encode(sentences)
    assert a.shape == (3, 64) and a.dtype == torch.float32
    assert torch.equal(a[0], a[1])  # same words, case and punctuation ignored
    assert torch.equal(
        a, HashingEncoder(64).encode(["The cat sat on the mat.", "the MAT, the cat sat on!", "A dog ran."])
    )
    assert not torch.equal(a, HashingEncoder(64, seed=1).encode(["The cat sat on the mat.", "x", "A dog ran."]))
    assert float(a[0].abs().sum()) == 6  # six words, +-1 each (no collision among them here)
    assert float(enc.encode([""]).abs().sum()) == 1  # never the zero vector
    bigrams = HashingEncoder(64, bigrams=True).encode(["the cat sat", "sat cat the"])
    assert not torch.equal(bigrams[0], bigrams[1])


def test_encoder_specs():
    assert load_encoder("hashing").dim == 256
    enc = load_encoder("hashing:32:5:1")
    assert (enc.dim, enc.seed, enc.bigrams) == (32, 5, True)
    assert load_encoder(enc.name).encode(["a b"]).equal(enc.encode(["a b"]))
    with pytest.raises(ConfigError, match="neither 'minilm'"):
        load_encoder("/no/such/encoder/dir")
    with pytest.raises(ConfigError, match="hashing:<dim>"):
        load_encoder("hashing:big")
    with pytest.raises(ConfigError, match="dim must be >= 2"):
        HashingEncoder(1)


def test_sentence_transformer_dir_must_look_like_one(tmp_path):
    with pytest.raises(ConfigError, match="no modules.json"):
        load_encoder(str(tmp_path))


def test_real_minilm_encoder_partition_and_detection(tmp_path):
    """The installed all-MiniLM-L6-v2 (local files, no hub): semantics, a fitted X-Guard partition saved with the
    encoder spec, and detection through the saved files."""
    assert (minilm_path() / "modules.json").is_file()
    enc = minilm_encoder()
    assert enc.dim == 384 and enc.name == "minilm"
    e = enc.encode(["The team won the final game.", "The squad won the last match.", "The chef baked fresh bread."])
    assert e.shape == (3, 384) and torch.allclose(e.norm(dim=1), torch.ones(3), atol=1e-5)
    assert cosine(e[0], e[1]) > cosine(e[0], e[2]) + 0.2  # a paraphrase is closer than another topic
    assert torch.allclose(enc.encode(["The team won the final game."])[0], e[0], atol=1e-6)

    corpus = GRAMMAR.corpus(48, seed=0)
    embeddings = enc.encode(corpus)
    partition = BalancedPartitioner(4, seed=0, subspace_dim=2).fit(embeddings)
    counts = torch.bincount(partition.assign(embeddings), minlength=4)
    assert (counts - 12).abs().max() <= 1
    assert torch.equal(partition.assign(embeddings * 3.0), partition.assign(embeddings))
    path = partition.save(tmp_path / "minilm_xguard", encoder=enc.name)
    loaded, spec = load_partitioner(path)
    assert spec == "minilm"
    scheme = WatermarkScheme(enc, loaded, key=3, gamma=0.5)
    text = " ".join(corpus[:6])
    result = detect(text, scheme)
    assert result.regions == partition.assign(embeddings[:6]).tolist()
    assert result.num_scored == 5


def test_hashing_encoder_never_returns_zero_when_words_cancel():
    """Two words hashed to one bucket with opposite signs cancel; the sentence still gets a nonzero vector (the
    empty-sentence bucket), so the partitioners can place it."""
    enc = HashingEncoder(4)
    words = [f"w{i}" for i in range(40)]
    buckets = {w: enc._bucket(w) for w in words}
    a, b = next(
        (a, b) for a in words for b in words if buckets[a][0] == buckets[b][0] and buckets[a][1] != buckets[b][1]
    )
    cancelled, empty = enc.encode([f"{a} {b}", ""])
    assert cancelled.abs().sum() > 0
    assert torch.equal(cancelled, empty)
    one = enc.encode([a])[0]  # a single word is unchanged: its own bucket only
    assert float(one.abs().sum()) == 1 and one[buckets[a][0]] == buckets[a][1]
