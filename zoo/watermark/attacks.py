"""Attacks on watermarked text, for robustness evaluation: each is a callable ``text -> text``.

Deterministic given ``(seed, text)``: every call draws from ``random.Random("<attack>:<seed>:<text>")`` (string
seeds hash with SHA-512, independent of ``PYTHONHASHSEED``).

* :class:`SynonymSubstitution` -- replace a fraction of the words that have synonyms in a table (a small
  built-in English table, or your own).
* :class:`ClauseReorder` -- reorder the clauses of a sentence (``A, and B.`` -> ``B, and A.``;
  ``A because B.`` -> ``Because B, A.``).
* :class:`SentenceMerge` -- join adjacent sentences (``A. B.`` -> ``A, and b.``).
* :class:`SentenceSplit` -- split a sentence at a clause boundary (``A, but B.`` -> ``A. But B.``). Merge and
  split change sentence boundaries, hence the previous-region keys (AliMark, arXiv 2605.29434).
* :class:`Paraphrase` -- a second generator: any callable ``list[str] -> list[str]`` (per sentence or whole text).
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from zoo.errors import ConfigError, DataError
from zoo.watermark.sentences import split_sentences

DEFAULT_SYNONYMS: dict[str, tuple[str, ...]] = {
    "big": ("large", "huge"),
    "large": ("big", "sizable"),
    "small": ("little", "tiny"),
    "little": ("small",),
    "quick": ("fast", "rapid"),
    "fast": ("quick", "rapid"),
    "slow": ("sluggish", "unhurried"),
    "good": ("fine", "decent"),
    "bad": ("poor", "awful"),
    "important": ("crucial", "significant"),
    "many": ("numerous", "several"),
    "often": ("frequently", "regularly"),
    "sometimes": ("occasionally", "at times"),
    "usually": ("typically", "normally"),
    "very": ("really", "quite"),
    "new": ("recent", "fresh"),
    "old": ("ancient", "aged"),
    "begin": ("start", "commence"),
    "start": ("begin", "launch"),
    "end": ("finish", "conclude"),
    "help": ("assist", "aid"),
    "show": ("reveal", "display"),
    "use": ("employ", "utilize"),
    "make": ("create", "produce"),
    "build": ("construct", "make"),
    "buy": ("purchase", "acquire"),
    "get": ("obtain", "receive"),
    "see": ("observe", "notice"),
    "say": ("state", "claim"),
    "says": ("states", "claims"),
    "said": ("stated", "remarked"),
    "think": ("believe", "suppose"),
    "need": ("require",),
    "needs": ("requires",),
    "want": ("wish", "desire"),
    "study": ("research", "analysis"),
    "studies": ("investigations", "analyses"),
    "result": ("outcome", "finding"),
    "results": ("outcomes", "findings"),
    "problem": ("issue", "difficulty"),
    "problems": ("issues", "difficulties"),
    "method": ("approach", "technique"),
    "idea": ("notion", "concept"),
    "people": ("individuals", "folks"),
    "city": ("town", "metropolis"),
    "car": ("vehicle", "automobile"),
    "house": ("home", "residence"),
    "road": ("street", "route"),
    "food": ("meal", "fare"),
    "doctor": ("physician",),
    "children": ("kids", "youngsters"),
    "team": ("squad", "group"),
    "game": ("match", "contest"),
    "win": ("triumph", "prevail"),
    "won": ("triumphed", "prevailed"),
    "rain": ("rainfall", "showers"),
    "weather": ("climate", "conditions"),
    "market": ("economy", "marketplace"),
    "price": ("cost", "rate"),
    "prices": ("costs", "rates"),
    "rise": ("increase", "climb"),
    "rose": ("increased", "climbed"),
    "fall": ("drop", "decline"),
    "fell": ("dropped", "declined"),
    "happy": ("glad", "pleased"),
    "sad": ("unhappy", "sorrowful"),
    "easy": ("simple", "effortless"),
    "hard": ("difficult", "tough"),
    "difficult": ("hard", "challenging"),
    "beautiful": ("lovely", "gorgeous"),
    "strong": ("powerful", "sturdy"),
    "weak": ("feeble", "frail"),
    "near": ("close to", "beside"),
    "also": ("too", "as well"),
    "because": ("since", "as"),
    "however": ("nevertheless", "still"),
    "quickly": ("rapidly", "swiftly"),
    "slowly": ("gradually", "leisurely"),
    "large-scale": ("extensive", "broad"),
}

_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
CONJUNCTIONS = ("and", "but", "or", "so", "yet")
SUBORDINATORS = ("because", "when", "while", "although", "though", "if", "after", "before", "since", "until")


def _rng(name: str, seed: int, text: str) -> random.Random:
    return random.Random(f"{name}:{seed}:{text}")


def _check_rate(rate: float) -> float:
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"attack rate must be in [0, 1], got {rate}")
    return float(rate)


def _match_case(word: str, replacement: str) -> str:
    if word.isupper() and len(word) > 1:
        return replacement.upper()
    if word[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _lower_first(text: str) -> str:
    """Lower-case the first letter unless the first word is ``I``/``I'm`` or an acronym (second letter upper)."""
    first = text.split(" ", 1)[0]
    if first in ("I", "I'm", "I've", "I'll", "I'd") or (len(first) > 1 and first[1].isupper()):
        return text
    return text[:1].lower() + text[1:]


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _split_terminal(sentence: str) -> tuple[str, str]:
    """``("body", "terminal")`` with the trailing punctuation (``.``, ``!?``, ``."``) separated."""
    match = re.search(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*$", sentence)
    return (sentence[: match.start()], match.group(0)) if match else (sentence, ".")


class Attack(ABC):
    """A text transformation ``text -> text``; ``name`` labels it in reports."""

    name: str = "attack"

    @abstractmethod
    def __call__(self, text: str) -> str:
        """The attacked text."""

    def apply(self, texts: Sequence[str]) -> list[str]:
        """Attack each text."""
        return [self(text) for text in texts]


class SentenceAttack(Attack):
    """An attack that rewrites sentences one at a time; each is attacked with probability ``rate``."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        self.rate = _check_rate(rate)
        self.seed = seed

    def __call__(self, text: str) -> str:
        rng = _rng(self.name, self.seed, text)
        out = []
        for sentence in split_sentences(text):
            out.append(self.rewrite(sentence, rng) if rng.random() < self.rate else sentence)
        return " ".join(out)

    @abstractmethod
    def rewrite(self, sentence: str, rng: random.Random) -> str:
        """One sentence rewritten (unchanged when the attack does not apply)."""


class SynonymSubstitution(Attack):
    """Replace each word that has synonyms with probability ``rate`` (a synonym drawn uniformly).

    Args:
        rate: replacement probability per eligible word.
        seed: attack seed.
        synonyms: lower-case word -> synonyms (default :data:`DEFAULT_SYNONYMS`); case is carried over.
    """

    name = "synonym"

    def __init__(self, rate: float = 0.5, seed: int = 0, synonyms: Mapping[str, Sequence[str]] | None = None) -> None:
        self.rate = _check_rate(rate)
        self.seed = seed
        table = DEFAULT_SYNONYMS if synonyms is None else synonyms
        self.synonyms = {k.lower(): tuple(v) for k, v in table.items() if v}

    def __call__(self, text: str) -> str:
        rng = _rng(self.name, self.seed, text)

        def swap(match: re.Match[str]) -> str:
            word = match.group(0)
            options = self.synonyms.get(word.lower())
            if not options or rng.random() >= self.rate:
                return word
            return _match_case(word, rng.choice(options))

        return _WORD.sub(swap, text)


class ClauseReorder(SentenceAttack):
    """Reorder clauses: ``A, <conj> B.`` -> ``B, <conj> A.``; ``A, B, C.`` -> ``C, A, B.``;
    ``A <subordinator> B.`` -> ``<Subordinator> B, A.``. Sentences without a clause boundary are kept."""

    name = "clause_reorder"

    def __init__(self, rate: float = 1.0, seed: int = 0) -> None:
        super().__init__(rate, seed)

    def rewrite(self, sentence: str, rng: random.Random) -> str:
        body, end = _split_terminal(sentence)
        clauses = [c.strip() for c in re.split(r"[,;]\s+", body) if c.strip()]
        if len(clauses) >= 2:
            first, rest = clauses[0], clauses[1:]
            words = rest[-1].split(" ", 1)
            if len(clauses) == 2 and words[0].lower() in CONJUNCTIONS and len(words) == 2:
                reordered = f"{_upper_first(words[1])}, {words[0].lower()} {_lower_first(first)}"
            else:
                reordered = ", ".join([_upper_first(rest[-1]), _lower_first(first), *rest[:-1]])
            return reordered + end
        match = re.search(r"\s(" + "|".join(SUBORDINATORS) + r")\s", body, flags=re.IGNORECASE)
        if match and match.start() > 0:
            main, sub = body[: match.start()].strip(), body[match.start() :].strip()
            return f"{_upper_first(sub)}, {_lower_first(main)}{end}"
        return sentence


class SentenceSplit(SentenceAttack):
    """Split a sentence at its first clause boundary: ``A, and B.`` -> ``A. B.``; ``A, but B.`` -> ``A. But B.``;
    ``A; B.`` / ``A, B.`` -> ``A. B.``. Sentences without a comma or semicolon are kept."""

    name = "split"

    def __init__(self, rate: float = 1.0, seed: int = 0) -> None:
        super().__init__(rate, seed)

    def rewrite(self, sentence: str, rng: random.Random) -> str:
        body, end = _split_terminal(sentence)
        match = re.search(r"[,;]\s+", body)
        if match is None or match.start() == 0 or not body[match.end() :].strip():
            return sentence
        head, tail = body[: match.start()].strip(), body[match.end() :].strip()
        words = tail.split(" ", 1)
        if words[0].lower() == "and" and len(words) == 2:
            tail = words[1]
        return f"{head}. {_upper_first(tail)}{end}"


class SentenceMerge(Attack):
    """Merge adjacent sentences: each sentence is joined to the next with probability ``rate`` (at most pairs).

    Args:
        rate: probability that a sentence absorbs the following one.
        seed: attack seed.
        joiner: what replaces the first sentence's terminal mark (default ``", and "``).
    """

    name = "merge"

    def __init__(self, rate: float = 1.0, seed: int = 0, joiner: str = ", and ") -> None:
        self.rate = _check_rate(rate)
        self.seed = seed
        self.joiner = joiner

    def __call__(self, text: str) -> str:
        rng = _rng(self.name, self.seed, text)
        sentences = split_sentences(text)
        out, i = [], 0
        while i < len(sentences):
            if i + 1 < len(sentences) and rng.random() < self.rate:
                body, _ = _split_terminal(sentences[i])
                out.append(body + self.joiner + _lower_first(sentences[i + 1]))
                i += 2
            else:
                out.append(sentences[i])
                i += 1
        return " ".join(out)


class Paraphrase(Attack):
    """Paraphrase with a second generator.

    Args:
        paraphraser: ``list[str] -> list[str]`` of the same length (a local model's batch paraphrase, a rule set,
            a call into another library).
        per_sentence: call it on the text's sentences (and join the outputs with spaces) instead of on the
            whole text.
        name: label in reports.
    """

    def __init__(
        self, paraphraser: Callable[[list[str]], Sequence[str]], *, per_sentence: bool = True, name: str = "paraphrase"
    ) -> None:
        if not callable(paraphraser):
            kind = type(paraphraser).__name__
            raise ConfigError(f"paraphraser must be a callable list[str] -> list[str], got {kind}")
        self.paraphraser = paraphraser
        self.per_sentence = per_sentence
        self.name = name

    def __call__(self, text: str) -> str:
        units = split_sentences(text) if self.per_sentence else [text]
        if not units:
            return text
        out = list(self.paraphraser(list(units)))
        if len(out) != len(units) or not all(isinstance(o, str) for o in out):
            raise DataError(
                f"paraphraser {self.name!r} returned {len(out)} items for {len(units)} inputs; "
                "it must return one string per input"
            )
        return " ".join(o.strip() for o in out)
