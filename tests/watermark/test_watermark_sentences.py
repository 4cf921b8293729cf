"""Sentence boundaries shared by generation (per-row stop) and detection (split)."""

from __future__ import annotations

import pytest
import torch

from zoo.watermark import first_sentence, first_sentence_end, sentence_ended, split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three?", ["One.", "Two!", "Three?"]),
        ("Dr. Smith met Mr. Jones. They talked.", ["Dr. Smith met Mr. Jones.", "They talked."]),
        ("It costs 3.5 dollars. Cheap.", ["It costs 3.5 dollars.", "Cheap."]),
        ("The U.S. Army left. Then rain.", ["The U.S. Army left.", "Then rain."]),
        ('He said "stop." She left.', ['He said "stop."', "She left."]),
        ("Wait... what? Yes", ["Wait...", "what?", "Yes"]),
        ("first para\n\nsecond para.", ["first para", "second para."]),
        ("e.g. this one. lower start.", ["e.g. this one.", "lower start."]),
        ("", []),
        ("   ", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_text_of_first_sentences_splits_back_into_them():
    raw = ["The cat sat. And more", "Prices rose 3.5 percent! extra", "Dr. Who arrived?  ", "No end here"]
    sentences = [first_sentence(r) for r in raw]
    assert sentences == ["The cat sat.", "Prices rose 3.5 percent!", "Dr. Who arrived?", "No end here"]
    assert split_sentences(" ".join(sentences)) == sentences


def test_first_sentence_end_and_per_row_stop():
    assert first_sentence_end("It is 3.") == len("It is 3.")
    assert first_sentence_end("It is 3.", at_end=False) is None  # could still become 3.5
    assert first_sentence_end("It is 3.5 now. Next") == len("It is 3.5 now.")
    assert first_sentence_end("  \n\n Hello") is None
    stop = sentence_ended(["Hello there.", "Hello", "Hi! x", "Mr. X"], at_end=False)
    assert stop.dtype == torch.bool
    assert stop.tolist() == [False, False, True, False]
    assert sentence_ended(["Hello there.", "Hello"]).tolist() == [True, False]
