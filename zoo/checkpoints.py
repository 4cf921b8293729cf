"""Checkpoint files: read one with a single clear error, and find non-finite values before one is written.

Plain torch (no Lightning): :func:`read_checkpoint` is how the zoo opens a ``.ckpt`` it was given (``ckpt_path``,
``backbone.init_from``), always with ``weights_only=True``; :func:`nonfinite_tensors` is what the run guard
(:class:`zoo.callbacks.RunGuard`) checks a checkpoint with before it is written, so that ``last.ckpt`` is always one
that a run can resume from, and :func:`all_finite` is its check of the gradients before every optimizer step.
:func:`atomic_save` writes a checkpoint so that its path holds either the previous file or the complete new one (what
the run guard's :class:`zoo.callbacks.run_guard.AtomicCheckpointIO` writes every Lightning checkpoint with).
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from zoo.errors import CheckpointError, CheckpointNotFoundError, DiskFullError

# torch.load's complaint when a weights_only load meets an object that is not a tensor or a plain container
_REFUSED = "Weights only load failed"
_NOT_ZIP = "mmap can only be used with files saved with"


def nonfinite_tensors(tree: Any, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in ``tree`` (nested dicts, lists, tuples) that hold a NaN or an
    infinity, in traversal order. ``tree`` is e.g. a Lightning checkpoint dict (``state_dict``,
    ``optimizer_states``, ...) or a module's ``named_parameters()`` turned into a dict."""
    found: list[str] = []
    if isinstance(tree, torch.Tensor):
        if (tree.is_floating_point() or tree.is_complex()) and tree.numel() and not torch.isfinite(tree).all():
            found.append(prefix or "<tensor>")
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            found.extend(nonfinite_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(tree, Sequence) and not isinstance(tree, (str, bytes)):
        for index, value in enumerate(tree):
            found.extend(nonfinite_tensors(value, f"{prefix}.{index}" if prefix else str(index)))
    return found


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor in ``tensors`` (e.g. the gradients of an optimizer step) holds finite values only.

    One fused pass: the L2 norm of each tensor, accumulated in float32 (``torch._foreach_norm``; half-precision
    tensors are not copied), stacked and tested with a single host synchronisation. A NaN or an infinity anywhere
    makes its tensor's norm non-finite. Sparse tensors are checked through their stored values. All tensors must be
    on one device. An empty sequence is finite.
    """
    if not tensors:
        return True
    dense = [t.detach().coalesce().values() if t.is_sparse else t.detach() for t in tensors]
    norms = torch._foreach_norm(dense, 2.0, dtype=torch.float32)
    return bool(torch.isfinite(torch.stack(norms)).all())


def read_checkpoint(path: str | Path, what: str = "ckpt_path", mmap: bool = True) -> dict[str, Any]:
    """Load a checkpoint on the CPU with ``weights_only=True``, or raise one error naming the file.

    Args:
        path: the ``.ckpt`` (or any ``torch.save`` file).
        what: the option it came from, for the message (``ckpt_path``, ``backbone.init_from``).
        mmap: map the tensors instead of reading them (cheap check of a large file; needs the zip format that
            ``torch.save`` has written since torch 1.6, else the file is read whole).

    Raises:
        CheckpointNotFoundError: no file at ``path``.
        CheckpointError: the file is truncated, corrupt, not a checkpoint, or holds objects that a
            ``weights_only`` load refuses (a pickled class: possibly code that would run on load).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointNotFoundError(f"{what}: no checkpoint file at {path.resolve()}")
    try:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as err:
            if not (mmap and _NOT_ZIP in str(err)):
                raise
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if _REFUSED in str(err):
            raise CheckpointError(
                f"{what}: refused to load {path.resolve()}: it holds Python objects other than tensors and plain "
                "containers, which torch.load(weights_only=True) does not unpickle (loading them could run code). "
                "Use a checkpoint written by this zoo, or an export directory (save_pretrained)"
            ) from None
        raise CheckpointError(_invalid(path, what, err)) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, OSError, AttributeError, KeyError) as err:
        raise CheckpointError(_invalid(path, what, err)) from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{what}: {path.resolve()} holds a {type(checkpoint).__name__}, not a checkpoint dict (a Lightning .ckpt)"
        )
    return checkpoint


def _invalid(path: Path, what: str, err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    detail = f"{type(err).__name__}: {text.split('. ')[0][:160]}" if text else type(err).__name__
    return (
        f"{what}: {path.resolve()} is not a valid checkpoint ({detail}); the file may be truncated or corrupt (an "
        f"interrupted write or copy: it is {path.stat().st_size} bytes). Use another checkpoint, e.g. the previous "
        "one of the run, or start the run again"
    )


# errors of a write that found its device (or the user's quota) full
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _remove_stale_temps(path: Path) -> None:
    """Remove the temporary files that :func:`atomic_save` calls of ``path`` killed mid-write left (their process is
    gone); a temporary file of a process that still runs is left alone."""
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        pid = leftover.name[len(path.name) + 2 :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            leftover.unlink(missing_ok=True)
        except OSError:  # it exists but belongs to someone else
            pass


def _fsync_directory(directory: Path) -> None:
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # some filesystems cannot sync a directory; the rename is done either way
        pass
    finally:
        os.close(handle)


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` such that ``path`` holds either its previous content or the complete new file.

    The file is written to a temporary file **in the target's own directory** (``.<name>.<pid>.<random>.tmp``),
    flushed and ``fsync``-ed, then renamed over ``path`` with :func:`os.replace` (atomic on POSIX within one
    filesystem) and the directory is synced. A temporary file elsewhere (``$TMPDIR``, as ``fsspec`` and so Lightning's
    ``_atomic_save`` use) cannot be renamed across filesystems (``EXDEV``) and falls back to truncating ``path`` and
    copying into it: a kill during that copy left an empty or partial checkpoint and no previous one. A process
    killed while writing leaves only its temporary file, which the next save of ``path`` removes.

    Raises:
        DiskFullError: the device (or the quota) ran out of space (``ENOSPC``/``EDQUOT``) while writing; the
            temporary file is removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    written = 0
    try:
        with os.fdopen(handle, "wb") as stream:
            try:
                torch.save(obj, stream)
                stream.flush()
                os.fsync(stream.fileno())
            finally:
                written = stream.tell()
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(temp, 0o666 & ~mask)  # mkstemp creates 0600; a checkpoint gets the permissions of a new file
        os.replace(temp, path)
    except BaseException as err:
        Path(temp).unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in _FULL:
            free = shutil.disk_usage(path.parent).free
            kept = f"the previous {path.name} is kept as it was" if path.exists() else f"no {path.name} exists yet"
            raise DiskFullError(
                f"no space left on the device of {path.parent} ({os.strerror(err.errno)}): writing {path.name} "
                f"stopped after {written:,} bytes ({free:,} bytes free there), so it was not written and {kept}. "
                "Free some space there, or set paths.log_dir (or ZOO_LOG_DIR) to a disk with room"
            ) from None
        raise
    _fsync_directory(path.parent)


__all__ = ["all_finite", "atomic_save", "nonfinite_tensors", "read_checkpoint"]
