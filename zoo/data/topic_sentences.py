"""Two tasks over the seeded multi-topic sentence grammar (:mod:`zoo.text.topics`), so the watermark methods run with
a real LM proposing sentences and a second LM paraphrasing them (``task=topic_text``, ``task=topic_paraphrase``):

* :class:`TopicText` -- a prompt of one sentence and a completion of the next sentences on the same topic;
* :class:`TopicParaphrase` -- a sentence and a rewrite of it (synonyms and clause order changed); a completion
  verifies when it has the sentence's words up to synonyms and order.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from zoo.data.tasks import Example, Task
from zoo.errors import ConfigError
from zoo.text.topics import TopicGrammar
from zoo.watermark.attacks import DEFAULT_SYNONYMS
from zoo.watermark.paraphrase import PARAPHRASE_PROMPT


class TopicText(Task):
    """Texts on one topic: ``prompt_sentences`` sentences, then the next ones as the completion.

    ``"The chef baked fresh bread."`` -> ``" The cook tasted the fish before dinner. ..."`` (the completion starts
    with the space between sentences, as a model continuing the prompt writes it). The answer is the topic; a
    completion verifies when its topic (:meth:`TopicGrammar.topic_of`) is the prompt's.

    Args:
        prompt_sentences: sentences in the prompt.
        min_sentences, max_sentences: sentences in the completion.
        off_topic: probability that a sentence after the first is drawn from a uniformly drawn topic (a text that
            may change the subject; 0 keeps every text on one topic).
        shape_weights: sentence shapes, as :class:`TopicGrammar`.
    """

    name = "topic_text"

    def __init__(
        self,
        prompt_sentences: int = 1,
        min_sentences: int = 1,
        max_sentences: int = 1,
        off_topic: float = 0.0,
        shape_weights: Sequence[float] = (0.5, 0.3, 0.2),
    ) -> None:
        if prompt_sentences < 1:
            raise ConfigError(f"task.prompt_sentences must be >= 1, got {prompt_sentences}")
        if not 1 <= min_sentences <= max_sentences:
            raise ConfigError(f"task needs 1 <= min_sentences <= max_sentences, got {min_sentences}, {max_sentences}")
        if not 0.0 <= off_topic <= 1.0:
            raise ConfigError(f"task.off_topic must be in [0, 1], got {off_topic}")
        self.prompt_sentences = prompt_sentences
        self.min_sentences = min_sentences
        self.max_sentences = max_sentences
        self.off_topic = off_topic
        self.shape_weights = tuple(shape_weights)
        self._grammar = TopicGrammar(shape_weights=self.shape_weights)

    def extract_answer(self, completion: str) -> str | None:
        """The topic whose words occur most in the completion (None when no topic word occurs)."""
        return self._grammar.topic_of(completion)

    def sample(self, rng: random.Random) -> Example:
        grammar = self._grammar
        topic = rng.choice(grammar.topic_names)
        count = self.prompt_sentences + rng.randint(self.min_sentences, self.max_sentences)
        sentences = [grammar.sentence(rng, topic)]
        for _ in range(count - 1):
            drift = rng.random() < self.off_topic
            sentences.append(grammar.sentence(rng, rng.choice(grammar.topic_names) if drift else topic))
        prompt = " ".join(sentences[: self.prompt_sentences])
        completion = " " + " ".join(sentences[self.prompt_sentences :])
        return Example(prompt, completion, topic, {"num_sentences": count - self.prompt_sentences})


class TopicParaphrase(Task):
    """Sentence -> paraphrase pairs: ``"Paraphrase: <sentence>\\n"`` -> a rewrite of it.

    The rewrite replaces words from :data:`zoo.watermark.attacks.DEFAULT_SYNONYMS` (each with probability
    ``synonym_rate``) and reorders the clauses of compound sentences (probability ``reorder_rate``), both from
    the zoo's rule-based attacks, so a model trained on it is a *learned* second generator for the paraphrase
    attack (:mod:`zoo.watermark.paraphrase`). The answer is the source sentence; a completion verifies when it has
    the sentence's words up to synonyms (of the table) and order.

    Args:
        synonym_rate: probability that a word with synonyms is replaced.
        reorder_rate: probability that a sentence's clauses are reordered.
        shape_weights: sentence shapes, as :class:`TopicGrammar`.
    """

    name = "topic_paraphrase"

    def __init__(
        self, synonym_rate: float = 0.6, reorder_rate: float = 0.5, shape_weights: Sequence[float] = (0.5, 0.3, 0.2)
    ) -> None:
        for field_name, value in (("synonym_rate", synonym_rate), ("reorder_rate", reorder_rate)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"task.{field_name} must be in [0, 1], got {value}")
        self.synonym_rate = synonym_rate
        self.reorder_rate = reorder_rate
        self.shape_weights = tuple(shape_weights)
        self._grammar = TopicGrammar(shape_weights=self.shape_weights)
        self._canonical = _synonym_classes()

    def sample(self, rng: random.Random) -> Example:
        from zoo.watermark.attacks import ClauseReorder, SynonymSubstitution

        topic = rng.choice(self._grammar.topic_names)
        sentence = self._grammar.sentence(rng, topic)
        seed = rng.randrange(2**31)
        rewrite = ClauseReorder(self.reorder_rate, seed)(SynonymSubstitution(self.synonym_rate, seed)(sentence))
        return Example(PARAPHRASE_PROMPT.format(sentence=sentence), rewrite, sentence, {"topic": topic})

    def _words(self, text: str) -> str:
        words = re.findall(r"[a-z]+", text.lower())
        return " ".join(sorted(self._canonical.get(w, w) for w in words))

    def extract_answer(self, completion: str) -> str | None:
        """The completion's words, each replaced by its synonym class, sorted (None when it has no word)."""
        return self._words(completion) or None

    def normalize_reference(self, answer: object) -> str:
        return self._words(str(answer))


def _synonym_classes() -> dict[str, str]:
    """Word -> one representative of its class under the synonym table (single words; union of all pairs)."""
    parent: dict[str, str] = {}

    def find(word: str) -> str:
        parent.setdefault(word, word)
        while parent[word] != word:
            word = parent[word]
        return word

    for word, synonyms in DEFAULT_SYNONYMS.items():
        for synonym in synonyms:
            if " " not in synonym and "-" not in word:
                a, b = find(word), find(synonym)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {word: find(word) for word in parent}
