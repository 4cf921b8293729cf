"""A seeded multi-topic template grammar of English sentences (no language model needed).

Stands in for a generator where only *candidate sentences* matter (sentence-level watermarks: the rejection
sampler needs a source of plausible next sentences on the topic of the context, and the detector needs human-like
unwatermarked text). Six topics with their own vocabulary, so sentence embeddings form topic clusters (an
anisotropic, clustered distribution like real text); three sentence shapes, two with a clause boundary (so
clause-reorder, merge and split attacks have something to act on); many words have entries in
:data:`zoo.watermark.attacks.DEFAULT_SYNONYMS`.

Everything is drawn from ``random.Random`` instances seeded explicitly: the same seed gives the same sentences on
every machine.

The tasks that turn the grammar into training data (``task=topic_text``, ``task=topic_paraphrase``) are in
:mod:`zoo.data.topic_sentences`; the grammar sits on the shared-machinery floor so that the watermark core fits its
partitions on it (``corpus="topics"``) without importing a task.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence

from zoo.errors import ConfigError

Vocabulary = Mapping[str, Sequence[str]]

TOPICS: dict[str, dict[str, tuple[str, ...]]] = {
    "weather": {
        "subjects": ("the rain", "a cold front", "the storm", "the morning fog", "the wind", "the weather"),
        "verbs": ("soaked", "covered", "battered", "cooled", "flooded", "crossed"),
        "objects": ("the old road", "the small city", "the coastal towns", "the big valley", "the farms", "the bridge"),
        "tails": ("overnight", "by noon", "for three days", "without warning"),
    },
    "sports": {
        "subjects": ("the home team", "the young striker", "the coach", "the old champion", "the squad", "the fans"),
        "verbs": ("won", "lost", "praised", "dominated", "celebrated", "watched"),
        "objects": ("the final game", "the big match", "the league title", "the rivals", "the new stadium", "the cup"),
        "tails": ("last night", "after extra time", "in front of a large crowd", "for the first time"),
    },
    "cooking": {
        "subjects": ("the chef", "my grandmother", "the small bakery", "the cook", "the restaurant", "the students"),
        "verbs": ("baked", "seasoned", "served", "roasted", "prepared", "tasted"),
        "objects": ("fresh bread", "a spicy soup", "the food", "the vegetables", "a sweet cake", "the fish"),
        "tails": ("with garlic", "before dinner", "in a hot oven", "with fresh herbs"),
    },
    "finance": {
        "subjects": ("the market", "the central bank", "investors", "the company", "prices", "the old fund"),
        "verbs": ("raised", "cut", "doubled", "bought", "sold", "reported"),
        "objects": ("interest rates", "its shares", "the quarterly profits", "new bonds", "the debt", "the forecast"),
        "tails": ("this quarter", "after the report", "despite the problems", "by a small margin"),
    },
    "science": {
        "subjects": ("the researchers", "a new study", "the lab", "the physicist", "the team of doctors", "the probe"),
        "verbs": ("measured", "discovered", "tested", "observed", "published", "confirmed"),
        "objects": ("the results", "a strange signal", "the method", "the new particle", "the old idea", "the cells"),
        "tails": ("with great care", "in the journal", "after many years", "using a large telescope"),
    },
    "travel": {
        "subjects": ("the tourists", "our guide", "the train", "the family", "the old ship", "the pilgrims"),
        "verbs": ("visited", "reached", "explored", "left", "photographed", "crossed"),
        "objects": (
            "the ancient temple",
            "the busy harbor",
            "the mountain village",
            "the big city",
            "the islands",
            "the desert",
        ),
        "tails": ("at dawn", "by car", "on a quick tour", "before the summer"),
    },
}

SHAPES = ("simple", "compound", "because")


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


class TopicGrammar:
    """Sentences from per-topic vocabularies.

    Args:
        topics: topic -> ``{"subjects", "verbs", "objects", "tails"}`` word lists (default :data:`TOPICS`).
        shape_weights: relative weights of the shapes ``simple`` (``S V O T.``), ``compound``
            (``S V O, and S' V' O'.``) and ``because`` (``S V O because S' V' O'.``).
    """

    def __init__(
        self, topics: Mapping[str, Vocabulary] | None = None, shape_weights: Sequence[float] = (0.5, 0.3, 0.2)
    ) -> None:
        self.topics = {name: {k: tuple(v) for k, v in vocab.items()} for name, vocab in (topics or TOPICS).items()}
        for name, vocab in self.topics.items():
            missing = [k for k in ("subjects", "verbs", "objects", "tails") if not vocab.get(k)]
            if missing:
                raise ConfigError(f"topic {name!r} lacks word lists {missing}")
        if len(shape_weights) != len(SHAPES) or min(shape_weights) < 0 or sum(shape_weights) <= 0:
            raise ConfigError(f"shape_weights must be {len(SHAPES)} non-negative weights, got {list(shape_weights)}")
        self.shape_weights = tuple(float(w) for w in shape_weights)
        self._topic_words = {
            name: {w for phrase in (*v["subjects"], *v["objects"]) for w in phrase.split() if len(w) > 3}
            for name, v in self.topics.items()
        }

    @property
    def topic_names(self) -> list[str]:
        return list(self.topics)

    def _clause(self, rng: random.Random, topic: str) -> str:
        vocab = self.topics[topic]
        return f"{rng.choice(vocab['subjects'])} {rng.choice(vocab['verbs'])} {rng.choice(vocab['objects'])}"

    def sentence(self, rng: random.Random, topic: str) -> str:
        """One sentence on ``topic``."""
        if topic not in self.topics:
            raise ConfigError(f"unknown topic {topic!r}; known: {self.topic_names}")
        shape = rng.choices(SHAPES, weights=self.shape_weights)[0]
        first = self._clause(rng, topic)
        if shape == "simple":
            body = f"{first} {rng.choice(self.topics[topic]['tails'])}"
        elif shape == "compound":
            body = f"{first}, and {self._clause(rng, topic)}"
        else:
            body = f"{first} because {self._clause(rng, topic)}"
        return _capitalize(body) + "."

    def text(self, num_sentences: int, seed: int, topic: str | None = None) -> str:
        """``num_sentences`` sentences on one topic (drawn from ``seed`` when not given), joined by spaces."""
        rng = random.Random(f"text:{seed}")
        topic = topic or rng.choice(self.topic_names)
        return " ".join(self.sentence(rng, topic) for _ in range(num_sentences))

    def mixed_text(self, num_sentences: int, seed: int) -> str:
        """``num_sentences`` sentences, each on a topic drawn uniformly and independently, joined by spaces.

        A text that aligns with no partition of the embedding space: a one-topic text (:meth:`text`) keeps its
        sentences in the few regions of its topic, so under a key that makes those regions' transitions green every
        such text looks watermarked; here consecutive sentences move between topics (5 times in 6), so the region
        of a sentence says little about the next one's."""
        rng = random.Random(f"mixed:{seed}")
        return " ".join(self.sentence(rng, rng.choice(self.topic_names)) for _ in range(num_sentences))

    def corpus(self, num_sentences: int, seed: int) -> list[str]:
        """``num_sentences`` sentences, topics drawn uniformly (a domain corpus to fit partitions on)."""
        rng = random.Random(f"corpus:{seed}")
        return [self.sentence(rng, rng.choice(self.topic_names)) for _ in range(num_sentences)]

    def topic_of(self, text: str) -> str | None:
        """The topic whose subject/object words occur most in ``text`` (None when none occurs)."""
        words = set(re.findall(r"[a-z]+", text.lower()))
        scores = {name: len(words & vocab) for name, vocab in self._topic_words.items()}
        best = max(scores, key=lambda name: scores[name])
        return best if scores[best] > 0 else None

    def proposer(self, seed: int, off_topic: float = 0.0) -> Callable[[str, int], list[str]]:
        """A candidate source ``(context, n) -> n`` sentences on the topic of the context's last sentence (a random
        topic when it has none); successive calls continue one seeded stream.

        Args:
            seed: seed of the stream.
            off_topic: probability that a candidate comes from a uniformly drawn topic instead (a generator whose
                next sentence may change the subject). At 0, every candidate stays on topic, so a partition
                whose regions follow topics leaves one reachable region per context (region collapse).
        """
        if not 0.0 <= off_topic <= 1.0:
            raise ConfigError(f"off_topic must be in [0, 1], got {off_topic}")
        rng = random.Random(f"proposer:{seed}")

        def propose(context: str, n: int) -> list[str]:
            last = context.rstrip().rsplit(". ", 1)[-1]
            topic = self.topic_of(last) or self.topic_of(context) or rng.choice(self.topic_names)
            return [
                self.sentence(rng, rng.choice(self.topic_names) if rng.random() < off_topic else topic)
                for _ in range(n)
            ]

        return propose


# The prompt of one paraphrase (TopicParaphrase and zoo.watermark.paraphrase share it).
