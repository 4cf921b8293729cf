"""Safety scorers for SafeThink: ``(prompts, partial_traces) -> scores in [0, 1]`` (1 = safe).

The scorer is R_safe of SafeThink (arXiv 2602.11096), the frozen safety reward model checked against tau at
each monitored step. Three kinds, one protocol:

* :class:`FunctionScorer` -- any plain function (an oracle, a regex, an API call);
* :class:`SequenceClassifierScorer` -- any local ``AutoModelForSequenceClassification`` checkpoint (score =
  probability of the safe label; with one logit, its sigmoid);
* :func:`load_safety_rm` -- the safety reward model trained by ``+method=safety_rm`` (exported with
  safetensors plus ``zoo_scorer.json`` naming the safe label and the text template).

A monitor scores the same rows again and again as their traces grow (SafeThink scores every early step of every row).
:func:`scoring_session` gives it a per-generation session ``session(rows, prompts, traces)`` that knows which row
each text belongs to. For a causal classifier (a decoder-only model with last-token pooling, whose output at position
``t`` depends only on tokens ``<= t``) the session is :class:`IncrementalScoringSession`: it keeps each row's key/value
cache and feeds only the tokens that follow the longest prefix it has already encoded (injected tokens and rollbacks
included), so a call costs the new tokens, not prompt + trace. Other scorers re-read the whole text at every call.

:func:`validate_scores` checks count and range of every call and raises :class:`ScorerError` naming the
scorer; :func:`as_scorer` turns a function, a path or a scorer into a scorer.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

from zoo.errors import CheckpointNotFoundError, ConfigError, ZooError
from zoo.generation.sampling import cache_kwarg_name, plain_dynamic_cache

SCORER_CONFIG = "zoo_scorer.json"


class ScorerError(ZooError, ValueError):
    """A scorer returned the wrong number of scores, or scores outside [0, 1] (the message names it)."""


@runtime_checkable
class SafetyScorer(Protocol):
    """``scorer(prompts, traces) -> scores`` with one score in ``[0, 1]`` per row (1 = safe)."""

    def __call__(self, prompts: Sequence[str], traces: Sequence[str]) -> Sequence[float] | torch.Tensor: ...


def scorer_name(scorer: Any) -> str:
    """A readable name of a scorer for error messages and logs."""
    name = getattr(scorer, "name", None)
    if isinstance(name, str) and name:
        return name
    fn = getattr(scorer, "__qualname__", None) or getattr(scorer, "__name__", None)
    return fn or type(scorer).__name__


def validate_scores(scores: Any, expected: int, name: str) -> list[float]:
    """Scores as a list of floats, or :class:`ScorerError` naming the scorer.

    Raises:
        ScorerError: not a sequence of numbers, a count different from ``expected``, NaN, or a value
            outside ``[0, 1]``.
    """
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().float().flatten().cpu().tolist()
    try:
        values = [float(s) for s in scores]
    except (TypeError, ValueError) as err:
        raise ScorerError(
            f"safety scorer '{name}' must return a sequence of numbers, got {type(scores).__name__}"
        ) from err
    if len(values) != expected:
        raise ScorerError(f"safety scorer '{name}' returned {len(values)} scores for {expected} traces")
    bad = [(i, v) for i, v in enumerate(values) if math.isnan(v) or not 0.0 <= v <= 1.0]
    if bad:
        shown = ", ".join(f"row {i}: {v}" for i, v in bad[:3])
        raise ScorerError(
            f"safety scorer '{name}' returned scores outside [0, 1] ({shown}); scorers must return P(safe) "
            "(wrap raw logits with a sigmoid)"
        )
    return values


class FunctionScorer:
    """A plain function ``(prompts, traces) -> list[float]`` as a named, validated scorer.

    Args:
        fn: the function.
        name: shown in errors and logs (default: the function's name).
    """

    def __init__(self, fn: Callable[[Sequence[str], Sequence[str]], Any], name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionScorer needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or scorer_name(fn)

    def __call__(self, prompts: Sequence[str], traces: Sequence[str]) -> list[float]:
        return validate_scores(self.fn(prompts, traces), len(traces), self.name)


class SequenceClassifierScorer:
    """A sequence classifier as a scorer: score = P(safe label | template(prompt, trace)).

    Args:
        model: an ``AutoModelForSequenceClassification`` model (run in eval mode, its mode is restored).
        tokenizer: its tokenizer (a pad token is required for batches; EOS is used when missing).
        safe_label: index of the safe class (ignored with a single logit: score = sigmoid).
        template: how the text is built; ``{prompt}`` and ``{trace}`` are filled in.
        batch_size: rows per forward pass.
        max_length: texts are truncated to their last ``max_length`` tokens (the latest steps matter).
        name: shown in errors and logs.
        incremental: how a :meth:`session` scores rows whose texts grow: ``"auto"`` (default) = incrementally
            (:class:`IncrementalScoringSession`, KV cache per row) when the model is a causal classifier
            (:func:`is_causal_classifier`), else by re-reading every text; ``True`` = incrementally (a
            :class:`~zoo.errors.ConfigError` for a model that is not causal); ``False`` = always re-read. Calls of
            the scorer itself (``scorer(prompts, traces)``) always read the whole texts.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        safe_label: int = 1,
        template: str = "{prompt}{trace}",
        batch_size: int = 64,
        max_length: int = 512,
        name: str | None = None,
        incremental: Literal["auto"] | bool = "auto",
    ) -> None:
        num_labels = int(getattr(model.config, "num_labels", 2))
        if num_labels > 1 and not 0 <= safe_label < num_labels:
            raise ValueError(f"safe_label={safe_label} is not a class of a {num_labels}-label classifier")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.model = model
        self.tokenizer = tokenizer
        self.safe_label = safe_label
        self.template = template
        self.batch_size = batch_size
        self.max_length = max_length
        self.name = name or f"{type(model).__name__}({getattr(model.config, '_name_or_path', '') or 'in memory'})"
        if incremental not in ("auto", True, False):
            raise ConfigError(f"scorer '{self.name}': incremental must be 'auto', true or false, got {incremental!r}")
        causal = is_causal_classifier(model)
        if incremental is True and not causal:
            raise ConfigError(
                f"scorer '{self.name}': incremental=true needs a causal (decoder-only, last-token pooled) classifier "
                f"with a `score` head; {type(model).__name__} is not one (use incremental='auto' or false)"
            )
        self.incremental = causal if incremental == "auto" else bool(incremental)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> SequenceClassifierScorer:
        """Load any local ``AutoModelForSequenceClassification`` checkpoint (``local_files_only``).

        ``zoo_scorer.json`` in the directory (written by the safety RM export) supplies ``safe_label`` and
        ``template`` unless given here.
        """
        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise CheckpointNotFoundError(f"safety scorer: no classifier at {path.resolve()} (no config.json)")
        meta = json.loads((path / SCORER_CONFIG).read_text()) if (path / SCORER_CONFIG).is_file() else {}
        for key in ("safe_label", "template", "max_length", "incremental"):
            if key in meta:
                kwargs.setdefault(key, meta[key])
        kwargs.setdefault("name", f"classifier:{path.name}")
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(model, tokenizer, **kwargs)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], traces: Sequence[str]) -> list[float]:
        texts = self.texts(prompts, traces)
        device = next(self.model.parameters()).device
        out: list[float] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            with _eval_mode(self.model):
                for start in range(0, len(texts), self.batch_size):
                    enc = self.tokenizer(
                        texts[start : start + self.batch_size],
                        return_tensors="pt",
                        padding=True,
                        truncation=True,
                        max_length=self.max_length,
                    ).to(device)
                    out.extend(self.safe_probability(self.model(**enc).logits).cpu().tolist())
        finally:
            self.tokenizer.truncation_side = side
        return validate_scores(out, len(texts), self.name)

    def texts(self, prompts: Sequence[str], traces: Sequence[str]) -> list[str]:
        """The classifier's input texts (the template filled in)."""
        if len(prompts) != len(traces):
            raise ScorerError(f"safety scorer '{self.name}' got {len(prompts)} prompts for {len(traces)} traces")
        return [self.template.format(prompt=p, trace=t) for p, t in zip(prompts, traces)]

    def safe_probability(self, logits: torch.Tensor) -> torch.Tensor:
        """``[N, num_labels]`` logits -> ``[N]`` P(safe): softmax at ``safe_label``, or the sigmoid of one logit."""
        logits = logits.float()
        if logits.shape[-1] == 1:
            return torch.sigmoid(logits[:, 0])
        return torch.softmax(logits, dim=-1)[:, self.safe_label]

    def session(self) -> ScoringSession:
        """A scoring session for one generation (see :func:`scoring_session`): incremental when
        :attr:`incremental` is set."""
        return IncrementalScoringSession(self) if self.incremental else StatelessSession(self)


