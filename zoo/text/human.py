"""Real human-written English sentences that ship with Python: the prose of the Python Language Reference.

Negatives of a watermark detector should include text that no model wrote. Nothing may be downloaded at run time,
and the only English prose installed on every machine with Python is the standard library's
``pydoc_data.topics`` (the help pages of ``help("assert")`` etc.: sections of the Language Reference and Library
Reference written by the Python documentation authors). :func:`python_docs_sentences` extracts its prose:

* each topic is cut into paragraphs at blank lines; a paragraph with an indented line (code, grammar rules, tables,
  bullet lists) or a heading underline is skipped;
* the remaining paragraphs are cut at whitespace after a terminal mark or a closing quote, before a capital;
* a sentence is kept when it starts with a capital letter, ends with ``.``/``!``/``?`` after a word of 3 letters
  or more (not an abbreviation), has no other sentence end inside, 6 to 40 words and no markup or code
  (``* = < > { } [ ] | ` \\``, ``::``, or a call such as ``f(``), and only its first occurrence (several topics
  repeat paragraphs of others).

The sentences keep the order of the topics and of the text (consecutive sentences are consecutive prose), so
:func:`python_docs_texts` cuts them into texts of consecutive sentences: topic-coherent human text, far from the
grammar domain of :mod:`zoo.text.topics`. The exact sentences depend on the Python version (its documentation
ships with it): 743 with CPython 3.11.7. The sentences are cut here, not with the watermark detector's rule (a
floor above this one); each kept sentence splits back into exactly itself under that rule (tested).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from zoo.errors import ConfigError, DataError

MIN_WORDS, MAX_WORDS = 6, 40
_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_UNDERLINE = re.compile(r"[*=\-~^]+")
_MARKUP = re.compile(r"[*=<>{}\[\]|`\\]|::|\w\(")
_CLOSERS = "\"'\u201d\u2019)\\]}"
# where a paragraph is cut into candidate sentences: whitespace after a terminal mark or a closing quote/bracket,
# before a capital or an opening quote (a piece that does not end in a terminal mark is dropped by the filter)
_SENTENCE_END = re.compile(rf"(?<=[.!?{_CLOSERS}])\s+(?=[A-Z\"\u201c\u2018])")
_INNER_END = re.compile(rf"[.!?\u2026][{_CLOSERS}]*\s")
_LAST_WORD = re.compile(rf"([A-Za-z]+)[{_CLOSERS}]*[.!?][{_CLOSERS}]*$")


def _prose_sentences(body: str) -> list[str]:
    sentences = []
    for paragraph in _BLANK_LINE.split(body):
        lines = [line for line in paragraph.split("\n") if line.strip()]
        if not lines or any(line[:1].isspace() for line in lines) or _UNDERLINE.fullmatch(lines[-1].strip()):
            continue
        for sentence in _SENTENCE_END.split(" ".join(line.strip() for line in lines)):
            words = sentence.split()
            last = _LAST_WORD.search(sentence)
            if (
                MIN_WORDS <= len(words) <= MAX_WORDS
                and sentence[0].isupper()
                and not _INNER_END.search(sentence)
                and last is not None
                and len(last.group(1)) >= 3
                and last.group(1).lower() not in ("etc", "al", "inc", "ltd")
                and not _MARKUP.search(sentence)
            ):
                sentences.append(sentence)
    return sentences


@lru_cache(maxsize=1)
def python_docs_sentences() -> tuple[str, ...]:
    """The prose sentences of ``pydoc_data.topics`` in topic and text order (module docstring)."""
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # some distributions strip the help topics
        raise DataError(f"this Python has no pydoc_data.topics (the Language Reference help pages): {err}") from err
    # several topics repeat a paragraph of another: each sentence is kept once, where it first occurs
    return tuple(dict.fromkeys(s for name in sorted(topics) for s in _prose_sentences(topics[name])))


def python_docs_texts(texts: int, sentences: int, seed: int = 0) -> list[str]:
    """``texts`` texts of ``sentences`` consecutive sentences of :func:`python_docs_sentences` (each sentence used
    once), in an order shuffled by ``seed``; a :class:`~zoo.errors.DataError` when the docs hold too few."""
    if texts < 1 or sentences < 1:
        raise ConfigError(f"python_docs_texts needs texts >= 1 and sentences >= 1, got {texts} and {sentences}")
    pool = python_docs_sentences()
    available = len(pool) // sentences
    if texts > available:
        raise DataError(
            f"the Python docs hold {len(pool)} prose sentences: at most {available} texts of {sentences} sentences, "
            f"asked for {texts}"
        )
    groups = [" ".join(pool[i * sentences : (i + 1) * sentences]) for i in range(available)]
    random.Random(f"python_docs:{seed}").shuffle(groups)
    return groups[:texts]


__all__ = ["python_docs_sentences", "python_docs_texts"]
