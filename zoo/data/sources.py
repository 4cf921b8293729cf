"""Row sources: where a datamodule's rows come from (a synthetic task, or the user's JSONL files).

A row is a ``dict`` with at least the fields a datamodule needs (``prompt``/``completion`` for SFT,
``prompt`` for RL prompts, ``prompt``/``chosen``/``rejected`` for preferences, e.g. from
:class:`TaskPreferenceSource`); every other field is carried along as a column (RL reward functions receive them
as keyword arguments; the weighted sampler reads a domain column, the SFT datamodule a loss-weight column).
"""

from __future__ import annotations

import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from zoo.data.tasks import Task
from zoo.errors import ConfigError, DataError
from zoo.tokens import THINK_CLOSE

log = logging.getLogger("zoo")

Row = dict[str, Any]


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` of each non-blank line of a JSONL file (UTF-8; a byte-order mark is allowed).

    Raises:
        DataError: naming the file and the line, for a missing file, bytes that are not UTF-8 (with the column of
            the first bad byte) or a line that is not valid JSON (with the column of the error in that line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: data file not found")
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{path}:{line_no}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            line = line.rstrip("\r\n")  # an error at the end of the line is then reported at its column
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line_no}: not valid JSON ({err.msg} at column {err.colno})") from None


def read_jsonl(path: str | Path, required_fields: Sequence[str]) -> list[Row]:
    """Read a JSONL file, one JSON object per line; blank lines are skipped (see :func:`iter_jsonl`).

    Raises:
        DataError: naming the file, the line number and the field, for a missing file, bytes that are not UTF-8,
            a line that is not a JSON object, a missing required field or a required field that is not a string.
    """
    rows: list[Row] = []
    for line_no, row in iter_jsonl(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
        for name in required_fields:
            if name not in row:
                raise DataError(f"{path}:{line_no}: missing field '{name}' (required: {list(required_fields)})")
            if not isinstance(row[name], str):
                raise DataError(f"{path}:{line_no}: field '{name}' must be a string, got {type(row[name]).__name__}")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


class RowSource(ABC):
    """Base class: ``rows(split, required_fields)`` for ``split`` in ``train | val | test``."""

    @abstractmethod
    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        """The rows of a split; ``required_fields`` are the fields the consuming datamodule needs."""

    def describe(self) -> dict[str, Any]:
        """JSON-able description used in cache keys."""
        return {"kind": type(self).__name__}


class GeneratedSource(RowSource):
    """Rows generated per split from a seed, built once and cached.

    Subclasses implement :meth:`generate`; ``split_seed(split)`` gives ``seed + {train: 0, val: 1, test: 2}``
    (plus ``seed_offset``), so the splits are disjoint draws and reproducible.

    Args:
        num_train, num_val, num_test: rows (or items) per split.
        seed: base seed.
    """

    seed_offset: int = 0

    def __init__(self, num_train: int, num_val: int, num_test: int, seed: int = 0) -> None:
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.seed = seed
        self._cache: dict[str, list[Row]] = {}

    def split_seed(self, split: str) -> int:
        """The seed of a split's draw."""
        return self.seed + self.seed_offset + {"train": 0, "val": 1, "test": 2}[split]

    @abstractmethod
    def generate(self, split: str, size: int) -> list[Row]:
        """Draw the rows of one split."""

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        if split not in self.sizes:
            raise ValueError(f"unknown split {split!r}; use one of {list(self.sizes)}")
        if split not in self._cache:
            self._cache[split] = self.generate(split, self.sizes[split])
        return self._cache[split]

    def held_out_prompts(self) -> set[str]:
        """Prompts of the validation and test splits (excluded from training draws)."""
        return {r["prompt"] for s in ("val", "test") for r in self.rows(s)}


class TaskSource(GeneratedSource):
    """Rows drawn from a synthetic task; validation/test prompts never appear in the training rows (unless the task
    declares ``distinct_prompts = False``: a fixed prompt set with sampled completions, e.g. a model organism).

    Args:
        task: the synthetic task.
        num_train, num_val, num_test: rows per split.
        seed: base seed (``val`` uses ``seed + 1``, ``test`` ``seed + 2``, ``train`` ``seed``).
    """

    def __init__(self, task: Task, num_train: int = 20_000, num_val: int = 256, num_test: int = 256, seed: int = 0):
        super().__init__(num_train, num_val, num_test, seed)
        self.task = task

    def generate(self, split: str, size: int) -> list[Row]:
        exclude = self.held_out_prompts() if split == "train" and self.task.distinct_prompts else None
        return [e.as_row() for e in self.task.examples(size, self.split_seed(split), exclude_prompts=exclude)]

    def describe(self) -> dict[str, Any]:
        return {"kind": "task", "task": self.task.describe(), "sizes": self.sizes, "seed": self.seed}


class TaskPreferenceSource(TaskSource):
    """Preference pairs drawn from a synthetic task: ``chosen`` is the reference completion, ``rejected`` the same
    reasoning ending in a wrong answer (the answer of another example of the split, drawn with the split's seed).

    Rows: ``prompt``, ``chosen``, ``rejected``, ``answer`` (the correct one). The pair differs only after
    ``</think>``, so a preference learner must learn which answer the reasoning supports.

    Args: as :class:`TaskSource`.

    Raises:
        DataError: the task's completions have no ``</think>``, or every example of a split has the same answer.
    """

    def generate(self, split: str, size: int) -> list[Row]:
        rows = super().generate(split, size)
        if len({r["answer"] for r in rows}) < 2:
            raise DataError(f"task {self.task.name}: every {split} example has the same answer; no wrong answer to use")
        rng = random.Random(f"rejected-{self.split_seed(split)}")
        pairs = []
        for row in rows:
            completion = row["completion"]
            if THINK_CLOSE not in completion:
                raise DataError(
                    f"task {self.task.name}: completion {completion[:40]!r} has no {THINK_CLOSE!r}; "
                    "TaskPreferenceSource needs the <think>...</think>ANSWER format"
                )
            wrong = row["answer"]
            while wrong == row["answer"]:
                wrong = rows[rng.randrange(len(rows))]["answer"]
            reasoning = completion[: completion.rindex(THINK_CLOSE) + len(THINK_CLOSE)]
            pairs.append(
                {"prompt": row["prompt"], "chosen": completion, "rejected": reasoning + wrong, "answer": row["answer"]}
            )
        return pairs

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kind": "task_preferences"}


class JsonlSource(RowSource):
    """Rows from the user's JSONL files (one per split; ``test`` falls back to ``val``).

    Args:
        train_path, val_path, test_path: JSONL files; the fields each row must have are set by the datamodule
            that reads them (``prompt``/``completion`` for SFT, ``prompt`` for RL, ...).
        num_train: use only the first ``num_train`` rows of the train file (``None``: all), as the synthetic sources'
            ``num_train`` does; a method's prompt budget (e.g. DRIFT's collection) then applies to the user's file too.
    """

    def __init__(
        self,
        train_path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        num_train: int | None = None,
    ):
        if num_train is not None and int(num_train) < 1:
            raise ConfigError(f"datamodule.source.num_train must be >= 1 or null, got {num_train}")
        self.paths = {"train": train_path, "val": val_path, "test": test_path or val_path}
        self.num_train = None if num_train is None else int(num_train)
        self._cache: dict[str, list[Row]] = {}

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        path = self.paths.get(split)
        if path is None:
            raise DataError(f"no JSONL file configured for split '{split}' (set datamodule.source.{split}_path)")
        if split not in self._cache:
            rows = read_jsonl(path, required_fields)
            if split == "train" and self.num_train is not None and len(rows) > self.num_train:
                log.info(
                    "%s: using the first %d of %d rows (datamodule.source.num_train)", path, self.num_train, len(rows)
                )
                rows = rows[: self.num_train]
            self._cache[split] = rows
        return self._cache[split]

    def describe(self) -> dict[str, Any]:
        return {"kind": "jsonl", "paths": self.paths, "num_train": self.num_train}
