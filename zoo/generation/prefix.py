"""Rows that share a prefix (the ``G`` samples of one prompt) run that prefix through the model once.

Two uses of one idea: a decode's prefill (:meth:`~zoo.generation.decoders.Prefill.start`: the distinct prompts are
prefilled and their KV cache copied to the repeats) and training forwards over prompt + completion rows
(:class:`SharedPrefix`: GRPO's loss and reference passes, over any micro-batching). A causal model's outputs at a
position depend only on the tokens up to it, so a row's prefix states are the same whichever row computed them; the
copies are ``index_select``, whose backward sums the rows' gradients into their prefix, so the gradient is the one of
the full forward as well.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from zoo.generation.sampling import accepts_logits_to_keep, cache_kwarg_name, plain_dynamic_cache


def distinct_rows(*columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows that repeat: ``(first, inverse)`` when some row of the ``[N, ...]`` tensors ``columns`` (read together)
    equals an earlier row -- ``first`` ``[U]`` the first row of each distinct one, in order of appearance, and
    ``inverse`` ``[N]`` the index into ``first`` of every row (``rows[first][inverse] == rows``); ``None`` when all
    ``N`` rows differ."""
    keys = torch.cat([c.reshape(c.shape[0], -1).to(torch.long) for c in columns], dim=1)
    num_rows = keys.shape[0]
    if num_rows < 2:
        return None
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    count = int(inverse.max()) + 1
    if count == num_rows:
        return None
    rows = torch.arange(num_rows, device=inverse.device)
    first = torch.full((count,), num_rows, dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    # number the distinct rows in order of first appearance
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(count, device=order.device)
    return first[order], rank[inverse]


class SharedPrefix:
    """The keys/values of a batch's distinct prefixes (columns before ``split``: a left-padded prompt), computed once
    and read by every micro-batch of the batch's rows.

    ``SharedPrefix.compute(...)`` runs the distinct prefixes; :meth:`logits` runs some rows' columns ``split ..`` on
    top of their prefix (``model(...).logits[:, split:]`` of the full forward: a causal model's suffix sees the same
    keys/values). Under autograd the micro-batches' backward passes stop at the prefix (its keys/values are leaves
    that collect their gradient) and :meth:`backward` then sends the collected gradient through the prefix forward
    once; the parameters' gradient is the full forward's (test), with the prompt computed once per distinct prompt
    instead of once per row.
    """

    def __init__(
        self,
        split: int,
        inverse: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        graph: list[torch.Tensor] | None,
    ) -> None:
        self.split = split
        self.inverse = inverse  # [N]: the distinct prefix of every row
        self.keys, self.values = keys, values  # per layer [U, kv_heads, split, head_dim]
        self.graph = graph  # the prefix forward's outputs the leaves were detached from (None without autograd)

    @classmethod
    def compute(
        cls,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        split: int,
    ) -> SharedPrefix | None:
        """Run the distinct prefixes of ``[N, T]`` rows (ids, mask and positions before ``split``) once.

        ``None`` -- the caller runs the full forward -- when no prefix repeats, ``split`` leaves no prefix or no
        suffix, or the model's cache is not a plain per-layer key/value cache (activation checkpointing in training
        mode turns the cache off; sliding-window layers)."""
        if not 0 < split < input_ids.shape[1]:
            return None
        if model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
            return None  # transformers turns the cache off under activation checkpointing
        distinct = distinct_rows(input_ids[:, :split], attention_mask[:, :split], position_ids[:, :split])
        if distinct is None:
            return None
        first, inverse = distinct
        out = model(
            input_ids=input_ids[first, :split],
            attention_mask=attention_mask[first, :split],
            position_ids=position_ids[first, :split],
            use_cache=True,
            **({"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}),
        )
        cache = out.get(cache_kwarg_name(model))
        if not plain_dynamic_cache(cache):
            return None
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        if not torch.is_grad_enabled() or not keys[0].requires_grad:
            return cls(split, inverse, keys, values, None)
        graph = keys + values
        leaves = [t.detach().requires_grad_() for t in graph]
        return cls(split, inverse, leaves[: len(keys)], leaves[len(keys) :], graph)

    def logits(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        rows: torch.Tensor | slice = slice(None),
    ) -> torch.Tensor:
        """Logits ``[n, T' - split, V]`` of the columns ``split ..`` of ``n`` rows (``input_ids`` etc. are those
        rows, ``rows`` their indices in the batch the prefix was computed for; ``T'`` may be cut short)."""
        index = self.inverse[rows]
        cache = DynamicCache(config=model.config)
        for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
            cache.update(keys.index_select(0, index), values.index_select(0, index), layer)
        out = model(
            input_ids=input_ids[:, self.split :],
            attention_mask=attention_mask,
            position_ids=position_ids[:, self.split :],
            use_cache=True,
            **{cache_kwarg_name(model): cache},
        )
        return out.logits

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the prefix keys/values through the prefix forward (once, after
        the last micro-batch's backward); nothing without autograd or when no gradient arrived."""
        if self.graph is None:
            return
        pairs = [(t, leaf.grad) for t, leaf in zip(self.graph, self.keys + self.values) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self.graph = None
