"""Answer voting over several traces of one prompt, and self-consistency as a decoder.

* :func:`majority_vote` -- the most common extracted answer (``collections.Counter.most_common``), shared by
  self-consistency and DTS-Stable (:mod:`zoo.generation.dts`);
* :class:`VotedResult` -- a :class:`~zoo.protocols.GenerationResult` whose completion per prompt was
  chosen by a vote over several traces, with the answers that voted and the decoding work;
* :class:`SelfConsistencyDecoder` (``module/decoder=self_consistency``) -- *Self-Consistency Improves Chain of
  Thought Reasoning in Language Models* (Wang et al., arXiv 2203.11171): ``num_samples`` independent samples per
  prompt, majority vote over their extracted answers; the returned completion is the first sample that gave the
  winning answer. With ``select=shortest`` (``module/decoder=shortest_of_n``) it is the compute-matched baseline of
  DTS-Greedy (arXiv 2511.00640): the samples race in lockstep and the first to finish (the shortest) is returned;
  the other samples stop in that step, so the work is what a lockstep decode of ``N`` traces spends until one ends.

Answers are extracted by the task's verifier (:meth:`zoo.answers.AnswerVerifier.extract_answer`, configs pass
``verifier: ${task}``); traces without an answer (``None`` or empty) do not vote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.answers import EXACT_ANSWER, AnswerVerifier
from zoo.errors import ConfigError
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill, SampleDecoder
from zoo.protocols import GenerationResult, SamplingParams

# how SelfConsistencyDecoder picks the returned sample: majority vote, or the first to finish
SELECT_RULES = ("vote", "shortest")


def majority_vote(answers: Iterable[str | None]) -> str | None:
    """The most common answer among ``answers`` that are not ``None``/empty, as
    ``Counter(valid).most_common(1)`` gives it (ties go to the answer seen first); ``None`` when none is valid.

    >>> majority_vote(["7", None, "8", "7", ""])
    '7'
    >>> majority_vote(["8", "7"])  # a tie: the first one seen
    '8'
    """
    valid = [a for a in answers if a]
    if not valid:
        return None
    return Counter(valid).most_common(1)[0][0]


def winner_share(answers: Iterable[str | None]) -> tuple[int, float]:
    """``(number of valid answers, share of the most common one)``; ``(0, 0.0)`` when none is valid."""
    valid = [a for a in answers if a]
    if not valid:
        return 0, 0.0
    return len(valid), Counter(valid).most_common(1)[0][1] / len(valid)


def first_index(answers: Sequence[str | None], winner: str | None) -> int:
    """Index of the first answer equal to ``winner`` (0 when there is none): the trace a vote returns."""
    return next((k for k, a in enumerate(answers) if winner is not None and a == winner), 0)


def check_verifier(verifier: Any, owner: str) -> AnswerVerifier:
    """The verifier a voting decoder extracts answers with (``None``: the shared completion format's)."""
    if verifier is None:
        return EXACT_ANSWER
    if not callable(getattr(verifier, "extract_answer", None)):
        raise ConfigError(
            f"{owner}.verifier must have extract_answer(text) -> str | None (a zoo Task or AnswerVerifier; configs "
            f"pass verifier: ${{task}}), got {type(verifier).__name__}"
        )
    return verifier


@dataclass(kw_only=True)
class VotedResult(GenerationResult):
    """A :class:`~zoo.protocols.GenerationResult` (one completion per prompt, the chosen trace) plus:

    Attributes:
        answers: per prompt, the extracted answers of the traces that voted, in order (``None``: no answer).
        voted: per prompt, the winning answer (``None`` when no trace had one).
        decoded_tokens: per prompt, tokens generated over all its traces (the decoding work; EOS included).
    """

    answers: list[list[str | None]]
    voted: list[str | None]
    decoded_tokens: list[int]

    def row_meta(self) -> dict[str, list[Any]]:
        return {
            **super().row_meta(),
            "decoded_tokens": list(self.decoded_tokens),
            "num_traces": [len(a) for a in self.answers],
            "voted_answer": list(self.voted),
        }


def stack_rows(
    rows: Sequence[Sequence[int]], values: Sequence[Sequence[float]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [B, L], mask [B, L], values [B, L])`` of variable-length rows, right-padded (pad id / 0)."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    vals = torch.zeros(len(rows), width, dtype=torch.float, device=device)
    for i, (r, v) in enumerate(zip(rows, values)):
        if r:
            ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long, device=device)
            mask[i, : len(r)] = 1
            vals[i, : len(r)] = torch.tensor(list(v), dtype=torch.float, device=device)
    return ids, mask, vals


class SelfConsistencyDecoder(Decoder):
    """``module/decoder=self_consistency``: ``num_samples`` independent samples per prompt (one batch through the
    standard loop, :class:`~zoo.generation.decoders.SampleDecoder`), majority vote over their answers.

    Every sample has the module's ``max_new_tokens`` budget, the same as each DTS hypothesis, so the comparison is
    at a matched per-trace budget; :attr:`VotedResult.decoded_tokens` reports the total work.

    ``select=shortest`` (``module/decoder=shortest_of_n``): the shortest finished sample instead of the vote. The
    samples of a prompt race (``race_groups`` of :meth:`~zoo.generation.decoders.Decoder.sample_loop`): when one
    finishes, the others stop in the same step, unfinished, which changes no sample's tokens up to that step, so the
    returned trace is the shortest of the ``N`` full samples and the work is ``sum_j min(len_j, len_shortest)``.
    Samples that finish in that same step vote as DTS-Greedy's do (answers that cannot be parsed do not vote; the
    first sample with the winning answer is returned); when none finishes within the budget, the first sample is
    returned, unfinished.

    Args:
        num_samples: samples per prompt (``B`` of the vote, ``N`` of shortest-of-N).
        temperature: sampling temperature of the samples (``None``: the module's sampling settings; ``0`` would
            make all samples identical and is refused).
        verifier: extracts the answer of a sample (``None``: the shared ``</think>ANSWER`` format).
        select: ``vote`` (self-consistency) or ``shortest`` (the first finished sample; see above).
        processors, hooks: as every :class:`~zoo.generation.decoders.Decoder`.
    """

    def __init__(
        self,
        num_samples: int = 8,
        temperature: float | None = 0.6,
        verifier: AnswerVerifier | None = None,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
        select: str = "vote",
    ) -> None:
        super().__init__(processors, hooks)
        if select not in SELECT_RULES:
            raise ConfigError(f"module.decoder.select must be one of {SELECT_RULES}, got {select!r}")
        if int(num_samples) < 1:
            raise ConfigError(f"module.decoder.num_samples must be >= 1, got {num_samples}")
        if temperature is not None and temperature <= 0:
            raise ConfigError(
                f"module.decoder.temperature must be > 0 (independent samples) or null, got {temperature}"
            )
        self.num_samples = int(num_samples)
        self.temperature = temperature
        self.verifier = check_verifier(verifier, "module.decoder")
        self.select = select

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> VotedResult:
        n, batch = self.num_samples, prefill.batch_size
        params = params.with_temperature(self.temperature)
        if self.temperature is None and not params.do_sample and n > 1:
            raise ConfigError(
                "self-consistency needs sampled traces: the module's sampling settings are greedy (do_sample=false); "
                "set module.decoder.temperature or the module's do_sample=true"
            )
        inner = SampleDecoder(processors=self.processors)  # the hooks are already attached by __call__
        repeated = prefill.repeat_interleave(n)
        race = torch.arange(batch, device=prefill.device).repeat_interleave(n) if self.select == "shortest" else None
        samples = inner.sample_loop(
            repeated.start(model), repeated.prompt_ids, tokenizer, params, generator, race_groups=race
        )
        lengths, ended = samples.lengths.tolist(), samples.finished.tolist()
        rows, values, texts, finished, answers, voted = [], [], [], [], [], []
        for i in range(batch):
            group = range(i * n, (i + 1) * n)
            if self.select == "shortest":
                # the samples that finished (all in the step the race ended), else the first one
                group = [j for j in group if ended[j]] or [i * n]
            group_answers = [self.verifier.extract_answer(samples.texts[j]) for j in group]
            winner = majority_vote(group_answers)
            chosen = group[first_index(group_answers, winner)]
            texts.append(samples.texts[chosen])
            rows.append(samples.completion_ids[chosen, : lengths[chosen]].tolist())
            values.append(samples.logprobs[chosen, : lengths[chosen]].tolist())
            finished.append(bool(samples.finished[chosen]))
            answers.append(group_answers)
            voted.append(winner)
        ids, mask, logprobs = stack_rows(rows, values, tokenizer.pad_token_id, prefill.device)
        return VotedResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=ids,
            completion_mask=mask,
            logprobs=logprobs,
            texts=texts,
            finished=torch.tensor(finished, dtype=torch.bool, device=prefill.device),
            answers=answers,
            voted=voted,
            decoded_tokens=[int(sum(lengths[i * n : (i + 1) * n])) for i in range(batch)],
        )


__all__ = [
    "SelfConsistencyDecoder",
    "VotedResult",
    "check_verifier",
    "first_index",
    "majority_vote",
    "stack_rows",
    "winner_share",
]
