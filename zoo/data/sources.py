"""Row sources: where a datamodule's rows come from (a synthetic task, or the user's data).

A row is a ``dict`` with at least the fields a datamodule needs (``prompt``/``completion`` for SFT,
``prompt`` for RL prompts, ``prompt``/``chosen``/``rejected`` for preferences, e.g. from
:class:`TaskPreferenceSource`); every other field is carried along as a column (RL reward functions receive them
as keyword arguments; the weighted sampler reads a domain column, the SFT datamodule a loss-weight column).

The user's data is read by one reader, :func:`read_rows`, for every datamodule (:class:`JsonlSource`): a JSONL file
(one JSON object a line), or a local Hugging Face dataset -- a ``save_to_disk`` directory (``Dataset`` or
``DatasetDict``, read with ``datasets.load_from_disk``), a ``.parquet``/``.json``/``.csv``/``.arrow`` file
(``datasets.load_dataset(<format>, data_files=...)``) or a folder of such files (``datasets.load_dataset(<folder>)``).
Nothing is downloaded: a path must exist on disk. A column mapping renames the user's columns to the fields the
datamodule reads (``columns={"prompt": "question"}``). The fields may hold text or, as TRL's conversational
formats, lists of ``{"role", "content"}`` messages (``messages`` stands for ``prompt`` + ``completion``;
preference rows may carry their prompt inside conversational ``chosen``/``rejected``), which the datamodules render
with the tokenizer's chat template (:func:`zoo.data.chat.conversation_as_text`).
"""

from __future__ import annotations

import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from zoo.data.chat import check_messages
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


#: the conversation field of TRL's conversational language-modeling format; it stands for ``prompt`` + ``completion``
CONVERSATION_FIELD = "messages"
#: file suffix -> the ``datasets`` builder that reads it (``datasets.load_dataset(<builder>, data_files=<file>)``)
DATASET_FILE_FORMATS = {".parquet": "parquet", ".json": "json", ".csv": "csv", ".arrow": "arrow"}
#: the zoo's split -> the names of that split in a Hugging Face dataset with several splits, tried in order
HF_SPLIT_NAMES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "val": ("validation", "val", "valid", "dev"),
    "test": ("test",),
}
#: fields that hold text: a CSV file's cells of these columns (after the column mapping) are read as strings, since a
#: CSV has no types (``2`` is the completion "2", not the number)
TEXT_FIELDS = ("prompt", "completion", "chosen", "rejected", "answer", "text")
#: the configuration key of the source's options, named in the messages of bad data
SOURCE_OPTION = "datamodule.source"


def missing_fields(row: Mapping[str, Any] | Collection[str], required_fields: Sequence[str]) -> list[str]:
    """The required fields that a row (or a dataset's list of column names) lacks, by TRL's dataset formats: a
    ``messages`` conversation stands for ``prompt`` and ``completion``; a preference row without ``prompt`` carries
    it in its conversational ``chosen``/``rejected`` (TRL's implicit prompt; given a row, both must be lists)."""
    present = set(row)
    if CONVERSATION_FIELD in present:
        present |= {"prompt", "completion"}
    if {"chosen", "rejected"} <= present and "prompt" not in present:
        values = [row["chosen"], row["rejected"]] if isinstance(row, Mapping) else []
        if all(isinstance(v, list) for v in values):
            present.add("prompt")
    return [name for name in required_fields if name not in present]


def _column_hint(name: str, columns: Mapping[str, str]) -> str:
    """How to point a field at another column (or which mapping named the missing one)."""
    if name in columns:
        return f"{SOURCE_OPTION}.columns.{name}={columns[name]}"
    return f"name the column that holds it with {SOURCE_OPTION}.columns.{name}=<column>"