def is_causal_classifier(model: PreTrainedModel) -> bool:
    """Whether ``model`` is a decoder-only sequence classifier whose score at position ``t`` depends only on tokens
    ``<= t``: not an encoder-decoder, its model type has a causal-LM class and no masked-LM class (which excludes
    bidirectional encoders such as BERT/RoBERTa, whose causal-LM class is a decoder variant), and its head is a
    ``score`` module applied to the last token's hidden state (``*ForSequenceClassification`` of Llama, Qwen,
    Mistral, GPT-2, ...)."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    return (
        not getattr(config, "is_encoder_decoder", False)
        and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and isinstance(getattr(model, "score", None), torch.nn.Module)
        and isinstance(getattr(model, getattr(model, "base_model_prefix", ""), None), torch.nn.Module)
    )


# ``session(rows, prompts, traces) -> scores``: ``rows`` name the sequence each text belongs to; a row may appear
# several times (its texts in the order they were written, e.g. the traces after each of its steps)
ScoringSession = Callable[[Sequence[Hashable], Sequence[str], Sequence[str]], list[float]]


class StatelessSession:
    """A session that ignores row identity: every call reads the whole texts (``scorer(prompts, traces)``)."""

    def __init__(self, scorer: Callable[[Sequence[str], Sequence[str]], Any]) -> None:
        self.scorer = scorer

    def __call__(self, rows: Sequence[Hashable], prompts: Sequence[str], traces: Sequence[str]) -> list[float]:
        return validate_scores(self.scorer(prompts, traces), len(traces), scorer_name(self.scorer))


def scoring_session(scorer: Any) -> ScoringSession:
    """A per-generation session ``session(rows, prompts, traces) -> scores`` of a scorer: ``rows`` name the sequence
    each text belongs to (the same row's later texts usually extend its earlier ones). The scorer's own ``session()``
    when it has one (:meth:`SequenceClassifierScorer.session`), else :class:`StatelessSession`."""
    make = getattr(scorer, "session", None)
    return make() if callable(make) else StatelessSession(scorer)


# a forward pass over rows of similar new-token counts is split off when it saves at least this many padded tokens
# (measured: one more forward pass of the 2-layer demo classifier costs about what ~100 fed tokens do)
BUCKET_MIN_SAVED_TOKENS = 128


def length_groups(lengths: Sequence[int], min_saved: int) -> list[list[int]]:
    """Indices of ``lengths`` in groups fed one forward pass each: sorted by length, a group is split in two where
    that saves the most padded tokens (``len(group) * max(length)`` summed over groups), while it saves at least
    ``min_saved``."""

    def split(order: list[int]) -> list[list[int]]:
        whole = len(order) * lengths[order[-1]]
        best, at = 0, 0
        for k in range(1, len(order)):
            saved = whole - k * lengths[order[k - 1]] - (len(order) - k) * lengths[order[-1]]
            if saved > best:
                best, at = saved, k
        if best == 0 or best < min_saved:
            return [order]
        return split(order[:at]) + split(order[at:])

    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    return split(order) if order else []


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class IncrementalScoringSession:
    """Incremental (KV-cached) scoring with a causal classifier: exact, and a call feeds only the new tokens.

    For a decoder-only classifier with last-token pooling the score of a text is ``score(h_T)``, where the hidden
    state ``h_T`` of the last token depends only on tokens ``<= T``, so the keys/values of an encoded prefix are
    reused as they are. Per row the session keeps the scorer token ids it encoded and their keys/values. A call
    tokenizes each row's full text (the scorer's own tokenizer and template, as :class:`SequenceClassifierScorer`
    does, so the tokens never differ from a full read), finds the longest common prefix ``c`` with what the row
    already encoded (a grown trace: all of it; injected prefix tokens are just more new tokens; a rollback or a
    re-tokenized boundary: the part before the change) and feeds ``ids[c:]`` (at least the last token).

    Several texts of one row in a call (its traces after each of several steps): when each one's tokens are a prefix
    of the next one's, the row's newest text is fed once and every text's score is read off the hidden state at its
    own last token (causality makes it the text's own score); a text that does not extend the one before it (a
    template that adds tokens after the trace, a changed boundary) starts another pass.

    Storage: one slot per row in per-layer buffers ``[slots, kv_heads, capacity, head_dim]`` (grown by doubling);
    a row's valid positions are its first ``len(ids)`` columns. A call over ``R`` rows gathers their slots' first
    ``P = max c`` columns as the past (columns ``>= c`` of a row are masked out), feeds the new tokens right-padded
    (``input_ids [R, W]``, ``attention_mask [R, P + W]``, explicit positions ``c + j``), so every row sees exactly its
    own tokens at their true positions, then writes the new keys/values back at columns ``c ..`` of its slot (a
    handful of tensor operations per layer, independent of ``R``). Rows whose new-token counts differ widely are
    fed in separate passes (:func:`length_groups`, when a split saves at least ``BUCKET_MIN_SAVED_TOKENS`` padded
    tokens). Rows whose text exceeds the scorer's
    ``max_length`` are scored by a full (left-truncated) read, as :class:`SequenceClassifierScorer` does.

    The last decoder layer's MLP runs only at the positions whose scores are read (:func:`last_layer_mlp`): the
    other positions need that layer's keys and values (computed before its MLP) but not its output, which nothing
    reads -- the same scores for about a layer's MLP less work (a third of a 2-layer classifier's matrix products).

    Args:
        scorer: a :class:`SequenceClassifierScorer` over a causal classifier (:func:`is_causal_classifier`).
    """

    def __init__(self, scorer: SequenceClassifierScorer) -> None:
        model = scorer.model
        if not is_causal_classifier(model):
            raise ConfigError(f"scorer '{scorer.name}': incremental scoring needs a causal classifier")
        self.scorer = scorer
        self.model = model
        self.base = getattr(model, model.base_model_prefix)
        self.cache_kwarg = cache_kwarg_name(self.base)
        self.last_mlp = last_layer_mlp(model)
        self.slot: dict[Hashable, int] = {}
        self.ids: list[list[int]] = []  # per slot, the scorer tokens whose keys/values are stored
        self.keys: list[torch.Tensor] = []  # per layer, [slots, kv_heads, capacity, head_dim]
        self.values: list[torch.Tensor] = []
        self.fed_tokens = 0  # tokens fed to the model over the session

    @torch.no_grad()
    def __call__(self, rows: Sequence[Hashable], prompts: Sequence[str], traces: Sequence[str]) -> list[float]:
        scorer = self.scorer
        texts = scorer.texts(prompts, traces)
        if len(rows) != len(texts):
            raise ScorerError(f"safety scorer '{scorer.name}': a session call needs one row per text")
        # one batch encode (measured: 2x faster than encoding in turn at 64-128 texts, no slower at 8)
        ids = list(scorer.tokenizer(list(texts), add_special_tokens=True)["input_ids"])
        scores: list[float | None] = [None] * len(texts)
        long = [i for i, x in enumerate(ids) if len(x) > scorer.max_length or not x]
        if long:
            for i, value in zip(long, scorer([prompts[i] for i in long], [traces[i] for i in long])):
                scores[i] = value
                if rows[i] in self.slot:
                    self.ids[self.slot[rows[i]]] = []
        # per row, passes: runs of its texts whose tokens extend one another; one feed per pass, every text read off it
        passes: dict[Hashable, list[list[int]]] = {}
        for i in range(len(texts)):
            if scores[i] is not None:
                continue
            runs = passes.setdefault(rows[i], [])
            last = runs[-1][-1] if runs else None
            if last is not None and len(ids[i]) >= len(ids[last]) and ids[i][: len(ids[last])] == ids[last]:
                runs[-1].append(i)
            else:
                runs.append([i])
        with _eval_mode(self.model):
            for depth in range(max((len(r) for r in passes.values()), default=0)):
                todo = [runs[depth] for runs in passes.values() if depth < len(runs)]
                for start in range(0, len(todo), scorer.batch_size):
                    chunk = todo[start : start + scorer.batch_size]
                    found = self._score(
                        [rows[run[-1]] for run in chunk],
                        [ids[run[-1]] for run in chunk],
                        [[len(ids[i]) for i in run] for run in chunk],
                    )
                    for run, values in zip(chunk, found):
                        for i, value in zip(run, values):
                            scores[i] = value
        return validate_scores(scores, len(texts), scorer.name)

    def _score(self, rows: list[Hashable], ids: list[list[int]], reads: list[list[int]]) -> list[list[float]]:
        """Feed each row's ``ids`` (distinct rows) past what its slot holds; per row, the scores of its prefixes of
        the lengths ``reads`` (ascending, the last ``len(ids)``). Rows are fed in groups of similar new-token
        counts (:func:`length_groups`) so that short feeds are not padded to the longest one."""
        for row in rows:
            if row not in self.slot:
                self.slot[row] = len(self.ids)
                self.ids.append([])
        slots = [self.slot[row] for row in rows]
        # feed at least from the shortest read's last token: its hidden state is that score's input
        reused = [min(_common_prefix(self.ids[s], x), r[0] - 1) for s, x, r in zip(slots, ids, reads)]
        found: list[list[float]] = [[] for _ in rows]
        for group in length_groups([len(x) - c for x, c in zip(ids, reused)], BUCKET_MIN_SAVED_TOKENS):
            values = self._feed(
                [slots[k] for k in group],
                [ids[k] for k in group],
                [reused[k] for k in group],
                [reads[k] for k in group],
            )
            for k, v in zip(group, values):
                found[k] = v
        for s, x in zip(slots, ids):
            self.ids[s] = list(x)
        return found

    def _feed(
        self, slots: list[int], ids: list[list[int]], reused: list[int], reads: list[list[int]]
    ) -> list[list[float]]:
        """One forward pass: each slot's ``ids[c:]`` after its ``c = reused`` stored columns; the scores at the
        ``reads`` lengths; the fed keys/values written back to the slots."""
        new = [x[c:] for x, c in zip(ids, reused)]
        past, width = max(reused), max(len(x) for x in new)
        device = next(self.model.parameters()).device
        pad = self.scorer.tokenizer.pad_token_id
        input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in new], dtype=torch.long, device=device)
        start = torch.tensor(reused, dtype=torch.long, device=device)[:, None]
        length = torch.tensor([len(x) for x in new], dtype=torch.long, device=device)[:, None]
        fed = torch.arange(width, device=device)[None]
        # per row: its c reused columns, masked padding up to the longest reuse, its new tokens, masked padding
        mask = torch.cat([torch.arange(past, device=device)[None] < start, fed < length], 1).long()
        # storage columns c + j; model positions the same, padding kept at the row's last position (learned position
        # tables, e.g. GPT-2's, end at the model's context)
        columns = start + fed
        positions = start + torch.minimum(fed, length - 1)
        slot_index = torch.tensor(slots, dtype=torch.long, device=device)
        cache = DynamicCache(config=self.base.config)
        if not plain_dynamic_cache(cache):
            raise ConfigError(
                f"scorer '{self.scorer.name}': incremental scoring supports full-attention caches only "
                f"({sorted({type(layer).__name__ for layer in cache.layers})}); set incremental=false"
            )
        if self.keys:
            self._reserve(len(self.ids), int(columns.max()) + 1)
        if past:
            for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
                cache.update(keys[slot_index, :, :past], values[slot_index, :, :past], layer)
        # the hidden state at each read's last token (fed column n - 1 - c of the row)
        which = torch.tensor([k for k, r in enumerate(reads) for _ in r], dtype=torch.long, device=device)
        at = torch.tensor([n - 1 - c for c, r in zip(reused, reads) for n in r], dtype=torch.long, device=device)
        with only_at_positions(self.last_mlp, which, at):
            out = self.base(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self.cache_kwarg: cache},
            )
        self.fed_tokens += sum(len(x) for x in new)
        probs = self.scorer.safe_probability(self.model.score(out.last_hidden_state[which, at])).cpu().tolist()
        self._store(cache, slot_index, columns, past)
        found = iter(probs)
        return [[next(found) for _ in r] for r in reads]

    def _store(self, cache: DynamicCache, slot_index: torch.Tensor, columns: torch.Tensor, past: int) -> None:
        """Write the keys/values of the fed tokens (cache columns ``past ..``) to their rows' slots at ``columns``
        ``[R, W]`` (padding lands after a row's valid length, where it is never read)."""
        if not self.keys:  # the first call (nothing reused): buffers shaped like the model's cache
            first = cache.layers[0].keys
            shape = (len(self.ids), first.shape[1], max(int(columns.max()) + 1, 64), first.shape[3])
            self.keys = [first.new_zeros(shape) for _ in cache.layers]
            self.values = [first.new_zeros(shape) for _ in cache.layers]
        rows = slot_index[:, None].expand_as(columns)
        for layer, stored_keys, stored_values in zip(cache.layers, self.keys, self.values):
            stored_keys[rows, :, columns] = layer.keys[:, :, past:].transpose(1, 2)
            stored_values[rows, :, columns] = layer.values[:, :, past:].transpose(1, 2)

    def _reserve(self, slots: int, width: int) -> None:
        """Grow the buffers (by doubling) to hold ``slots`` rows of ``width`` positions."""
        have_slots, have_width = self.keys[0].shape[0], self.keys[0].shape[2]
        more_slots = max(slots, 2 * have_slots) - have_slots if slots > have_slots else 0
        more_width = max(width, 2 * have_width) - have_width if width > have_width else 0
        if more_slots or more_width:
            self.keys = [_grown(t, more_slots, more_width) for t in self.keys]
            self.values = [_grown(t, more_slots, more_width) for t in self.values]


def last_layer_mlp(model: PreTrainedModel) -> torch.nn.Module | None:
    """The MLP (``mlp``) of the last decoder layer of a classifier's base model, or ``None`` when there is none to
    find: the layers are the base model's ``ModuleList`` of ``config.num_hidden_layers`` blocks (``layers`` of Llama,
    Qwen, Mistral; ``h`` of GPT-2). Such an MLP is position-wise (``[..., H] -> [..., H]``)."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    count = getattr(model.config, "num_hidden_layers", None)
    if not isinstance(base, torch.nn.Module) or not count:
        return None
    for child in base.children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == count:
            mlp = getattr(child[-1], "mlp", None)
            return mlp if isinstance(mlp, torch.nn.Module) else None
    return None


@contextlib.contextmanager
def only_at_positions(module: torch.nn.Module | None, rows: torch.Tensor, columns: torch.Tensor) -> Iterator[None]:
    """Inside the block, the position-wise ``module`` (called with a ``[B, T, H]`` tensor as its first argument) runs
    only at the positions ``(rows[i], columns[i])``; its output is zero at the others. For a layer whose output is
    read at a few positions only (the last layer of a classifier read at the scored tokens). ``None``: no change."""
    if module is None:
        yield
        return
    inputs: list[torch.Tensor] = []

    def gather(_module: torch.nn.Module, args: tuple) -> tuple | None:
        if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() != 3:
            return None  # called in another way: runs everywhere
        inputs.append(args[0])
        return (args[0][rows, columns], *args[1:])

    def scatter(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
        if not inputs:
            return output
        x = inputs.pop()
        full = output.new_zeros(*x.shape[:-1], output.shape[-1])
        full[rows, columns] = output
        return full

    handles = [module.register_forward_pre_hook(gather), module.register_forward_hook(scatter)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _grown(buffer: torch.Tensor, slots: int, columns: int) -> torch.Tensor:
    """``buffer`` ``[S, H, C, D]`` with ``slots`` more rows and ``columns`` more positions (zeros)."""
    if columns:
        buffer = torch.cat([buffer, buffer.new_zeros(buffer.shape[0], buffer.shape[1], columns, buffer.shape[3])], 2)
    if slots:
        buffer = torch.cat([buffer, buffer.new_zeros(slots, *buffer.shape[1:])], 0)
    return buffer


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` in eval mode inside the block, restoring its mode after (no module walk when already in eval)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


def load_safety_rm(path: str | Path, **kwargs: Any) -> SequenceClassifierScorer:
    """The safety reward model exported by ``python train.py +method=safety_rm`` (``<run>/export``)."""
    path = Path(path).expanduser()
    if not (path / SCORER_CONFIG).is_file():
        raise CheckpointNotFoundError(
            f"safety RM: {path.resolve() / SCORER_CONFIG} not found; pass the export directory of a "
            "`+method=safety_rm` run (or use SequenceClassifierScorer.from_pretrained for another classifier)"
        )
    return SequenceClassifierScorer.from_pretrained(path, **kwargs)


def as_scorer(
    scorer: Any, incremental: Literal["auto"] | bool = "auto"
) -> Callable[[Sequence[str], Sequence[str]], list[float]]:
    """A validated scorer from a scorer object, a plain function, or a path to a classifier export.

    ``incremental`` (:class:`SequenceClassifierScorer`'s option) applies to a path; for a scorer object other than
    ``"auto"`` it must agree with the object (a plain function is never incremental), else a
    :class:`~zoo.errors.ConfigError`.
    """
    if isinstance(scorer, (str, Path)):
        return SequenceClassifierScorer.from_pretrained(
            scorer, **({} if incremental == "auto" else {"incremental": incremental})
        )
    if isinstance(scorer, (FunctionScorer, SequenceClassifierScorer)):
        out = scorer
    elif callable(scorer):
        out = FunctionScorer(scorer)
    else:
        raise TypeError(f"a safety scorer must be callable or a path to a classifier, got {type(scorer).__name__}")
    if incremental != "auto" and bool(getattr(out, "incremental", False)) != incremental:
        raise ConfigError(
            f"scorer '{scorer_name(out)}' is {'' if getattr(out, 'incremental', False) else 'not '}incremental but "
            f"incremental={incremental} was asked; pass a classifier directory, or build the scorer with that option"
        )
    return out
