"""One cache for everything that is trained once and reused (base policies, reward models, encoders, teachers, ...).

:func:`ensure` is the only way such a prerequisite is made:

* **key**: the SHA-256 of the canonical JSON of ``spec`` (for artifacts trained by the app: the composed config of
  the build run, see :func:`zoo.cli.artifacts.train_artifact`); the artifact lives at
  ``<cache_dir>/<kind>/<readable name>-<key>/``;
* **one builder**: an inter-process file lock (``filelock``) per key, so that concurrent callers (several ranks, a
  multirun, two terminals) build it once and the others wait, then use it;
* **atomic**: the builder writes into a temporary sibling directory (``<name>-<key>.tmp-<pid>-<random>``) that is
  renamed onto the final path with :func:`os.replace` only when the build succeeded, so a half-written artifact is
  never visible. A build that raises removes its temporary directory; one that was killed (``SIGKILL``, power loss)
  leaves it behind, and the next call for the same kind (cached or not) removes it: a temporary directory whose key
  lock is free belongs to a dead build;
* **logged**: one warning says what is built, why and where (a build may take long); one line says which cached
  artifact is used.

A finished artifact holds ``artifact.json`` (kind, name, key, reason, build time, the spec and what the builder
returned); its presence marks the directory as complete.

Every artifact :func:`ensure` returns is noted in this process (:func:`artifacts_used`), so that a run can record which
prerequisites it used (``run_info.json`` -> ``artifacts``: kind, path, key, whether it was built now, its metrics).

**Prerequisites declared by configs.** A config node whose ``_target_`` is marked with :func:`prerequisite` (a
*plan*: a generator function) declares what the run needs before it starts; the CLI (``zoo.cli.prerequisites``)
builds it before the job and puts the plan's return value (a path, or a config node) in the node's place. A plan
yields :class:`Prerequisite` requests -- runs of the app described as data -- and receives each built
artifact's directory back; code below the CLI never runs the app itself.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from zoo.errors import ConfigError

log = logging.getLogger("zoo")

ARTIFACT_META = "artifact.json"
TMP_MARK = ".tmp-"
LOCK_DIR = ".locks"
KEY_LENGTH = 16
Builder = Callable[[Path], "Mapping[str, Any] | None"]
_USED: list[dict[str, Any]] = []


def default_cache_dir() -> Path:
    """``$ZOO_CACHE_DIR`` or ``./.zoo_cache`` (what ``paths.cache_dir`` resolves to when run from the current dir)."""
    return Path(os.environ.get("ZOO_CACHE_DIR", ".zoo_cache")).expanduser().resolve()


def spec_key(spec: Mapping[str, Any]) -> str:
    """The cache key of a spec: SHA-256 (first 16 hex digits) of its canonical JSON (sorted keys)."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:KEY_LENGTH]


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:64]


