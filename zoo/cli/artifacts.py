"""Artifacts trained by the normal app: compose ``pkg://zoo.conf/train.yaml`` and call :func:`zoo.cli.train.run`.

A prerequisite that is trained once and reused (the base SFT policy, a pretrained structure encoder, VaLR's synthetic
teacher, a safety reward model, ...) is a run of ``python train.py <overrides>`` whose ``export/`` is kept in the
artifact cache (:func:`zoo.artifacts.ensure`):

* :func:`plan_artifact` composes the build run's config (``overrides`` + ``values`` set on the composed config) and
  computes the spec that keys the cache: the composed config, resolved, without the run's locations (``paths``,
  ``run_id``) and without :data:`EXECUTION_FIELDS` (where it runs, not what it builds);
* :func:`train_artifact` builds it on first use: the run's output directory is the temporary build directory, its
  ``export/`` is the artifact (``<cache_dir>/<kind>/<name>-<key>/export``), next to the run's logs, resolved config
  and ``artifact.json`` (with the run's final metrics).

Inside a running Hydra app the build's config is composed with the app's own Hydra (``hydra.compose``, the public
API); outside one (tests, notebooks) under ``initialize_config_module``, which restores Hydra's state after. The
caller's random-number state is kept. Inside the app, builds happen only before the job starts
(:func:`zoo.cli.prerequisites.prepare`): a running job never starts another run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from zoo.artifacts import PLAN_ATTRIBUTE, Plan, Prerequisite, artifact_path, default_cache_dir, ensure
from zoo.errors import ZooError

# Where a build runs, not what it builds: set on the build run, left out of its key.
EXECUTION_FIELDS = ("trainer.accelerator", "flush_denormal")
# Descriptive top-level fields that do not change what a run builds: the catalogue entries (``methods.*``) and tags.
DESCRIPTIVE_FIELDS = ("methods", "tags")
# Every build run exports its model and keeps no checkpoints (the export is the artifact).
BUILD_OVERRIDES = ("export=true", "++callbacks.model_checkpoint=null", "++trainer.enable_checkpointing=false")
PATH_FIELDS = ("root_dir", "log_dir", "output_dir", "cache_dir")
SEED_ENV = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@contextlib.contextmanager
def rng_isolated() -> Iterator[None]:
    """Run a block without changing the caller's random state (Python, NumPy, torch CPU/CUDA, Lightning's seed
    variables) or torch's determinism flags."""
    py_state, np_state = random.getstate(), np.random.get_state()
    env = {k: os.environ.get(k) for k in SEED_ENV}
    flags = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
    )
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.benchmark = flags[2]


_COMPOSED: dict[tuple[Any, tuple[str, ...]], DictConfig] = {}
_COMPOSED_KEPT = 64


def _composed(overrides: tuple[str, ...]) -> DictConfig:
    """A copy of ``train.yaml`` composed with ``overrides``, composed once per Hydra instance and overrides.

    Every job of a sweep plans the same prerequisites (one composition each, ~0.13 s): the compositions are kept,
    keyed by the Hydra that composed them (the app's, whose search path the command line may extend, or none: the
    package's own ``zoo.conf`` outside an app) and the overrides; at most :data:`_COMPOSED_KEPT`, oldest dropped.
    """
    owner = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    key = (owner, overrides)
    if key not in _COMPOSED:
        # Hydra's first composition imports its plugins, which may draw random numbers: keep the caller's state
        with rng_isolated():
            if owner is not None:  # inside the app (or a caller's initialize_*): its Hydra
                cfg = compose(config_name="train", overrides=list(overrides))
            else:
                with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
                    cfg = compose(config_name="train", overrides=list(overrides))
        if len(_COMPOSED) >= _COMPOSED_KEPT:
            del _COMPOSED[next(iter(_COMPOSED))]
        _COMPOSED[key] = cfg
    return copy.deepcopy(_COMPOSED[key])


