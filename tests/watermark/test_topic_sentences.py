"""The seeded multi-topic sentence grammar (candidate source of the sentence-watermark demo and tests)."""

from __future__ import annotations

import random

import pytest

from zoo.data.topic_sentences import TOPICS, TopicGrammar
from zoo.errors import ConfigError
from zoo.watermark import split_sentences


def test_grammar_is_seeded_and_on_topic():
    grammar = TopicGrammar()
    assert grammar.corpus(50, seed=1) == TopicGrammar().corpus(50, seed=1)
    assert grammar.corpus(50, seed=1) != grammar.corpus(50, seed=2)
    for topic in TOPICS:
        text = grammar.text(6, seed=0, topic=topic)
        assert len(split_sentences(text)) == 6
        assert grammar.topic_of(text) == topic
    corpus = grammar.corpus(300, seed=0)
    assert {grammar.topic_of(s) for s in corpus} == set(TOPICS)
    assert all(s[0].isupper() and s.endswith(".") for s in corpus)
    assert sum("," in s for s in corpus) > 30  # compound sentences exist for clause attacks


def test_proposer_follows_the_context_topic_and_continues_its_stream():
    grammar = TopicGrammar()
    propose = grammar.proposer(seed=3)
    first = propose("The chef baked fresh bread.", 4)
    assert len(first) == 4 and all(grammar.topic_of(s) == "cooking" for s in first)
    assert propose("The chef baked fresh bread.", 4) != first  # one stream, not a restart
    assert grammar.proposer(seed=3)("The chef baked fresh bread.", 4) == first
    # the topic of the last sentence counts
    assert all(grammar.topic_of(s) == "finance" for s in propose("The chef baked fresh bread. Prices rose.", 4))
    drifting = grammar.proposer(seed=3, off_topic=1.0)("The chef baked fresh bread.", 60)
    assert len({grammar.topic_of(s) for s in drifting}) == len(TOPICS)


def test_bad_vocabularies():
    with pytest.raises(ConfigError, match="lacks word lists"):
        TopicGrammar({"empty": {"subjects": ["a"]}})
    with pytest.raises(ConfigError, match="off_topic"):
        TopicGrammar().proposer(0, off_topic=1.5)
    with pytest.raises(ConfigError, match="unknown topic"):
        TopicGrammar().sentence(random.Random(0), "cars")
