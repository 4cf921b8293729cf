"""The decoder seam: one protocol from prompt ids or ``inputs_embeds`` to a :class:`GenerationResult`.

A generating module holds one :class:`Decoder` (``module/decoder=<name>``: ``sample``, ``stepwise``, ...) and
every generation of its validation/test/predict steps goes through it. A decoder is called as::

    decoder(model, tokenizer, prompt_ids, attention_mask, params=SamplingParams(...), generator=g)
    decoder(model, tokenizer, attention_mask=mask, inputs_embeds=embeds, params=...)   # prefill from vectors
    decoder(model, tokenizer, ids, mask, params=..., pixel_values=pixels)             # extra prefill inputs

and carries two ordered lists that compose with any decoding loop (callbacks may append to / remove from them at
run time, e.g. ``pl_module.decoder.processors.append(p)`` in ``setup``):

* :attr:`Decoder.processors` -- logits processors with the transformers ``LogitsProcessor`` call convention
  ``processor(input_ids [B, t], scores [B, V]) -> scores [B, V]``, applied in order to the next-token logits of
  every sampled step (watermark biases, token bans, ...). ``input_ids`` are the prompt ids (when given) followed by
  the tokens kept so far; rows of different lengths are right-padded with the pad id. Processors see every row of
  the batch, finished ones included; the log-probabilities of the result are taken after them.
* :attr:`Decoder.hooks` -- forward hooks: callables ``hook(model) -> context manager`` entered in order around the
  whole decode and exited (hooks removed) when it ends, also on an exception. :class:`ModuleHook` wraps
  ``register_forward_hook`` / ``register_forward_pre_hook`` on a named submodule this way (residual steering, head
  scaling of an attention output projection, activation capture).

Writing a decoder (DTS tree decoding, undo-aware decoding, sentence-level rejection sampling, ...): subclass
:class:`Decoder` and implement only :meth:`Decoder.decode`, the loop. The base has already validated the inputs
into a :class:`Prefill`, checked the context length, put the model in eval mode under ``torch.no_grad`` and
attached the hooks. Inside the loop use :meth:`Prefill.start` for a KV-cached
:class:`~zoo.generation.sampling.IncrementalDecoder` (token ids or ``inputs_embeds``, extra model inputs),
:meth:`Decoder.next_tokens` to apply the processors and sample (greedy or :func:`~zoo.generation.sampling.sample_next`
with the seeded generator), or :meth:`Decoder.sample_loop` for the whole standard token loop with an extra per-row
stop test, and return a :class:`~zoo.protocols.GenerationResult` (or a dataclass subclass of it with the
decoder's extra fields, like :class:`~zoo.generation.stepwise.StepwiseResult`). A decoder that does not keep the
whole completion in the model's context (e.g. a sliding window) overrides :meth:`Decoder.check_length`.

Sharded models (FSDP ``FULL_SHARD``, DeepSpeed ZeRO-3) on several processes: a loop stops when its own rows are done,
and :meth:`Decoder.__call__` keeps the ranks in step around it (:func:`~zoo.generation.lockstep.forwards_in_step`: an
all-reduce before each forward, and a finished rank runs dummy forwards until every rank's loop has returned), so a
decoder needs no agreement of its own as long as every forward of its loop is a call of the ``model`` it was given
(not of a submodule) and its loop runs no other collective.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import encode_prompts, pad_token_id
from zoo.generation.lockstep import forwards_in_step
from zoo.generation.prefix import distinct_rows
from zoo.generation.sampling import (
    IncrementalDecoder,
    TokenTextMatcher,
    check_context,
    decode_completions,
    sample_next,
    stop_token_ids,
)
from zoo.protocols import GenerationResult, SamplingParams

LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ForwardHook = Callable[[nn.Module], AbstractContextManager[Any]]
# ``(row, completion ids so far) -> stop``: a per-row stop test of :meth:`Decoder.sample_loop`.
RowStop = Callable[[int, list[int]], bool]
# :meth:`Decoder.sample_loop` drops the stopped rows from the KV-cached batch once at most this fraction of its rows
# still run (each drop copies the cache; measured on GRPO's 64-row batches of the tiny Llama: 4% less decode time
# than at 0.75, none at 0.999)
COMPACT_FRACTION = 0.9


@dataclass
class Prefill:
    """What a decode starts from (validated by :meth:`Decoder.__call__`).

    Attributes:
        prompt_ids: ``[B, P]`` left-padded prompt ids (``[B, 0]`` when only embeddings were given); the context of
            the logits processors and the ``prompt_ids`` of the result.
        attention_mask: ``[B, P']`` mask of what is prefilled (``inputs_embeds`` when given, else ``prompt_ids``).
        inputs_embeds: ``[B, P', H]`` prefill vectors, or ``None`` to prefill ``prompt_ids``.
        model_inputs: extra inputs of the prefill forward (e.g. ``pixel_values``).
        share_repeats: prefill a prompt that several rows repeat once (:meth:`start`). A decoder with forward hooks
            turns it off: hooks see the batch the model runs on (e.g. per-row records of the prefill).
    """

    prompt_ids: torch.Tensor
    attention_mask: torch.Tensor
    inputs_embeds: torch.Tensor | None = None
    model_inputs: dict[str, Any] = field(default_factory=dict)
    share_repeats: bool = True

    @property
    def batch_size(self) -> int:
        return int(self.attention_mask.shape[0])

    @property
    def length(self) -> int:
        """Number of prefilled positions (padding included)."""
        return int(self.attention_mask.shape[1])

    @property
    def device(self) -> torch.device:
        return self.attention_mask.device

    def distinct_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(first, inverse)`` when some rows of a token-id prefill repeat another row (ids and mask): ``first``
        ``[U]`` the first row of each distinct prompt, ``inverse`` ``[B]`` the index into ``first`` of each row; else
        ``None`` (all rows distinct, an ``inputs_embeds`` prefill, or extra model inputs)."""
        if self.inputs_embeds is not None or self.model_inputs:
            return None
        return distinct_rows(self.prompt_ids, self.attention_mask)

    def repeat_interleave(self, repeats: int) -> Prefill:
        """Each row ``repeats`` times in a row (``[B, ...]`` -> ``[B * repeats, ...]``): several independent samples
        of every prompt in one batch. Extra model inputs that are batch-first tensors are repeated too."""
        batch = self.batch_size

        def rep(value: Any) -> Any:
            is_rows = isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch
            return value.repeat_interleave(repeats, dim=0) if is_rows else value

        return Prefill(
            rep(self.prompt_ids),
            rep(self.attention_mask),
            None if self.inputs_embeds is None else rep(self.inputs_embeds),
            {key: rep(value) for key, value in self.model_inputs.items()},
            self.share_repeats,
        )

    def start(self, model: PreTrainedModel, output_hidden_states: bool = False) -> IncrementalDecoder:
        """Run the prefill: a KV-cached :class:`~zoo.generation.sampling.IncrementalDecoder` of the batch.

        Rows that repeat a prompt (several samples of one prompt: a GRPO group, a voting batch) are prefilled once:
        the distinct rows go through the model and their KV cache, next-token logits and hidden states are copied
        to the repeats (``reorder_rows``). Each row's state is the one a full prefill gives it (a row's outputs do
        not depend on the other rows); a cache that cannot be reordered gets the full prefill."""
        distinct = self.distinct_rows() if self.share_repeats else None
        if distinct is not None:
            first, inverse = distinct
            state = Prefill(self.prompt_ids[first], self.attention_mask[first]).start(model, output_hidden_states)
            if state.reorderable:
                state.reorder_rows(inverse)
                return state
        if self.inputs_embeds is not None:
            return IncrementalDecoder(
                model,
                attention_mask=self.attention_mask,
                inputs_embeds=self.inputs_embeds,
                output_hidden_states=output_hidden_states,
                **self.model_inputs,
            )
        return IncrementalDecoder(
            model,
            self.prompt_ids,
            self.attention_mask,
            output_hidden_states=output_hidden_states,
            **self.model_inputs,
        )


def as_prefill(
    prompt_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    model_inputs: dict[str, Any],
) -> Prefill:
    """Validate the decoder inputs (see :meth:`Decoder.__call__`) into a :class:`Prefill`."""
    if prompt_ids is None and inputs_embeds is None:
        raise ValueError("a decoder needs prompt_ids or inputs_embeds")
    if prompt_ids is not None and prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be [batch, length], got shape {tuple(prompt_ids.shape)}")
    if inputs_embeds is not None and inputs_embeds.dim() != 3:
        raise ValueError(f"inputs_embeds must be [batch, length, hidden], got shape {tuple(inputs_embeds.shape)}")
    prefilled = inputs_embeds if inputs_embeds is not None else prompt_ids
    batch, length = prefilled.shape[:2]
    if attention_mask is None:
        attention_mask = torch.ones(batch, length, dtype=torch.long, device=prefilled.device)
    if tuple(attention_mask.shape) != (batch, length):
        what = "inputs_embeds" if inputs_embeds is not None else "prompt_ids"
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but {what} is [{batch}, {length}, ...]; "
            "the mask describes what is prefilled"
        )
    if prompt_ids is None:
        prompt_ids = torch.zeros(batch, 0, dtype=torch.long, device=prefilled.device)
    elif prompt_ids.shape[0] != batch:
        raise ValueError(f"prompt_ids has {prompt_ids.shape[0]} rows but inputs_embeds has {batch}")
    return Prefill(prompt_ids, attention_mask, inputs_embeds, dict(model_inputs))


class Decoder(ABC):
    """Base of all decoders: the call protocol, the processor and hook lists, eval mode and the context check.

    Args:
        processors: logits processors ``(input_ids [B, t], scores [B, V]) -> scores``, applied in order.
        hooks: forward hooks ``model -> context manager``, entered in order around each decode.

    Attributes:
        consistent_with_forward: whether one forward pass over prompt + ``completion_ids`` of the result shows every
            completion token the context it was sampled in (True for the loops here). Trainers that score
            completions with such a pass (GRPO) refuse a decoder that says False (e.g. undo decoding with KV-cache
            cropping, where retracted tokens left the context).
    """

    consistent_with_forward: bool = True

    def __init__(self, processors: Iterable[LogitsProcessor] = (), hooks: Iterable[ForwardHook] = ()) -> None:
        self.processors: list[LogitsProcessor] = list(processors)
        self.hooks: list[ForwardHook] = list(hooks)

    @property
    def shares_prefills(self) -> bool:
        """Whether a prefill may compute a prompt that several rows repeat once (:attr:`Prefill.share_repeats`):
        not when forward hooks are attached, which see the batch the model runs on."""
        return not self.hooks

    @torch.no_grad()
    def __call__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        **model_inputs: Any,
    ) -> GenerationResult:
        """Decode a batch.

        Args:
            model: any Hugging Face causal LM (put in eval mode for the call, then restored).
            tokenizer: its tokenizer (EOS/pad ids, decoding, stop strings).
            prompt_ids: ``[B, P]`` left-padded prompt ids; with ``inputs_embeds`` they are only the processors'
                context and the result's ``prompt_ids`` (their width may differ from the embeddings').
            attention_mask: ``[B, P']`` mask of the prefill (of ``inputs_embeds`` when given; ``None``: all ones).
            inputs_embeds: ``[B, P', H]`` left-padded prefill vectors, fed instead of the ids.
            params: decoding options (default :class:`~zoo.protocols.SamplingParams`).
            generator: a seeded ``torch.Generator`` for reproducible sampling.
            **model_inputs: extra inputs of the prefill forward (e.g. ``pixel_values``).
        """
        params = params or SamplingParams()
        prefill = as_prefill(prompt_ids, attention_mask, inputs_embeds, model_inputs)
        if not self.shares_prefills:
            prefill = replace(prefill, share_repeats=False)
        self.check_length(model, prefill, params)
        was_training = model.training
        model.eval()
        try:
            with forwards_in_step(model, tokenizer), self.attached(model):
                return self.decode(model, tokenizer, prefill, params, generator)
        finally:
            model.train(was_training)

    def check_length(self, model: PreTrainedModel, prefill: Prefill, params: SamplingParams) -> None:
        """Refuse a decode the model's positions cannot hold (:class:`~zoo.errors.ConfigError`). Default: the
        prefill plus ``params.max_new_tokens``; a decoder that adds tokens of its own (injections) or does not keep
        the whole completion in the model's context overrides it."""
        what = "prompt" if prefill.inputs_embeds is None else "prefill (inputs_embeds)"
        check_context(model, prefill.length, params, what)

    @contextlib.contextmanager
    def attached(self, model: nn.Module) -> Iterator[None]:
        """Enter every forward hook in order (exited in reverse order on leaving, also on an exception)."""
        with contextlib.ExitStack() as stack:
            for hook in list(self.hooks):
                stack.enter_context(hook(model))
            yield

    @abstractmethod
    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> GenerationResult:
        """The decoding loop (model in eval mode, no grad, hooks attached, context length checked)."""

    # -- helpers for the loops --------------------------------------------------------------------------------
    def process(self, context_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Apply the logits processors in order: ``context_ids [B, t]``, ``scores [B, V]`` -> ``[B, V]``."""
        for processor in list(self.processors):
            scores = processor(context_ids, scores)
        return scores

    def next_tokens(
        self,
        logits: torch.Tensor,
        context_ids: torch.Tensor | None,
        params: SamplingParams,
        generator: torch.Generator | None,
        rows: torch.Tensor | None = None,
        num_rows: int | None = None,
        ban_eos: tuple[torch.Tensor, int | Sequence[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Processors (when any; ``context_ids`` may be ``None`` when there are none), then
        :func:`~zoo.generation.sampling.sample_next`: ``(tokens [B], logprobs [B])``. ``ban_eos = (rows [B] bool,
        stop id(s))``: those rows may not sample them (their logits are set to ``-inf`` after the processors)."""
        if self.processors:
            logits = self.process(context_ids, logits)
        if ban_eos is not None:
            banned, eos = ban_eos
            columns = [eos] if isinstance(eos, int) else list(eos)
            block = logits[:, columns].masked_fill(banned[:, None], float("-inf"))
            logits = logits.clone()
            logits[:, columns] = block
        return sample_next(logits, params, generator, rows=rows, num_rows=num_rows)

    def sample_loop(
        self,
        state: IncrementalDecoder,
        context_ids: torch.Tensor,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        generator: torch.Generator | None,
        row_stop: RowStop | None = None,
        no_eos: torch.Tensor | None = None,
        race_groups: torch.Tensor | None = None,
    ) -> GenerationResult:
        """Sample from a prefilled ``state`` one token per row per step until every row has stopped.

        A row stops at a stop token (the tokenizer's EOS and the model's generation-config EOS ids,
        :func:`~zoo.generation.sampling.stop_token_ids`), when its completion ends with one of
        ``params.stop_strings``, when ``row_stop(row, ids)`` (called after each sampled token with the row's
        completion ids so far, EOS excluded) is true, or after ``params.max_new_tokens`` tokens. Rows that stopped
        leave the KV-cached batch once a tenth of them are done unless there are logits processors (they always see
        every row).

        Args:
            state: the prefilled batch (:meth:`Prefill.start`); ``B`` rows.
            context_ids: ``[B, P]`` the processors' context before the first sampled token (the prompt ids),
                returned as the result's ``prompt_ids``.
            tokenizer, params, generator: as :meth:`__call__`.
            row_stop: an extra per-row stop test (e.g. a sentence end).
            no_eos: ``[B]`` bool, rows that may not sample a stop token (logits set to ``-inf`` after the processors,
                so the sampling distribution and the returned log-probs are renormalised over the other tokens).
            race_groups: ``[B]`` group id of each row: once a row of a group finishes, the group's other rows stop
                in the same step, unfinished (a race of independent samples whose first finisher wins, e.g.
                shortest-of-N in :class:`~zoo.generation.voting.SelfConsistencyDecoder`).

        Returns:
            a :class:`~zoo.protocols.GenerationResult`; ``finished`` is true for rows stopped by EOS, a
            stop string or ``row_stop``.
        """
        batch, device = int(context_ids.shape[0]), context_ids.device
        eos, pad = sorted(stop_token_ids(state.model, tokenizer)), pad_token_id(tokenizer)
        eos_ids = torch.tensor(eos, dtype=torch.long, device=device)
        stops = TokenTextMatcher(tokenizer, params.stop_strings) if params.stop_strings else None
        track = stops is not None or row_stop is not None
        compact = not self.processors
        context = context_ids
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        out_ids, out_lp, out_mask = [], [], []
        rows: list[list[int]] = [[] for _ in range(batch)]
        # ``live`` maps the state's (possibly compacted) rows to rows of the batch.
        live = torch.arange(batch, device=device)
        ban = no_eos.to(device) if no_eos is not None and eos and bool(no_eos.any()) else None
        for _ in range(params.max_new_tokens):
            sampled, sampled_lp = self.next_tokens(
                state.next_logits,
                context,
                params,
                generator,
                live,
                batch,
                ban_eos=None if ban is None else (ban[live], eos),
            )
            tokens = torch.full((batch,), pad, dtype=torch.long, device=device)
            logprobs = torch.zeros(batch, dtype=sampled_lp.dtype, device=device)
            tokens[live] = sampled
            logprobs[live] = sampled_lp
            active = ~done
            tokens = torch.where(active, tokens, torch.full_like(tokens, pad))
            out_ids.append(tokens)
            out_lp.append(torch.where(active, logprobs, torch.zeros_like(logprobs)))
            out_mask.append(active.long())
            if self.processors:
                context = torch.cat([context, tokens[:, None]], dim=1)
            hit_eos = active & torch.isin(tokens, eos_ids)
            if track:
                token_list = tokens.tolist()
                for i in torch.nonzero(active & ~hit_eos).flatten().tolist():
                    rows[i].append(token_list[i])
                    stop = stops is not None and stops.ends_with(rows[i])
                    if stop or (row_stop is not None and row_stop(i, rows[i])):
                        hit_eos[i] = True
            finished |= hit_eos
            done |= hit_eos
            if race_groups is not None and bool(hit_eos.any()):
                done |= torch.isin(race_groups, race_groups[finished])
            if bool(done.all()):
                break
            still = ~done[live]
            if (
                compact
                and int(still.sum()) <= COMPACT_FRACTION * len(live)
                and state.select_rows(torch.nonzero(still).flatten())
            ):
                live = live[still]
            state.feed(tokens[live][:, None], (~done[live]).long()[:, None])
        completion_ids = torch.stack(out_ids, dim=1)
        return GenerationResult(
            prompt_ids=context_ids,
            completion_ids=completion_ids,
            completion_mask=torch.stack(out_mask, dim=1),
            logprobs=torch.stack(out_lp, dim=1),
            texts=decode_completions(tokenizer, completion_ids.tolist(), eos),
            finished=finished,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(processors={len(self.processors)}, hooks={len(self.hooks)})"


def padded_context(prompt_ids: torch.Tensor, rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """``[B, P + max len]``: the prompt ids followed by each row's kept tokens, right-padded with ``pad_id``."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long, device=prompt_ids.device)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long, device=prompt_ids.device)
    return torch.cat([prompt_ids, out], dim=1)


class SampleDecoder(Decoder):
    """The standard loop (``module/decoder=sample``): one token per row per step until EOS, a stop string or
    ``max_new_tokens``; greedy or sampled (temperature / top-k / top-p, Gumbel-max with per-row noise).

    Rows that finished leave the KV-cached batch once a tenth of them are done (the sampling noise is drawn per
    batch row, so seeded outputs do not depend on it); with logits processors the batch is kept whole, so that
    processors always see every row. The loop is :meth:`Decoder.sample_loop`.
    """

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> GenerationResult:
        return self.sample_loop(prefill.start(model), prefill.prompt_ids, tokenizer, params, generator)


class GreedyDecoder(SampleDecoder):
    """``module/decoder=greedy``: the standard loop taking the most likely token at every step, whatever the
    module's sampling settings say (``do_sample`` is ignored; budget and stop strings apply). The greedy anchor of
    decoding comparisons."""

    def decode(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> GenerationResult:
        return super().decode(model, tokenizer, prefill, replace(params, do_sample=False), generator)


@dataclass
class ModuleHook:
    """A forward hook on a named submodule, as a decoder hook: ``ModuleHook("model.layers.1.self_attn.o_proj",
    fn, pre=True)``; calling it with a model returns a context manager that registers ``fn`` and removes it on exit.

    Args:
        submodule: dotted path for ``model.get_submodule`` (``""`` = the model itself).
        fn: the hook, with PyTorch's signature (``fn(module, args[, kwargs])`` for pre-hooks,
            ``fn(module, args[, kwargs], output)`` for forward hooks).
        pre: a forward pre-hook (sees and may replace the inputs) instead of a forward hook.
        with_kwargs: pass keyword arguments to ``fn`` too.
    """

    submodule: str
    fn: Callable[..., Any]
    pre: bool = False
    with_kwargs: bool = False

    @contextlib.contextmanager
    def __call__(self, model: nn.Module) -> Iterator[torch.utils.hooks.RemovableHandle]:
        target = model.get_submodule(self.submodule)
        register = target.register_forward_pre_hook if self.pre else target.register_forward_hook
        handle = register(self.fn, with_kwargs=self.with_kwargs)
        try:
            yield handle
        finally:
            handle.remove()


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_attention_mask: torch.Tensor,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """:class:`SampleDecoder` without processors or hooks on left-padded prompts (the plain sampler)."""
    return SampleDecoder()(model, tokenizer, prompt_ids, prompt_attention_mask, params=params, generator=generator)


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
    decoder: Decoder | None = None,
) -> GenerationResult:
    """Tokenize ``prompts`` as the datamodules do (BOS first when the tokenizer has one), left-pad, and decode
    (with ``decoder``; default: a plain :class:`SampleDecoder`)."""
    ids, mask = encode_prompts(tokenizer, prompts, next(model.parameters()).device)
    return (decoder or SampleDecoder())(model, tokenizer, ids, mask, params=params, generator=generator)


__all__ = [
    "Decoder",
    "ForwardHook",
    "GreedyDecoder",
    "LogitsProcessor",
    "ModuleHook",
    "Prefill",
    "RowStop",
    "SampleDecoder",
    "as_prefill",
    "generate",
    "generate_text",
    "padded_context",
]
