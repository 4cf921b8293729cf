"""Vocabulary extension whose new rows are separate parameters (the old rows can never move).

Paper: "Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping"
(arXiv 2605.04308, ICML 2026). Autoregressive generation is read as a Markov process whose memory is the
transition matrix ``P_ik = p(x_{t+1} = k | x_t = i)``; adding a token adds a state, and there is no forgetting
iff the old ``T x T`` block is preserved. Each new token ``j`` maps to a dictionary ``D_j`` of ``s`` existing
tokens; the paper realises the mapping by tuning only the new token's embedding.

Equation -> function:

- old block preserved: the old rows stay in the original ``nn.Parameter`` and the original module computes them
  -> :class:`ExtendedEmbedding` (input rows ``e_j``), :class:`ExtendedOutputHead` (output rows ``u_j``, optional)
- ``free`` parametrisation: learn ``e_j``, init ``e_j = mean_{i in D_j} e_i`` -> :class:`FreeRows`
- ``dictionary`` parametrisation: ``e_j = sum_i softmax(a_j)_i e_{D_j,i}`` -> :class:`DictionaryRows`
- new output rows of a tied model: ``u_j = e_j`` (the same new rows) -> ``tie_output_rows`` of
  :func:`extend_vocabulary`
- old-context mask: ``logit_k = -inf`` for new ``k`` while no new token is in the context
  -> :func:`mask_new_token_logits`, :class:`NewTokenLogitsMask`
- forgetting ``max |delta logit|``, ``KL(p_old || p_new)`` -> :func:`zoo.vocab.forgetting.forgetting_metrics`
- the extended model as a plain checkpoint of ``V + m`` tokens -> :meth:`VocabularyExtension.merge_into`

Reconstruction choices (no official code; notes ``inference.md`` section 5), all arguments of
:func:`extend_vocabulary`: ``free`` init without a dictionary = mean of all old rows; ``dictionary`` mixing logits
start at 0 (uniform weights); a tied model's new output rows are its new input rows; new output rows of an untied
model use their own parameters (``free``: init = mean of the dictionary's output rows; ``dictionary``: their own
mixing logits over the dictionary's output rows); a head bias gets new entries the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import LogitsProcessor

from zoo.errors import ConfigError

MODES = ("free", "dictionary")


class NewRows(nn.Module, ABC):
    """The ``m`` new rows of a table, computed from the old table ``[V, *rest]`` -> ``[m, *rest]``."""

    num_rows: int

    @abstractmethod
    def forward(self, table: Tensor) -> Tensor:
        """The new rows ``[m, *rest]`` from the old table ``[V, *rest]``."""


class FreeRows(NewRows):
    """``free`` parametrisation: the new rows are parameters, initialised from ``init`` ``[m, *rest]``."""

    def __init__(self, init: Tensor) -> None:
        super().__init__()
        self.num_rows = int(init.shape[0])
        self.rows = nn.Parameter(init.detach().clone())

    def forward(self, table: Tensor) -> Tensor:
        return self.rows


class DictionaryRows(NewRows):
    """``dictionary`` parametrisation: ``row_j = sum_i softmax(a_j)_i table[D_j,i]`` (mixing logits ``a [m, s]``).

    Args:
        dictionary_ids: ``[m, s]`` old token ids, ``-1`` where a dictionary is shorter than ``s``.

    The mixing logits are float32 and start at 0 (uniform weights over each dictionary) [reconstruction].
    With ``s = 1`` the weight is exactly 1, so the row is bit-identical to the dictionary token's row.
    """

    def __init__(self, dictionary_ids: Tensor) -> None:
        super().__init__()
        self.num_rows = int(dictionary_ids.shape[0])
        self.register_buffer("dictionary_ids", dictionary_ids.long().clone())
        self.mixing_logits = nn.Parameter(torch.zeros(dictionary_ids.shape, device=dictionary_ids.device))

    def weights(self) -> Tensor:
        """``[m, s]`` mixing weights (0 on padding; each row sums to 1)."""
        pad = self.dictionary_ids < 0
        return self.mixing_logits.masked_fill(pad, float("-inf")).softmax(-1).masked_fill(pad, 0.0)

    def forward(self, table: Tensor) -> Tensor:
        pad = self.dictionary_ids < 0
        gathered = table[self.dictionary_ids.clamp(min=0)]  # [m, s, *rest]
        extra = (1,) * (table.dim() - 1)
        gathered = gathered.masked_fill(pad.view(*pad.shape, *extra), 0.0)
        return (self.weights().to(table.dtype).view(*pad.shape, *extra) * gathered).sum(1)


class ExtendedEmbedding(nn.Embedding):
    """An input embedding that accepts ``m`` new ids after its ``V`` old ones.

    It is an ``nn.Embedding`` whose ``weight`` *is* the original ``Parameter`` (state-dict keys, weight tying and
    ``get_input_embeddings().weight`` keep working); ids ``< V`` go through the original module unchanged, ids
    ``>= V`` read ``new_rows`` (scaled like the original when it has an ``embed_scale``, e.g. Gemma).

    Shapes: ``input_ids [*]`` -> ``[*, d]``.
    """

    def __init__(self, original: nn.Embedding, new_rows: NewRows) -> None:
        nn.Module.__init__(self)
        self.num_old_embeddings = original.num_embeddings
        self.num_embeddings = original.num_embeddings + new_rows.num_rows
        self.embedding_dim = original.embedding_dim
        self.padding_idx = original.padding_idx
        self.max_norm = original.max_norm
        self.norm_type = original.norm_type
        self.scale_grad_by_freq = original.scale_grad_by_freq
        self.sparse = original.sparse
        self.weight = original.weight
        self.new_rows = new_rows
        object.__setattr__(self, "original", original)  # not a submodule: its parameter is ``self.weight``

    def forward(self, input_ids: Tensor) -> Tensor:
        is_new = input_ids >= self.num_old_embeddings
        old = self.original(input_ids.masked_fill(is_new, 0))
        new = F.embedding((input_ids - self.num_old_embeddings).clamp(min=0), self.new_rows(self.weight))
        scale = getattr(self.original, "embed_scale", None)
        if scale is not None:
            new = new * (scale.to(new.dtype) if isinstance(scale, Tensor) else scale)
        return torch.where(is_new.unsqueeze(-1), new.to(old.dtype), old)

    def extra_repr(self) -> str:
        return (
            f"{self.num_old_embeddings} old + {self.num_embeddings - self.num_old_embeddings} new, {self.embedding_dim}"
        )


class ExtendedOutputHead(nn.Linear):
    """An output projection with ``m`` new logits appended after the ``V`` old ones.

    ``weight``/``bias`` *are* the original parameters; the old logits come from the original module unchanged,
    the new ones are ``h @ u_j + b_j``. Shapes: ``hidden [*, d]`` -> ``[*, V + m]``.
    """

    def __init__(self, original: nn.Linear, new_rows: NewRows, new_bias: NewRows | None) -> None:
        nn.Module.__init__(self)
        self.in_features = original.in_features
        self.out_features = original.out_features + new_rows.num_rows
        self.weight = original.weight
        self.bias = original.bias
        self.new_rows = new_rows
        self.new_bias = new_bias
        object.__setattr__(self, "original", original)

    def forward(self, hidden: Tensor) -> Tensor:
        old = self.original(hidden)
        bias = self.new_bias(self.bias) if self.new_bias is not None else None
        new = F.linear(
            hidden, self.new_rows(self.weight).to(hidden.dtype), None if bias is None else bias.to(hidden.dtype)
        )
        return torch.cat([old, new.to(old.dtype)], dim=-1)

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features - self.new_rows.num_rows} old + {self.new_rows.num_rows} new"


def mask_new_token_logits(logits: Tensor, input_ids: Tensor, first_new_id: int) -> Tensor:
    """Set new-token logits (columns ``>= first_new_id``) to ``-inf`` where the context holds no new token yet.

    On an old-only context the softmax over ``V + m`` then equals the old softmax over ``V`` exactly, so new output
    rows take no probability mass there.

    Args:
        logits: ``[B, T, V + m]`` (or ``[B, V + m]`` for the last position only, with ``input_ids [B, T]``).
        input_ids: ``[B, T]`` the context (position ``t`` of ``logits`` sees ``input_ids[:, : t + 1]``).
        first_new_id: ``V``.

    Returns:
        A new tensor shaped like ``logits``.
    """
    seen = (input_ids >= first_new_id).cumsum(-1) > 0  # [B, T]
    if logits.dim() == 2:
        seen = seen[:, -1]
    hidden = ~seen.unsqueeze(-1)
    out = logits.clone()
    out[..., first_new_id:] = out[..., first_new_id:].masked_fill(hidden, float("-inf"))
    return out


class NewTokenLogitsMask(LogitsProcessor):
    """``transformers`` logits processor applying :func:`mask_new_token_logits` during ``model.generate``."""

    def __init__(self, first_new_id: int) -> None:
        self.first_new_id = int(first_new_id)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return mask_new_token_logits(scores, input_ids, self.first_new_id)


def _dictionary_tensor(dictionaries: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> Tensor:
    width = max((len(d) for d in dictionaries), default=0)
    out = torch.full((len(dictionaries), max(width, 1)), -1, dtype=torch.long)
    for j, entries in enumerate(dictionaries):
        seen: set[int] = set()
        for i, token in enumerate(entries):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                raise ConfigError(
                    f"dictionaries[{j}][{i}] = {token!r} is not a token of the vocabulary (ids 0..{vocab_size - 1})"
                )
            if token in seen:
                raise ConfigError(f"dictionaries[{j}] lists token id {token} twice")
            seen.add(token)
            out[j, i] = token
    return out.to(device)


def _mean_rows(table: Tensor, dictionary_ids: Tensor) -> Tensor:
    """``[m, *rest]`` mean of each dictionary's rows of ``table``; an empty dictionary gives the mean of all rows."""
    rows = []
    for ids in dictionary_ids:
        ids = ids[ids >= 0]
        rows.append(table[ids].mean(0) if len(ids) else table.mean(0))
    return torch.stack(rows)


