"""The seeded multi-topic sentence grammar (candidate source of the sentence-watermark demo and tests)."""

from __future__ import annotations

import random

import pytest

from zoo.errors import ConfigError
from zoo.text.topics import TOPICS, TopicGrammar
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


def test_topic_text_rows_are_seeded_on_topic_texts_that_verify_by_topic():
    from zoo.data.topic_sentences import TopicText

    task = TopicText(min_sentences=1, max_sentences=3)
    examples = task.examples(60, seed=0)
    assert [e.as_row() for e in examples] == [e.as_row() for e in TopicText(1, 1, 3).examples(60, seed=0)]
    counts = set()
    grammar = TopicGrammar()
    for example in examples:
        assert len(split_sentences(example.prompt)) == 1
        assert example.completion.startswith(" ") and not example.completion.startswith("  ")
        n = len(split_sentences(example.completion))
        counts.add(n)
        assert example.meta["num_sentences"] == n
        assert example.answer == grammar.topic_of(example.prompt) == grammar.topic_of(example.completion)
        assert task.verify(example.completion, example.answer)
        other = next(t for t in TOPICS if t != example.answer)
        assert not task.verify(grammar.text(2, seed=1, topic=other), example.answer)
    assert counts == {1, 2, 3}
    # with off_topic = 1 later sentences change the subject
    drifting = TopicText(max_sentences=3, off_topic=1.0).examples(60, seed=0)
    assert sum(grammar.topic_of(e.completion) != e.answer for e in drifting) > 20
    assert TopicText().describe()["name"] == "topic_text"


GRAMMAR_TEXT = "The chef baked fresh bread with garlic."


def test_topic_paraphrase_rewrites_the_sentence_and_verifies_up_to_synonyms_and_order():
    from zoo.data.topic_sentences import TopicParaphrase
    from zoo.watermark.paraphrase import PARAPHRASE_PROMPT

    task = TopicParaphrase()
    examples = task.examples(80, seed=0)
    changed = 0
    for example in examples:
        sentence = example.prompt.removeprefix("Paraphrase: ").removesuffix("\n")
        assert example.prompt == PARAPHRASE_PROMPT.format(sentence=sentence)
        assert len(split_sentences(example.completion)) == 1
        assert example.answer == sentence and task.verify(example.completion, sentence)
        assert not task.verify(GRAMMAR_TEXT, sentence)
        changed += example.completion != sentence
    assert changed > 50  # most rows are real rewrites
    assert task.verify("the large town the storm crossed.", "The storm crossed the big city.")
    assert not task.verify("The storm crossed the big city.", "The storm crossed the small city.")
    same = TopicParaphrase(synonym_rate=0.0, reorder_rate=0.0).examples(20, seed=0)
    assert all(e.completion == e.prompt.removeprefix("Paraphrase: ").removesuffix("\n") for e in same)


def test_bad_task_settings():
    from zoo.data.topic_sentences import TopicParaphrase, TopicText

    with pytest.raises(ConfigError, match="min_sentences <= max_sentences"):
        TopicText(min_sentences=3, max_sentences=2)
    with pytest.raises(ConfigError, match="prompt_sentences"):
        TopicText(prompt_sentences=0)
    with pytest.raises(ConfigError, match="off_topic"):
        TopicText(off_topic=2.0)
    with pytest.raises(ConfigError, match="synonym_rate"):
        TopicParaphrase(synonym_rate=-0.1)