def check_row(row: Any, required_fields: Sequence[str], where: str, columns: Mapping[str, str] | None = None) -> Row:
    """Check one row (already renamed by the column mapping): a JSON object with every required field, each a string
    or a conversation (a non-empty list of ``{"role", "content"}`` messages, :func:`~zoo.data.chat.check_messages`).

    Raises:
        DataError: naming ``where`` (``file:line`` of a JSONL file, ``dir (split) row i`` of a dataset) and the field;
            for a missing field also the user's column it was mapped from, or the mapping option to set.
    """
    columns = columns or {}
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for name in missing_fields(row, required_fields):
        field = f"'{columns[name]}'" if name in columns else f"'{name}'"
        raise DataError(
            f"{where}: missing field {field} (required: {list(required_fields)}; {_column_hint(name, columns)})"
        )
    checked = [n for n in required_fields if n in row]
    if CONVERSATION_FIELD in row and any(n not in row for n in ("prompt", "completion") if n in required_fields):
        checked.append(CONVERSATION_FIELD)  # the conversation stands in for them
    for name in checked:
        value = row[name]
        if isinstance(value, list):
            check_messages(value, f"{where}: field '{name}'")
        elif not isinstance(value, str) or name == CONVERSATION_FIELD:
            kind = "a list of {role, content} messages" if name == CONVERSATION_FIELD else "a string"
            raise DataError(
                f"{where}: field '{name}' must be {kind}"
                + ("" if name == CONVERSATION_FIELD else " or a list of {role, content} messages")
                + f", got {type(value).__name__}"
            )
    return row


def check_columns(columns: Mapping[str, Any] | None) -> dict[str, str]:
    """The column mapping ``{field: the user's column}`` without its unset (``None``) entries.

    Raises:
        ConfigError: a column name that is not a non-empty string, or one column mapped to two fields.
    """
    mapping: dict[str, str] = {}
    for field, column in dict(columns or {}).items():
        if column is None or column == field:
            continue
        if not isinstance(column, str) or not column:
            raise ConfigError(f"{SOURCE_OPTION}.columns.{field} must be a column name, got {column!r}")
        mapping[str(field)] = column
    seen: dict[str, str] = {}
    for field, column in mapping.items():
        if column in seen:
            raise ConfigError(
                f"{SOURCE_OPTION}.columns: column '{column}' is mapped to both '{seen[column]}' and '{field}'"
            )
        seen[column] = field
    return mapping


def rename_row(row: Any, columns: Mapping[str, str], where: str) -> Any:
    """A row with the user's columns renamed to the fields they are mapped to (``columns``: field -> column)."""
    if not columns or not isinstance(row, dict):
        return row
    out = dict(row)
    for field, column in columns.items():
        if column not in out:
            continue
        if field in out:
            raise DataError(
                f"{where}: has both '{field}' and '{column}', which {SOURCE_OPTION}.columns.{field}={column} renames "
                f"to '{field}'; drop one of them or map '{field}' to another name"
            )
        out[field] = out.pop(column)
    return out


def read_jsonl(path: str | Path, required_fields: Sequence[str], columns: Mapping[str, str] | None = None) -> list[Row]:
    """Read a JSONL file, one JSON object per line; blank lines are skipped (see :func:`iter_jsonl`). Each row is
    renamed by ``columns`` (field -> the file's column) and checked by :func:`check_row`.

    Raises:
        DataError: naming the file, the line number and the field, for a missing file, bytes that are not UTF-8,
            a line that is not a JSON object, a missing required field or a required field that is neither a string
            nor a conversation; naming the file and the option for a mapped column that no row has.
    """
    columns = dict(columns or {})
    rows: list[Row] = []
    found: set[str] = set()
    for line_no, raw in iter_jsonl(path):
        where = f"{path}:{line_no}"
        if isinstance(raw, dict):
            found.update(c for c in columns.values() if c in raw)
        rows.append(check_row(rename_row(raw, columns, where), required_fields, where, columns))
    if not rows:
        raise DataError(f"{path}: no rows")
    for field, column in columns.items():
        if column not in found:
            raise DataError(f"{path}: no row has the column '{column}' ({SOURCE_OPTION}.columns.{field}={column})")
    return rows


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and any((path / name).is_file() for name in ("dataset_dict.json", "state.json"))


