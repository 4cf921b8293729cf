"""Calibration batches of the post-hoc binary quantizers (``quant=nanoquant|sign|onebit``), drawn from a task or a file.

The quantizers (:mod:`zoo.quant.nanoquant_quantizer`) receive calibration batches and never read a task or a file:
:class:`Calibration` is the callable the quant configs hand them (``quant.calibration``), built where the run is
composed (it reads the run's task, a JSONL or a text file with the backbone's tokenizer).

Calibration data (paper: 128 x 2048 tokens of WikiText-2 *train*, seed 0, i.e. windows shaped like the pretraining
data; notes 1(d)). Sources:

* ``source="task"`` -- rows of the synthetic task's *training* split (``TaskSource(task, seed).rows("train")``, so
  validation/test prompts never enter calibration), rendered exactly as the SFT datamodule renders them
  (``<bos> prompt completion <eos>``);
* ``source="jsonl"`` -- a JSONL file: a ``text`` field per row, or ``prompt`` + ``completion``;
* ``source="text"`` -- a plain text file, tokenized as one stream (``layout="windows"`` only).

Layouts -- calibration should look like the data the model was trained on, because statistics, block targets and
the distillation are all fitted on it:

* ``layout="rows"`` (default) -- ``num_samples`` single rows, each starting at position 0, cut at ``seq_len`` and
  right-padded to the longest; a token mask excludes the padding from every statistic and loss. This is how the SFT
  datamodule feeds a model trained on rows (right padding under causal attention leaves real tokens untouched);
* ``layout="windows"`` -- rows concatenated into one stream and cut into ``num_samples`` windows of ``seq_len``
  tokens (the paper's protocol for a model pretrained on packed text: positions beyond a row and attention across
  rows, which a row-trained model never saw).

Calibration needs the backbone's tokenizer: pass ``tokenizer=`` (a tokenizer or a
:class:`~zoo.backbones.base.Backbone`, whose ``.tokenizer`` is used; the Hydra configs pass ``${backbone}``); without
one, the tokenizer is loaded from the model's ``name_or_path`` directory, and otherwise a ``ConfigError`` says so.
From Python, a quantizer's ``calib_input_ids`` (a ``[N, T]`` tensor, with ``calib_mask`` for padded rows) bypasses
all of this.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.backbones.base import Backbone
from zoo.data.sources import TaskSource, iter_jsonl
from zoo.encoding import pad_sequences
from zoo.errors import ConfigError, DataError
from zoo.quant.nanoquant_quantizer import CalibrationSet

CALIBRATION_SOURCES = ("task", "jsonl", "text")
CALIBRATION_LAYOUTS = ("rows", "windows")


def resolve_tokenizer(tokenizer: Any, model: nn.Module | None) -> Any:
    """The tokenizer of the calibration text: ``tokenizer`` (a backbone's own when a backbone is given), else the one
    saved in the model's ``name_or_path`` directory."""
    if isinstance(tokenizer, Backbone):
        return tokenizer.tokenizer
    if tokenizer is not None:
        return tokenizer
    path = getattr(model, "name_or_path", "") if model is not None else ""
    if path and (Path(path) / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    raise ConfigError(
        "calibration needs the backbone's tokenizer: pass tokenizer=<tokenizer or backbone> to the calibration "
        "(the quant configs set calibration.tokenizer: ${backbone}), or give the quantizer calib_input_ids"
    )


def task_texts(task: Any, n_rows: int, seed: int) -> list[tuple[str, str]]:
    """``(prompt, completion)`` of ``n_rows`` rows of the task's *training* split (held-out prompts never enter)."""
    source = TaskSource(task, num_train=n_rows, seed=seed)
    return [(r["prompt"], r["completion"]) for r in source.rows("train")]


def jsonl_texts(path: Path) -> list[tuple[str, str]]:
    """``(prompt, completion)`` of every row of a JSONL file (a ``text`` field, or ``prompt`` + ``completion``)."""
    if not path.is_file():
        raise DataError(f"{path}: calibration file not found")
    rows: list[tuple[str, str]] = []
    for line_no, row in iter_jsonl(path):
        if isinstance(row, dict) and isinstance(row.get("text"), str):
            rows.append(("", row["text"]))
        elif isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("prompt", "completion")):
            rows.append((row["prompt"], row["completion"]))
        else:
            raise DataError(f"{path}:{line_no}: calibration rows need a string 'text' or 'prompt' + 'completion'")
    if not rows:
        raise DataError(f"{path}: no calibration rows")
    return rows


def calibration_set(
    tokenizer: Any,
    *,
    source: str = "task",
    layout: str = "rows",
    task: Any = None,
    path: str | Path | None = None,
    num_samples: int = 32,
    seq_len: int = 128,
    seed: int = 0,
) -> CalibrationSet:
    """Calibration data (see the module docstring for sources and layouts).

    Rows are rendered ``<bos> prompt completion <eos>`` (the SFT datamodule's rendering). ``layout="rows"``:
    ``num_samples`` rows cut at ``seq_len`` tokens, right-padded with the pad token to the longest, with the mask
    of real tokens. ``layout="windows"``: the rows concatenated into one stream and cut into consecutive
    ``[num_samples, seq_len]`` windows (the paper's WikiText-2 protocol: random 2048-token windows of the
    concatenated train split; here consecutive windows of a seeded draw), no mask. Raises ``DataError`` if the
    source is too short.
    """
    if source not in CALIBRATION_SOURCES:
        raise ConfigError(f"quant.calibration.source={source!r}; use one of {CALIBRATION_SOURCES}")
    if layout not in CALIBRATION_LAYOUTS:
        raise ConfigError(f"quant.calibration.layout={layout!r}; use one of {CALIBRATION_LAYOUTS}")
    if num_samples <= 0 or seq_len <= 1:
        raise ConfigError(f"quant.calibration: num_samples={num_samples}, seq_len={seq_len} must be positive (> 1)")
    if layout == "rows" and source == "text":
        raise ConfigError("quant.calibration.source=text has no rows; use quant.calibration.layout=windows")
    need = num_samples * seq_len
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def encode_row(prompt: str, completion: str) -> list[int]:
        return bos + list(tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]) + eos

    def encode(rows: list[tuple[str, str]]) -> list[int]:
        return [t for prompt, completion in rows for t in encode_row(prompt, completion)]

    if source == "task" and task is None:
        raise ConfigError("quant.calibration.source=task needs quant.calibration.task (the configs pass ${task})")
    if source != "task" and path is None:
        raise ConfigError(f"quant.calibration.source={source} needs quant.calibration.path")
    if layout == "rows":
        rows = task_texts(task, num_samples, seed) if source == "task" else jsonl_texts(Path(path))
        if len(rows) < num_samples:
            raise DataError(
                f"calibration source {source} ({path or 'task'}) has {len(rows)} rows; {num_samples} are needed "
                "(lower quant.calibration.num_samples)"
            )
        encoded = [encode_row(p, c)[:seq_len] for p, c in rows[:num_samples]]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
        ids = pad_sequences(encoded, pad, "right")
        mask = pad_sequences([[1] * len(e) for e in encoded], 0, "right").bool()
        return CalibrationSet(ids, mask)
    if source == "task":
        n_rows = max(16, need // 16)
        stream = encode(task_texts(task, n_rows, seed))
        while len(stream) < need:  # very short rows: draw more
            n_rows *= 2
            stream = encode(task_texts(task, n_rows, seed))
    elif source == "jsonl":
        stream = encode(jsonl_texts(Path(path)))
    else:
        p = Path(path)
        if not p.is_file():
            raise DataError(f"{p}: calibration file not found")
        stream = bos + list(tokenizer(p.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"])
    if len(stream) < need:
        raise DataError(
            f"calibration source {source} ({path or 'task'}) has {len(stream)} tokens; "
            f"{num_samples} x {seq_len} = {need} are needed (lower quant.calibration.num_samples/seq_len)"
        )
    return CalibrationSet(torch.tensor(stream[:need], dtype=torch.long).view(num_samples, seq_len))


class Calibration:
    """``quant.calibration``: a callable ``model -> CalibrationSet`` over :func:`calibration_set` (the keyword
    arguments are its own; ``tokenizer``: a tokenizer or a backbone, else the model's ``name_or_path`` directory)."""

    def __init__(
        self,
        source: str = "task",
        layout: str = "rows",
        task: Any = None,
        path: str | Path | None = None,
        num_samples: int = 32,
        seq_len: int = 128,
        seed: int = 0,
        tokenizer: Any = None,
    ) -> None:
        self.source, self.layout, self.task, self.path = source, layout, task, path
        self.num_samples, self.seq_len, self.seed = int(num_samples), int(seq_len), int(seed)
        self.tokenizer = tokenizer

    def describe(self) -> dict[str, Any]:
        """The settings (for the quantizer's report; the tokenizer is the backbone's)."""
        keys = ("source", "layout", "task", "path", "num_samples", "seq_len", "seed")
        return {k: getattr(self, k) for k in keys}

    def __call__(self, model: nn.Module | None = None) -> CalibrationSet:
        return calibration_set(
            resolve_tokenizer(self.tokenizer, model),
            source=self.source,
            layout=self.layout,
            task=self.task,
            path=self.path,
            num_samples=self.num_samples,
            seq_len=self.seq_len,
            seed=self.seed,
        )
