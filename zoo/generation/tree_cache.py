"""A KV cache for a tree of hypotheses: every token's keys/values are stored once, however many rows read them.

Decoders that branch (:class:`~zoo.generation.dts.DTSDecoder`) keep many rows that share a beginning: the rows of
one prompt share its prompt, and the children of a branch share everything their parent had generated. A stacked
transformers ``DynamicCache`` gives every row its own copy of that shared beginning (``reorder_cache`` is an
``index_select`` along the batch), so the cache grows as ``rows x (prompt + generated)``. :class:`TreeKVCache`
stores the keys/values of every token **once** and gives each row an index into that store:

* per layer, a store of ``[S, kv_heads, head_dim]`` keys and values (``S`` slots: one per stored token);
* one slot table ``index`` ``[B, L]`` shared by the layers: row ``b`` reads, at position ``l``, the slot
  ``index[b, l]`` (and, computed once per table, the ``[B x kv_heads x L]`` row index of the contiguous gather).
  The prefill's rows take ``B x P`` slots (its left padding included: positions and masks stay those of the stacked
  cache); every later forward of ``q`` tokens gives each row ``q`` new slots.

Reordering rows (a branch: a row repeated into its children; a finish: a row dropped), selecting rows and cropping
touch the slot table only, never the stores: children share their parent's slots, so the prompt **and every branch
point's prefix** are held once. What the model's attention needs is a dense ``[B, kv_heads, L, head_dim]`` view,
gathered from the store by :meth:`TreeKVLayer.update` per layer and per forward and released when the layer's
attention has run: one layer's worth of keys/values at a time (the stored cache itself only grows by the tokens
fed). The view holds exactly the keys/values a stacked ``DynamicCache`` would hold, in the same order, so the model
computes the same numbers (same tokens out; test).

Slots no row reads any more (rows dropped, positions cropped) stay in the store until fewer than
:data:`COMPACT_BELOW` of the slots are read; then the stores keep only the read slots (one ``index_select`` per
layer, slot order kept) and the table is renumbered. Transformers' own API is the seam: ``TreeKVCache`` is a
``transformers.Cache`` whose layers implement ``update``, ``get_seq_length`` and ``get_mask_sizes``, so any model
that runs on a ``DynamicCache`` of full-attention layers runs on it; :meth:`TreeKVCache.from_cache` converts a
prefilled ``DynamicCache`` and returns ``None`` for any other cache (sliding windows, linear attention, quantized
caches), which the caller keeps as it is.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from zoo.generation.sampling import plain_dynamic_cache

# the stores are compacted once fewer than this fraction of their slots are read by some row
COMPACT_BELOW = 0.5


class _SlotTable:
    """The slot every row reads at every position (``index`` ``[B, L]``, long), shared by the layers; ``size`` is the
    number of slots handed out (the length of every store between forwards), ``last_q`` the width of the latest
    extension (a layer whose store is shorter than ``size`` has not stored those positions yet)."""

    __slots__ = ("_gather", "_index", "last_q", "size")

    def __init__(self, index: torch.Tensor, size: int) -> None:
        self._index, self.size, self.last_q = index, size, 0
        self._gather: dict[int, torch.Tensor] = {}

    @property
    def index(self) -> torch.Tensor:
        return self._index

    @index.setter
    def index(self, index: torch.Tensor) -> None:
        self._index, self._gather = index, {}

    def gather_index(self, heads: int) -> torch.Tensor:
        """``[B * heads * L]``: the rows of a store seen as ``[S * heads, head_dim]`` that make the dense view
        ``[B, heads, L, head_dim]`` in one contiguous gather (computed once per table and head count, shared by the
        layers of a forward)."""
        if heads not in self._gather:
            offsets = torch.arange(heads, device=self._index.device)[None, :, None]
            self._gather[heads] = (self._index[:, None, :] * heads + offsets).reshape(-1)
        return self._gather[heads]

    def claim(self, start: int, rows: int, width: int) -> torch.Tensor:
        """The slots ``[rows, width]`` of the tokens a layer is storing from slot ``start``: the first layer of a
        forward extends the table, the others find the columns it added."""
        if start == self.size:
            new = torch.arange(start, start + rows * width, device=self.index.device).view(rows, width)
            self.index = torch.cat([self.index, new], dim=1)
            self.size, self.last_q = start + rows * width, width
        if start + rows * width != self.size or self.index.shape[0] != rows:
            raise RuntimeError(
                f"TreeKVCache: a layer stores {rows} x {width} tokens from slot {start}, but the table has "
                f"{self.index.shape[0]} rows and {self.size} slots (each layer must store each forward's tokens once)"
            )
        return self.index[:, -width:]


class TreeKVLayer(CacheLayerMixin):
    """One attention layer of a :class:`TreeKVCache`: ``keys``/``values`` are the store ``[S, kv_heads, head_dim]``;
    :meth:`update` appends the new tokens and returns the dense view ``[B, kv_heads, L, head_dim]`` of every row."""

    is_sliding = False
    is_croppable = True

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: _SlotTable) -> None:
        super().__init__()
        self.keys, self.values, self.slots = keys, values, slots
        self.device = keys.device
        self.is_initialized = True
        self.view_bytes = 0  # bytes of the largest keys + values view this layer has handed to the attention

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: a layer is built from a prefilled cache (:meth:`TreeKVCache.from_cache`)."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the keys/values ``[B, kv_heads, q, head_dim]`` of the fed tokens in new slots and return every
        row's keys and values ``[B, kv_heads, L + q, head_dim]`` (what a stacked ``DynamicLayer`` returns)."""
        rows, heads, width, dim = key_states.shape
        self.slots.claim(self.keys.shape[0], rows, width)
        self.keys = torch.cat([self.keys, key_states.transpose(1, 2).reshape(rows * width, heads, dim)])
        self.values = torch.cat([self.values, value_states.transpose(1, 2).reshape(rows * width, heads, -1)])
        keys, values = self.view(self.keys), self.view(self.values)
        self.view_bytes = max(self.view_bytes, keys.nbytes + values.nbytes)
        return keys, values

    def view(self, store: torch.Tensor) -> torch.Tensor:
        """The rows' dense, contiguous ``[B, kv_heads, L, head_dim]`` gather of ``store`` through the slot table."""
        slots, heads, dim = store.shape
        rows, width = self.slots.index.shape
        gathered = store.view(slots * heads, dim).index_select(0, self.slots.gather_index(heads))
        return gathered.view(rows, heads, width, dim)

    def get_seq_length(self) -> int:
        width = self.slots.index.shape[1]
        return width - self.slots.last_q if self.keys.shape[0] < self.slots.size else width

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("a TreeKVCache cannot be reset; build a new one from a prefilled cache")