def artifact_path(kind: str, spec: Mapping[str, Any], cache_dir: str | Path | None = None, name: str = "") -> Path:
    """Where the artifact of ``kind`` built from ``spec`` lives (whether or not it exists yet)."""
    if not kind or _safe_name(kind) != kind:
        raise ConfigError(f"artifact kind {kind!r} must be a plain name (letters, digits, '_', '-', '.')")
    root = Path(cache_dir).expanduser().resolve() if cache_dir is not None else default_cache_dir()
    key = spec_key(spec)
    stem = f"{_safe_name(name)}-{key}" if _safe_name(name) else key
    return root / kind / stem


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` is a finished artifact (it holds ``artifact.json``)."""
    return (Path(path) / ARTIFACT_META).is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    """The ``artifact.json`` of a finished artifact."""
    return json.loads((Path(path) / ARTIFACT_META).read_text())


def _lock(kind_dir: Path, stem: str, timeout: float = -1) -> FileLock:
    (kind_dir / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    return FileLock(str(kind_dir / LOCK_DIR / f"{stem}.lock"), timeout=timeout)


def temporaries(kind_dir: Path) -> Iterator[Path]:
    """Temporary build directories under ``<cache_dir>/<kind>`` (live or left by dead builds)."""
    if kind_dir.is_dir():
        yield from (p for p in kind_dir.iterdir() if TMP_MARK in p.name)


def remove_stale_temporaries(kind_dir: Path, held_stem: str | None = None) -> list[Path]:
    """Remove the temporary directories of dead builds of one kind; returns what was removed.

    A temporary directory belongs to the build that holds its key's lock; when that lock can be taken at once (or is
    ``held_stem``, the key this process holds), no live build owns it.
    """
    removed = []
    for tmp in list(temporaries(kind_dir)):
        stem = tmp.name.split(TMP_MARK, 1)[0]
        if stem == held_stem:
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
            continue
        lock = _lock(kind_dir, stem, timeout=0)
        try:
            with lock:
                shutil.rmtree(tmp, ignore_errors=True)
                removed.append(tmp)
        except Timeout:
            continue  # a live build owns it
    for tmp in removed:
        log.info("removed %s, left by an interrupted build", tmp)
    return removed


def _note_use(target: Path, built: bool) -> Path:
    meta = read_meta(target)
    _USED.append(
        {
            "kind": meta.get("kind"),
            "name": meta.get("name"),
            "key": meta.get("key"),
            "path": str(target),
            "built_now": built,
            "metrics": meta.get("metrics"),
        }
    )
    return target


def artifacts_used(since: int = 0) -> list[dict[str, Any]]:
    """The artifacts :func:`ensure` returned in this process (from the ``since``-th on; one entry per path, first use
    first): ``kind``, ``name``, ``key``, ``path``, ``built_now`` and the build's ``metrics``."""
    seen: dict[str, dict[str, Any]] = {}
    for entry in _USED[since:]:
        if entry["path"] in seen:
            seen[entry["path"]]["built_now"] |= entry["built_now"]
        else:
            seen[entry["path"]] = dict(entry)
    return list(seen.values())


def artifacts_mark() -> int:
    """A position in the record of used artifacts (pass it to :func:`artifacts_used` later)."""
    return len(_USED)


def ensure(
    kind: str,
    spec: Mapping[str, Any],
    build: Builder,
    cache_dir: str | Path | None = None,
    *,
    name: str = "",
    reason: str = "first use",
) -> Path:
    """Return the directory of the artifact ``kind`` built from ``spec``, building it first if it is not cached.

    Args:
        kind: what it is (``base_policy``, ``structure_encoder``, ...): the cache sub-folder.
        spec: everything that determines the artifact (JSON-able; hashed into the key).
        build: ``build(directory)`` writes the artifact into the (empty, temporary) ``directory``; it may return a
            mapping stored in ``artifact.json`` (e.g. final metrics).
        cache_dir: cache root (default :func:`default_cache_dir`).
        name: readable prefix of the directory name (e.g. the task).
        reason: why the artifact is needed (logged when it is built).
    """
    target = artifact_path(kind, spec, cache_dir, name)
    kind_dir = target.parent
    if is_complete(target):
        remove_stale_temporaries(kind_dir)
        log.info("using the cached %s artifact at %s", kind, target)
        return _note_use(target, built=False)
    try:
        kind_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"cannot write the artifact cache at {kind_dir} ({err.strerror}); set paths.cache_dir (or ZOO_CACHE_DIR) "
            "to a writable directory"
        ) from None
    with _lock(kind_dir, target.name):
        remove_stale_temporaries(kind_dir, held_stem=target.name)
        if is_complete(target):  # another process built it while this one waited for the lock
            log.info("using the cached %s artifact at %s (built by another process)", kind, target)
            return _note_use(target, built=False)
        if target.exists():  # not an artifact of this cache (no artifact.json): replace it
            shutil.rmtree(target)
        tmp = kind_dir / f"{target.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        log.warning(
            "building the %s artifact '%s': %s, and none is cached for this config (key %s); it is written to %s and "
            "moved to %s when complete",
            kind,
            name or kind,
            reason,
            spec_key(spec),
            tmp,
            target,
        )
        start = time.monotonic()
        tmp.mkdir()
        try:
            extra = build(tmp) or {}
            meta = {
                "kind": kind,
                "name": name,
                "key": spec_key(spec),
                "reason": reason,
                "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "build_seconds": round(time.monotonic() - start, 1),
                **dict(extra),
                "spec": dict(spec),
            }
            (tmp / ARTIFACT_META).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("built the %s artifact '%s' in %.0fs: %s", kind, name or kind, time.monotonic() - start, target)
    return _note_use(target, built=True)


@dataclass(frozen=True)
class Prerequisite:
    """A run of the app (``python train.py <overrides>``) whose product is cached and reused: a request that a plan
    yields (see :func:`prerequisite`); the CLI builds it through :func:`ensure`, keyed by the run's composed config.

    Attributes:
        kind: cache sub-folder (``base_policy``, ``nmars_policy``, ``valr_teacher``, ...).
        overrides: command-line overrides of the build run (``+method=nmars_sft``, ...).
        values: dotted key -> value set on the composed config (whole nodes, e.g. the parent run's ``task``).
        name: readable prefix of the artifact directory.
        reason: why it is needed (logged when it is built).
        product: what the run writes that consumers use, relative to its output directory (``export``).
        cache_dir, root_dir: the parent run's ``paths.cache_dir`` / ``paths.root_dir`` (``None``: the defaults).
        execution: where it runs, not what it builds (``{"trainer.accelerator": "gpu"}``): not part of the key.
    """

    kind: str
    overrides: Sequence[str] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""
    reason: str = "first use"
    product: str = "export"
    cache_dir: str | Path | None = None
    root_dir: str | Path | None = None
    execution: Mapping[str, Any] = field(default_factory=dict)


# A plan: yields the runs it needs, receives each artifact's directory, returns what replaces its config node.
Plan = Generator[Prerequisite, Path, Any]
PLAN_ATTRIBUTE = "__zoo_prerequisite__"


def prerequisite(plan: Callable[..., Plan]) -> Callable[..., Plan]:
    """Mark a generator function as a prerequisite plan: a config node with it as ``_target_`` is built by the CLI
    before the job (``zoo.cli.prerequisites.prepare``), and the plan's return value takes the node's place.

    Example::

        @prerequisite
        def teacher(steps: int = 400) -> Plan:
            directory = yield Prerequisite("valr_teacher", ["+method=valr_teacher"], {"trainer.max_steps": steps})
            return str(directory / "export")
    """
    setattr(plan, PLAN_ATTRIBUTE, plan)
    return plan


def plan_of(target: Any) -> Callable[..., Plan] | None:
    """The plan behind a ``_target_`` object (``None`` when it is not a prerequisite)."""
    return getattr(target, PLAN_ATTRIBUTE, None)


def model_fingerprint(model: torch.nn.Module, sample: int = 4096) -> str:
    """A content key of a model's weights, for specs of artifacts fitted on a model (probes, head rankings, ...).

    SHA-256 (first 16 hex digits) over every parameter and buffer, sorted by name: its name, shape and dtype, the
    float64 sum and sum of squares of its values, and up to ``sample`` evenly strided values. Any training step or
    reload of other weights changes it; it reads each tensor once (cheap next to a forward pass over a data set).
    """
    digest = hashlib.sha256()
    tensors = sorted({**dict(model.named_parameters()), **dict(model.named_buffers())}.items())
    for name, tensor in tensors:
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // sample)
        picked = flat[::step][:sample].float().cpu()
        moments = (float(flat.double().sum()), float(flat.double().pow(2).sum())) if flat.numel() else (0.0, 0.0)
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|{moments[0]!r}|{moments[1]!r}|".encode())
        digest.update(picked.numpy().tobytes())
    return digest.hexdigest()[:KEY_LENGTH]


__all__ = [
    "ARTIFACT_META",
    "PLAN_ATTRIBUTE",
    "Plan",
    "Prerequisite",
    "artifact_path",
    "artifacts_mark",
    "artifacts_used",
    "default_cache_dir",
    "ensure",
    "is_complete",
    "model_fingerprint",
    "plan_of",
    "prerequisite",
    "read_meta",
    "remove_stale_temporaries",
    "spec_key",
    "temporaries",
]
