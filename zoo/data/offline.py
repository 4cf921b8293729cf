"""Resumable JSONL output of offline stages (data generation through ``stage=predict``): rows written batch by batch.

Layout: ``<path>`` holds the rows, one JSON object per line; ``<path>.progress`` holds JSON lines, first a header
``{"format": ..., "spec": {...}}`` (what produced the file), then one ``{"batch": b, "rows": n, "end": offset}`` per
completed batch, written after that batch's rows were flushed and synced to disk.

Resuming (the same ``path`` again) reads the progress file, refuses a different ``spec``, cuts the rows file back
to the end of the last completed batch (a batch interrupted while being written, or a truncated last line,
disappears) and reports the completed batch indices, which the stage skips. Regenerating an interrupted batch
with the same seed reproduces it, so a resumed run writes exactly the rows of an uninterrupted one, once each.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zoo.errors import DataError

OFFLINE_FORMAT = "zoo.offline_rows/1"


def _fsync(handle: Any) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _canonical(spec: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(dict(spec), sort_keys=True, default=str))


class ResumableJsonlWriter:
    """Append rows batch by batch to a JSONL file that a later run can resume (see the module docstring).

    Args:
        path: the rows file (its directory is created).
        spec: what produces the rows (e.g. the stage's resolved config); a resumed file must have been written
            with the same spec.

    Use :meth:`open` once (it returns the completed batches), then :meth:`write_batch` per batch.
    """

    def __init__(self, path: str | Path, spec: Mapping[str, Any] | None = None) -> None:
        self.path = Path(path).expanduser()
        self.progress_path = self.path.with_name(self.path.name + ".progress")
        self.spec = _canonical(spec or {})
        self.done: dict[int, int] = {}  # batch index -> rows written
        self._end = 0
        self._opened = False

    @property
    def done_batches(self) -> set[int]:
        """Indices of the batches already on disk."""
        return set(self.done)

    @property
    def num_rows(self) -> int:
        """Rows on disk."""
        return sum(self.done.values())

    def open(self) -> set[int]:
        """Create the files, or resume them; returns the completed batch indices.

        Raises:
            DataError: the progress file belongs to another spec or another format, or the rows file is shorter
                than its recorded progress (edited or truncated by hand).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.progress_path.is_file():
            self.path.write_bytes(b"")
            with self.progress_path.open("w", encoding="utf-8") as handle:
                handle.write(json.dumps({"format": OFFLINE_FORMAT, "spec": self.spec}, sort_keys=True) + "\n")
                _fsync(handle)
            self._opened = True
            return set()
        self._resume()
        self._opened = True
        return self.done_batches

    def _resume(self) -> None:
        lines = self.progress_path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if not isinstance(header, dict) or header.get("format") != OFFLINE_FORMAT:
            raise DataError(f"{self.progress_path}: not a progress file of {OFFLINE_FORMAT}; remove it to start over")
        if header.get("spec") != self.spec:
            old, new = header.get("spec") or {}, self.spec
            keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise DataError(
                f"{self.path} was written by another configuration (differs in {keys}); resume with the same "
                "configuration, or write to another path"
            )
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                break  # a progress line cut by an interruption: its batch counts as not written
            self.done[int(entry["batch"])] = int(entry["rows"])
            self._end = int(entry["end"])
        size = self.path.stat().st_size if self.path.is_file() else 0
        if size < self._end:
            raise DataError(
                f"{self.path} has {size} bytes but its progress file records {self._end}; the rows file was "
                "truncated or edited: remove both files to start over"
            )
        if size > self._end:  # an interrupted batch (or a truncated last line): regenerated on resume
            with self.path.open("r+b") as handle:
                handle.truncate(self._end)
                _fsync(handle)

    def write_batch(self, batch: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append the rows of batch ``batch`` (a no-op when that batch is already on disk)."""
        if not self._opened:
            raise RuntimeError("call open() before write_batch()")
        if batch in self.done:
            return
        data = "".join(json.dumps(dict(row), ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
        with self.path.open("ab") as handle:
            handle.write(data)
            _fsync(handle)
        self._end += len(data)
        self.done[batch] = len(rows)
        with self.progress_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"batch": batch, "rows": len(rows), "end": self._end}) + "\n")
            _fsync(handle)


__all__ = ["OFFLINE_FORMAT", "ResumableJsonlWriter"]
