"""Batched sampling with a KV cache over any Hugging Face causal LM.

The pieces are reusable functions and one small class, not a method of a module:

* :class:`IncrementalDecoder` -- prefill a left-padded batch, then feed tokens (any number per row, with
  per-row padding) and read the next-token logits of every row; rows may diverge (e.g. after an injection)
  because positions come from the running attention mask.
* :func:`sample_next` -- temperature / top-k / top-p (transformers' logits warpers) or greedy.
* :func:`generate` -- the standard loop: max tokens, EOS, stop strings; returns token ids, texts and the
  log-probabilities of the generated tokens.

Used by the SFT module's validation, GRPO rollouts, and the step-wise loops (SafeThink, DTS, UNDO).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper


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


@dataclass
class GenerationResult:
    """Output of :func:`generate` (the fields of the generation protocol).

    Attributes:
        prompt_ids: ``[B, P]`` left-padded prompts.
        completion_ids: ``[B, L]`` generated tokens, right-padded with the pad id after EOS/stop.
        completion_mask: ``[B, L]`` 1 for generated tokens (EOS included), 0 for padding.
        logprobs: ``[B, L]`` log-probability of each generated token under the temperature-scaled model
            distribution (0 on padding).
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


def cache_kwarg_name(model: torch.nn.Module) -> str:
    """Name of the KV-cache argument of ``model.forward``: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class IncrementalDecoder:
    """KV-cached decoding state of a batch.

    Args:
        model: a Hugging Face causal LM.
        input_ids, attention_mask: ``[B, P]`` left-padded prompts.
    """

    def __init__(self, model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        self.model = model
        self.attention_mask = attention_mask.clone()
        self.cache = None
        self._cache_kwarg = cache_kwarg_name(model)
        self.next_logits = self._forward(input_ids, attention_mask)

    def _forward(self, tokens: torch.Tensor, chunk_mask: torch.Tensor) -> torch.Tensor:
        full_mask = self.attention_mask
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)[:, -tokens.shape[1] :]
        out = self.model(
            input_ids=tokens,
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: self.cache},
        )
        self.cache = out[self._cache_kwarg]
        logits = out.logits.float()
        # Logits after the last valid token of each row; rows that fed only padding keep their old logits.
        last = (chunk_mask * torch.arange(1, chunk_mask.shape[1] + 1, device=chunk_mask.device)).argmax(-1)
        picked = logits[torch.arange(logits.shape[0], device=logits.device), last]
        if hasattr(self, "next_logits"):
            fed = chunk_mask.any(-1)
            picked = torch.where(fed[:, None], picked, self.next_logits)
        return picked

    def select_rows(self, indices: torch.Tensor) -> bool:
        """Keep only the rows ``indices`` (cache, attention mask, next logits); False if the cache cannot."""
        if not hasattr(self.cache, "batch_select_indices"):
            return False
        self.cache.batch_select_indices(indices)
        self.attention_mask = self.attention_mask[indices]
        self.next_logits = self.next_logits[indices]
        return True

    def feed(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Append ``tokens`` ``[B, k]`` (``mask`` 0 marks per-row padding) and return next-token logits ``[B, V]``."""
        if mask is None:
            mask = torch.ones_like(tokens)
        self.attention_mask = torch.cat([self.attention_mask, mask.to(self.attention_mask.dtype)], dim=-1)
        self.next_logits = self._forward(tokens, mask)
        return self.next_logits