def load_hf_dataset(
    path: str | Path,
    split: str = "train",
    split_names: Sequence[str] | None = None,
    cache_dir: str | None = None,
    text_columns: Sequence[str] = (),
) -> Any:
    """One split of a local Hugging Face dataset as a ``datasets.Dataset`` (nothing is downloaded).

    ``path`` is a ``save_to_disk`` directory (``datasets.load_from_disk``), a data file whose suffix is in
    :data:`DATASET_FILE_FORMATS` (``datasets.load_dataset(<format>, data_files=path)``: the file is the split), or a
    folder of data files (``datasets.load_dataset(path)``, splits from the file names as the Hub names them). Of a
    dataset with several splits, the first of ``split_names`` it has is read (default :data:`HF_SPLIT_NAMES` of the
    zoo's ``split``). ``cache_dir``: where ``load_dataset`` keeps its Arrow copy of data files (``None``: the
    ``datasets`` cache, ``HF_DATASETS_CACHE``). ``text_columns``: the columns of a CSV file read as strings.

    Raises:
        DataError: the path does not exist, cannot be read as a dataset, or has none of the split names.
    """
    import datasets  # a core dependency; imported on first use (it takes a second)

    path = Path(path)
    names = tuple(split_names or HF_SPLIT_NAMES.get(split, (split,)))
    if not path.exists():
        raise DataError(f"{path}: data file not found")
    if path.is_dir():
        how = "load_from_disk" if is_saved_dataset(path) else "load_dataset"
    elif path.suffix.lower() in DATASET_FILE_FORMATS:
        how = DATASET_FILE_FORMATS[path.suffix.lower()]
    else:
        raise DataError(f"{path}: not a dataset file; use one of {sorted(DATASET_FILE_FORMATS)}, .jsonl or a directory")
    try:
        if how == "load_from_disk":
            data = datasets.load_from_disk(str(path))
        elif how == "load_dataset":
            data = datasets.load_dataset(str(path), cache_dir=cache_dir)
        else:
            options = {"converters": dict.fromkeys(text_columns, str)} if how == "csv" and text_columns else {}
            data = datasets.load_dataset(how, data_files=str(path), cache_dir=cache_dir, **options)["train"]
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
        raise DataError(f"{path}: cannot be read as a dataset ({how}): {type(err).__name__}: {err}") from None
    if isinstance(data, datasets.DatasetDict):
        name = next((n for n in names if n in data), None)
        if name is None:
            raise DataError(
                f"{path}: no {split} split (looked for {list(names)}; its splits are {list(data)}); "
                f"name it with {SOURCE_OPTION}.splits.{split}=<split>"
            )
        data = data[name]
    return data


