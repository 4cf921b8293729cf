"""zoo.text.retrieval: dense (exact and FAISS), BM25 (bm25s) and hybrid scoring with the real encoders."""

from __future__ import annotations

import pytest
import torch

from zoo.errors import ConfigError
from zoo.text.encoders import HashingEncoder, load_encoder
from zoo.text.retrieval import BM25Retriever, DenseRetriever, HybridRetriever, build_retriever, rank_top_k

CORPUS = [
    "bought running shoes size 42 at stridemart",
    "searched for jazz concert tickets downtown",
    "reviewed a python course on learnhub five stars",
    "bought trail running shoes at stridemart",
    "visited the weather page",
]


def test_rank_top_k_sorts_and_breaks_ties_by_index() -> None:
    scores = torch.tensor([0.5, 0.9, 0.5, 0.1])
    best = rank_top_k(scores, 3)
    assert [i for i, _ in best] == [1, 0, 2]
    assert [s for _, s in best] == pytest.approx([0.9, 0.5, 0.5])
    assert rank_top_k(scores, 10)[-1] == (3, pytest.approx(0.1))
    assert rank_top_k(scores, 0) == []


@pytest.mark.parametrize("kind", ["cosine", "faiss", "bm25", "hybrid"])
def test_search_finds_the_matching_rows_best_first(kind: str) -> None:
    retriever = build_retriever(kind, HashingEncoder(dim=256))
    retriever.add(CORPUS[:3])
    retriever.add(CORPUS[3:])  # indices continue after a second add
    hits = retriever.search("running shoes stridemart", top_k=2)
    assert len(hits) == 2
    assert {i for i, _ in hits} == {0, 3}
    assert hits[0][1] >= hits[1][1]
    assert retriever.search("running shoes stridemart", top_k=2) == hits  # deterministic
    assert len(retriever.search("anything", top_k=50)) == len(CORPUS)


def test_faiss_and_exact_give_the_same_scores() -> None:
    encoder = HashingEncoder(dim=128)
    exact, flat = DenseRetriever(encoder), DenseRetriever(encoder, index="faiss")
    for r in (exact, flat):
        r.add(CORPUS)
    torch.testing.assert_close(exact.scores("python course review"), flat.scores("python course review"))


def test_hybrid_alpha_endpoints_are_the_pure_rankings() -> None:
    encoder = HashingEncoder(dim=128)
    query = "jazz tickets"
    pure = {}
    for alpha in (0.0, 1.0):
        hybrid = HybridRetriever(DenseRetriever(encoder), alpha=alpha)
        hybrid.add(CORPUS)
        pure[alpha] = [i for i, _ in hybrid.search(query, top_k=5)]
    bm25 = BM25Retriever()
    bm25.add(CORPUS)
    dense = DenseRetriever(encoder)
    dense.add(CORPUS)
    assert pure[0.0][0] == bm25.search(query, 1)[0][0]
    assert pure[1.0] == [i for i, _ in dense.search(query, 5)]


def test_bm25_unknown_query_words_score_zero() -> None:
    bm25 = BM25Retriever()
    bm25.add(CORPUS)
    assert torch.count_nonzero(bm25.scores("zzzz qqqq")) == 0


def test_minilm_retrieves_a_paraphrase_hashing_cannot() -> None:
    minilm = DenseRetriever(load_encoder("minilm"))
    minilm.add(["purchased sneakers for jogging", "booked a table at an italian restaurant"])
    assert minilm.search("bought running shoes", top_k=1)[0][0] == 0


def test_bad_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown retriever"):
        build_retriever("tfidf", HashingEncoder(dim=8))
    with pytest.raises(ConfigError, match="needs a sentence encoder"):
        build_retriever("cosine")
    with pytest.raises(ConfigError, match="alpha"):
        HybridRetriever(DenseRetriever(HashingEncoder(dim=8)), alpha=1.5)
    dense = DenseRetriever(HashingEncoder(dim=8))
    with pytest.raises(ConfigError, match="dimension 8"):
        dense.add_vectors(torch.ones(2, 16))
