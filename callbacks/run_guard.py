"""Keep every checkpoint of a run resumable and every interruption recoverable (``callbacks.run_guard``).

:class:`RunGuard` is part of the default callbacks of ``train.py``; it works in any Lightning project.

* **Non-finite values never reach a checkpoint.** Before a checkpoint is written, its tensors (weights and optimizer
  state) are checked with :func:`zoo.checkpoints.nonfinite_tensors`; a checkpoint holding a NaN or an infinity is not
  written and training stops with :class:`~zoo.errors.NaNLossError` naming the step and the first bad tensor, so
  ``last.ckpt`` keeps the last good state. Before every optimizer step the gradients are checked as well
  (``check_gradients``), so a non-finite gradient stops training before it reaches the weights (skipped under a
  gradient scaler, which skips such steps itself).
* **An interrupted run keeps its state.** SIGINT (Ctrl+C) and SIGTERM (``kill``, a scheduler's preemption) during
  training let the current step finish, write ``last.ckpt`` (in the ``ModelCheckpoint`` folder) at its end -- the
  state ``ModelCheckpoint`` itself saves every ``every_n_train_steps`` -- and stop before the next step with
  :class:`~zoo.errors.RunInterrupted` (``train.py`` exits with status 128 + the signal number and prints the resume
  command). The step's metrics, and a validation that was due after it, are logged before the stop. A second SIGINT
  or SIGTERM stops at once, without a checkpoint (exit status 128 + the signal number), even while the process waits
  in a collective or other native call that never returns to Python (a hung DDP peer): the signals are counted by a
  watcher thread fed through ``signal.set_wakeup_fd``, which Python's C-level handler writes at once.
* **Resumed logs hold every step once.** Each checkpoint records how many metric rows each resumable logger
  (:class:`zoo.loggers.CSVLogger`) had written (flushing them first) and the first logging step that a run resumed
  from it logs; resuming a fit from it cuts the log back to those rows plus the later rows of earlier steps (those
  of the checkpoint's own step, logged after it was written), so the resumed run appends its rows after them and no
  step is lost or written twice. A checkpoint written after an epoch ended resumes at the next epoch's first batch
  (:func:`start_next_epoch_afresh`).
* **A checkpoint is replaced whole or not at all.** At ``setup`` the strategy's plain ``TorchCheckpointIO`` is
  replaced by :class:`AtomicCheckpointIO` (``atomic_checkpoints``): every checkpoint is written to a temporary file
  next to it, synced and renamed over it (:func:`zoo.checkpoints.atomic_save`), so a kill or a full disk mid-write
  leaves the previous ``last.ckpt`` as it was, also when ``$TMPDIR`` is on another filesystem (Lightning's own write
  then falls back to truncating ``last.ckpt`` and copying into it). A full disk stops training with
  :class:`~zoo.errors.DiskFullError`. A custom ``CheckpointIO`` given to the trainer is left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from zoo.checkpoints import all_finite, atomic_save, nonfinite_tensors, read_checkpoint
from zoo.errors import CheckpointError, NaNLossError, RunInterrupted
from zoo.loggers import CSVLogger

log = logging.getLogger("zoo")

LOG_ROWS_KEY = "zoo_log_rows"


def last_checkpoint_path(trainer: pl.Trainer) -> Path | None:
    """Where the trainer's ``ModelCheckpoint`` writes ``last.ckpt`` (``None`` when checkpointing is off)."""
    callback = trainer.checkpoint_callback
    if not isinstance(callback, ModelCheckpoint) or callback.dirpath is None:
        return None
    return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"


def describe_checkpoint(path: Path | None) -> str:
    """``'<path> (global step N)'`` for an existing checkpoint, else a sentence saying that none was written."""
    if path is None or not path.is_file():
        return "no checkpoint was written before (the run has none to resume from)"
    try:
        checkpoint = read_checkpoint(path)
    except CheckpointError:
        return f"{path} (unreadable)"
    loss = (checkpoint.get(LOG_ROWS_KEY) or {}).get("train_loss")
    at = f", train/loss {loss:.4g}" if isinstance(loss, float) else ""
    return f"{path} (global step {checkpoint.get('global_step', '?')}{at})"


def save_last(trainer: pl.Trainer, path: Path) -> None:
    """Write the full training state to ``path`` (the ``ModelCheckpoint``'s ``last.ckpt``), recorded in that callback's
    state as its last checkpoint (as its own saves do), so that a run resumed from it overwrites it instead of writing
    ``last-v1.ckpt`` next to it."""
    callback = trainer.checkpoint_callback
    if isinstance(callback, ModelCheckpoint):
        callback.last_model_path = str(path)
    trainer.save_checkpoint(path, weights_only=False)


def logger_key(logger: Any) -> str:
    return f"{type(logger).__name__}:{getattr(logger, 'name', '')}"


