"""Hydra callbacks of the app (``hydra.callbacks`` in ``conf/hydra/default.yaml``)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("zoo")

# what a launch of train.py leaves in its run directory once it started its stage (Hydra's own .hydra and job log
# are written by every launch, also one refused at once)
EARLIER_LAUNCH = ("run_info.json", "checkpoints", "csv")
# the settings that name a launch rather than the run it makes
LAUNCH_KEYS = ("ckpt_path", "overwrite")


def earlier_launch(directory: Path) -> bool:
    """Whether ``directory`` holds the files of an earlier launch (its run info, checkpoints or metrics)."""
    return any((directory / name).exists() for name in EARLIER_LAUNCH)


def setting(override: str) -> str:
    """The key an override sets (``+a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def without_launch_keys(overrides: list[str]) -> list[str]:
    return [o for o in overrides if setting(o) not in LAUNCH_KEYS]


def command(args: list[str]) -> str:
    """``python train.py <args>`` (``zoo-train`` when launched so), shell-quoted; empty arguments are left out."""
    argv0 = sys.argv[0] if sys.argv else ""
    program = "zoo-train" if Path(argv0).name == "zoo-train" else "python train.py"
    return " ".join([program, *(shlex.quote(a) for a in args if a)])


def argv_command(replace: dict[str, str | None]) -> str:
    """This launch's own command line with the settings in ``replace`` set (value) or dropped (``None``)."""
    args = [a for a in sys.argv[1:] if setting(a) not in replace]
    return command([*args, *(f"{key}={value}" for key, value in replace.items() if value is not None)])


def refuse(message: str) -> None:
    """Stop the launch with one message and exit status 2, before Hydra writes anything. (A callback's ``Exception``
    is turned into a warning by Hydra; ``SystemExit`` passes through.)"""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def is_fit(config: DictConfig) -> bool:
    return OmegaConf.select(config, "stage", default="fit") == "fit"


class HydraConfigForSweeps(Callback):
    """Make ``${hydra:...}`` resolvable while a multirun's sweeper resolves ``hydra.sweep.dir``.

    Hydra sets its global ``HydraConfig`` for each job, but not before the sweeper reads ``hydra.sweep.dir``; the
    app's directories derive from ``paths.root_dir: ${hydra:runtime.cwd}``, so without this ``python train.py -m ...``
    stops with "HydraConfig was not set" unless ``paths.log_dir`` is given explicitly.
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)


def launched_rank() -> int:
    """The global rank this process was launched as (0 outside distributed launches): Lightning's DDP launcher and
    ``torchrun`` set ``RANK``/``LOCAL_RANK``, SLURM ``SLURM_PROCID``; each relaunches the same command, so a check of
    the run directory belongs to rank 0 alone (the others write into the directory rank 0 just created)."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK"):
        value = os.environ.get(key, "0")
        if value.isdigit() and int(value) != 0:
            return int(value)
    return 0