class TreeKVCache(Cache):
    """A ``transformers.Cache`` whose rows share stored tokens (see the module docstring for the layout).

    Build it from a prefilled ``DynamicCache`` with :meth:`from_cache`; it then takes that cache's place (e.g.
    ``IncrementalDecoder.cache``). Row operations (``reorder_cache``, ``batch_select_indices``,
    ``batch_repeat_interleave``, ``crop``) act on the slot table, shared by all layers.
    """

    def __init__(self, layers: list[TreeKVLayer], slots: _SlotTable) -> None:
        super().__init__(layers=layers)
        self.slots = slots

    @classmethod
    def from_cache(cls, cache: object) -> TreeKVCache | None:
        """The tree cache holding a prefilled cache's rows (each row's tokens in its own slots: the prefill's rows are
        distinct prompts); ``None`` unless ``cache`` is a ``DynamicCache`` of full-attention ``DynamicLayer`` s, all
        holding the same rows and positions."""
        if not plain_dynamic_cache(cache) or not all(layer.is_initialized for layer in cache.layers):
            return None
        shapes = {(layer.keys.shape[0], layer.keys.shape[2], layer.values.shape[2]) for layer in cache.layers}
        if len(shapes) != 1:
            return None
        rows, width, _ = shapes.pop()
        if rows == 0 or width == 0:
            return None
        device = cache.layers[0].keys.device
        slots = _SlotTable(torch.arange(rows * width, device=device).view(rows, width), rows * width)

        def store(tensor: torch.Tensor) -> torch.Tensor:  # [B, heads, P, dim] -> [B * P, heads, dim]
            return tensor.transpose(1, 2).reshape(rows * width, tensor.shape[1], tensor.shape[3])

        layers = [TreeKVLayer(store(layer.keys), store(layer.values), slots) for layer in cache.layers]
        return cls(layers, slots)

    @property
    def index(self) -> torch.Tensor:
        """``[B, L]``: the slot each row reads at each position."""
        return self.slots.index

    @property
    def num_slots(self) -> int:
        """Number of stored tokens per layer (read or not)."""
        return self.slots.size

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds: the stores of every layer, the slot table and its gather index."""
        stored = sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)
        return stored + self.slots.index.nbytes + sum(t.nbytes for t in self.slots._gather.values())

    @property
    def view_bytes(self) -> int:
        """Bytes of the largest one-layer view (keys + values) handed to the attention so far (transient)."""
        return max((layer.view_bytes for layer in self.layers), default=0)

    def dense_bytes(self) -> int:
        """Bytes a stacked ``DynamicCache`` of the same rows and positions would hold."""
        rows, width = self.slots.index.shape
        per_token = sum((layer.keys[:1].nbytes + layer.values[:1].nbytes) for layer in self.layers)
        return rows * width * per_token

    # -- row operations: the slot table only -----------------------------------------------------------------------
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row ``i`` becomes row ``beam_idx[i]`` (rows may repeat or disappear); the stores are not copied."""
        self._select(self.slots.index.index_select(0, beam_idx.to(self.slots.index.device)), beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` (a long index or a boolean mask)."""
        rows = torch.arange(self.slots.index.shape[0], device=self.slots.index.device)[indices]
        self._select(self.slots.index[rows], rows)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.slots.index = self.slots.index.repeat_interleave(repeats, dim=0)

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` positions of every row (``DynamicLayer.crop``'s convention: a
        count <= 0)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove < 0:
            self.slots.index = self.slots.index[:, :tokens_to_remove].contiguous()
            self.compact()

    def reset(self) -> None:
        raise NotImplementedError("a TreeKVCache cannot be reset; build a new one from a prefilled cache")

    def _select(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        """Take the new table; compact when some row was left out (only then can a slot lose its last reader)."""
        before = self.slots.index.shape[0]
        self.slots.index = index.contiguous()
        if torch.unique(rows).numel() < before:
            self.compact()

    def compact(self, below: float = COMPACT_BELOW) -> bool:
        """Drop the slots no row reads once fewer than ``below`` of the slots are read (``below=1``: whenever some
        slot is unread); the stores keep the read slots in order and the table is renumbered. Returns whether the
        stores were rebuilt."""
        index = self.slots.index
        read = torch.unique(index) if index.numel() else index.new_zeros(0)
        if read.numel() >= below * self.slots.size or read.numel() == self.slots.size:
            return False
        renumber = torch.full((self.slots.size,), -1, dtype=index.dtype, device=index.device)
        renumber[read] = torch.arange(read.numel(), device=index.device)
        self.slots.index = renumber[index]
        self.slots.size = int(read.numel())
        for layer in self.layers:
            layer.keys = layer.keys.index_select(0, read)
            layer.values = layer.values.index_select(0, read)
        return True


def kv_cache_bytes(cache: object) -> int:
    """Bytes of keys/values a transformers cache holds: a :class:`TreeKVCache`'s stores and slot table, or the sum of
    every layer's ``keys``/``values`` tensors for any other cache (0 for ``None``)."""
    if isinstance(cache, TreeKVCache):
        return cache.nbytes
    layers = getattr(cache, "layers", None) or []
    return sum(
        t.nbytes
        for layer in layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if isinstance(t, torch.Tensor)
    )


__all__ = ["COMPACT_BELOW", "TreeKVCache", "TreeKVLayer", "kv_cache_bytes"]
