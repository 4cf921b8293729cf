"""The orchestrator: build what a config declares it needs, each as its own run, before the job starts.

A config declares its prerequisites as data, where their results go:

* ``backbone.init_from: base`` -- the cached base SFT policy of the run's task (:mod:`zoo.cli.bootstrap`) for a
  random-init backbone; a pretrained one (``backbone=hf``) keeps its own weights unless ``base_policy.pretrained=sft``;
* a node whose ``_target_`` is a prerequisite plan (:func:`zoo.artifacts.prerequisite`), e.g.
  ``backbone.init_from: {_target_: zoo.modules.nmars.undo_policy, ...}`` (N-MARS's masked-SFT policy),
  ``module.teacher: {_target_: zoo.modules.valr_teacher.synthetic_teacher}``, ``module.encoder_init: {_target_:
  zoo.modules.cuttlefish_encoder.pretrained_encoder, ...}``, the rollouts, mixtures and proxies of
  :mod:`zoo.cli.rollouts` / :mod:`zoo.cli.mixing`, a demo's ``zoo.cli.artifacts.train_artifact`` node.

:func:`prepare` replaces each such entry by its result (a path, or a config node such as a ``JsonlSource`` of paths)
before anything is instantiated: the base policy first, then the plan nodes, each once the nodes its arguments
refer to (``${backbone}``, ``${datamodule}``, ...) are resolved. A plan yields :class:`~zoo.artifacts.Prerequisite`
requests; each is composed into a build run (:func:`zoo.cli.artifacts.plan_request`), looked up in the artifact cache
by its composed config and, when not cached, built: first its own prerequisites (:func:`prepare` on the build's
config), then its job. Jobs therefore run one after the other, never one inside another, and modules receive paths.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from zoo.artifacts import Plan, Prerequisite, plan_of
from zoo.backbones.base import BASE_POLICY
from zoo.cli.artifacts import APP, plan_request
from zoo.errors import ConfigError

Job = Callable[[DictConfig], dict[str, float]]
log = logging.getLogger(__name__)


def _plan_target(node: Any) -> Callable[..., Plan] | None:
    """The plan of a config node whose ``_target_`` is a prerequisite (``None`` for any other node)."""
    if not isinstance(node, (DictConfig, dict)) or "_target_" not in node:
        return None
    target = node["_target_"]
    if not isinstance(target, str):
        return None
    try:
        return plan_of(get_object(target))
    except Exception:  # a target that does not import is reported when it is instantiated
        return None


def declared(cfg: DictConfig) -> Iterator[tuple[str, DictConfig | ListConfig, Any]]:
    """``(dotted key, parent node, key)`` of every prerequisite node written in ``cfg`` (interpolations are not
    followed: the node they point to is found at its own place), innermost first."""

    def walk(node: DictConfig | ListConfig, prefix: str) -> Iterator[tuple[str, DictConfig | ListConfig, Any]]:
        keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
        for key in keys:
            if prefix == "" and key == "hydra":
                continue
            if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
                continue
            child = node[key]
            dotted = f"{prefix}{key}" if isinstance(node, DictConfig) else f"{prefix.rstrip('.')}[{key}]"
            if isinstance(child, (DictConfig, ListConfig)):
                yield from walk(child, dotted + ".")
                if _plan_target(child) is not None:
                    yield dotted, node, key

    yield from walk(cfg, "")


def _pending(value: Any) -> bool:
    """Whether a resolved value still holds a prerequisite node to build."""
    if isinstance(value, dict):
        if _plan_target(value) is not None:
            return True
        return any(_pending(v) for v in value.values())
    if isinstance(value, list):
        return any(_pending(v) for v in value)
    return False


def fulfil(plan: Plan, job: Job | None = None) -> Any:
    """Drive a plan: build each :class:`~zoo.artifacts.Prerequisite` it yields (through the artifact cache; a build
    runs its own prerequisites, then ``job``; default: :func:`zoo.cli.train.run_job`) and return the plan's result.

    From Python: ``fulfil(zoo.modules.nmars.undo_policy(backbone=..., task=..., seed=0))`` -> the policy's directory.
    """
    job = job if job is not None else _default_job()
    try:
        request = next(plan)
        while True:
            request = plan.send(build_request(request, job))
    except StopIteration as done:
        return done.value


def obtain(plan: Plan, job: Job | None = None) -> Any:
    """:func:`fulfil`, then the object a returned config node describes (e.g. the loaded teacher of
    :func:`zoo.modules.valr_teacher.synthetic_teacher`); a path is returned as is."""
    value = fulfil(plan, job)
    return instantiate(value, _convert_="all") if isinstance(value, dict) and "_target_" in value else value


def build_request(request: Prerequisite, job: Job) -> Path:
    """The artifact directory of one requested run, built (its prerequisites, then its job) if not cached."""
    if not isinstance(request, Prerequisite):
        raise TypeError(f"a prerequisite plan yielded {type(request).__name__}, not a zoo.artifacts.Prerequisite")
    build = plan_request(request)
    build.runner = lambda cfg: run_prepared(cfg, job)
    return build.ensure_artifact(request.reason)


def run_prepared(cfg: DictConfig, job: Job) -> dict[str, float]:
    """A build run: its prerequisites (:func:`prepare`), then its job."""
    prepare(cfg, job)
    return job(cfg)


def _default_job() -> Job:
    if APP.job is None:
        raise RuntimeError("no app is registered to run prerequisite builds: import zoo.cli (it registers its job)")
    return APP.job


def prepare(cfg: DictConfig, job: Job | None = None) -> None:
    """Build everything ``cfg`` declares it needs (see the module docstring) and put the results in its nodes.

    Args:
        cfg: the run's composed config (changed in place).
        job: runs a build's config once its prerequisites are ready (default :func:`zoo.cli.train.run_job`).
    """
    job = job if job is not None else _default_job()
    if cfg.get("backbone") is not None and cfg.backbone.get("init_from") == BASE_POLICY:
        from zoo.cli.bootstrap import base_policy_build, base_policy_reason, bootstraps_base_policy

        if bootstraps_base_policy(cfg):
            build = base_policy_build(cfg)
            build.runner = lambda sub: run_prepared(sub, job)
            start = str(build.ensure(base_policy_reason(cfg, build)))
            log.info("backbone.init_from=base: the run starts from the base SFT policy of its task at %s", start)
        else:
            start = None
            log.info(
                "backbone.init_from=base: the backbone (%s) is pretrained, so the run starts from its own weights; "
                "+base_policy.pretrained=sft fine-tunes it on the task first (the synthetic backbone's base policy)",
                cfg.backbone.get("name_or_path", cfg.backbone.get("_target_")),
            )
        with open_dict(cfg):
            cfg.backbone.init_from = start
    while True:
        nodes = list(declared(cfg))
        if not nodes:
            return
        ready = [(dotted, parent, key) for dotted, parent, key in nodes if not _waits(parent[key])]
        if not ready:
            raise ConfigError(
                f"the prerequisites {[dotted for dotted, _, _ in nodes]} refer to each other (through their "
                "arguments' interpolations); none can be built first"
            )
        dotted, parent, key = ready[0]
        value = fulfil(_start(cfg, dotted, parent[key]), job)
        if dotted == "backbone.init_from" and not isinstance(value, (str, Path)):
            raise ConfigError(
                f"backbone.init_from._target_={parent[key]._target_} returned {type(value).__name__}, not a directory"
            )
        with open_dict(cfg):
            parent[key] = str(value) if isinstance(value, Path) else value


def _waits(node: DictConfig) -> bool:
    """Whether a prerequisite node's arguments still hold an unbuilt prerequisite (its own, or one they refer to)."""
    resolved = OmegaConf.to_container(node, resolve=True)
    resolved.pop("_target_", None)
    return _pending(resolved)


