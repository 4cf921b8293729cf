"""The generation protocol: the only thing callbacks may rely on.

A *generating module* has a ``tokenizer``, a ``model``, a ``generate`` method, and returns a
:class:`GenerationOutput` dict from ``validation_step`` / ``test_step`` / ``predict_step``.

The zoo's generating modules (:class:`zoo.modules.generating.GeneratingModule`) also carry a ``decoder``
(:class:`zoo.generation.decoders.Decoder`, ``module/decoder=<name>``): ``generate`` and every evaluation
generation run through it, and a callback may add logits processors or forward hooks to
``module.decoder.processors`` / ``module.decoder.hooks``. The decoder is not part of the protocol (a plain
Lightning module with ``tokenizer``, ``model`` and ``generate`` is enough); callbacks use it when present.
"""

from __future__ import annotations

from typing import Any, Protocol, TypedDict, runtime_checkable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.generation.sampling import GenerationResult, SamplingParams


class GenerationOutput(TypedDict, total=False):
    """Returned by ``validation_step``/``test_step``/``predict_step`` of generating modules.

    Keys: ``prompt_ids [B, P]`` (left-padded), ``completion_ids [B, L]``, ``texts`` (list of completions),
    ``logprobs [B, L]`` (optional), ``meta`` (dict of per-row lists: ``prompts``, ``answers``,
    ``correct``, and from the zoo's generating modules the decoder's statistics ``finished``,
    ``completion_tokens``, ..., see :meth:`zoo.generation.sampling.GenerationResult.row_meta`).
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