def start_next_epoch_afresh(checkpoint: dict[str, Any]) -> bool:
    """In a checkpoint written after an epoch ended (every epoch counter equal), zero the batch counters that still
    describe that finished epoch; returns whether it did.

    Lightning resumes iteration-based training (``trainer.max_steps`` set) from such a checkpoint as if the *next*
    epoch were already over: it restores "all batches processed" and ends that epoch without training it. Counted
    from zero, the next epoch trains from its first batch (the datamodule's state says the same).
    """
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    epochs = (fit.get("epoch_progress") or {}).get("current") or {}
    batches = fit.get("epoch_loop.batch_progress") or {}
    finished = bool(epochs) and len({epochs.get(k) for k in ("ready", "started", "processed", "completed")}) == 1
    if not finished or not (batches.get("current") or {}).get("processed"):
        return False
    batches["current"] = dict.fromkeys(batches["current"], 0)
    batches["is_last_batch"] = False
    return True


def next_logging_step(trainer: pl.Trainer) -> int:
    """The logging step of the first rows a run resumed from a checkpoint written now logs: the loop's
    ``_batches_that_stepped``, plus one when written at the end of a training batch (Lightning steps it on resume)."""
    loop = trainer.fit_loop.epoch_loop
    step = int(getattr(loop, "_batches_that_stepped", trainer.global_step))
    progress = loop.batch_progress.current
    return step + 1 if progress.processed == progress.completed + 1 else step


