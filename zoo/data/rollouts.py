"""Offline multi-turn rollout files: the JSONL format, a resumable writer, the reader and the training row source.

A rollout file is written once by ``python train.py +method=drift_rollouts`` (a reference policy's episodes of
:class:`~zoo.data.feedback.FeedbackEnvironment`, :class:`~zoo.modules.MultiTurnRolloutModule`; rows made by
:func:`zoo.data.multiturn.episode_row`) and read by any offline method (DRIFT and its baselines:
:class:`RolloutSource`).
One JSON object per line, one line per trajectory:

============== =========================================================================================================
field          meaning
============== =========================================================================================================
prompt_id      ``str``: the prompt; the trajectories of one prompt form a group (DRIFT normalises weights per group)
index          ``int``: the trajectory's index within its group (``0 .. n_traj - 1``)
messages       the whole conversation, ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``: the initial
               messages, then assistant turns and feedback, ending with the last assistant turn
answer         ``str``: the reference answer
turn_rewards   ``[float]``: the reward ``r_t`` of every assistant turn taken (``len`` = number of turns)
answers        ``[str | null]``: the normalised extracted answer of every turn (``null``: malformed)
t_star         ``int | null``: the first successful turn (1-based), ``null`` if the episode failed
format_penalty ``float``: sum of the format penalties of the malformed turns (``<= 0``)
repeat_penalty ``float``: ``lambda (1 - #unique answers / #answers)``
return         ``float``: ``sum_t gamma^(t-1) r_t + format_penalty - repeat_penalty`` with the collection's ``gamma``
gamma          ``float``: the ``gamma`` of ``return``
out_of_context ``bool``: the episode ended early because its next turn would not fit in the model's positions
============== =========================================================================================================

Required when reading: :data:`REQUIRED_FIELDS`. Next to the file, ``<file>.meta.json`` records what produced it
(the environment, the reference model, the sampling, ``n_traj``); a collection resumed with other settings is refused.

Writes are atomic per batch of prompts (one ``write`` of whole lines, flushed and synced). A killed collection can
leave a truncated last line and prompts with part of their trajectories; :class:`RolloutWriter` repairs both when it
is opened again (it drops the partial line and the incomplete groups, then the collection regenerates them), and
:func:`read_rollouts` refuses a file whose last line is truncated (it never silently reads one).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zoo.data.chat import check_messages
from zoo.data.sources import Row, RowSource
from zoo.errors import ConfigError, DataError

log = logging.getLogger("zoo")

FORMAT = "zoo.rollouts/1"
REQUIRED_FIELDS: tuple[str, ...] = (
    "prompt_id",
    "messages",
    "turn_rewards",
    "t_star",
    "format_penalty",
    "repeat_penalty",
    "return",
)
Weighting = Callable[[Sequence[Row]], Sequence[float]]


def meta_path(path: str | Path) -> Path:
    """The sidecar ``<file>.meta.json`` of a rollout file."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_rollout(row: Any, where: str) -> Row:
    """Check one rollout row against the format (see the module docstring); returns it.

    Raises:
        DataError: naming ``where`` (``file:line``) and the field.
    """
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [name for name in REQUIRED_FIELDS if name not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing} (a rollout row needs {list(REQUIRED_FIELDS)})")
    if not isinstance(row["prompt_id"], (str, int)) or isinstance(row["prompt_id"], bool) or row["prompt_id"] == "":
        raise DataError(f"{where}: field 'prompt_id' must be a non-empty string, got {row['prompt_id']!r}")
    messages = check_messages(row["messages"], where)
    if messages[-1]["role"] != "assistant":
        raise DataError(f"{where}: field 'messages' must end with an assistant turn (the one that is trained)")
    rewards = row["turn_rewards"]
    if not isinstance(rewards, list) or not rewards or not all(_finite(r) for r in rewards):
        raise DataError(f"{where}: field 'turn_rewards' must be a non-empty list of finite numbers, got {rewards!r}")
    t_star = row["t_star"]
    if t_star is not None and (not isinstance(t_star, int) or isinstance(t_star, bool) or t_star < 1):
        raise DataError(f"{where}: field 't_star' must be a turn number >= 1 or null, got {t_star!r}")
    for name in ("format_penalty", "repeat_penalty", "return"):
        if not _finite(row[name]):
            raise DataError(f"{where}: field '{name}' must be a finite number, got {row[name]!r}")
    return row