def compose_config(
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    root_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> DictConfig:
    """``train.yaml`` composed with ``overrides`` as ``python train.py <overrides>`` would (in or outside a Hydra app).

    ``values`` (dotted key -> value) are then set on the composed config, replacing whole nodes (``{"task": {...}}``
    swaps the task); the paths are set to ``root_dir`` (default: the current directory) and ``cache_dir`` (default:
    :func:`zoo.artifacts.default_cache_dir`); the output directory is ``<root_dir>/logs/artifacts`` until
    :class:`ArtifactBuild` points it at a build directory.
    """
    cfg = _composed(tuple(overrides))
    root = Path(root_dir).expanduser().resolve() if root_dir is not None else Path.cwd()
    with open_dict(cfg):
        for key, value in (values or {}).items():
            OmegaConf.update(cfg, key, copy.deepcopy(value), merge=False, force_add=True)
        cfg.paths.root_dir = str(root)
        cfg.paths.log_dir = str(root / "logs")
        cfg.paths.output_dir = str(root / "logs" / "artifacts")
        cfg.paths.cache_dir = str(Path(cache_dir).expanduser().resolve() if cache_dir else default_cache_dir())
    return cfg


def _drop(container: dict[str, Any], dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = container
    for part in parents:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(leaf, None)


def config_spec(cfg: DictConfig) -> dict[str, Any]:
    """What keys an artifact built by ``run(cfg)``: the resolved config without locations, execution fields and
    descriptive fields (catalogue entries, tags), so that editing a method's catalogue entry rebuilds nothing."""
    probe = copy.deepcopy(cfg)
    with open_dict(probe):
        for field in PATH_FIELDS:
            probe.paths[field] = f"<paths.{field}>"
        probe.run_id = "<run_id>"
    spec = OmegaConf.to_container(probe, resolve=True)
    for key in ("paths", "run_id", "hydra", *DESCRIPTIVE_FIELDS):
        spec.pop(key, None)
    for dotted in EXECUTION_FIELDS:
        _drop(spec, dotted)
    return spec


@dataclass
class App:
    """The CLI's entry points a build needs, registered by :mod:`zoo.cli.train` when it is imported (importing the
    :mod:`zoo.cli` package does): ``run`` (a whole run: checks, prerequisites, job) and ``job`` (the job of a config
    whose prerequisites are built). The modules below it call them through here, so none imports the module that
    calls it (the CLI's imports go one way)."""

    run: Callable[[DictConfig], dict[str, float]] | None = None
    job: Callable[[DictConfig], dict[str, float]] | None = None


APP = App()


@dataclass
class ArtifactBuild:
    """A planned build run: its composed config, the spec that keys it, and where its artifact lives."""

    kind: str
    name: str
    config: DictConfig
    spec: dict[str, Any]
    cache_dir: Path
    overrides: tuple[str, ...]
    product: str = "export"
    # runs the build's config: zoo.cli.train.run by default (its prerequisites, then its job); the orchestrator
    # (zoo.cli.prerequisites) passes its own, so that no job starts inside another
    runner: Callable[[DictConfig], dict[str, float]] | None = None

    @property
    def path(self) -> Path:
        """``<cache_dir>/<kind>/<name>-<key>`` (the artifact directory, built or not)."""
        return artifact_path(self.kind, self.spec, self.cache_dir, self.name)

    @property
    def export_dir(self) -> Path:
        """The run's ``export/`` inside the artifact: what consumers load."""
        return self.path / "export"

    @property
    def product_path(self) -> Path:
        """What consumers use inside the artifact: the run's ``product`` (``export/`` for a trained model, e.g.
        ``rollouts.jsonl`` for a data-collection run)."""
        return self.path / self.product

    def __call__(self, directory: Path) -> dict[str, Any]:
        """Run the build with ``directory`` as the run's output directory (the builder of :func:`ensure`)."""
        cfg = copy.deepcopy(self.config)
        with open_dict(cfg):
            cfg.paths.output_dir = str(directory)
            cfg.paths.log_dir = str(directory / "logs")
            cfg.run_id = "artifact"
        with rng_isolated():
            runner = self.runner or APP.run
            if runner is None:
                raise RuntimeError("no app is registered to build artifacts: import zoo.cli (it registers its run)")
            metrics = runner(cfg)
        shutil.rmtree(directory / "checkpoints", ignore_errors=True)
        if not (directory / self.product).exists():
            raise ZooError(
                f"the {self.kind} build run wrote nothing to {directory / self.product} (is export=false or "
                "trainer.fast_dev_run set among its overrides?)"
            )
        return {"overrides": list(self.overrides), "metrics": metrics}

    def ensure(self, reason: str = "first use") -> Path:
        """The artifact's ``product`` (``export/``), built first if it is not cached."""
        return self.ensure_artifact(reason) / self.product

    def ensure_artifact(self, reason: str = "first use") -> Path:
        """The artifact's directory, built first if it is not cached."""
        return ensure(self.kind, self.spec, self, self.cache_dir, name=self.name, reason=reason)


def plan_artifact(
    kind: str,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "",
    cache_dir: str | Path | None = None,
    root_dir: str | Path | None = None,
    execution: Mapping[str, Any] | None = None,
    product: str = "export",
) -> ArtifactBuild:
    """Compose the build run of an artifact (see :func:`compose_config`) and compute its key, without running it.

    Args:
        kind: cache sub-folder (``base_policy``, ``structure_encoder``, ...).
        overrides: command-line overrides of the build run (``+method=sft``, ``task=jailbreak``, ...).
        values: dotted key -> value set on the composed config (whole nodes, e.g. the parent run's task).
        name: readable prefix of the artifact directory.
        cache_dir, root_dir: as in :func:`compose_config`.
        execution: values of :data:`EXECUTION_FIELDS` (e.g. ``{"trainer.accelerator": "gpu"}``): set on the run,
            not part of the key.
        product: the path, inside the run's output directory, that is the artifact (``export`` for a trained model;
            e.g. ``rollouts.jsonl`` for a run that collects data).
    """
    unknown = sorted(set(execution or {}) - set(EXECUTION_FIELDS))
    if unknown:
        raise ValueError(f"execution fields {unknown} are not among {EXECUTION_FIELDS}")
    cache = Path(cache_dir).expanduser().resolve() if cache_dir is not None else default_cache_dir()
    all_overrides = (*overrides, *BUILD_OVERRIDES)
    cfg = compose_config(all_overrides, values, root_dir=root_dir, cache_dir=cache)
    spec = config_spec(cfg)
    with open_dict(cfg):
        for key, value in (execution or {}).items():
            OmegaConf.update(cfg, key, value, merge=False)
    return ArtifactBuild(kind, name, cfg, spec, cache, tuple(all_overrides), product)


def plan_request(request: Prerequisite) -> ArtifactBuild:
    """The build run of a :class:`~zoo.artifacts.Prerequisite` that a plan yielded (see :func:`plan_artifact`)."""
    return plan_artifact(
        request.kind,
        request.overrides,
        request.values,
        name=request.name,
        cache_dir=request.cache_dir,
        root_dir=request.root_dir,
        execution=request.execution,
        product=request.product,
    )


def train_artifact_plan(
    kind: str,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "",
    reason: str = "first use",
    cache_dir: str | Path | None = None,
    root_dir: str | Path | None = None,
    execution: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan behind a ``_target_: zoo.cli.artifacts.train_artifact`` config node: the run's ``export/``."""
    if OmegaConf.is_config(values):  # a node with _recursive_: false passes its values as a config
        values = OmegaConf.to_container(values, resolve=True)
    directory = yield Prerequisite(
        kind,
        tuple(overrides),
        dict(values or {}),
        name=name,
        reason=reason,
        cache_dir=cache_dir,
        root_dir=root_dir,
        execution=dict(execution or {}),
    )
    return str(directory / "export")


def train_artifact(
    kind: str,
    overrides: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "",
    reason: str = "first use",
    cache_dir: str | Path | None = None,
    root_dir: str | Path | None = None,
    execution: Mapping[str, Any] | None = None,
) -> Path:
    """The ``export/`` directory of the artifact trained by ``python train.py <overrides>``, built on first use.

    Example: ``train_artifact("safety_rm", ["+method=safety_rm", "trainer.max_epochs=1"], name="jailbreak")``.
    """
    plan = plan_artifact(
        kind, overrides, values, name=name, cache_dir=cache_dir, root_dir=root_dir, execution=execution
    )
    return plan.ensure(reason)


# as a config node's _target_, train_artifact is a prerequisite: built by the CLI before the job
setattr(train_artifact, PLAN_ATTRIBUTE, train_artifact_plan)


__all__ = [
    "BUILD_OVERRIDES",
    "EXECUTION_FIELDS",
    "ArtifactBuild",
    "compose_config",
    "config_spec",
    "plan_artifact",
    "plan_request",
    "rng_isolated",
    "train_artifact",
    "train_artifact_plan",
]