def check_context(model: PreTrainedModel, prompt_ids: torch.Tensor, params: SamplingParams) -> None:
    """Raise a clear error when prompt + ``max_new_tokens`` exceeds the model's positions."""
    max_ctx = getattr(model.config, "max_position_embeddings", None)
    if max_ctx is not None and prompt_ids.shape[1] + params.max_new_tokens > max_ctx:
        raise ValueError(
            f"prompt length {prompt_ids.shape[1]} + max_new_tokens {params.max_new_tokens} exceeds the model "
            f"context ({max_ctx} positions); shorten the prompts or lower max_new_tokens"
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
    methods optimise), not under the top-k/top-p truncated one.
    """
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


def decode_completion(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """Text of generated ids up to the first EOS, without pad/BOS/EOS but with other special tokens kept."""
    ids = list(ids)
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    drop = {tokenizer.pad_token_id, tokenizer.bos_token_id}
    return tokenizer.decode([i for i in ids if i not in drop], skip_special_tokens=False)


def _ends_with_stop(tokenizer: PreTrainedTokenizerBase, ids: list[int], stops: Sequence[str], window: int) -> bool:
    tail = tokenizer.decode(ids[-window:], skip_special_tokens=False)
    return any(tail.endswith(s) for s in stops)


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_attention_mask: torch.Tensor,
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Generate completions for a left-padded batch of prompts (KV cache; greedy or sampled).

    Args:
        model: any Hugging Face causal LM (put in eval mode for the call, then restored).
        tokenizer: its tokenizer (EOS/pad ids, decoding).
        prompt_ids, prompt_attention_mask: ``[B, P]`` left-padded.
        params: decoding options.
        generator: a seeded ``torch.Generator`` for reproducible sampling.
    """
    params = params or SamplingParams()
    was_training = model.training
    model.eval()
    try:
        device = prompt_ids.device
        batch = prompt_ids.shape[0]
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        check_context(model, prompt_ids, params)
        window = max_token_length(tokenizer, params.stop_strings)
        decoder = IncrementalDecoder(model, prompt_ids, prompt_attention_mask)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        out_ids, out_lp, out_mask = [], [], []
        rows: list[list[int]] = [[] for _ in range(batch)]
        # ``live`` maps the decoder's (possibly compacted) rows to rows of the batch; finished rows are dropped
        # from the decoder once a quarter of its rows are done, so they stop costing forward passes.
        live = torch.arange(batch, device=device)
        for _ in range(params.max_new_tokens):
            sampled, sampled_lp = sample_next(decoder.next_logits, params, generator, rows=live, num_rows=batch)
            tokens = torch.full((batch,), pad, dtype=torch.long, device=device)
            logprobs = torch.zeros(batch, dtype=sampled_lp.dtype, device=device)
            tokens[live] = sampled
            logprobs[live] = sampled_lp
            active = ~done
            tokens = torch.where(active, tokens, torch.full_like(tokens, pad))
            out_ids.append(tokens)
            out_lp.append(torch.where(active, logprobs, torch.zeros_like(logprobs)))
            out_mask.append(active.long())
            hit_eos = active & (tokens == eos)
            if params.stop_strings:
                for i in torch.nonzero(active & ~hit_eos).flatten().tolist():
                    rows[i].append(int(tokens[i]))
                    if _ends_with_stop(tokenizer, rows[i], params.stop_strings, window + 2):
                        hit_eos[i] = True
            finished |= hit_eos
            done |= hit_eos
            if bool(done.all()):
                break
            still = ~done[live]
            if int(still.sum()) <= 0.75 * len(live) and decoder.select_rows(torch.nonzero(still).flatten()):
                live = live[still]
            decoder.feed(tokens[live][:, None], (~done[live]).long()[:, None])
        completion_ids = torch.stack(out_ids, dim=1)
        texts = [decode_completion(tokenizer, row.tolist()) for row in completion_ids]
        return GenerationResult(
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            completion_mask=torch.stack(out_mask, dim=1),
            logprobs=torch.stack(out_lp, dim=1),
            texts=texts,
            finished=finished,
        )
    finally:
        model.train(was_training)


def generate_text(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    params: SamplingParams | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Tokenize ``prompts`` (BOS first when the tokenizer has one), left-pad, and :func:`generate`."""
    from zoo.datamodules.base import encode_prompt, pad_sequences

    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    device = next(model.parameters()).device
    ids = pad_sequences(encoded, tokenizer.pad_token_id, "left").to(device)
    mask = pad_sequences([[1] * len(e) for e in encoded], 0, "left").to(device)
    return generate(model, tokenizer, ids, mask, params, generator)