def _lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the non-blank lines; a last line without its newline is an error."""
    if not path.is_file():
        raise DataError(f"{path}: rollout file not found (collect one with python train.py +method=drift_rollouts)")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if lines and lines[-1].strip():
        raise DataError(
            f"{path}:{len(lines)}: truncated last line (no newline; an interrupted collection?). Resume the "
            "collection with the same command to repair it, or delete the line"
        )
    return [(i, line) for i, line in enumerate(lines, start=1) if line.strip()]


def read_rollouts(path: str | Path) -> list[Row]:
    """Read and validate a rollout file; each row gets ``_line`` (its line number, for error messages).

    Raises:
        DataError: naming the file and line, for a missing file, invalid JSON, a truncated last line, a row that does
            not follow the format, a repeated ``(prompt_id, index)``, or an empty file.
    """
    path = Path(path)
    rows, seen = [], {}
    for line_no, line in _lines(path):
        where = f"{path}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        row = validate_rollout(row, where)
        key = (str(row["prompt_id"]), row.get("index"))
        if row.get("index") is not None and key in seen:
            raise DataError(f"{where}: trajectory {key} already at line {seen[key]} (duplicated rows)")
        seen[key] = line_no
        rows.append({**row, "prompt_id": str(row["prompt_id"]), "_line": line_no})
    if not rows:
        raise DataError(f"{path}: no rollout rows")
    return rows


class RolloutWriter:
    """Appends trajectories to a rollout file, resumably.

    Opening repairs what an interrupted collection left (a truncated last line; the rows of prompts with fewer than
    ``group_size`` trajectories) and records which prompts are complete (:meth:`is_done`); the collection then skips
    those and regenerates the others. :meth:`write` appends whole lines in one ``write``, flushed and synced.

    Args:
        path: the JSONL file (created with its folder).
        group_size: trajectories per prompt.
        spec: what produces the rows (JSON-able); stored in ``<file>.meta.json`` and compared on resume.

    Raises:
        ConfigError: resuming a file written with another ``spec`` (the message lists the differing keys).
        DataError: a file that is not a rollout file (invalid line in the middle, a group larger than ``group_size``).
    """

    def __init__(self, path: str | Path, group_size: int, spec: dict[str, Any]) -> None:
        if group_size < 1:
            raise ConfigError(f"group_size must be >= 1, got {group_size}")
        self.path = Path(path)
        self.group_size = group_size
        self.spec = json.loads(json.dumps(spec, default=str))
        self.done: set[str] = set()
        self.repaired: dict[str, int] = {}
        self._handle = None

    # -- open / repair ---------------------------------------------------------------------------------------------
    def open(self) -> RolloutWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._check_meta()
        if self.path.exists():
            self._repair()
        self._handle = self.path.open("a", encoding="utf-8")
        return self

    def _check_meta(self) -> None:
        meta = meta_path(self.path)
        if meta.is_file():
            stored = json.loads(meta.read_text()).get("spec")
            if stored != self.spec:
                keys = sorted(
                    k for k in set(stored or {}) | set(self.spec) if (stored or {}).get(k) != self.spec.get(k)
                )
                raise ConfigError(
                    f"{self.path} was collected with other settings (differing: {keys}); resume with the same "
                    "settings, or write to another file (module.output)"
                )
        elif self.path.exists() and self.path.stat().st_size > 0:
            raise ConfigError(f"{self.path} exists but has no {meta.name}: it is not a resumable rollout file")
        else:
            meta.write_text(json.dumps({"format": FORMAT, "spec": self.spec}, indent=2))

    def _repair(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):
            log.warning(
                "%s: removed a truncated last line (%d bytes) left by an interrupted collection",
                self.path,
                len(data) - cut,
            )
            self.repaired["truncated_bytes"] = len(data) - cut
        lines = [line for line in data[:cut].decode("utf-8").split("\n") if line.strip()]
        groups: dict[str, list[str]] = {}
        for line_no, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{self.path}:{line_no}: not valid JSON ({err.msg}); not a resumable rollout file"
                ) from None
            groups.setdefault(str(row.get("prompt_id")), []).append(line)
        too_many = [p for p, g in groups.items() if len(g) > self.group_size]
        if too_many:
            raise DataError(
                f"{self.path}: prompt(s) {too_many[:3]} have more than {self.group_size} trajectories (duplicated rows)"
            )
        incomplete = {p for p, g in groups.items() if len(g) < self.group_size}
        if incomplete:
            log.warning(
                "%s: dropped the rows of %d prompt(s) with incomplete groups (an interrupted collection); they are "
                "collected again",
                self.path,
                len(incomplete),
            )
            self.repaired["incomplete_prompts"] = len(incomplete)
        if cut < len(data) or incomplete:
            kept = [line for line in lines if str(json.loads(line).get("prompt_id")) not in incomplete]
            tmp = self.path.with_name(self.path.name + f".tmp{os.getpid()}")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            os.replace(tmp, self.path)
        self.done = {p for p, g in groups.items() if len(g) == self.group_size}

    # -- writing ---------------------------------------------------------------------------------------------------
    def is_done(self, prompt_id: str) -> bool:
        """Whether the file already has the whole group of ``prompt_id``."""
        return str(prompt_id) in self.done

    @property
    def trajectories(self) -> int:
        """Trajectories in the file (complete groups)."""
        return len(self.done) * self.group_size

    def write(self, rows: Sequence[Row]) -> None:
        """Append whole groups (every prompt's ``group_size`` rows) in one write, flushed and synced."""
        if self._handle is None:
            raise RuntimeError("RolloutWriter.write() before open()")
        counts = Counter(str(r["prompt_id"]) for r in rows)
        partial = {p: n for p, n in counts.items() if n != self.group_size}
        if partial:
            raise ValueError(f"write whole groups of {self.group_size} rows; got {partial}")
        again = sorted(set(counts) & self.done)
        if again:
            raise ValueError(f"prompts {again[:3]} are already in {self.path}")
        self._handle.write("".join(json.dumps(r) + "\n" for r in rows))
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.done |= set(counts)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> RolloutWriter:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RolloutSource(RowSource):
    """Training rows from a rollout file, weighted; validation/test rows from another source.

    The ``train`` split is the file's trajectories (:func:`read_rollouts`), each with ``loss_weight`` given by
    ``weighting`` (e.g. :class:`zoo.rl.drift.DriftWeighting`); rows weighted exactly 0 are left out. ``val``/``test``
    come from ``held_out`` (e.g. the task's :class:`~zoo.data.sources.TaskSource`: held-out problems for the
    multi-turn evaluation).

    Args:
        path: the rollout file; ``None``: the file ``collect()`` returns.
        weighting: ``rows -> weights``; ``None``: weight 1. Its ``min_group_size`` (default 1) is checked per prompt.
        held_out: source of the ``val`` and ``test`` splits.
        collect: the file to use when ``path`` is ``None`` (e.g. the reference policy's rollouts, built by the CLI
            through the artifact cache before the job: :func:`zoo.cli.rollouts.reference_rollouts`), or a callable
            returning it (called once, when the training rows are first needed).

    Raises:
        DataError: naming the file and line (see :func:`read_rollouts`), a prompt with fewer trajectories than the
            weighting needs, or no row left after weighting.
    """

    def __init__(
        self,
        path: str | None = None,
        weighting: Weighting | None = None,
        held_out: RowSource | None = None,
        collect: Callable[[], str] | str | None = None,
    ) -> None:
        if not path and isinstance(collect, (str, Path)):
            path = collect
        if not path and collect is None:
            raise ConfigError(
                "datamodule.source.path: give a rollout file (collected with python train.py +method=drift_rollouts)"
            )
        self.path = str(path) if path else None
        self.weighting = weighting
        self.held_out = held_out
        self.collect = collect
        self._train: list[Row] | None = None

    def train_rows(self) -> list[Row]:
        """The weighted training rows (read once)."""
        if self._train is None:
            if self.path is None:
                self.path = str(self.collect())
            rows = read_rollouts(self.path)
            minimum = int(getattr(self.weighting, "min_group_size", 1))
            sizes = Counter(r["prompt_id"] for r in rows)
            for row in rows:
                if sizes[row["prompt_id"]] < minimum:
                    raise DataError(
                        f"{self.path}:{row['_line']}: prompt_id {row['prompt_id']!r} has {sizes[row['prompt_id']]} "
                        f"trajectory; {type(self.weighting).__name__} normalises weights per prompt and needs at least "
                        f"{minimum} (collect with module.n_traj >= {minimum})"
                    )
            weights = [1.0] * len(rows) if self.weighting is None else list(self.weighting(rows))
            kept = [{**row, "loss_weight": float(w)} for row, w in zip(rows, weights) if w != 0.0]
            if not kept:
                raise DataError(f"{self.path}: no trajectory left after weighting ({self.describe()['weighting']})")
            if len(kept) < len(rows):
                log.info(
                    "%s: %d of %d trajectories have weight 0 and are left out",
                    self.path,
                    len(rows) - len(kept),
                    len(rows),
                )
            self._train = kept
        return self._train

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        if split == "train":
            return self.train_rows()
        if self.held_out is None:
            raise DataError(f"no rows for split '{split}': set datamodule.source.held_out (e.g. the task's prompts)")
        return self.held_out.rows(split, required_fields)

    def describe(self) -> dict[str, Any]:
        weighting = self.weighting.describe() if hasattr(self.weighting, "describe") else repr(self.weighting)
        held = self.held_out.describe() if self.held_out is not None else None
        return {"kind": "rollouts", "path": self.path, "weighting": weighting, "held_out": held}


__all__ = [
    "FORMAT",
    "REQUIRED_FIELDS",
    "RolloutSource",
    "RolloutWriter",
    "meta_path",
    "read_rollouts",
    "validate_rollout",
]
