"""Negatives and a common margin budget for comparing sentence watermarks: multi-topic grammar texts, real human
sentences of the Python docs, the calibration / reported split of negatives, and the margin that rejects a given
fraction of held-out domain sentences (the same units for every partition)."""

from __future__ import annotations

import pytest
import torch
from wm_helpers import GRAMMAR

from zoo.errors import ConfigError, DataError
from zoo.text.human import python_docs_sentences, python_docs_texts
from zoo.watermark import (
    HashingEncoder,
    KMeansPartitioner,
    LSHPartitioner,
    SchemeSpec,
    SemanticWatermarkDecoder,
    domain_corpus,
    split_sentences,
)
from zoo.watermark.evaluation import human_texts, split_negatives
from zoo.watermark.fitting import margin_at_rejection

ENCODER = HashingEncoder(64)


def _topics(text: str) -> list[str | None]:
    return [GRAMMAR.topic_of(s) for s in split_sentences(text)]


def test_mixed_texts_change_topic_between_sentences_where_one_topic_texts_never_do():
    mixed = [GRAMMAR.mixed_text(10, seed=s) for s in range(30)]
    one = [GRAMMAR.text(10, seed=s) for s in range(30)]
    assert all(len(split_sentences(t)) == 10 for t in mixed)
    assert mixed[0] == GRAMMAR.mixed_text(10, seed=0) != mixed[1]

    def switch_rate(texts: list[str]) -> float:
        switches = [a != b for t in texts for a, b in zip(_topics(t), _topics(t)[1:])]
        return sum(switches) / len(switches)

    # a topic drawn uniformly from 6 for every sentence changes 5 times in 6; topic_of reads the topic from words
    # (a few are shared by two topics), so one-topic texts show a few spurious switches
    assert 0.7 < switch_rate(mixed) < 0.95
    assert switch_rate(one) < 0.15


def test_python_docs_sentences_are_real_prose_that_splits_back_one_by_one():
    sentences = python_docs_sentences()
    assert len(sentences) >= 500
    assert "The objects do not need to have the same type." in sentences  # from the Language Reference
    for sentence in sentences:
        assert split_sentences(sentence) == [sentence]
        assert sentence[0].isupper() and 6 <= len(sentence.split()) <= 40
        assert "::" not in sentence and "`" not in sentence
    texts = python_docs_texts(30, 10, seed=1)
    assert all(len(split_sentences(t)) == 10 for t in texts)
    assert len({s for t in texts for s in split_sentences(t)}) == 300  # no sentence twice
    assert texts == python_docs_texts(30, 10, seed=1) != python_docs_texts(30, 10, seed=2)
    with pytest.raises(DataError, match="prose sentences: at most"):
        python_docs_texts(len(sentences), 10)


def test_human_texts_offers_the_mixed_grammar_and_the_python_docs():
    assert human_texts("topics_mixed", 3, 5, seed=7) == [GRAMMAR.mixed_text(5, seed=7 + i) for i in range(3)]
    assert human_texts("python_docs", 4, 6, seed=2) == python_docs_texts(4, 6, seed=2)
    assert human_texts("topics", 2, 4, seed=1) == [GRAMMAR.text(4, seed=1 + i) for i in range(2)]


def test_split_negatives_is_a_seeded_partition_of_the_texts():
    chosen, reported = split_negatives(10, 0.3, seed=4)
    assert len(chosen) == 3 and len(reported) == 7 and sorted(chosen + reported) == list(range(10))
    assert (chosen, reported) == split_negatives(10, 0.3, seed=4)
    assert split_negatives(40, 0.5, seed=1) != split_negatives(40, 0.5, seed=2)
    assert split_negatives(5, 0.0) == (list(range(5)), list(range(5)))  # no split: every text in both roles
    with pytest.raises(ConfigError, match="in \\[0, 1\\)"):
        split_negatives(10, 1.0)
    with pytest.raises(ConfigError, match="leaves no text"):
        split_negatives(2, 0.1)


@pytest.mark.parametrize("partition", [LSHPartitioner(8, seed=0), KMeansPartitioner(8, seed=0)])
@pytest.mark.parametrize("rate", [0.1, 0.3])
def test_margin_at_rejection_rejects_that_fraction_of_the_sentences(partition, rate):
    partition.fit(ENCODER.encode(domain_corpus("topics", 300, seed=0)))
    held = ENCODER.encode(domain_corpus("topics", 400, seed=1))
    margin = margin_at_rejection(partition, held, rate)
    _, margins = partition.assign_with_margin(held)
    assert abs(float((margins < margin).double().mean()) - rate) <= 2 / 400  # ties of the hashing encoder's margins
    assert margin_at_rejection(partition, held, 0.0) == 0.0
    with pytest.raises(ConfigError, match="rejection rate"):
        margin_at_rejection(partition, held, 1.0)


def test_the_decoders_margin_rejection_sets_its_margin_on_held_out_domain_sentences():
    spec = SchemeSpec(encoder="hashing:64", partition={"kind": "kmeans", "corpus_size": 200}, key=3)
    decoder = SemanticWatermarkDecoder(spec, margin=0.5, margin_rejection=0.25)
    assert "at rejection 0.25" in repr(decoder)  # nothing built before first use
    held = spec.heldout_sentences()
    assert held == domain_corpus("topics", 200, seed=1) and held != domain_corpus("topics", 200, seed=0)
    expected = margin_at_rejection(decoder.scheme.partitioner, ENCODER.encode(held), 0.25)
    assert decoder.margin == pytest.approx(expected) and decoder.margin != 0.5
    assert decoder.sampler().margin == decoder.margin == decoder.unwatermarked().margin
    # without margin_rejection the margin is the one given
    assert SemanticWatermarkDecoder(spec, margin=0.5).margin == 0.5
    with pytest.raises(ConfigError, match="margin_rejection must be in"):
        SemanticWatermarkDecoder(decoder.scheme, margin_rejection=0.2)
    with pytest.raises(ConfigError, match="margin_rejection must be in"):
        SemanticWatermarkDecoder(spec, margin_rejection=1.5)


def test_margins_at_one_rejection_rate_are_in_each_partitions_own_units():
    held = ENCODER.encode(domain_corpus("topics", 300, seed=1))
    fitted = [p.fit(ENCODER.encode(domain_corpus("topics", 300))) for p in (LSHPartitioner(8), KMeansPartitioner(8))]
    margins = [margin_at_rejection(p, held, 0.2) for p in fitted]
    assert margins[0] != pytest.approx(margins[1])  # the same budget, different numbers
    for partition, margin in zip(fitted, margins):
        assert torch.isclose(
            (partition.assign_with_margin(held)[1] < margin).double().mean(), torch.tensor(0.2).double(), atol=0.01
        )