def continue_logging_steps(trainer: pl.Trainer, step: int) -> None:
    """Make the first batch of a resumed fit log at ``step`` (recorded in the checkpoint by :func:`next_logging_step`).

    Lightning adds one to the restored logging step when it resumes, because a checkpoint written at the end of a
    training batch was written before that batch's step was counted; for a checkpoint written after the step was
    counted (at the end of a fit that stopped at ``trainer.max_steps`` on an epoch's last batch) that skips one step
    in the logs. Called at the first batch's start, before the learning-rate monitor logs (``run_guard`` comes first
    in the callbacks).
    """
    loop = trainer.fit_loop.epoch_loop
    if getattr(loop, "_batches_that_stepped", step) != step:
        loop._batches_that_stepped = step


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` whose local writes go through :func:`zoo.checkpoints.atomic_save` (a
    temporary file in the checkpoint's own directory, fsync, rename); remote paths (``s3://``, ...) keep Lightning's
    ``fsspec`` write."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        atomic_save(checkpoint, path)


def use_atomic_checkpoints(trainer: pl.Trainer) -> bool:
    """Make the trainer's strategy write checkpoints with :class:`AtomicCheckpointIO` where it uses Lightning's plain
    ``TorchCheckpointIO`` (also inside a wrapper such as ``AsyncCheckpointIO``); returns whether it does."""
    strategy = trainer.strategy
    io = strategy.checkpoint_io
    if type(io) is TorchCheckpointIO:
        strategy.checkpoint_io = AtomicCheckpointIO()
    elif isinstance(io, _WrappingCheckpointIO) and type(io.checkpoint_io) is TorchCheckpointIO:
        io.checkpoint_io = AtomicCheckpointIO()
    io = strategy.checkpoint_io
    return isinstance(getattr(io, "checkpoint_io", io), AtomicCheckpointIO)


class RunGuard(Callback):
    """Refuses non-finite checkpoints, stops at non-finite gradients, checkpoints on SIGINT/SIGTERM, and keeps
    resumed logs free of gaps and duplicates (see the module docstring).

    Args:
        check_gradients: check the gradients before every optimizer step (:func:`zoo.checkpoints.all_finite`: one
            fused norm pass over the gradients and one host synchronisation per step).
        save_on_signal: write ``last.ckpt`` and stop at the end of the step when SIGINT/SIGTERM arrives during
            training (``False``: the signals keep their usual effect).
        atomic_checkpoints: write every checkpoint with :class:`AtomicCheckpointIO` (``False``: Lightning's write).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(
        self, check_gradients: bool = True, save_on_signal: bool = True, atomic_checkpoints: bool = True
    ) -> None:
        super().__init__()
        self.check_gradients = bool(check_gradients)
        self.save_on_signal = bool(save_on_signal)
        self.atomic_checkpoints = bool(atomic_checkpoints)
        self.received: int | None = None
        self.saved_step: int | None = None  # the global step of the latest checkpoint written in this fit
        self.resume_logging_step: int | None = None  # the logging step a resumed fit continues at
        self._interrupted: RunInterrupted | None = None
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[socket.socket, socket.socket, int] | None = None  # reader, writer, previous wakeup fd

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.atomic_checkpoints:
            use_atomic_checkpoints(trainer)

    # -- non-finite values -------------------------------------------------------------------------------------
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self.check_gradients or getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        bad = (
            []
            if all_finite(grads)  # one fused reduction, one host sync; names are looked up only when it fails
            else [n for n, p in pl_module.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        )
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(bool(bad), all=False)
        else:
            stop = bool(bad)
        if stop:
            first = f" (first: {bad[0]})" if bad else " (on another rank)"
            raise NaNLossError(
                f"non-finite gradients at global step {trainer.global_step} in {len(bad)} parameter tensors{first}; "
                "training stopped before the optimizer step, so the weights are unchanged"
            )

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        bad = nonfinite_tensors(
            {"state_dict": checkpoint.get("state_dict", {}), "optimizer_states": checkpoint.get("optimizer_states", [])}
        )
        if bad:
            raise NaNLossError(
                f"non-finite values at global step {trainer.global_step} in {len(bad)} tensors of the checkpoint about "
                f"to be written (first: {bad[0]}); it was not written, so the last good checkpoint is "
                f"{describe_checkpoint(last_checkpoint_path(trainer))}"
            )
        rows = {}
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):  # (not duck-typed: fast_dev_run's DummyLogger answers any name)
                logger.save()  # the rows up to this checkpoint are on disk before it is
                rows[logger_key(logger)] = int(logger.rows_logged)
        self.saved_step = trainer.global_step
        loss = trainer.callback_metrics.get("train/loss")
        checkpoint[LOG_ROWS_KEY] = {
            "rows": rows,
            "next_step": next_logging_step(trainer),
            # the training loss last logged before this checkpoint, shown when naming it (is it still a sane model?)
            "train_loss": float(loss) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None,
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # evaluating a checkpoint leaves the run's logs alone
            return
        start_next_epoch_afresh(checkpoint)
        saved = checkpoint.get(LOG_ROWS_KEY) or {}
        rows, next_step = saved.get("rows") or {}, saved.get("next_step")
        self.resume_logging_step = None if next_step is None else int(next_step)
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger) and logger_key(logger) in rows:
                logger.keep_rows(int(rows[logger_key(logger)]), before_step=next_step)

    # -- signals -------------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.received = signal.SIGTERM if trainer.received_sigterm else None
        self.saved_step = trainer.global_step  # a resumed fit starts from a state already on disk
        if self.save_on_signal:
            self._install()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._interrupted = None  # the signal came during the last step: training is complete, nothing is lost
        self._restore()
        self.save_final_state(trainer)

    def save_final_state(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` at the final step when no checkpoint of that step exists and ``ModelCheckpoint`` will
        not write one: it writes ``last`` at the end of a fit only when it wrote none during it, so a fit that saved
        every ``every_n_train_steps`` (or a resumed one, whose restored state counts as saved) would keep an older
        ``last.ckpt`` than its final weights."""
        callback, path = trainer.checkpoint_callback, last_checkpoint_path(trainer)
        if path is None or not callback.save_last or self.saved_step == trainer.global_step or trainer.fast_dev_run:
            return
        if not getattr(callback, "_last_checkpoint_saved", True):
            return  # ModelCheckpoint.on_train_end writes it (it runs after this callback)
        save_last(trainer, path)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._restore()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.save_on_signal or self._interrupted is not None:
            return
        stop = self.received is not None
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if not stop:
            return
        number = self.received if self.received is not None else signal.SIGTERM
        path = last_checkpoint_path(trainer)
        if path is None:
            where = "checkpointing is off (no ModelCheckpoint), so no checkpoint was written"
        else:
            save_last(trainer, path)
            where = f"wrote {path}"
        self._interrupted = RunInterrupted(
            f"interrupted by {signal.Signals(number).name} at global step {trainer.global_step}: {where}",
            exit_code=128 + int(number),
        )

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.resume_logging_step is not None:
            continue_logging_steps(trainer, self.resume_logging_step)
            self.resume_logging_step = None
        # stop before the next step, once the interrupted step's metrics (and a validation due after it) are logged
        if self._interrupted is not None:
            interrupted, self._interrupted = self._interrupted, None
            raise interrupted

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        if self.received is not None and number == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop at once
        self.received = number
        log.warning(
            "received %s: training stops at the end of this step, after writing last.ckpt (Ctrl+C again stops at "
            "once, without a checkpoint)",
            signal.Signals(number).name,
        )

    def _install(self) -> None:
        try:
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._on_signal)
            self._watch_signals()
        except ValueError:  # not the main thread of the interpreter: signals cannot be handled here
            self._restore()

    def _watch_signals(self) -> None:
        """Start the watcher thread that ends the process at the second SIGINT/SIGTERM (see the module docstring)."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer, previous)
        threading.Thread(target=self._count_signals, args=(reader,), name="zoo-run-guard-signals", daemon=True).start()

    def _count_signals(self, reader: socket.socket) -> None:
        seen = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:  # closed by _restore
                return
            if not data:
                return
            for number in data:
                if number in self.SIGNALS:
                    seen += 1
                    if seen >= 2:
                        name = signal.Signals(number).name
                        os.write(2, f"[zoo] second {name}: stopping at once, without a checkpoint\n".encode())
                        os._exit(128 + number)

    def _restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        if self._wakeup is not None:
            reader, writer, previous = self._wakeup
            self._wakeup = None
            with contextlib.suppress(ValueError):  # (not the main thread)
                signal.set_wakeup_fd(previous)
            with contextlib.suppress(OSError):
                reader.shutdown(socket.SHUT_RDWR)  # wakes the watcher's recv: it returns b"" and the thread ends
            reader.close()
            writer.close()


__all__ = [
    "AtomicCheckpointIO",
    "RunGuard",
    "use_atomic_checkpoints",
    "describe_checkpoint",
    "last_checkpoint_path",
    "start_next_epoch_afresh",
]
