"""Sentence-level rejection sampling (SemStamp, k-SemStamp, X-Guard share it; only the partitioner differs).

For each new sentence: draw candidate sentences, embed them, and accept the first whose region is green given
the previous sentence's region *and* whose margin reaches ``margin``; after ``max_trials`` candidates without a
pass, accept a fallback anyway (SemStamp's ``N_max`` rule). The candidate source is a plain callable, so the
same logic serves the seeded template grammar of the demo and a model-backed proposer (a decoder samples
``candidates_per_round`` continuations per row in one batch, each stopped at its sentence end with
:func:`zoo.watermark.sentences.sentence_ended`):

* :meth:`RejectionSampler.choose` -- one round for many rows at once (one encoder call for all candidates),
  with the per-row bookkeeping in :class:`RowState`;
* :meth:`RejectionSampler.sample` -- one sentence from ``propose(n) -> list[str]``;
* :meth:`RejectionSampler.generate` -- a whole text from ``propose(context, n) -> list[str]``.

The first generated sentence is keyed on the region of the prompt's last sentence (region 0 for an empty
prompt), as in SemStamp; detection never scores it, so it does not matter which prompt was used.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from zoo.errors import ConfigError, DataError
from zoo.text.encoders import SentenceEncoder
from zoo.watermark.green import GreenList
from zoo.watermark.partition import Partitioner
from zoo.watermark.sentences import first_sentence, split_sentences

INITIAL_REGION = 0


class WatermarkScheme:
    """What generation and detection must share: encoder, fitted partition, key and ``gamma``.

    Args:
        encoder: sentence encoder (its ``dim`` must be the partition's).
        partitioner: a fitted :class:`~zoo.watermark.partition.Partitioner`.
        key: secret integer key of the green sets.
        gamma: green fraction of regions (``gamma R`` whole, in ``[1, R - 1]``).
    """

    def __init__(self, encoder: SentenceEncoder, partitioner: Partitioner, key: int, gamma: float = 0.25) -> None:
        if not partitioner.fitted:
            raise ConfigError(f"{type(partitioner).__name__} is not fitted: fit it or load a saved partition")
        if int(encoder.dim) != partitioner.dim:
            raise ConfigError(
                f"encoder {encoder.name!r} gives {encoder.dim}-dim embeddings but the partition was fit on "
                f"{partitioner.dim}-dim ones: use the encoder the partition was fit with"
            )
        self.encoder = encoder
        self.partitioner = partitioner
        self.green = GreenList(key, partitioner.num_regions, gamma)

    @property
    def key(self) -> int:
        return self.green.key

    @property
    def gamma(self) -> float:
        return self.green.gamma

    def regions(self, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Regions ``[N]`` (long) and margins ``[N]`` (float64) of sentences."""
        if not sentences:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
        return self.partitioner.assign_with_margin(self.encoder.encode(list(sentences)))

    def context_region(self, text: str) -> int:
        """Region of the last sentence of ``text`` (:data:`INITIAL_REGION` when it has none)."""
        sentences = split_sentences(text)
        return int(self.regions(sentences[-1:])[0][0]) if sentences else INITIAL_REGION


@dataclass(frozen=True)
class SentenceSample:
    """The sentence chosen for one position.

    Attributes:
        text: the sentence.
        region: its region.
        margin: its margin in the partitioner's geometry.
        green: whether ``region`` is in the green set of the previous region.
        passed: whether it passed the acceptance test (green and margin); False for a fallback after
            ``max_trials``.
        trials: candidates drawn for this position, the accepted one included.
    """

    text: str
    region: int
    margin: float
    green: bool
    passed: bool
    trials: int


@dataclass
class RowState:
    """Per-row bookkeeping of one sentence position across rounds.

    Attributes:
        previous_region: region of the sentence before this position.
        trials: candidates drawn so far.
        fallback: the candidate kept in case no candidate passes within ``max_trials``.
    """

    previous_region: int
    trials: int = 0
    fallback: SentenceSample | None = None


@dataclass
class WatermarkedText:
    """A text generated sentence by sentence.

    Attributes:
        prompt: the prompt (not part of ``text``).
        sentences: the accepted sentences, in order.
        samples: one :class:`SentenceSample` per sentence.
    """

    prompt: str
    sentences: list[str] = field(default_factory=list)
    samples: list[SentenceSample] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The generated sentences joined by single spaces."""
        return " ".join(self.sentences)

    @property
    def success_rate(self) -> float:
        """Watermark Success Rate [reconstruction]: fraction of sentences accepted by the test within
        ``max_trials`` (NaN for an empty text)."""
        return sum(s.passed for s in self.samples) / len(self.samples) if self.samples else float("nan")

    @property
    def mean_trials(self) -> float:
        """Mean candidates drawn per sentence (NaN for an empty text)."""
        return sum(s.trials for s in self.samples) / len(self.samples) if self.samples else float("nan")


def check_sampler_settings(margin: float, max_trials: int, candidates_per_round: int, fallback: str) -> None:
    """Refuse rejection-sampling settings out of range (one :class:`~zoo.errors.ConfigError` naming the field)."""
    if margin < 0:
        raise ConfigError(f"margin must be >= 0, got {margin}")
    if max_trials < 1:
        raise ConfigError(f"max_trials must be >= 1, got {max_trials}")
    if candidates_per_round < 1:
        raise ConfigError(f"candidates_per_round must be >= 1, got {candidates_per_round}")
    if fallback not in ("last", "best"):
        raise ConfigError(f"fallback must be 'last' or 'best', got {fallback!r}")


def _flatten(rows: Sequence[Sequence[bool]]) -> list[bool]:
    return [bool(v) for row in rows for v in row]


class RejectionSampler:
    """Sentence-level rejection sampling against a :class:`WatermarkScheme`.

    Args:
        scheme: encoder, partition, key, gamma.
        margin: a candidate passes only when its margin is ``>= margin`` (SemStamp/MarkLLM ``margin_m`` = 0.01 on
            ``|cos|``; k-SemStamp's ``delta`` on the cosine gap; X-Guard's is a whitened distance; 0 disables).
        max_trials: ``N_max``: candidates drawn for one position before a fallback is accepted (SemStamp: 100).
        candidates_per_round: candidates requested per call of the proposer (a model samples them in one batch).
            A round is cut short so that no more than ``max_trials`` are drawn.
        fallback: what is accepted after ``max_trials`` failures -- ``"last"``: the last candidate (SemStamp's
            code); ``"best"``: the green candidate with the largest margin if any was green, else the last.
    """

    def __init__(
        self,
        scheme: WatermarkScheme,
        *,
        margin: float = 0.0,
        max_trials: int = 100,
        candidates_per_round: int = 1,
        fallback: Literal["last", "best"] = "last",
    ) -> None:
        check_sampler_settings(margin, max_trials, candidates_per_round, fallback)
        self.scheme = scheme
        self.margin = float(margin)
        self.max_trials = int(max_trials)
        self.candidates_per_round = int(candidates_per_round)
        self.fallback = fallback

    def round_size(self, state: RowState) -> int:
        """Candidates to request for ``state`` this round (``candidates_per_round`` capped by the trials left)."""
        return min(self.candidates_per_round, self.max_trials - state.trials)

    def accepts(self, regions: torch.Tensor, margins: torch.Tensor, previous_regions: torch.Tensor) -> torch.Tensor:
        """The acceptance test ``[N]`` bool: green given the previous region and ``margin >= self.margin``."""
        return self.scheme.green.is_green(regions, previous_regions) & (margins.cpu() >= self.margin)

    def choose(
        self,
        candidates: Sequence[Sequence[str]],
        states: Sequence[RowState],
        valid: Sequence[Sequence[bool]] | None = None,
    ) -> list[SentenceSample | None]:
        """One round for several rows: embed every candidate in one call and pick per row.

        Each candidate is cut to its first sentence (an empty candidate never passes). For row ``b``, the first
        candidate that passes :meth:`accepts` is returned (``trials`` counts the candidates up to it); if none
        passes and the row has now drawn ``max_trials``, the fallback is returned; otherwise None (the row needs
        another round) and ``states[b]`` is updated.

        Args:
            candidates: per row, the candidates of this round (at most :meth:`round_size` of its state).
            states: per row, its :class:`RowState` (updated in place).
            valid: per row and candidate, False for a candidate that must not pass whatever its region (e.g. one a
                model cut at its token budget before the sentence ended); it may still become the fallback.
                ``None``: all valid.
        """
        if len(candidates) != len(states):
            raise DataError(f"got candidates for {len(candidates)} rows but {len(states)} row states")
        texts = [[first_sentence(c) for c in row] for row in candidates]
        for row, (row_texts, state) in enumerate(zip(texts, states)):
            if not row_texts or len(row_texts) > self.round_size(state):
                raise DataError(
                    f"row {row}: got {len(row_texts)} candidates, expected 1..{self.round_size(state)} "
                    f"(candidates_per_round={self.candidates_per_round}, {state.trials} of {self.max_trials} drawn)"
                )
        if valid is not None and [len(v) for v in valid] != [len(t) for t in texts]:
            raise DataError("valid must hold one flag per candidate of every row")
        flat = [t for row in texts for t in row]
        allowed = [bool(t) for t in flat] if valid is None else [bool(t) and v for t, v in zip(flat, _flatten(valid))]
        regions, margins = self.scheme.regions(flat)
        previous = torch.tensor([s.previous_region for s, row in zip(states, texts) for _ in row], dtype=torch.long)
        green = self.scheme.green.is_green(regions, previous)
        passed = self.accepts(regions, margins, previous) & torch.tensor(allowed, dtype=torch.bool)
        results: list[SentenceSample | None] = []
        offset = 0
        for row_texts, state in zip(texts, states):
            chosen = None
            for i, text in enumerate(row_texts):
                j = offset + i
                sample = SentenceSample(
                    text, int(regions[j]), float(margins[j]), bool(green[j]), bool(passed[j]), state.trials + i + 1
                )
                if sample.passed:
                    chosen = sample
                    break
                state.fallback = self._keep(state.fallback, sample)
            offset += len(row_texts)
            if chosen is None:
                state.trials += len(row_texts)
                if state.trials >= self.max_trials:
                    assert state.fallback is not None
                    chosen = replace(state.fallback, trials=state.trials)
            results.append(chosen)
        return results

    def _keep(self, kept: SentenceSample | None, new: SentenceSample) -> SentenceSample:
        if self.fallback == "last" or kept is None:
            return new
        if new.green and (not kept.green or new.margin > kept.margin):
            return new
        if not kept.green:
            return new  # no green candidate yet: keep the last
        return kept

    def sample(self, propose: Callable[[int], Sequence[str]], previous_region: int) -> SentenceSample:
        """One sentence from ``propose(n) -> n candidate sentences``, keyed on ``previous_region``."""
        state = RowState(previous_region)
        while True:
            n = self.round_size(state)
            candidates = list(propose(n))
            if len(candidates) != n:
                raise DataError(f"propose({n}) returned {len(candidates)} candidates")
            chosen = self.choose([candidates], [state])[0]
            if chosen is not None:
                return chosen

    def generate(
        self, propose: Callable[[str, int], Sequence[str]], prompt: str, num_sentences: int
    ) -> WatermarkedText:
        """A watermarked text of ``num_sentences`` sentences after ``prompt``.

        Args:
            propose: ``(context, n) -> n`` candidate next sentences, where ``context`` is the prompt followed by
                the sentences accepted so far (joined by single spaces).
            prompt: the prompt; its last sentence keys the first generated sentence.
            num_sentences: sentences to generate.
        """
        if num_sentences < 0:
            raise ConfigError(f"num_sentences must be >= 0, got {num_sentences}")
        result = WatermarkedText(prompt)
        previous = self.scheme.context_region(prompt)
        for _ in range(num_sentences):
            context = " ".join(part for part in (prompt.strip(), result.text) if part)
            sample = self.sample(lambda n, context=context: propose(context, n), previous)
            result.sentences.append(sample.text)
            result.samples.append(sample)
            previous = sample.region
        return result
