"""Run and sweep directories as data: metric series from Lightning's CSV logger, each run's Hydra overrides (arm and
seed), its resolved config, ``run_info.json`` and the files its callbacks wrote; the newest sweep of a demo."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from zoo.stats import Stat, stat


def find_runs(root: Path) -> list[Path]:
    """Run directories (holding ``csv/metrics.csv``) under ``root``, sorted."""
    return sorted({p.parent.parent for p in root.rglob("csv/metrics.csv")})


def read_metrics(run: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` from a run's CSV log (empty cells skipped; no log: ``{}``)."""
    series: dict[str, list[tuple[int, float]]] = {}
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return series
    with path.open() as handle:
        for row in csv.DictReader(handle):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                series.setdefault(key, []).append((step, float(value)))
    return series


def run_label(run: Path) -> str:
    """The run's overrides joined by spaces (or its directory name)."""
    overrides = run / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        items = yaml.safe_load(overrides.read_text()) or []
        items = [o for o in items if not o.startswith(("paths.", "hydra.", "run_id"))]
        if items:
            return " ".join(items)
    return run.name


def summarize(root: Path, metrics: list[str] | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns and rows (run label + last value of each metric) of every run under ``root``."""
    rows, names = [], set()
    for run in find_runs(root):
        series = read_metrics(run)
        wanted = metrics or sorted(k for k in series if not k.startswith("lr-"))
        names.update(wanted)
        rows.append({"run": run_label(run), **{k: series[k][-1][1] for k in wanted if series.get(k)}})
    columns = metrics or sorted(names)
    return columns, rows


SEED_KEY = "seed"


def split_override(override: str) -> tuple[str, str]:
    """``"+demo/x/arm=rm"`` -> ``("demo/x/arm", "rm")``: the key without ``+``/``++``/``~`` and the value text."""
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _is_sweep(value: str) -> bool:
    """Whether an override value is a sweep (Hydra's parser; a top-level comma when it cannot be parsed)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        return OverridesParser.create().parse_override(f"k={value}").is_sweep_override()
    except Exception:  # a value Hydra cannot parse outside its app: fall back to the comma
        return "," in value


def _load_json(path: Path) -> dict[str, Any]:
    """A JSON file's content; ``{}`` when the file is absent."""
    return json.loads(path.read_text()) if path.is_file() else {}


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


@dataclass
class Run:
    """One run directory of a sweep.

    Attributes:
        path: the run directory (Hydra's job output directory).
        overrides: the job's overrides (``.hydra/overrides.yaml``), command-line ones included.
        arm: the swept overrides other than the seed (``{key: value}``, filled by :class:`Sweep`).
        seed: the run's seed (its ``seed=`` override, else the resolved config's ``seed``).
        number: Hydra's job number in the sweep (order of launch).
    """

    path: Path
    overrides: list[str]
    arm: dict[str, str] = field(default_factory=dict)
    seed: int | None = None
    number: int = 0
    group_choices: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Run:
        """Read a run directory (its overrides, seed and job number)."""
        path = Path(path)
        overrides = [str(o) for o in (_load_yaml(path / ".hydra" / "overrides.yaml") or [])]
        values = dict(split_override(o) for o in overrides)
        hydra_cfg = _load_yaml(path / ".hydra" / "hydra.yaml") or {}
        # a single (non-multirun) run's job number is Hydra's missing value "???"
        num = str(((hydra_cfg.get("hydra") or {}).get("job") or {}).get("num") or 0)
        number = int(num) if num.isdigit() else 0
        choices = ((hydra_cfg.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
        run = cls(
            path=path, overrides=overrides, number=number, group_choices={str(k): str(v) for k, v in choices.items()}
        )
        seed = values.get(SEED_KEY)
        if seed is None:
            seed = (run.config or {}).get(SEED_KEY)
        run.seed = int(seed) if seed is not None else None
        return run

    @property
    def name(self) -> str:
        """The arm's values joined by ``/`` (e.g. ``rlhf/gr3``); ``"all"`` when nothing but the seed is swept."""
        return "/".join(self.arm.values()) or "all"

    @property
    def label(self) -> str:
        """The arm's overrides, ``key=value`` joined by spaces."""
        return " ".join(f"{k}={v}" for k, v in self.arm.items())

    def choice(self, key: str, default: str | None = None) -> str | None:
        """The value the run's overrides give ``key`` (``+``/``~`` ignored)."""
        return dict(split_override(o) for o in self.overrides).get(key, default)

    def group_choice(self, group: str) -> str | None:
        """The option the run's composed config took for a config group (``task``, ``method``; Hydra's
        ``hydra.runtime.choices``, defaults included), ``None`` when unknown."""
        return self.group_choices.get(group)

    @cached_property
    def metrics(self) -> dict[str, list[tuple[int, float]]]:
        """``{metric: [(step, value), ...]}`` of the CSV logger (``{}`` without one)."""
        return read_metrics(self.path)

    def series(self, metric: str) -> list[tuple[int, float]]:
        """The logged ``(step, value)`` pairs of ``metric`` (empty when never logged)."""
        return self.metrics.get(metric, [])

    @property
    def max_steps(self) -> int | None:
        """The run's training steps (``trainer.max_steps``; ``None`` when unset or negative: a run trained by
        epochs)."""
        steps = self.get("trainer.max_steps")
        return None if steps is None or int(steps) < 0 else int(steps)

    def last(self, metric: str) -> float:
        """The last logged value of ``metric`` (``nan`` when never logged)."""
        points = self.series(metric)
        return points[-1][1] if points else math.nan

    @cached_property
    def config(self) -> dict[str, Any]:
        """The run's resolved config (``resolved_config.yaml``; ``{}`` when absent)."""
        return _load_yaml(self.path / "resolved_config.yaml") or {}

    def get(self, dotted: str, default: Any = None) -> Any:
        """A value of the resolved config by dotted key (``"module.shaper.alpha"``)."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @cached_property
    def info(self) -> dict[str, Any]:
        """``run_info.json`` (command line, commit, versions, machine, start/finish times; ``{}`` when absent)."""
        return _load_json(self.path / "run_info.json")

    def artifacts(self, kind: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
        """The prerequisites the run used (``run_info.json`` -> ``artifacts``: each its ``kind``, ``name``, ``path``,
        build ``metrics`` and ``built_now``), of ``kind`` and ``name`` when given, in order of use."""
        return [
            used
            for used in self.info.get("artifacts") or []
            if (kind is None or used.get("kind") == kind) and (name is None or used.get("name") == name)
        ]

    @property
    def finished(self) -> bool:
        """Whether the run finished (``run_info.json`` has ``finished_at``)."""
        return "finished_at" in self.info

    def file(self, relative: str) -> Path:
        """A file of the run directory (it may not exist)."""
        return self.path / relative

    def read_json(self, relative: str) -> Any:
        """A JSON file a callback wrote into the run directory."""
        return json.loads(self.file(relative).read_text())

    def read_jsonl(self, relative: str) -> list[dict[str, Any]]:
        """A JSONL file a callback wrote into the run directory (one record per line)."""
        with self.file(relative).open() as handle:
            return [json.loads(line) for line in handle if line.strip()]


@dataclass
class Sweep:
    """The runs of one multirun directory, grouped into arms (swept overrides other than the seed).

    Attributes:
        path: the sweep directory (``hydra.sweep.dir``).
        runs: its runs in launch order.
        swept: the override keys that define the arms, in sweep order.
        multirun: ``multirun.yaml`` (the composed config of the sweep; ``{}`` when absent).
    """

    path: Path
    runs: list[Run]
    swept: list[str]
    multirun: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path) -> Sweep:
        """Read every run under ``path`` (directories holding ``.hydra/overrides.yaml``)."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no sweep directory at {path}")
        runs = sorted(
            (Run.load(p.parent.parent) for p in path.rglob(".hydra/overrides.yaml")), key=lambda r: (r.number, r.path)
        )
        if not runs:
            raise FileNotFoundError(f"no run directories (with .hydra/overrides.yaml) under {path}")
        multirun = _load_yaml(path / "multirun.yaml") or {}
        swept = cls._swept_keys(runs, multirun)
        for run in runs:
            values = dict(split_override(o) for o in run.overrides)
            run.arm = {k: values[k] for k in swept if k in values}
        return cls(path=path, runs=runs, swept=swept, multirun=multirun)

    @staticmethod
    def _swept_keys(runs: list[Run], multirun: dict[str, Any]) -> list[str]:
        """Keys declared as sweeps (``hydra.sweeper.params``, then the command line) or whose value varies across
        runs; the seed is left out."""
        hydra_cfg = multirun.get("hydra") or {}
        declared = [(str(k), str(v)) for k, v in ((hydra_cfg.get("sweeper") or {}).get("params") or {}).items()]
        declared += [split_override(str(o)) for o in ((hydra_cfg.get("overrides") or {}).get("task") or [])]
        keys: list[str] = []
        for key, value in declared:
            key = key.lstrip("+~")
            if _is_sweep(value) and key not in keys:
                keys.append(key)
        per_run = [dict(split_override(o) for o in r.overrides) for r in runs]
        every = {k for values in per_run for k in values}
        keys += sorted(k for k in every if k not in keys and len({v.get(k) for v in per_run}) > 1)
        return [k for k in keys if k != SEED_KEY and any(k in v for v in per_run)]

    # -- grouping -------------------------------------------------------------------------------------------------
    def arms(self) -> dict[str, list[Run]]:
        """``{arm name: runs}`` in launch order (arm name: :attr:`Run.name`)."""
        groups: dict[str, list[Run]] = {}
        for run in self.runs:
            groups.setdefault(run.name, []).append(run)
        return groups

    def arm(self, name: str) -> list[Run]:
        """The runs of one arm (empty when the sweep has none)."""
        return self.arms().get(name, [])

    @property
    def seeds(self) -> list[int]:
        """The seeds of the sweep, sorted."""
        return sorted({r.seed for r in self.runs if r.seed is not None})

    # -- provenance -----------------------------------------------------------------------------------------------
    @property
    def command(self) -> str:
        """The command line that launched the sweep (``python`` + the first run's ``argv``)."""
        commands = self.commands
        return commands[0] if commands else "(unknown: the runs hold no run_info.json)"

    @property
    def commands(self) -> list[str]:
        """Every distinct command line of the runs (``python`` + ``argv``), in launch order: one for a sweep made by a
        single launch, several when runs of further launches (e.g. some arms run in parallel) joined the folder."""
        found: list[str] = []
        for run in sorted(self.runs, key=lambda r: (str(r.info.get("started_at") or ""), r.number)):
            argv = run.info.get("argv")
            if argv:
                command = " ".join(["python", Path(argv[0]).name, *map(_quote, argv[1:])])
                if command not in found:
                    found.append(command)
        return found


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(c in arg for c in " ${}[]*?") else arg


def latest_sweep(paper: str, log_dir: str | Path | None = None) -> Path:
    """The newest sweep of ``paper`` under ``<log_dir>/demos/<paper>/`` (by the time of its ``multirun.yaml``, which
    Hydra writes when the sweep starts)."""
    root = Path(log_dir or os.environ.get("ZOO_LOG_DIR") or "logs") / "demos" / paper
    marks = sorted(root.glob("*/multirun.yaml"), key=lambda p: (p.stat().st_mtime, p.parent.name))
    if not marks:
        raise FileNotFoundError(
            f"no sweep of the {paper!r} demo under {root}; run `python train.py -m +demo={paper}` first "
            "(or pass --sweep DIR)"
        )
    return marks[-1].parent


def artifact_values(runs: Iterable[Run], kind: str, metric: str, name: str | None = None) -> list[float]:
    """A build metric of the prerequisites of ``kind`` (and, when given, of that ``name``) the runs used
    (``run_info.json`` -> ``artifacts``), one value per distinct artifact (several runs of a seed share one)."""
    seen: dict[str, float] = {}
    for run in runs:
        for used in run.artifacts(kind, name):
            value = (used.get("metrics") or {}).get(metric)
            if value is not None:
                seen[used["path"]] = float(value)
    return list(seen.values())


def _val_losses(path: Path) -> list[float] | None:
    """The ``val/loss`` values of a run directory's CSV log (:func:`read_metrics`); ``None`` when there is no log."""
    if not (path / "csv" / "metrics.csv").is_file():
        return None
    return [loss for _, loss in read_metrics(path).get("val/loss", [])]


def artifact_val_losses(run: Run, kind: str = "base_policy") -> list[float]:
    """The validation loss of the prerequisite of ``kind`` a run used, at each of its validations (the prerequisite's
    own training-run log, found through ``run_info.json`` -> ``artifacts``; the first one of that kind whose log is
    there); empty when the run used none or its log is gone."""
    for used in run.artifacts(kind):
        curve = _val_losses(Path(used.get("path", "")))
        if curve is not None:
            return curve
    return []


def base_policy_val_losses(run: Run) -> list[float]:
    """The validation loss of the base policy a run started from, at each of its validations:
    :func:`artifact_val_losses` of kind ``base_policy``."""
    return artifact_val_losses(run, "base_policy")


def artifact_users(runs: Iterable[Run], kind: str, name: str | None = None) -> dict[str, list[Run]]:
    """``{path: the runs that used it}`` of every distinct prerequisite of ``kind`` (and, when given, of that
    ``name``) the runs used (:meth:`Run.artifacts`; several runs may share one), in order of first use."""
    users: dict[str, list[Run]] = {}
    for run in runs:
        for used in run.artifacts(kind, name):
            if used.get("path"):
                users.setdefault(used["path"], []).append(run)
    return users


def build_run(used: dict[str, Any]) -> Run:
    """The build run of a prerequisite (an entry of :meth:`Run.artifacts`): its directory read as a :class:`Run`, so
    its resolved config (:attr:`Run.config`, ``{}`` when the artifact is gone) and its log (:meth:`Run.series`) read as
    any run's do."""
    return Run(path=Path(str(used.get("path", ""))), overrides=[])


def artifact_runs(runs: Iterable[Run], kind: str, name: str | None = None) -> list[Run]:
    """The build runs (:func:`build_run`) of every distinct prerequisite of ``kind`` (and, when given, of that
    ``name``) the runs used (:func:`artifact_users`), in order of first use."""
    return [build_run({"path": path}) for path in artifact_users(runs, kind, name)]


def build_seconds(used: dict[str, Any]) -> float:
    """How long a prerequisite's build took (an entry of :meth:`Run.artifacts`; ``build_seconds`` of its
    ``artifact.json``); ``nan`` when that file is gone."""
    meta = _load_json(Path(str(used.get("path", ""))) / "artifact.json") if used else {}
    return float(meta.get("build_seconds", math.nan))


def artifact_val_loss_curves(runs: Iterable[Run], kind: str) -> dict[str, list[float]]:
    """``{path: validation losses}`` of every distinct prerequisite of ``kind`` the runs used (:func:`artifact_users`),
    in order of first use; a prerequisite whose log is gone maps to ``[]``."""
    return {path: _val_losses(Path(path)) or [] for path in artifact_users(runs, kind)}


#: a loss this close to 0 that a change of less than this many nats is flat, whatever its relative size
LOSS_FLOOR_NATS = 1e-3


#: the keys of a prerequisite's build spec that set how long it trains, and the unit each counts in: a doubling check
#: (:func:`doubling_checks`) pairs two builds whose specs differ only in one of these, the second twice the first
TRAINING_LENGTH_KEYS = {"trainer.max_epochs": "epochs", "trainer.max_steps": "steps"}


@dataclass(frozen=True)
class DoublingCheck:
    """A prerequisite and a build of the same spec trained twice as long (``key``, :data:`TRAINING_LENGTH_KEYS`),
    found beside it in the artifact cache: their last validation losses."""

    key: str
    length: int
    loss: float
    doubled_loss: float

    @property
    def unit(self) -> str:
        """What ``length`` counts: ``"epochs"`` or ``"steps"``."""
        return TRAINING_LENGTH_KEYS[self.key]

    @property
    def change(self) -> float:
        """The relative change of the last validation loss from the build to the doubled one (negative: the longer
        training lowered it)."""
        return (self.doubled_loss - self.loss) / self.loss if self.loss else math.nan

    def settled(self, relative: float) -> bool:
        """Whether the longer training failed to lower the loss: it lowered it by less than ``relative`` of it (or by
        less than :data:`LOSS_FLOOR_NATS` nats), or raised it -- either way training longer does not help."""
        return loss_settled(min(self.change, 0.0), min(self.doubled_loss - self.loss, 0.0), relative)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": leaf}`` (an empty mapping is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flat(value, f"{name}.") if isinstance(value, dict) and value else {name: value})
    return flat


def _last_val_loss(build: Path, meta: dict[str, Any]) -> float:
    """A build's last validation loss: its CSV log's last ``val/loss``, else its ``artifact.json`` metrics'."""
    curve = _val_losses(build)
    if curve:
        return curve[-1]
    return float((meta.get("metrics") or {}).get("val/loss", math.nan))


def doubling_checks(runs: Iterable[Run], kind: str) -> list[DoublingCheck]:
    """The doubling checks of the prerequisites of ``kind`` the runs used (:func:`artifact_users`): for each, a build
    in the same artifact-cache folder whose ``artifact.json`` spec equals its own except for one training length
    (:data:`TRAINING_LENGTH_KEYS`) set to twice its value -- built by running the demo once more with that length
    doubled (``base_policy.max_epochs=2E``, ``trainer.max_steps=1``), into the same ``paths.cache_dir``. In order of
    first use; ``[]`` when no such build is there."""
    checks = []
    for path in artifact_users(runs, kind):
        build = Path(path)
        meta = _load_json(build / "artifact.json")
        if not meta.get("spec"):
            continue
        spec = _flat(meta["spec"])
        for other in sorted(build.parent.glob("*/artifact.json")):
            if other.parent == build:
                continue
            other_meta = _load_json(other)
            if other_meta.get("kind") != meta.get("kind"):
                continue
            other_spec = _flat(other_meta.get("spec") or {})
            differ = {k for k in spec.keys() | other_spec.keys() if spec.get(k) != other_spec.get(k)}
            if len(differ) != 1 or (key := differ.pop()) not in TRAINING_LENGTH_KEYS:
                continue
            length, longer = spec.get(key), other_spec.get(key)
            if isinstance(length, int) and length > 0 and longer == 2 * length:
                checks.append(
                    DoublingCheck(key, length, _last_val_loss(build, meta), _last_val_loss(other.parent, other_meta))
                )
    return checks


def doubling_check_text(checks: Sequence[DoublingCheck], relative: float, models: int) -> str:
    """The doubling checks (:func:`doubling_checks`) of ``models`` models in words, each read as a plateau when the
    longer training did not lower the last validation loss (:meth:`DoublingCheck.settled`); ``""`` without checks."""
    if not checks:
        return ""
    parts = []
    for check in checks:
        if not check.settled(relative):
            reading = "not at its plateau: more training lowers it"
        elif check.change >= relative and check.doubled_loss - check.loss >= LOSS_FLOOR_NATS:
            reading = "more training raises it: at its plateau, training longer does not help"
        else:
            reading = "at its plateau"
        parts.append(
            f"{check.loss:.4g} after {check.length} {check.unit} and {check.doubled_loss:.4g} after "
            f"{2 * check.length} ({100 * check.change:+.1f}%, {check.doubled_loss - check.loss:+.2g} nats: {reading}; "
            f"at a plateau more training lowers it by less than {100 * relative:g}% or {LOSS_FLOOR_NATS:g} nats)"
        )
    checked = "the model" if models == 1 else f"{len(checks)} of the {models} models"
    return (
        f"a doubling check of {checked} (a build of the same recipe trained twice as long, found in the same "
        "artifact cache) ends at a held-out loss of " + "; ".join(parts)
    )


#: the learning-rate schedules that decay by the end of training (``module.scheduler._target_``), each as the caveat
#: names it (``{min_ratio}``: the run's ``module.scheduler.min_ratio``, the schedule's default where unset)
DECAYING_SCHEDULES = {
    "zoo.optim.one_cycle": "a one-cycle schedule that decays towards 0",
    "zoo.optim.warmup_cosine": "a cosine schedule that decays to {min_ratio:g} of its peak",
}


#: ``zoo.optim.warmup_cosine``'s default floor (a share of the peak rate; read here without importing torch, pinned
#: to the schedule's own default by a test)
COSINE_MIN_RATIO = 0.1


def _decaying_schedule(configs: Sequence[Run]) -> str:
    """How the first config (of ``configs``) whose schedule decays (:data:`DECAYING_SCHEDULES`) names it; ``""``
    when none does (or their configs are gone)."""
    for config in configs:
        phrase = DECAYING_SCHEDULES.get(str(config.get("module.scheduler._target_"))) if config.config else None
        if phrase:
            min_ratio = config.get("module.scheduler.min_ratio")
            return phrase.format(min_ratio=COSINE_MIN_RATIO if min_ratio is None else float(min_ratio))
    return ""


def decaying_schedule_caveat(
    runs: Iterable[Run], kind: str | None, interval: str, check: str = "", *, relative: float, whose: str = "Their"
) -> str:
    """A caveat on a plateau read over the last ``interval`` (``"epoch"``, ``"validation interval"``) of the
    prerequisites of ``kind`` the runs used -- or, with ``kind=None``, of the runs themselves -- (``whose``: how the
    sentence names them, e.g. ``"The base policy's"``), when their learning rate followed a schedule that decays by the
    end of training (:data:`DECAYING_SCHEDULES`, read from each one's own config): a flat last interval then comes
    partly from the schedule, not only from training having converged. For prerequisites, the doubling checks found in
    the artifact cache (:func:`doubling_checks`, read against ``relative``) follow; ``check`` says where another one is
    recorded. ``""`` when none used such a schedule (or their configs are gone)."""
    runs = list(runs)
    schedule = _decaying_schedule(runs if kind is None else artifact_runs(runs, kind))
    if not schedule:
        return ""
    checks = [] if kind is None else doubling_checks(runs, kind)
    found = doubling_check_text(checks, relative, len(artifact_runs(runs, kind)) if kind else len(runs))
    unsettled = [c for c in checks if not c.settled(relative)]
    return (
        f" {whose} learning rate follows {schedule} by the end of training, so a flat "
        f"last {interval} does not show that more training would not lower the loss"
        + (f"; {found}" if found else "")
        + (f"; {check}" if check else "")
        + "."
        + (
            f" By the doubling check the plateau is **not met**, whatever the last {interval} shows."
            if unsettled
            else ""
        )
    )


def loss_settled(change: float, drop: float, relative: float) -> bool:
    """The plateau reading of a validation loss over its last interval: its relative ``change``
    (:func:`last_change`) below ``relative`` in size, or its change in nats ``drop`` below :data:`LOSS_FLOOR_NATS`
    (at a loss near 0, ten-thousandths of a nat are large fractions of it)."""
    return abs(change) < relative or abs(drop) < LOSS_FLOOR_NATS


def last_change(values: Sequence[float]) -> float:
    """The relative change of a curve's last value over the one before, ``(v[-1] - v[-2]) / v[-2]`` (e.g. of a
    validation loss over its last validation interval; near 0 on a plateau); ``nan`` with fewer than two values or
    when the one before the last is 0."""
    if len(values) < 2 or not values[-2]:
        return math.nan
    return (values[-1] - values[-2]) / values[-2]


def quarter_change(values: Sequence[float], *, relative: bool = False) -> float:
    """The change of a logged series from the third to the last quarter of its points: the last quarter's mean minus
    the third quarter's mean (``relative``: divided by the third quarter's mean); near 0 on a plateau. ``nan`` with
    fewer than 8 points (and, when ``relative``, with a third-quarter mean of 0)."""
    if len(values) < 8:
        return math.nan
    q = len(values) // 4
    third, last = values[-2 * q : -q], values[-q:]
    before = sum(third) / len(third)
    after = sum(last) / len(last)
    if not relative:
        return after - before
    return (after - before) / before if before else math.nan


def val_loss_plateau(runs: Iterable[Run], kind: str = "base_policy", *, absolute: bool = False) -> tuple[Stat, Stat]:
    """How the prerequisites of ``kind`` the runs started from ended: their last validation loss and its change over
    their last validation interval -- relative (:func:`last_change`) or, with ``absolute``, in the loss's own units
    (last minus the one before) -- over the distinct curves of two or more validations (:func:`artifact_val_losses`;
    one value per distinct curve)."""
    curves = {tuple(c) for c in (artifact_val_losses(r, kind) for r in runs) if len(c) >= 2}
    change = (lambda c: c[-1] - c[-2]) if absolute else last_change
    return stat(c[-1] for c in curves), stat(change(c) for c in curves)


def values(runs: Iterable[Run], fn: str | Callable[[Run], float]) -> list[float]:
    """One value per run: the last logged value of a metric name, or ``fn(run)``."""
    get = (lambda r: r.last(fn)) if isinstance(fn, str) else fn
    return [float(get(r)) for r in runs]
