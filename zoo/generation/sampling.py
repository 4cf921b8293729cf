"""Decoding primitives shared by every decoder (:mod:`zoo.generation.decoders`) over any Hugging Face causal LM.

The pieces are reusable functions and one small class, not a method of a module:

* :class:`IncrementalDecoder` -- prefill a left-padded batch (from token ids or from ``inputs_embeds``, with extra
  model inputs such as ``pixel_values``), then feed tokens or embedding vectors (any number per row, with per-row
  padding) and read the next-token logits (and, optionally, the last hidden states) of every row; rows may
  diverge (e.g. after an injection) because positions come from the running attention mask.
* :func:`sample_next` -- temperature / top-k / top-p (transformers' logits warpers) or greedy.
* :func:`check_context`, :func:`decode_completion` (:func:`decode_completions` for several), :func:`max_token_length`
  -- the context check, the text of a completion and the tail window of stop-string checks.

The decoding loops themselves are decoders: :class:`~zoo.generation.decoders.SampleDecoder` (the standard loop,
also :func:`~zoo.generation.decoders.generate`), :class:`~zoo.generation.stepwise.StepwiseDecoder`, and the
decoders of individual methods (e.g. VaLR's :class:`~zoo.multimodal.valr.LatentDecoder`).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from zoo.encoding import pad_width
from zoo.errors import ConfigError
from zoo.protocols import SamplingParams


def cache_kwarg_name(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward``: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def crop_cache(cache: object, num_tokens: int) -> bool:
    """Remove the last ``num_tokens`` positions of a transformers ``Cache`` with its public ``crop`` (both call
    conventions: ``crop(-n)`` in recent transformers 5 releases, ``crop(max_length)`` before); False when the cache
    has no ``crop`` or says it is not croppable."""
    crop = getattr(cache, "crop", None)
    if crop is None or getattr(cache, "is_croppable", True) is False:
        return False
    if "tokens_to_remove" in inspect.signature(crop).parameters:
        crop(-num_tokens)
    else:
        crop(cache.get_seq_length() - num_tokens)
    return True


def plain_dynamic_cache(cache: object) -> bool:
    """Whether ``cache`` is a transformers cache of plain full-attention ``DynamicLayer`` s only (per-layer key/value
    tensors ``[B, heads, T, head_dim]`` that may be sliced, gathered and joined along the batch)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` (of the base model under a PEFT wrapper) takes ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


@dataclass
class ParkedRow:
    """One row set aside from an :class:`IncrementalDecoder` batch (:meth:`IncrementalDecoder.park_rows`): per layer
    its keys/values ``[1, heads, T, head_dim]``, its attention mask ``[1, T]``, next logits ``[1, V]`` and hidden
    states (or ``None``)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    attention_mask: torch.Tensor
    next_logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None


class IncrementalDecoder:
    """KV-cached decoding state of a batch.

    Args:
        model: a Hugging Face causal LM (or an image-text model with a language head).
        input_ids: ``[B, P]`` left-padded prompt ids, or ``None`` with ``inputs_embeds``.
        attention_mask: ``[B, P]`` mask of the prefill (``None``: all ones).
        inputs_embeds: ``[B, P, H]`` left-padded prompt embeddings fed instead of ``input_ids`` (e.g. a prompt
            with inserted structure tokens, or latent vectors).
        output_hidden_states: also keep :attr:`hidden_states`, the hidden states of every layer at each row's
            last fed position.
        **model_inputs: extra inputs of the prefill forward only (e.g. ``pixel_values`` of a vision-language model).

    Positions are ``cumsum(attention_mask) - 1`` (padding does not advance them), so left padding and per-row
    padding inside fed chunks are invisible to the model.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        **model_inputs: object,
    ) -> None:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("IncrementalDecoder needs exactly one of input_ids and inputs_embeds")
        width_of = input_ids if input_ids is not None else inputs_embeds
        if attention_mask is None:
            attention_mask = torch.ones(width_of.shape[:2], dtype=torch.long, device=width_of.device)
        self.model = model
        self.attention_mask = attention_mask.clone()
        self.cache = None
        self.output_hidden_states = output_hidden_states
        self.hidden_states: tuple[torch.Tensor, ...] | None = None
        self.next_logits: torch.Tensor | None = None
        self._cache_kwarg = cache_kwarg_name(model)
        self._logits_to_keep = accepts_logits_to_keep(model)
        inputs = {"input_ids": input_ids} if input_ids is not None else {"inputs_embeds": inputs_embeds}
        self.next_logits = self._forward(attention_mask, **inputs, **model_inputs)

    def _forward(self, chunk_mask: torch.Tensor, **inputs: object) -> torch.Tensor:
        full_mask = self.attention_mask
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, -chunk_mask.shape[1] :]
        # Only the last position's logits are needed when every row's last fed token is its last valid one (a
        # one-token feed, a left-padded prefill): no [B, P, V] logits for a prompt.
        last_only = self._logits_to_keep and (chunk_mask.shape[1] == 1 or bool(chunk_mask[:, -1].all()))
        out = self.model(
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            **({"logits_to_keep": 1} if last_only else {}),
            **({"output_hidden_states": True} if self.output_hidden_states else {}),
            **{self._cache_kwarg: self.cache},
            **inputs,
        )
        self.cache = out[self._cache_kwarg]
        logits = out.logits
        # Outputs after the last valid token of each row; rows that fed only padding keep their old ones.
        last = (chunk_mask * torch.arange(1, chunk_mask.shape[1] + 1, device=chunk_mask.device)).argmax(-1)
        rows = torch.arange(logits.shape[0], device=logits.device)
        fed = chunk_mask.any(-1)[:, None]
        picked = (logits[:, -1] if logits.shape[1] == 1 else logits[rows, last]).float()
        if self.next_logits is not None:
            picked = torch.where(fed, picked, self.next_logits)
        if self.output_hidden_states:
            states = tuple(h[rows, last] for h in out.hidden_states)
            if self.hidden_states is not None:
                states = tuple(torch.where(fed, new, old) for new, old in zip(states, self.hidden_states))
            self.hidden_states = states
        return picked

    def select_rows(self, indices: torch.Tensor) -> bool:
        """Keep only the rows ``indices`` (cache, attention mask, next logits); False if the cache cannot."""
        if not hasattr(self.cache, "batch_select_indices"):
            return False
        self.cache.batch_select_indices(indices)
        self.attention_mask = self.attention_mask[indices]
        self.next_logits = self.next_logits[indices]
        if self.hidden_states is not None:
            self.hidden_states = tuple(h[indices] for h in self.hidden_states)
        return True

    def drop_masked_tail(self) -> int:
        """Remove the trailing positions that are masked out in every row (e.g. tokens a decoder retracted) from the
        attention mask and, with the cache's public ``crop``, from the KV cache; returns how many were removed (0
        when none, or when the cache cannot be cropped). Outputs are unchanged: those positions were invisible."""
        masked = (self.attention_mask == 0).all(0).flip(0).long()
        count = int(masked.cumprod(0).sum())
        if count == 0 or count >= self.attention_mask.shape[1] or not crop_cache(self.cache, count):
            return 0
        self.attention_mask = self.attention_mask[:, :-count]
        return count

    @property
    def reorderable(self) -> bool:
        """Whether the cache can be reordered by row (a transformers ``Cache`` with ``reorder_cache``)."""
        return callable(getattr(self.cache, "reorder_cache", None))

    def reorder_rows(self, indices: torch.Tensor) -> None:
        """Row ``i`` of the state becomes a copy of row ``indices[i]``: rows may repeat (a hypothesis that branches
        into several children) or disappear (finished ones). Cache (``Cache.reorder_cache``, the public
        transformers API that beam search uses), attention mask, next logits and hidden states follow.

        Raises:
            ConfigError: the model's cache cannot be reordered (e.g. a remote-code model returning legacy tuples).
        """
        self.check_reorderable()
        try:
            self.cache.reorder_cache(indices.to(self.attention_mask.device))
        except (NotImplementedError, TypeError, AttributeError) as err:
            raise ConfigError(
                f"the KV cache of {type(self.model).__name__} ({type(self.cache).__name__}) refused to be reordered "
                f"by row ({err}); use a model with a dynamic transformers Cache"
            ) from err
        self.attention_mask = self.attention_mask[indices]
        self.next_logits = self.next_logits[indices]
        if self.hidden_states is not None:
            self.hidden_states = tuple(h[indices] for h in self.hidden_states)

    @property
    def parkable(self) -> bool:
        """Whether rows can be set aside and put back (:meth:`park_rows`): a cache of plain full-attention
        ``DynamicLayer`` s (the per-layer key/value tensors are sliced and joined along the batch)."""
        return plain_dynamic_cache(self.cache) and all(layer.is_initialized for layer in self.cache.layers)

    def park_rows(self, indices: Sequence[int]) -> list[ParkedRow]:
        """Copies of the rows ``indices`` (their keys/values, attention mask, next logits and hidden states) to put
        back later with :meth:`restore_rows` (copies: the parked rows do not keep the batch's tensors alive, nor see
        its later in-place changes); the state itself is unchanged (drop the rows with :meth:`select_rows`). Needs
        :attr:`parkable`."""
        if not self.parkable:
            raise ConfigError(f"rows of a {type(self.cache).__name__} cannot be parked (plain DynamicLayers only)")
        index = torch.tensor(list(indices), dtype=torch.long, device=self.attention_mask.device)
        # one gather per tensor; each row is a view of those copies
        keys = [layer.keys[index] for layer in self.cache.layers]
        values = [layer.values[index] for layer in self.cache.layers]
        mask, logits = self.attention_mask[index], self.next_logits[index]
        hidden = None if self.hidden_states is None else [h[index] for h in self.hidden_states]
        parked = [
            ParkedRow(
                keys=[k[j : j + 1] for k in keys],
                values=[v[j : j + 1] for v in values],
                attention_mask=mask[j : j + 1],
                next_logits=logits[j : j + 1],
                hidden_states=None if hidden is None else tuple(h[j : j + 1] for h in hidden),
            )
            for j in range(len(index))
        ]
        return parked

    def restore_rows(self, parked: Sequence[ParkedRow]) -> None:
        """Append parked rows (:meth:`park_rows`) at the end of the batch. Rows are padded on the right to a common
        width with masked-out columns: positions come from the running mask, so a restored row continues exactly as
        if it had never left (its columns keep their indices)."""
        if not parked:
            return
        width = max(self.attention_mask.shape[1], *(p.attention_mask.shape[1] for p in parked))

        def joined(tensors: list[torch.Tensor]) -> torch.Tensor:  # [*, heads, T, head_dim], T padded to ``width``
            return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors])

        for n, layer in enumerate(self.cache.layers):
            layer.keys = joined([layer.keys, *(p.keys[n] for p in parked)])
            layer.values = joined([layer.values, *(p.values[n] for p in parked)])
        masks = [self.attention_mask, *(p.attention_mask for p in parked)]
        self.attention_mask = torch.cat([pad_width(m, width, 0, "right") for m in masks])
        self.next_logits = torch.cat([self.next_logits, *(p.next_logits for p in parked)])
        if self.hidden_states is not None:
            self.hidden_states = tuple(
                torch.cat([h, *(p.hidden_states[n] for p in parked)]) for n, h in enumerate(self.hidden_states)
            )

    def check_reorderable(self) -> None:
        """Raise :class:`~zoo.errors.ConfigError` when the cache cannot be reordered by row."""
        if not self.reorderable:
            raise ConfigError(
                f"the KV cache of {type(self.model).__name__} ({type(self.cache).__name__}) cannot be reordered by "
                "row: decoders that branch or drop hypotheses need a transformers Cache object with reorder_cache "
                "(transformers-native models return one; a remote-code model returning legacy tuples does not)"
            )

    def feed(
        self,
        tokens: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append ``tokens`` ``[B, k]`` or embedding vectors ``embeds`` ``[B, k, H]`` (``mask`` ``[B, k]``: 0 marks
        per-row padding) and return the next-token logits ``[B, V]``."""
        if (tokens is None) == (embeds is None):
            raise ValueError("feed needs exactly one of tokens and embeds")
        if mask is None:
            shape = tokens.shape if tokens is not None else embeds.shape[:2]
            mask = torch.ones(shape, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = torch.cat([self.attention_mask, mask.to(self.attention_mask.dtype)], dim=-1)
        inputs = {"input_ids": tokens} if tokens is not None else {"inputs_embeds": embeds}
        self.next_logits = self._forward(mask, **inputs)
        return self.next_logits


def context_length(model: PreTrainedModel) -> int | None:
    """Number of positions of the (text) model, or ``None`` when its config does not say."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if value is not None else None


def check_context(
    model: PreTrainedModel,
    prompt_length: int,
    params: SamplingParams,
    what: str = "prompt",
    injected: int = 0,
    injected_what: str = "injected tokens",
) -> None:
    """Raise :class:`~zoo.errors.ConfigError` when ``prompt_length`` + ``max_new_tokens`` (+ ``injected``, tokens a
    decoder adds besides the sampled ones) exceeds the model's positions (``what`` names the prefill in the
    message, e.g. ``"prompt + 12 structure tokens"``; ``injected_what`` the added tokens)."""
    max_ctx = context_length(model)
    if max_ctx is not None and prompt_length + params.max_new_tokens + injected > max_ctx:
        extra = f" + up to {injected} {injected_what}" if injected else ""
        raise ConfigError(
            f"{what} length {prompt_length} + max_new_tokens {params.max_new_tokens}{extra} exceeds the model "
            f"context ({max_ctx} positions); shorten the prompts or lower max_new_tokens "
            f"(module.generation.max_new_tokens){' or the injections' if injected else ''}"
        )


def max_token_length(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> int:
    """Longest tokenization (in tokens) among ``texts`` (0 when empty): the tail window for suffix checks."""
    return max((len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts), default=0)


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    rows: torch.Tensor | None = None,
    num_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of every row; returns ``(tokens [B], logprobs [B])``.

    Sampling is Gumbel-max (``argmax(log p + G)``, ``G = -log(-log U)``), which draws exactly from the warped
    distribution. The uniform noise is drawn for ``num_rows`` rows and row ``rows[i]`` of it used for
    ``logits[i]``: a batch that drops finished rows (``rows`` = the indices of the rows still running) draws the
    same tokens for the remaining rows as the full batch would, so seeded outputs do not depend on compaction.

    The log-probability is taken under ``softmax(logits / temperature)`` (the policy distribution RL
    methods optimise), not under the top-k/top-p truncated one. Half-precision logits are upcast to float32 before
    the temperature divides them (as :func:`zoo.losses.masked_token_logprobs` scores them in training).
    """
    logits = logits.float()
    scaled = logits / params.temperature if params.temperature != 1.0 else logits
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    if params.do_sample:
        warped = scaled
        if params.top_k:
            warped = TopKLogitsWarper(top_k=params.top_k)(None, warped)
        if params.top_p < 1.0:
            warped = TopPLogitsWarper(top_p=params.top_p)(None, warped)
        total = num_rows if num_rows is not None else logits.shape[0]
        uniform = torch.rand(total, logits.shape[-1], generator=generator, device=logits.device)
        if rows is not None:
            uniform = uniform[rows]
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20, max=1.0 - 1e-7)))
        tokens = (torch.log_softmax(warped.float(), dim=-1) + gumbel).argmax(-1)
    else:
        tokens = scaled.argmax(-1)
    return tokens, logprobs_all.gather(-1, tokens[:, None]).squeeze(-1)


def stop_token_ids(model: torch.nn.Module | None, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The token ids that end a row: the tokenizer's EOS and every id of the model's
    ``generation_config.eos_token_id`` (an int or a list), as ``transformers``' ``generate`` stops on them (e.g.
    Llama-3-Instruct's ``<|eot_id|>`` next to ``<|end_of_text|>``, Gemma's ``<end_of_turn>``). Stop strings
    (``SamplingParams.stop_strings``) come on top of these."""
    ids = {tokenizer.eos_token_id}
    config = getattr(model, "generation_config", None)
    listed = getattr(config, "eos_token_id", None)
    ids.update(listed if isinstance(listed, (list, tuple)) else [listed])
    return frozenset(int(i) for i in ids if i is not None)


def decode_completion(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], stop_ids: Iterable[int] | None = None
) -> str:
    """Text of generated ids up to the first stop id (``stop_ids``, default the tokenizer's EOS; see
    :func:`stop_token_ids`), without pad/BOS/EOS but with other special tokens kept."""
    return decode_completions(tokenizer, [ids], stop_ids)[0]


def decode_completions(
    tokenizer: PreTrainedTokenizerBase, rows: Iterable[Sequence[int]], stop_ids: Iterable[int] | None = None
) -> list[str]:
    """:func:`decode_completion` of every row of ids (the special token ids are looked up once)."""
    stops = {tokenizer.eos_token_id} if stop_ids is None else set(stop_ids)
    drop = {tokenizer.pad_token_id, tokenizer.bos_token_id}
    texts = []
    for ids in rows:
        ids = list(ids)
        end = next((k for k, i in enumerate(ids) if i in stops), None)
        if end is not None:
            ids = ids[:end]
        texts.append(tokenizer.decode([i for i in ids if i not in drop], skip_special_tokens=False))
    return texts


def ends_with_stop(tokenizer: PreTrainedTokenizerBase, ids: list[int], stops: Sequence[str], window: int) -> bool:
    """Whether the text of the last ``window`` tokens of ``ids`` ends with one of ``stops``."""
    tail = tokenizer.decode(ids[-window:], skip_special_tokens=False)
    return any(tail.endswith(s) for s in stops)


_TOKEN_TEXTS: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, tuple[int, list[str], list[str]]] = (
    weakref.WeakKeyDictionary()
)


def token_texts(tokenizer: PreTrainedTokenizerBase) -> tuple[list[str], list[str]]:
    """The text of every token id, decoded alone and after an anchor token (the text it adds in context, which
    differs for tokenizers that drop a leading space when decoding one token); special tokens kept. Cached per
    tokenizer and vocabulary size."""
    cached = _TOKEN_TEXTS.get(tokenizer)
    size = len(tokenizer)
    if cached is None or cached[0] != size:
        alone = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
        anchor_ids = tokenizer("a", add_special_tokens=False)["input_ids"][:1] or [0]
        anchor = tokenizer.decode(anchor_ids, skip_special_tokens=False)
        paired = tokenizer.batch_decode([[*anchor_ids, i] for i in range(size)], skip_special_tokens=False)
        in_context = [t[len(anchor) :] if t.startswith(anchor) else t for t in paired]
        cached = (size, alone, in_context)
        _TOKEN_TEXTS[tokenizer] = cached
    return cached[1], cached[2]


class TokenTextMatcher:
    """Where a row's generated text comes to contain (or end with) one of ``texts``, decoding only when the newest
    token could complete one of them (step delimiters, stop strings).

    A text newly appears in a row's text only with a token whose own text holds the text's last character, so the
    vocabulary is split once (:func:`token_texts`): tokens that hold a whole text (certain hits), tokens that hold
    a last character or whose text is unreliable alone (empty, a partial UTF-8 byte: decode the row's tail to
    decide), and all others (certain misses, the common case: no decoding).

    Args:
        tokenizer: the decoding tokenizer.
        texts: non-empty strings.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> None:
        self.texts = tuple(texts)
        if not self.texts or any(not t for t in self.texts):
            raise ValueError(f"TokenTextMatcher needs non-empty strings, got {texts!r}")
        self.tokenizer = tokenizer
        alone, in_context = token_texts(tokenizer)
        lasts = {t[-1] for t in self.texts}

        def unreliable(text: str) -> bool:
            return not text or "\ufffd" in text

        self.whole = frozenset(
            i for i, (a, c) in enumerate(zip(alone, in_context)) if any(t in a and t in c for t in self.texts)
        )
        self.may_contain = frozenset(
            i
            for i, (a, c) in enumerate(zip(alone, in_context))
            if unreliable(a) or unreliable(c) or any(ch in a or ch in c for ch in lasts)
        )
        self.may_end = frozenset(
            i
            for i, (a, c) in enumerate(zip(alone, in_context))
            if unreliable(a) or unreliable(c) or any(a.endswith(ch) or c.endswith(ch) for ch in lasts)
        )
        self.window = max_token_length(tokenizer, self.texts) + 2

    def contains(self, ids: Sequence[int], start: int = 0) -> bool:
        """Whether the text of ``ids[start:]`` contains one of the texts, for a text that did not before the last
        id was appended (the check runs after every token)."""
        token = ids[-1]
        if token in self.whole:
            return True
        if token not in self.may_contain:
            return False
        tail = self.tokenizer.decode(list(ids[max(start, len(ids) - self.window) :]), skip_special_tokens=False)
        return any(t in tail for t in self.texts)

    def ends_with(self, ids: Sequence[int]) -> bool:
        """Whether the text of ``ids`` ends with one of the texts."""
        if ids[-1] not in self.may_end:
            return False
        return ends_with_stop(self.tokenizer, list(ids), self.texts, self.window)
