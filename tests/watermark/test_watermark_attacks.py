"""Attacks: deterministic given (seed, text), doing what their names say; the paraphrase interface."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from wm_helpers import GRAMMAR

from zoo.errors import ConfigError, DataError
from zoo.watermark import (
    ClauseReorder,
    Paraphrase,
    SentenceMerge,
    SentenceSplit,
    SynonymSubstitution,
    split_sentences,
)
from zoo.watermark.attacks import DEFAULT_SYNONYMS

TEXT = GRAMMAR.text(12, seed=4)


def words(text: str) -> Counter:
    return Counter(re.findall(r"[a-z]+", text.lower()))


@pytest.mark.parametrize("attack_type", [SynonymSubstitution, ClauseReorder, SentenceMerge, SentenceSplit])
def test_attacks_are_deterministic_and_seeded(attack_type):
    outputs = [attack_type(rate=0.5, seed=seed)(TEXT) for seed in range(6)]
    assert outputs == [attack_type(rate=0.5, seed=seed)(TEXT) for seed in range(6)]
    assert len(set(outputs)) >= 3  # the seed matters
    assert attack_type(rate=1.0, seed=0)(TEXT) != TEXT
    assert attack_type(rate=0.0, seed=1)(TEXT) == " ".join(split_sentences(TEXT))


def test_synonym_substitution_only_swaps_table_words():
    attacked = SynonymSubstitution(rate=1.0, seed=0)(TEXT)
    before, after = words(TEXT), words(attacked)
    table_words = {w for options in DEFAULT_SYNONYMS.values() for o in options for w in o.split()}
    assert any(w in DEFAULT_SYNONYMS for w in before)
    # words outside the table stay, table words are replaced by table synonyms
    assert all(after[w] >= c for w, c in before.items() if w not in DEFAULT_SYNONYMS and w not in table_words)
    assert set(after) <= set(before) | table_words
    assert sum((before - after).values()) >= 10
    custom = SynonymSubstitution(rate=1.0, synonyms={"Chef": ["cook"]})("The chef smiled. CHEF!")
    assert custom == "The cook smiled. COOK!"


def test_clause_reorder_keeps_the_words_and_sentences():
    sentence = "The market fell, and investors sold new bonds."
    assert ClauseReorder()(sentence) == "Investors sold new bonds, and the market fell."
    assert ClauseReorder()("Prices rose because the bank cut rates.") == "Because the bank cut rates, prices rose."
    assert ClauseReorder()("No clause here.") == "No clause here."
    attacked = ClauseReorder(rate=1.0)(TEXT)
    assert words(attacked) == words(TEXT)
    assert len(split_sentences(attacked)) == len(split_sentences(TEXT))


def test_merge_and_split_change_sentence_boundaries():
    assert SentenceMerge()("The rain fell. The road flooded.") == "The rain fell, and the road flooded."
    assert SentenceSplit()("The rain fell, and the road flooded.") == "The rain fell. The road flooded."
    assert SentenceSplit()("The rain fell, but the road held.") == "The rain fell. But the road held."
    n = len(split_sentences(TEXT))
    assert len(split_sentences(SentenceMerge(rate=1.0)(TEXT))) == (n + 1) // 2
    split = SentenceSplit(rate=1.0)(TEXT)
    compound = sum("," in s for s in split_sentences(TEXT))
    assert compound > 0 and len(split_sentences(split)) == n + compound


def test_paraphrase_calls_the_second_generator():
    calls = []

    def upper_first_word(batch: list[str]) -> list[str]:
        calls.append(list(batch))
        return [s.replace("The ", "A ", 1) for s in batch]

    out = Paraphrase(upper_first_word)("The rain fell. The road flooded.")
    assert out == "A rain fell. A road flooded." and calls == [["The rain fell.", "The road flooded."]]
    whole = Paraphrase(upper_first_word, per_sentence=False)("The rain fell. The road flooded.")
    assert whole == "A rain fell. The road flooded." and calls[-1] == ["The rain fell. The road flooded."]
    with pytest.raises(DataError, match="one string per input"):
        Paraphrase(lambda batch: batch[:1])("One. Two.")
    with pytest.raises(ConfigError, match="callable"):
        Paraphrase("t5-paraphraser")
    with pytest.raises(ConfigError, match="rate"):
        SentenceMerge(rate=2.0)