def _start(cfg: DictConfig, dotted: str, node: DictConfig) -> Plan:
    """The plan of a node, called with its arguments; a plan at ``backbone.init_from`` that takes ``backbone`` gets the
    rest of the backbone node (a plain dict) unless the node sets it."""
    extra: dict[str, Any] = {}
    plan = _plan_target(node)
    if dotted == "backbone.init_from" and "backbone" not in node and "backbone" in inspect.signature(plan).parameters:
        extra["backbone"] = OmegaConf.to_container(cfg.backbone, resolve=True)
        extra["backbone"].pop("init_from")
    # resolved in place (relative interpolations such as ${..encoder_pretrain} need the node's parents); the target
    # becomes the plan itself where it is marked on an eager function (e.g. zoo.cli.artifacts.train_artifact)
    arguments = OmegaConf.to_container(node, resolve=True)
    arguments["_target_"] = f"{plan.__module__}.{plan.__qualname__}"
    arguments.pop("_partial_", None)  # the orchestrator calls a plan once, now: a partial node would return no plan
    started = instantiate(arguments, **extra)
    if not inspect.isgenerator(started):
        raise ConfigError(f"{dotted}._target_={node._target_} is marked as a prerequisite but returned no plan")
    return started


__all__ = ["build_request", "declared", "fulfil", "obtain", "prepare", "run_prepared"]
