"""Safety scorers for SafeThink: ``(prompts, partial_traces) -> scores in [0, 1]`` (1 = safe).

The scorer is R_safe of SafeThink (arXiv 2602.11096), the frozen safety reward model checked against tau at
each monitored step. Three kinds, one protocol:

* :class:`FunctionScorer` -- any plain function (an oracle, a regex, an API call);
* :class:`SequenceClassifierScorer` -- any local ``AutoModelForSequenceClassification`` checkpoint (score =
  probability of the safe label; with one logit, its sigmoid);
* :func:`load_safety_rm` -- the safety reward model trained by ``+method=safety_rm`` (exported with
  safetensors plus ``zoo_scorer.json`` naming the safe label and the text template).

:func:`validate_scores` checks count and range of every call and raises :class:`ScorerError` naming the
scorer; :func:`as_scorer` turns a function, a path or a scorer into a scorer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from zoo.errors import CheckpointNotFoundError, ZooError

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
        for key in ("safe_label", "template", "max_length"):
            if key in meta:
                kwargs.setdefault(key, meta[key])
        kwargs.setdefault("name", f"classifier:{path.name}")
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        return cls(model, tokenizer, **kwargs)

    @torch.no_grad()
    def __call__(self, prompts: Sequence[str], traces: Sequence[str]) -> list[float]:
        if len(prompts) != len(traces):
            raise ScorerError(f"safety scorer '{self.name}' got {len(prompts)} prompts for {len(traces)} traces")
        texts = [self.template.format(prompt=p, trace=t) for p, t in zip(prompts, traces)]
        device = next(self.model.parameters()).device
        out: list[float] = []
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[start : start + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                ).to(device)
                logits = self.model(**enc).logits.float()
                if logits.shape[-1] == 1:
                    probs = torch.sigmoid(logits[:, 0])
                else:
                    probs = torch.softmax(logits, dim=-1)[:, self.safe_label]
                out.extend(probs.cpu().tolist())
        finally:
            self.tokenizer.truncation_side = side
            self.model.train(was_training)
        return validate_scores(out, len(texts), self.name)


def load_safety_rm(path: str | Path, **kwargs: Any) -> SequenceClassifierScorer:
    """The safety reward model exported by ``python train.py +method=safety_rm`` (``<run>/export``)."""
    path = Path(path).expanduser()
    if not (path / SCORER_CONFIG).is_file():
        raise CheckpointNotFoundError(
            f"safety RM: {path.resolve() / SCORER_CONFIG} not found; pass the export directory of a "
            "`+method=safety_rm` run (or use SequenceClassifierScorer.from_pretrained for another classifier)"
        )
    return SequenceClassifierScorer.from_pretrained(path, **kwargs)


def as_scorer(scorer: Any) -> Callable[[Sequence[str], Sequence[str]], list[float]]:
    """A validated scorer from a scorer object, a plain function, or a path to a classifier export."""
    if isinstance(scorer, (str, Path)):
        return SequenceClassifierScorer.from_pretrained(scorer)
    if isinstance(scorer, (FunctionScorer, SequenceClassifierScorer)):
        return scorer
    if callable(scorer):
        return FunctionScorer(scorer)
    raise TypeError(f"a safety scorer must be callable or a path to a classifier, got {type(scorer).__name__}")
