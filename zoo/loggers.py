"""Loggers of the zoo: a CSV logger whose metrics file survives a resumed run (``logger=csv``).

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when a run starts in the same directory again, so a
run resumed with ``ckpt_path=last`` lost every row logged before the resume point. :class:`CSVLogger` appends to
the file instead, and can cut it back to the rows logged before a checkpoint (:meth:`CSVLogger.keep_rows`, called by
:class:`zoo.callbacks.RunGuard` when a fit resumes from it): rows logged after that checkpoint by the interrupted
run are logged again by the resumed one, so the file ends up holding every step exactly once.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities.rank_zero import rank_zero_only


def read_rows(fs: Any, path: str) -> tuple[list[str], list[dict[str, str]]]:
    """``(header, rows)`` of a CSV file written by a ``csv.DictWriter`` (``fs``: an fsspec file system)."""
    with fs.open(path, "r", newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _step(row: dict[str, str]) -> float:
    try:
        return float(row.get("step") or "inf")
    except ValueError:
        return float("inf")


class AppendingExperimentWriter(ExperimentWriter):
    """Lightning's experiment writer, except that an existing ``metrics.csv`` is kept and appended to.

    ``rows_logged``: rows written to the file plus rows logged and not yet written.
    """

    def __init__(self, log_dir: str) -> None:
        self.rows_written = 0
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:
        # instead of deleting the metrics of an earlier run in this directory, continue after them
        if self._fs.isfile(self.metrics_file_path):
            header, rows = read_rows(self._fs, self.metrics_file_path)
            self.metrics_keys = sorted(header)
            self.rows_written = len(rows)

    def save(self) -> None:
        pending = len(self.metrics)
        super().save()
        self.rows_written += pending

    @property
    def rows_logged(self) -> int:
        return self.rows_written + len(self.metrics)

    def keep_rows(self, count: int, before_step: int | None = None) -> None:
        """Cut the file back to its first ``count`` rows and, of the rows after them, those logged at a step below
        ``before_step``; rows not yet written are dropped."""
        self.metrics = []
        if not self._fs.isfile(self.metrics_file_path):
            self.rows_written = 0
            return
        header, rows = read_rows(self._fs, self.metrics_file_path)
        later = [r for r in rows[count:] if before_step is not None and _step(r) < before_step]
        kept = rows[:count] + later
        if len(kept) < len(rows):
            with self._fs.open(self.metrics_file_path, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=header)
                writer.writeheader()
                writer.writerows(kept)
        self.rows_written = len(kept)


class CSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger`` (same arguments and files) whose ``metrics.csv`` is appended to when the run
    directory already holds one, as when a run is resumed; see the module docstring."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingExperimentWriter:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment

    @property
    def metrics_file(self) -> str:
        return os.path.join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)

    @property
    def rows_logged(self) -> int:
        """Metric rows of this run directory: in the file, and logged but not yet written."""
        if self._experiment is not None:
            return self._experiment.rows_logged
        return len(read_rows(self._fs, self.metrics_file)[1]) if self._fs.isfile(self.metrics_file) else 0

    @rank_zero_only
    def keep_rows(self, count: int, before_step: int | None = None) -> None:
        """Cut ``metrics.csv`` back to the rows logged before a checkpoint that a run resumes from: its first
        ``count`` rows, and the later ones of steps below ``before_step`` (those the resumed run does not log again)."""
        if self._experiment is not None:
            self._experiment.keep_rows(count, before_step)
            return
        if self._fs.isfile(self.metrics_file):
            AppendingExperimentWriter(log_dir=self.log_dir).keep_rows(count, before_step)


__all__ = ["AppendingExperimentWriter", "CSVLogger"]
