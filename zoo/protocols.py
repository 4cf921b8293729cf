"""The protocols every floor shares (ground floor, ``docs/architecture.md``): the verifier and the generation protocol.

A *verifier* (:data:`Verifier`) is any ``(completion, answer) -> bool``; decoders, rewards and callbacks receive one
as an object (a task, :data:`zoo.answers.EXACT_ANSWER`, a function) and never import a task.

The generation protocol is the only thing callbacks may rely on. Its data types are :class:`SamplingParams` (decoding
options) and :class:`GenerationResult` (what every decoder returns).

A *generating module* has a ``tokenizer``, a ``model``, a ``generate`` method, and returns a
:class:`GenerationOutput` dict from ``validation_step`` / ``test_step`` / ``predict_step``.

The zoo's generating modules (:class:`zoo.modules.generating.GeneratingModule`) also carry a ``decoder``
(:class:`zoo.generation.decoders.Decoder`, ``module/decoder=<name>``): ``generate`` and every evaluation
generation run through it, and a callback may add logits processors or forward hooks to
``module.decoder.processors`` / ``module.decoder.hooks``. The decoder is not part of the protocol (a plain
Lightning module with ``tokenizer``, ``model`` and ``generate`` is enough); callbacks use it when present.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import pad_width

# ``(completion, answer) -> bool``: what modules, decoders and callbacks accept as a verifier (a task, an
# :class:`~zoo.answers.AnswerVerifier`, or any function).
Verifier = Callable[[str, Any], bool]


@dataclass
class SamplingParams:
    """Decoding options.

    Attributes:
        max_new_tokens: generation budget per row.
        do_sample: sample (``True``) or greedy (``False``).
        temperature, top_k, top_p: sampling transforms (``top_k=0`` and ``top_p=1`` disable them).
        stop_strings: generation of a row stops once its completion ends with one of these (kept in the text).
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_strings: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.do_sample and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def with_temperature(self, temperature: float | None) -> SamplingParams:
        """These options with a decoder's own temperature: ``None`` keeps them, ``0`` decodes greedily, ``t > 0``
        samples at ``t`` (budget, top-k/top-p and stop strings are kept)."""
        if temperature is None:
            return self
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy) or None, got {temperature}")
        if temperature == 0:
            return replace(self, do_sample=False)
        return replace(self, do_sample=True, temperature=float(temperature))


@dataclass
class GenerationResult:
    """Output of every decoder (the fields of the generation protocol).

    Attributes:
        prompt_ids: ``[B, P]`` left-padded prompts (``[B, 0]`` when decoding started from ``inputs_embeds`` alone).
        completion_ids: ``[B, L]`` generated tokens, right-padded with the pad id after EOS/stop.
        completion_mask: ``[B, L]`` 1 for generated tokens (EOS included), 0 for padding.
        logprobs: ``[B, L]`` log-probability of each sampled token under the temperature-scaled distribution
            after the decoder's logits processors (the model's own when there are none; 0 on padding and on
            tokens the decoder forced instead of sampling).
        texts: decoded completions (up to EOS, special reasoning tags kept, pad/EOS removed).
        finished: ``[B]`` whether the row ended by EOS or a stop string (False: ran out of tokens).
    """

    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor
    texts: list[str]
    finished: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` number of generated tokens per row."""
        return self.completion_mask.sum(-1)

    def row_meta(self) -> dict[str, list[Any]]:
        """Per-row statistics for the generation protocol's ``meta`` (one list entry per row): ``finished``
        (ended by EOS or a stop string within the budget) and ``completion_tokens`` (generated tokens, EOS included).
        Decoders with more to say (branch events, votes, ...) extend it in their result class."""
        return {
            "finished": [bool(x) for x in self.finished.tolist()],
            "completion_tokens": [int(x) for x in self.lengths.tolist()],
        }

    def select(self, rows: torch.Tensor | Sequence[int]) -> GenerationResult:
        """The rows ``rows`` (indices, in that order) as a plain :class:`GenerationResult`."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.completion_ids.device)
        return GenerationResult(
            prompt_ids=self.prompt_ids[index],
            completion_ids=self.completion_ids[index],
            completion_mask=self.completion_mask[index],
            logprobs=self.logprobs[index],
            texts=[self.texts[i] for i in index.tolist()],
            finished=self.finished[index],
        )

    @staticmethod
    def concat(results: Sequence[GenerationResult], pad_id: int) -> GenerationResult:
        """Rows of several results, one after the other: prompts left-padded and completions right-padded
        (``pad_id``; masks and log-probs with 0) to the widest of them."""
        if not results:
            raise ValueError("GenerationResult.concat: no results")
        prompt_width = max(r.prompt_ids.shape[1] for r in results)
        width = max(r.completion_ids.shape[1] for r in results)
        return GenerationResult(
            prompt_ids=torch.cat([pad_width(r.prompt_ids, prompt_width, pad_id, "left") for r in results]),
            completion_ids=torch.cat([pad_width(r.completion_ids, width, pad_id, "right") for r in results]),
            completion_mask=torch.cat([pad_width(r.completion_mask, width, 0, "right") for r in results]),
            logprobs=torch.cat([pad_width(r.logprobs, width, 0.0, "right") for r in results]),
            texts=[t for r in results for t in r.texts],
            finished=torch.cat([r.finished for r in results]),
        )


class GenerationOutput(TypedDict, total=False):
    """Returned by ``validation_step``/``test_step``/``predict_step`` of generating modules.

    Keys: ``prompt_ids [B, P]`` (left-padded), ``completion_ids [B, L]``, ``texts`` (list of completions),
    ``logprobs [B, L]`` (optional), ``meta`` (dict of per-row lists: ``prompts``, ``answers``,
    ``correct``, and from the zoo's generating modules the decoder's statistics ``finished``,
    ``completion_tokens``, ..., see :meth:`zoo.protocols.GenerationResult.row_meta`).
    """

    prompt_ids: torch.Tensor
    completion_ids: torch.Tensor
    texts: list[str]
    logprobs: torch.Tensor
    meta: dict[str, Any]


@runtime_checkable
class SupportsGenerate(Protocol):
    """What a callback needs from a generating module."""

    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_attention_mask: torch.Tensor,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> GenerationResult:
        """Generate completions for left-padded prompts (``params``: the module's defaults when ``None``)."""
        ...


def missing_generation_protocol(module: object) -> list[str]:
    """Names of the protocol members ``module`` lacks (empty when it supports the protocol)."""
    missing = [name for name in ("tokenizer", "model") if getattr(module, name, None) is None]
    if not callable(getattr(module, "generate", None)):
        missing.append("generate()")
    return missing