class OneRunPerDirectory(Callback):
    """A run directory (or a sweep directory) holds one run: checked before Hydra writes to it.

    * ``stage=fit`` into a directory holding an earlier launch (its ``run_info.json``, checkpoints or metrics) --
      a reused ``run_id`` or ``hydra.run.dir`` -- is refused with one message (exit status 2) unless it resumes that
      run (``ckpt_path=last``, or a checkpoint inside the directory): a second history would be appended to
      ``metrics.csv``, ``export/`` overwritten and the checkpoints written as ``last-v1.ckpt``. ``overwrite=true``
      deletes the earlier run's directory first and starts afresh. Evaluation and predict stages may add to an
      earlier run's directory (resumable collections such as ``+method=drift_rollouts`` rely on it).
    * A multirun into a ``hydra.sweep.dir`` that holds an earlier sweep (``multirun.yaml``) is refused likewise,
      unless it resumes that sweep: ``ckpt_path=last`` with the same overrides (jobs are matched by number; finished
      jobs are skipped, interrupted ones resume from their ``last.ckpt``, the others start; see
      :func:`zoo.cli.train.sweep_job`). ``overwrite=true`` deletes the earlier sweep first.
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_fit(config) or launched_rank() != 0:  # Lightning relaunches the same command for ranks 1..N-1
            return
        HydraConfig.instance().set_config(config)  # ${hydra:runtime.cwd} in the run directory's path
        run_dir = Path(str(config.hydra.run.dir)).expanduser().resolve()
        if not earlier_launch(run_dir):
            return
        ckpt = config.get("ckpt_path")
        if ckpt == "last" or (ckpt and run_dir in Path(str(ckpt)).expanduser().resolve().parents):
            return
        given = [o for o in config.hydra.overrides.hydra if setting(o) == "hydra.run.dir"]
        where = given[-1] if given else f"run_id={config.get('run_id')}"
        if config.get("overwrite"):
            self.delete(run_dir, where)
            return
        info = run_dir / "run_info.json"
        what, resume = "an earlier run", argv_command({"overwrite": None, "ckpt_path": "last"})
        if info.is_file():
            try:
                earlier = json.loads(info.read_text())
            except (ValueError, OSError):
                earlier = {}
            overrides = earlier.get("overrides")
            if isinstance(overrides, list):  # the earlier run's own settings resume it
                what = f"the run started {earlier.get('started_at')} with {shlex.join(overrides) or 'no overrides'}"
                kept = [o for o in without_launch_keys(overrides) if setting(o) != "run_id"]
                resume = command([*kept, *given, where if not given else "", "ckpt_path=last"])
        refuse(
            f"{where}: {run_dir} holds {what}; a new fit there would mix the two runs (a second history in "
            f"metrics.csv, export/ overwritten, last-v1.ckpt next to last.ckpt). Resume it with: {resume}; or "
            "choose a new run_id; or add overwrite=true to delete it and start afresh"
        )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)
        sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().resolve()
        saved = sweep_dir / "multirun.yaml"
        now = without_launch_keys(list(config.hydra.overrides.task))
        if config.get("ckpt_path") == "last":
            if not saved.is_file():
                refuse(
                    f"ckpt_path=last in a multirun resumes an earlier sweep, but {sweep_dir} holds none (no "
                    "multirun.yaml): give the sweep's directory, hydra.sweep.dir=<it>, as printed when it stopped"
                )
            before = without_launch_keys(list(OmegaConf.load(saved).hydra.overrides.task))
            if before != now:
                refuse(
                    f"hydra.sweep.dir={sweep_dir} holds the sweep {shlex.join(before)}, not {shlex.join(now)}: "
                    "resume it with the same overrides (its jobs are matched by number), or choose another "
                    "hydra.sweep.dir"
                )
            return
        if not saved.is_file() or not is_fit(config):
            return
        if config.get("overwrite"):
            self.delete(sweep_dir, f"hydra.sweep.dir={sweep_dir}", marker="multirun.yaml")
            return
        refuse(
            f"hydra.sweep.dir={sweep_dir} holds an earlier sweep; a new one there would mix the two. Resume it "
            f"(finished jobs are skipped): {argv_command({'overwrite': None, 'ckpt_path': 'last'})}; or choose "
            "another hydra.sweep.dir; or add overwrite=true to delete it and start afresh"
        )

    @staticmethod
    def delete(directory: Path, where: str, marker: str = ".hydra") -> None:
        """``overwrite=true``: delete a run (sweep) directory this app made (it holds ``marker``)."""
        if not (directory / marker).exists():
            refuse(
                f"{where}: overwrite=true deletes only a directory that train.py made, and {directory} holds no "
                f"{marker}; delete it yourself or choose another directory"
            )
        shutil.rmtree(directory)
        log.warning("overwrite=true: deleted %s (%s) to start afresh", directory, where)