def read_rows(
    path: str | Path,
    required_fields: Sequence[str] = (),
    *,
    columns: Mapping[str, str | None] | None = None,
    split: str = "train",
    split_names: Sequence[str] | None = None,
    limit: int | None = None,
    cache_dir: str | None = None,
) -> list[Row]:
    """The rows of one split of the user's data, whatever its format: the one reader of every datamodule.

    A path ending in ``.jsonl`` (or any suffix that is not a dataset format: the zoo's files before it read
    datasets) is read line by line (:func:`read_jsonl`: errors name ``file:line``); a directory or a
    ``.parquet``/``.json``/``.csv``/``.arrow`` file is a Hugging Face dataset (:func:`load_hf_dataset`: its
    columns are checked once, then every row, errors naming the row). Then each row is renamed by ``columns``
    (``{field: the user's column}``; unset entries are ignored) and must have ``required_fields`` (see
    :func:`check_row`; ``messages`` stands for ``prompt`` + ``completion``).

    Args:
        limit: keep the first ``limit`` rows (``None``: all; a logged line says so when it cuts).

    Raises:
        DataError: naming the file, the row (or line) and the field or column, and the mapping option to set.
    """
    path = Path(path)
    mapping = check_columns(columns)
    if not path.exists():
        raise DataError(
            f"{path}: data file not found (a Hugging Face Hub dataset is never downloaded at run time: save it once "
            "with datasets.load_dataset('<hub id>').save_to_disk('<dir>') and pass that directory)"
        )
    if not path.is_dir() and path.suffix.lower() not in DATASET_FILE_FORMATS:
        rows = read_jsonl(path, required_fields, mapping)
        total = len(rows)
    else:
        text = [mapping.get(f, f) for f in dict.fromkeys([*required_fields, *TEXT_FIELDS])]
        data = load_hf_dataset(path, split, split_names, cache_dir, text)
        names = list(data.column_names)
        for field, column in mapping.items():
            if column not in names:
                raise DataError(
                    f"{path}: no column '{column}' ({SOURCE_OPTION}.columns.{field}={column}); its columns are {names}"
                )
            if field in names:
                raise DataError(
                    f"{path}: has both columns '{field}' and '{column}', which {SOURCE_OPTION}.columns.{field}="
                    f"{column} renames to '{field}'; map '{field}' to another name or drop a column"
                )
        renamed = [next((f for f, c in mapping.items() if c == n), n) for n in names]
        missing = missing_fields(renamed, required_fields)
        if missing:
            raise DataError(
                f"{path}: no column '{missing[0]}' (required: {list(required_fields)}; its columns are {names}); "
                f"{_column_hint(missing[0], mapping)}"
            )
        total = len(data)
        if total == 0:
            raise DataError(f"{path}: no rows in its {split} split")
        if limit is not None and total > limit:
            data = data.select(range(limit))
        rows = [
            check_row(rename_row(row, mapping, ""), required_fields, f"{path} ({split} split) row {i}", mapping)
            for i, row in enumerate(data.to_list())
        ]
    if limit is not None and total > limit:
        log.info("%s: using the first %d of %d rows (%s.num_train)", path, limit, total, SOURCE_OPTION)
        rows = rows[:limit]
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
    """Rows from the user's data, one path per split (``test`` falls back to ``val``), read by :func:`read_rows`:
    JSONL files or local Hugging Face datasets (a ``save_to_disk`` directory, ``.parquet``/``.json``/``.csv``/
    ``.arrow`` files, a folder of data files).

    Args:
        train_path, val_path, test_path: the data of each split; the fields each row must have are set by the
            datamodule that reads them (``prompt``/``completion`` for SFT, ``prompt`` for RL, ...). Several paths may
            name one dataset with several splits (a ``DatasetDict`` directory): each reads its own split.
        num_train: use only the first ``num_train`` rows of the train data (``None``: all), as the synthetic sources'
            ``num_train`` does; a method's prompt budget (e.g. DRIFT's collection) then applies to the user's file too.
        columns: ``{field: the user's column}`` -- the column that holds each field the datamodule reads (e.g.
            ``{"prompt": "question", "completion": "response"}``); unset (``None``) entries keep the field's name.
        splits: ``{train|val|test: split name}`` -- the split of a multi-split dataset that each zoo split reads
            (default: ``train``; ``validation``, ``val``, ``valid`` or ``dev``; ``test``, and for a ``test`` that
            falls back to ``val_path`` its ``test`` split when it has one, else the ``val`` split).
        cache_dir: where ``datasets.load_dataset`` keeps the Arrow copy of data files (``None``: the ``datasets``
            cache; the configs use ``${paths.cache_dir}/datasets``).
    """

    def __init__(
        self,
        train_path: str | None = None,
        val_path: str | None = None,
        test_path: str | None = None,
        num_train: int | None = None,
        columns: Mapping[str, str | None] | None = None,
        splits: Mapping[str, str | None] | None = None,
        cache_dir: str | None = None,
    ):
        if num_train is not None and int(num_train) < 1:
            raise ConfigError(f"datamodule.source.num_train must be >= 1 or null, got {num_train}")
        unknown = sorted(set(splits or {}) - set(HF_SPLIT_NAMES))
        if unknown:
            raise ConfigError(f"datamodule.source.splits: unknown split(s) {unknown}; use {list(HF_SPLIT_NAMES)}")
        self.paths = {"train": train_path, "val": val_path, "test": test_path or val_path}
        self.num_train = None if num_train is None else int(num_train)
        self.columns = check_columns(columns)
        self.splits = {k: str(v) for k, v in (splits or {}).items() if v is not None}
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self._test_falls_back = test_path is None
        self._cache: dict[str, list[Row]] = {}

    def split_names(self, split: str) -> tuple[str, ...]:
        """The names of ``split`` in a multi-split dataset, in the order they are tried."""
        if split in self.splits:
            return (self.splits[split],)
        if split == "test" and self._test_falls_back:
            return (*HF_SPLIT_NAMES["test"], *self.split_names("val"))
        return HF_SPLIT_NAMES[split]

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        path = self.paths.get(split)
        if path is None:
            raise DataError(f"no data configured for split '{split}' (set datamodule.source.{split}_path)")
        if split not in self._cache:
            self._cache[split] = read_rows(
                path,
                required_fields,
                columns=self.columns,
                split=split,
                split_names=self.split_names(split),
                limit=self.num_train if split == "train" else None,
                cache_dir=self.cache_dir,
            )
        return self._cache[split]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "jsonl", "paths": self.paths, "num_train": self.num_train}
        if self.columns:  # only when set: the keys of earlier runs stay
            out["columns"] = self.columns
        if self.splits:
            out["splits"] = self.splits
        return out
