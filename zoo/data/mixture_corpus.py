"""A procedurally generated multi-domain corpus: latent topics of Zipf-imbalanced sizes plus a near-duplicate cluster.

The GEM demo's data (notes ``multimodal_quant_data.md`` §2d): ``num_topics`` latent topics (up to 12), each with its
own vocabulary over a shared sentence grammar (:class:`zoo.text.topics.TopicGrammar`), topic sizes
``share_k ∝ 1/(k+1)^zipf`` (the head topic dominates, the tail is rare), and a ``synthetic`` cluster of near-duplicate
templated documents (web-spam-like contamination) that a bucketing should not let swallow or dominate its buckets.

Rows: ``{"text", "topic"}`` (the true latent topic, for NMI and topic-uniform evaluation). The training split follows
the imbalanced sizes; ``val``/``test`` hold the same number of documents of every topic (``balanced_eval``), so their
mean loss is the uniform-topic held-out loss. Everything is drawn from explicitly seeded ``random.Random`` instances.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from zoo.data.sources import Row, RowSource, read_jsonl
from zoo.errors import ConfigError, DataError
from zoo.text.topics import TOPICS, TopicGrammar

EXTRA_TOPICS: dict[str, dict[str, tuple[str, ...]]] = {
    "medicine": {
        "subjects": ("the nurse", "the surgeon", "the clinic", "the patient", "the hospital", "the doctor"),
        "verbs": ("treated", "examined", "vaccinated", "diagnosed", "monitored", "healed"),
        "objects": ("the infection", "a broken arm", "the fever", "the heart disease", "the wound", "the children"),
        "tails": ("in the ward", "after surgery", "with antibiotics", "during the night shift"),
    },
    "music": {
        "subjects": ("the orchestra", "the violinist", "the band", "the choir", "the pianist", "the drummer"),
        "verbs": ("performed", "rehearsed", "composed", "recorded", "played", "sang"),
        "objects": ("the symphony", "a slow melody", "the new album", "the concerto", "the old song", "the chorus"),
        "tails": ("on stage", "in the concert hall", "with great passion", "before the tour"),
    },
    "law": {
        "subjects": ("the judge", "the lawyer", "the jury", "the court", "the defendant", "the prosecutor"),
        "verbs": ("ruled on", "appealed", "dismissed", "argued", "reviewed", "signed"),
        "objects": ("the contract", "the verdict", "the lawsuit", "the new statute", "the evidence", "the case"),
        "tails": ("in court", "after the hearing", "under the constitution", "before the deadline"),
    },
    "computing": {
        "subjects": ("the programmer", "the compiler", "the server", "the database", "the engineers", "the software"),
        "verbs": ("compiled", "debugged", "deployed", "indexed", "refactored", "crashed"),
        "objects": ("the source code", "a memory leak", "the network", "the query", "the kernel", "the algorithm"),
        "tails": ("in production", "after the update", "on the cluster", "with unit tests"),
    },
    "gardening": {
        "subjects": ("the gardener", "my neighbour", "the farmer", "the nursery", "the volunteers", "the florist"),
        "verbs": ("planted", "pruned", "watered", "harvested", "fertilized", "weeded"),
        "objects": ("the roses", "the tomato seedlings", "the hedge", "the tulip bulbs", "the orchard", "the herbs"),
        "tails": ("in early spring", "with compost", "after the frost", "in the greenhouse"),
    },
    "history": {
        "subjects": (
            "the emperor",
            "the historians",
            "the ancient army",
            "the medieval king",
            "the rebels",
            "the monks",
        ),
        "verbs": ("conquered", "founded", "besieged", "chronicled", "abolished", "ruled"),
        "objects": ("the empire", "the fortress", "the old dynasty", "the kingdom", "the republic", "the monastery"),
        "tails": ("in the ninth century", "after the war", "for many centuries", "during the revolution"),
    },
}
ALL_TOPICS = {**TOPICS, **EXTRA_TOPICS}
SYNTHETIC = "synthetic"
_SPAM_ITEMS = ("phone", "laptop", "watch", "voucher", "prize", "cruise")
_SPAM_VERBS = ("Win", "Claim", "Get")


def topic_sizes(total: int, num_topics: int, zipf: float) -> list[int]:
    """``total`` documents split over ``num_topics`` with ``share_k ∝ 1/(k+1)^zipf`` (each topic gets >= 1)."""
    shares = [1.0 / (k + 1) ** zipf for k in range(num_topics)]
    scale = sum(shares)
    sizes = [max(1, round(total * s / scale)) for s in shares]
    sizes[0] += total - sum(sizes)
    return sizes


class MixtureCorpus:
    """The generator: topic documents and near-duplicates.

    Args:
        num_topics: latent topics (``1..12``; the first ones are the largest).
        zipf: exponent of the topic sizes.
        duplicate_share: share of the training documents in the ``synthetic`` near-duplicate cluster.
        sentences: sentences per topic document.
    """

    def __init__(self, num_topics: int = 12, zipf: float = 1.2, duplicate_share: float = 0.1, sentences: int = 1):
        if not 1 <= num_topics <= len(ALL_TOPICS):
            raise ConfigError(f"num_topics must be in 1..{len(ALL_TOPICS)}, got {num_topics}")
        if not 0.0 <= duplicate_share < 1.0 or zipf < 0 or sentences < 1:
            raise ConfigError(
                f"need 0 <= duplicate_share < 1, zipf >= 0, sentences >= 1; got {duplicate_share}, {zipf}, {sentences}"
            )
        names = list(ALL_TOPICS)[:num_topics]
        self.grammar = TopicGrammar({name: ALL_TOPICS[name] for name in names})
        self.topics = names
        self.zipf = zipf
        self.duplicate_share = duplicate_share
        self.sentences = sentences

    @property
    def labels(self) -> list[str]:
        """Every latent label: the topics, then ``synthetic`` when there are near-duplicates."""
        return self.topics + ([SYNTHETIC] if self.duplicate_share > 0 else [])

    def document(self, rng: random.Random, topic: str) -> str:
        if topic == SYNTHETIC:
            return (
                f"{rng.choice(_SPAM_VERBS)} a free {rng.choice(_SPAM_ITEMS)} today, limited offer "
                f"number {rng.randint(1, 99)}, click now."
            )
        return " ".join(self.grammar.sentence(rng, topic) for _ in range(self.sentences))

    def imbalanced(self, num: int, seed: int) -> list[Row]:
        """``num`` documents: ``duplicate_share`` near-duplicates, the rest over Zipf-sized topics, shuffled."""
        rng = random.Random(f"mixture-corpus:imbalanced:{seed}")
        duplicates = round(num * self.duplicate_share)
        labels = [SYNTHETIC] * duplicates
        for topic, size in zip(self.topics, topic_sizes(num - duplicates, len(self.topics), self.zipf)):
            labels += [topic] * size
        rng.shuffle(labels)
        return [{"text": self.document(rng, label), "topic": label} for label in labels]

    def balanced(self, num_per_label: int, seed: int) -> list[Row]:
        """``num_per_label`` documents of every label (topic-uniform held-out data)."""
        rng = random.Random(f"mixture-corpus:balanced:{seed}")
        return [
            {"text": self.document(rng, label), "topic": label} for label in self.labels for _ in range(num_per_label)
        ]


class MixtureCorpusSource(RowSource):
    """:class:`MixtureCorpus` as a row source: ``train`` imbalanced, ``val``/``test`` balanced over the latent labels.

    Args:
        num_train: training documents.
        num_val, num_test: held-out documents *per latent label* (topic-uniform).
        num_topics, zipf, duplicate_share, sentences: see :class:`MixtureCorpus`.
        seed: seed of the draw (splits use distinct streams).
    """

    def __init__(
        self,
        num_train: int = 4000,
        num_val: int = 16,
        num_test: int = 16,
        num_topics: int = 12,
        zipf: float = 1.2,
        duplicate_share: float = 0.1,
        sentences: int = 1,
        seed: int = 0,
    ) -> None:
        self.corpus = MixtureCorpus(num_topics, zipf, duplicate_share, sentences)
        self.num = {"train": num_train, "val": num_val, "test": num_test}
        self.seed = seed

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        if split not in self.num:
            raise ConfigError(f"unknown split {split!r}; use train, val or test")
        if split == "train":
            return self.corpus.imbalanced(self.num["train"], self.seed)
        return self.corpus.balanced(self.num[split], self.seed * 1000 + (1 if split == "val" else 2))


class BucketedCorpusSource(RowSource):
    """The splits a bucketing run wrote (``+method=gem``: ``<directory>/train.jsonl`` with the bucket column,
    ``val.jsonl`` and ``test.jsonl`` unchanged; ``test`` falls back to ``val``).

    Args:
        directory: the run's ``export`` folder (e.g. from the artifact cache).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        path = self.directory / f"{split}.jsonl"
        if split == "test" and not path.is_file():
            path = self.directory / "val.jsonl"
        if not path.is_file():
            raise DataError(
                f"{path}: no {split} split in the bucketed corpus {self.directory} (written by +method=gem)"
            )
        return read_jsonl(path, required_fields)
