"""Sentence boundaries for sentence-level watermarking: one rule for generation and detection.

SemStamp and MarkLLM split with ``nltk.sent_tokenize``, which needs the ``punkt`` download (research notes
``inference.md`` 0.6); the zoo uses the regex rule below instead. Generation (stop a row at the end of its first
sentence) and detection (split a text into sentences) share it, so a text made of accepted candidates splits back
into exactly those candidates.

The rule: a sentence ends after a run of terminal marks (``.``, ``!``, ``?``, ``…``) and any closing quotes or
brackets, when whitespace follows -- except a run that is a single ``.`` after a known abbreviation (``Dr.``,
``e.g.``) or after a single letter (an initial, ``U.S.``). ``3.5`` does not end a sentence (no whitespace). A blank
line also ends one. At the end of a text a terminal run counts only with ``at_end=True``: a finished text's last
sentence is complete, while a row that is still being generated may be inside ``3.`` of ``3.5``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

TERMINAL_RUN = re.compile(r"(?:[.!?\u2026]+)[\"'\u201d\u2019)\]}]*")
BLANK_LINE = re.compile(r"\n[ \t]*\n")
ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "cf", "fig", "al", "inc", "ltd"}
)
_WORD_BEFORE = re.compile(r"([\w.]+)$")


def _is_boundary(text: str, match: re.Match[str], at_end: bool) -> bool:
    end = match.end()
    if end == len(text):
        followed = at_end
    else:
        followed = text[end].isspace()
    if not followed:
        return False
    if match.group(0) == ".":
        word = _WORD_BEFORE.search(text, 0, match.start())
        if word is not None:
            token = word.group(1).lower().rstrip(".")
            if token in ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
                return False
            # a dotted initialism such as "u.s" (its last piece is a single letter)
            if "." in token and len(token.rsplit(".", 1)[-1]) == 1:
                return False
    return True


def sentence_boundaries(text: str, *, at_end: bool = True) -> list[int]:
    """Character offsets just after each sentence end in ``text`` (closing quotes included), in order."""
    ends = {m.end() for m in TERMINAL_RUN.finditer(text) if _is_boundary(text, m, at_end)}
    ends.update(m.start() for m in BLANK_LINE.finditer(text))
    return sorted(ends)


def split_sentences(text: str) -> list[str]:
    """Split a finished text into sentences (whitespace stripped, empty pieces dropped).

    The last piece is a sentence even without a terminal mark (a text cut at a token budget).
    """
    pieces: list[str] = []
    start = 0
    for end in [*sentence_boundaries(text, at_end=True), len(text)]:
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        start = end
    return pieces


def first_sentence_end(text: str, *, at_end: bool = True) -> int | None:
    """Offset just after the first sentence end of ``text`` (None while no sentence has ended).

    Leading whitespace and a blank line before any words do not end a sentence.
    """
    for end in sentence_boundaries(text, at_end=at_end):
        if text[:end].strip():
            return end
    return None


def first_sentence(text: str, *, at_end: bool = True) -> str:
    """The first sentence of ``text`` (stripped); the whole text when no sentence end occurs."""
    end = first_sentence_end(text, at_end=at_end)
    return (text if end is None else text[:end]).strip()


def sentence_ended(texts: Sequence[str], *, at_end: bool = True) -> torch.Tensor:
    """Per-row stop test for batched sentence sampling: ``[B]`` bool, True where row ``b`` holds a whole sentence.

    Args:
        texts: the text each row has generated since its sentence began.
        at_end: whether a terminal mark at the very end of a row ends its sentence. True stops at the mark
            (one token earlier); False waits for the whitespace after it (no false stop inside ``3.5``; the
            extra character is cut off by :func:`first_sentence`).
    """
    return torch.tensor([first_sentence_end(t, at_end=at_end) is not None for t in texts], dtype=torch.bool)