class VocabularyExtension:
    """``m`` new tokens spliced into a model; built by :func:`extend_vocabulary` (see there for the arguments).

    Attributes:
        new_token_ids: ``[V, V + 1, ..., V + m - 1]``: contiguous ids after the model's ``V`` old ones.
        first_new_id: ``V``.
        mode, output_rows, tied_output_rows: the parametrisation.
        dictionaries: the dictionaries as given (``None`` when none).
        embedding, head: the spliced :class:`ExtendedEmbedding` / :class:`ExtendedOutputHead` (``None`` without
            output rows).
    """

    def __init__(
        self,
        model: nn.Module,
        num_new_tokens: int,
        dictionaries: Sequence[Sequence[int]] | None = None,
        mode: str = "free",
        output_rows: bool = False,
        tie_output_rows: bool | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"vocabulary extension mode must be one of {MODES}, got {mode!r}")
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise ConfigError(f"num_new_tokens must be a positive integer, got {num_new_tokens!r}")
        embedding = model.get_input_embeddings()
        if isinstance(embedding, ExtendedEmbedding):
            raise ConfigError("this model's vocabulary is already extended; call remove() on that extension first")
        if not isinstance(embedding, nn.Embedding):
            raise ConfigError(f"the input embedding is a {type(embedding).__name__}, not an nn.Embedding")
        if embedding.max_norm is not None:
            raise ConfigError("the input embedding renormalises its rows in place (max_norm); old rows would move")
        self.model = model
        self.mode = mode
        self.output_rows = bool(output_rows)
        self.first_new_id = int(embedding.num_embeddings)
        self.num_new_tokens = num_new_tokens
        self.new_token_ids = list(range(self.first_new_id, self.first_new_id + num_new_tokens))
        self.dictionaries = None if dictionaries is None else [list(d) for d in dictionaries]
        weight = embedding.weight
        dictionary_ids = self._check_dictionaries(weight.device)

        self._original_embedding = embedding
        self.input_rows = self._new_rows(weight, dictionary_ids)
        self.embedding = ExtendedEmbedding(embedding, self.input_rows)

        self._original_head: nn.Module | None = None
        self.head: ExtendedOutputHead | None = None
        self.output_rows_module: NewRows | None = None
        self.output_bias: NewRows | None = None
        self.tied_output_rows = False
        if self.output_rows:
            self._build_head(model, embedding, dictionary_ids, tie_output_rows)
        text_config = model.config.get_text_config() if hasattr(model, "config") else None
        self._config = text_config if hasattr(text_config, "vocab_size") else None
        self._old_config_vocab = getattr(self._config, "vocab_size", None)
        self.attached = False
        self.attach()

    # -- construction -----------------------------------------------------------------------------------------------
    def _check_dictionaries(self, device: torch.device) -> Tensor | None:
        if self.dictionaries is None:
            if self.mode == "dictionary":
                raise ConfigError("mode='dictionary' needs dictionaries: one list of old token ids per new token")
            return None
        if len(self.dictionaries) != self.num_new_tokens:
            raise ConfigError(
                f"{len(self.dictionaries)} dictionaries for {self.num_new_tokens} new tokens; give one per new token"
            )
        if self.mode == "dictionary":
            empty = [j for j, d in enumerate(self.dictionaries) if not d]
            if empty:
                raise ConfigError(
                    f"dictionaries[{empty[0]}] is empty; mode='dictionary' mixes at least one old token per new token"
                )
        return _dictionary_tensor(self.dictionaries, self.first_new_id, device)

    def _new_rows(self, table: Tensor, dictionary_ids: Tensor | None) -> NewRows:
        if self.mode == "dictionary":
            return DictionaryRows(dictionary_ids)
        with torch.no_grad():
            if dictionary_ids is None:
                init = table.detach().mean(0, keepdim=True).expand(self.num_new_tokens, *table.shape[1:])
            else:
                init = _mean_rows(table.detach(), dictionary_ids)
        return FreeRows(init)

    def _build_head(
        self, model: nn.Module, embedding: nn.Embedding, dictionary_ids: Tensor | None, tie: bool | None
    ) -> None:
        head = model.get_output_embeddings()
        if not isinstance(head, nn.Linear) or head.weight.dim() != 2 or not head.weight.is_floating_point():
            raise ConfigError(
                f"output_rows=True needs a floating-point nn.Linear output head, got {type(head).__name__}"
            )
        if head.out_features != self.first_new_id:
            raise ConfigError(
                f"the output head has {head.out_features} rows but the input embedding {self.first_new_id}; "
                "output rows need both to cover the same vocabulary"
            )
        model_tied = head.weight is embedding.weight
        if tie and not model_tied:
            raise ConfigError("tie_output_rows=True but this model's input and output embeddings are not tied")
        self.tied_output_rows = model_tied if tie is None else bool(tie)
        self.output_rows_module = (
            self.input_rows if self.tied_output_rows else self._new_rows(head.weight, dictionary_ids)
        )
        if head.bias is not None:
            self.output_bias = (
                self.output_rows_module
                if isinstance(self.output_rows_module, DictionaryRows)
                else self._new_rows(head.bias, dictionary_ids)
            )
        self._original_head = head
        self.head = ExtendedOutputHead(head, self.output_rows_module, self.output_bias)

    # -- splice in / out --------------------------------------------------------------------------------------------
    def attach(self) -> None:
        """Splice the extended modules into the model (done by the constructor; idempotent)."""
        if self.attached:
            return
        self.model.set_input_embeddings(self.embedding)
        if self.head is not None:
            self.model.set_output_embeddings(self.head)
            if self._config is not None:
                self._config.vocab_size = self.first_new_id + self.num_new_tokens
        self.attached = True

    def remove(self) -> None:
        """Restore the original modules (and ``config.vocab_size``): the model is the one before the extension.

        The new rows stay in this object (``attach()`` splices them back). Old parameters are the same objects
        throughout, so after training only the new rows the model is bit-identical to the original.
        """
        if not self.attached:
            return
        self.model.set_input_embeddings(self._original_embedding)
        if self._original_head is not None:
            self.model.set_output_embeddings(self._original_head)
            if self._config is not None:
                self._config.vocab_size = self._old_config_vocab
        self.attached = False

    # -- parameters and state ----------------------------------------------------------------------------------------
    def _parts(self) -> dict[str, NewRows]:
        parts: dict[str, NewRows] = {"input": self.input_rows}
        if self.output_rows_module is not None and self.output_rows_module is not self.input_rows:
            parts["output"] = self.output_rows_module
        if self.output_bias is not None and all(self.output_bias is not p for p in parts.values()):
            parts["output_bias"] = self.output_bias
        return parts

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` of the new rows, e.g. ``input.rows`` or ``input.mixing_logits``."""
        return [
            (f"{part}.{name}", p) for part, module in self._parts().items() for name, p in module.named_parameters()
        ]

    def parameters(self) -> list[nn.Parameter]:
        """The parameters to train: the new rows only (never an old row)."""
        return [p for _, p in self.named_parameters()]

    def state_dict(self) -> dict[str, Tensor]:
        """The new rows (and dictionary ids in ``dictionary`` mode), detached: ``{name: tensor}``."""
        return {
            f"{part}.{name}": t.detach().clone()
            for part, module in self._parts().items()
            for name, t in module.state_dict().items()
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Copy new rows from ``state`` (as returned by :meth:`state_dict`); names and shapes must match."""
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise ConfigError(
                f"vocabulary extension state does not match this extension (mode={self.mode}, output_rows="
                f"{self.output_rows}): missing {missing}, unexpected {unexpected}"
            )
        for name, value in state.items():
            if tuple(value.shape) != tuple(own[name].shape):
                raise ConfigError(
                    f"vocabulary extension state '{name}' has shape {tuple(value.shape)}, expected "
                    f"{tuple(own[name].shape)} ({self.num_new_tokens} new tokens, width {self.embedding.embedding_dim})"
                )
            if name.endswith("dictionary_ids") and not torch.equal(value.to(own[name].device), own[name]):
                raise ConfigError(f"vocabulary extension state '{name}': the dictionaries differ from this extension's")
        with torch.no_grad():
            for part, module in self._parts().items():
                for name, p in module.named_parameters():
                    p.copy_(state[f"{part}.{name}"].to(device=p.device, dtype=p.dtype))

    def freeze_base(self) -> None:
        """``requires_grad=False`` on every model parameter, ``True`` on the new rows."""
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in self.parameters():
            p.requires_grad_(True)

    # -- export -----------------------------------------------------------------------------------------------------
    def merge_into(self, base: nn.Module) -> nn.Module:
        """Write the new rows into ``base`` as ordinary rows and return it: a plain model of ``V + m`` tokens.

        ``base`` is a copy of the model *without* the extension (same old weights; e.g. ``copy.deepcopy`` of the
        model after :meth:`remove`). Its input embedding and output head are resized to ``V + m`` rows
        (``resize_token_embeddings``) and rows ``V .. V + m - 1`` set to the new rows (output head and bias too),
        so that ``config.vocab_size = V + m`` and its logits equal the extended model's. The result is an ordinary
        checkpoint (``save_pretrained``/``from_pretrained``, any tool); the extension itself is unchanged.

        Raises:
            ConfigError: the extension has no output rows (a plain head would score the new tokens with untrained
                rows), ``base`` does not have the old vocabulary, or its output head is tied to the input embedding
                while the extension's new output rows are not the new input rows.
        """
        if not self.output_rows:
            raise ConfigError(
                "merging a vocabulary extension needs output rows (output_rows=True): a plain model's head scores "
                "every token, so new tokens without trained output rows cannot be written as a plain checkpoint"
            )
        embedding = base.get_input_embeddings()
        if isinstance(embedding, ExtendedEmbedding) or embedding.num_embeddings != self.first_new_id:
            raise ConfigError(
                f"merge_into needs the model without the extension ({self.first_new_id} rows), got an embedding of "
                f"{embedding.num_embeddings} rows ({type(embedding).__name__})"
            )
        base_tied = base.get_output_embeddings().weight is embedding.weight
        if base_tied and not self.tied_output_rows:
            raise ConfigError("the base model ties its head to its embedding but the new output rows are separate")
        end = self.first_new_id + self.num_new_tokens
        with torch.no_grad():
            new_input = self.input_rows(self._original_embedding.weight)
            new_output = self.output_rows_module(self._original_head.weight)
            new_bias = None if self.output_bias is None else self.output_bias(self._original_head.bias)
            base.resize_token_embeddings(end, mean_resizing=False)
            weight = base.get_input_embeddings().weight
            weight[self.first_new_id : end] = new_input.to(weight.dtype)
            head = base.get_output_embeddings()
            if not base_tied:
                head.weight[self.first_new_id : end] = new_output.to(head.weight.dtype)
            if new_bias is not None:
                head.bias[self.first_new_id : end] = new_bias.to(head.bias.dtype)
        return base

    # -- reading ----------------------------------------------------------------------------------------------------
    def input_embeddings(self) -> Tensor:
        """``[m, d]`` the current new input rows ``e_j`` (detached)."""
        with torch.no_grad():
            return self.input_rows(self._original_embedding.weight).detach().clone()

    def mask_logits(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        """:func:`mask_new_token_logits` with this extension's first new id."""
        return mask_new_token_logits(logits, input_ids, self.first_new_id)

    def logits_processor(self) -> NewTokenLogitsMask:
        """A ``transformers`` logits processor masking new tokens on old-only contexts during ``generate``."""
        return NewTokenLogitsMask(self.first_new_id)


def extend_vocabulary(
    model: nn.Module,
    num_new_tokens: int,
    dictionaries: list[list[int]] | None = None,
    mode: str = "free",
    output_rows: bool = False,
    *,
    tie_output_rows: bool | None = None,
) -> VocabularyExtension:
    """Add ``num_new_tokens`` tokens to ``model`` as separate parameters; the old rows stay bit-identical.

    After the call ``model(input_ids)`` accepts ids ``V .. V + m - 1`` (``V``: the input embedding's rows). With
    ``output_rows=False`` (default) the logits keep ``V`` columns: the model reads the new tokens but does not
    emit them, and its outputs on old-only contexts are bit-identical to the original's whatever the new rows
    are. With ``output_rows=True`` ``m`` new logits are appended (``config.vocab_size`` becomes ``V + m``); the
    old logits stay identical but the softmax now spreads mass over the new tokens too, unless masked
    (:meth:`VocabularyExtension.mask_logits`).

    Args:
        model: any Hugging Face causal LM (or VLM: its language model's embeddings are extended) whose
            ``get_input_embeddings()`` is an ``nn.Embedding``.
        num_new_tokens: ``m >= 1``.
        dictionaries: one list of old token ids per new token (``D_j``); ``free`` uses it for the initial row
            (mean of the dictionary's rows; an empty list or ``None``: the mean of all old rows) [reconstruction],
            ``dictionary`` needs a non-empty list per new token.
        mode: ``free`` (learn ``e_j``) or ``dictionary`` (learn mixing logits, ``e_j = sum softmax(a_j)_i e_{D_j,i}``).
        output_rows: also add new output rows (needed to *emit* the new tokens).
        tie_output_rows: new output rows = new input rows; ``None`` follows the model (tied iff its output weight
            is its input weight) [reconstruction].

    Returns:
        The :class:`VocabularyExtension`: ``new_token_ids``, ``parameters()`` (the only parameters to train),
        ``state_dict()``/``load_state_dict()``, ``remove()`` (restores the original model exactly).

    Raises:
        ConfigError: unknown mode, ``num_new_tokens < 1``, a dictionary naming a token outside the vocabulary, an
            empty dictionary in ``dictionary`` mode, a wrong number of dictionaries, an embedding that is not an
            ``nn.Embedding``, a model that is already extended.
    """
    return VocabularyExtension(model, num_new_tokens, dictionaries, mode, output_rows, tie_output_rows)


__all__ = [
    "MODES",
    "DictionaryRows",
    "ExtendedEmbedding",
    "ExtendedOutputHead",
    "FreeRows",
    "NewRows",
    "NewTokenLogitsMask",
    "VocabularyExtension",
    "extend_vocabulary",
    "mask_new_token_logits",
]
