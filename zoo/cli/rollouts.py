"""Offline rollouts built on first use: the rollout file behind ``datamodule.source.path: null`` of DRIFT's runs.

An offline method that is given no rollout file (``+method=drift`` and its baselines, ``datamodule.source.path:
null``) trains on the rollouts of its own reference policy: a ``python train.py +method=drift_rollouts`` run with the
parent run's task, multi-turn environment, backbone (the reference policy: ``init_from`` as the parent's, e.g. the
cached base policy) and seed, built once through the artifact cache (:func:`zoo.cli.artifacts.plan_artifact`) and kept
at ``<paths.cache_dir>/drift_rollouts/<task>-<key>/rollouts.jsonl``. The key is that run's composed config.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.utils import instantiate

from zoo.artifacts import Plan, Prerequisite, prerequisite
from zoo.cli.artifacts import ArtifactBuild, plan_request
from zoo.errors import ConfigError

ROLLOUT_FILE = "rollouts.jsonl"


def reference_rollouts_request(
    task: Mapping[str, Any],
    multiturn: Mapping[str, Any],
    backbone: Mapping[str, Any],
    base_policy: Mapping[str, Any],
    seed: int,
    n_traj: int = 8,
    num_prompts: int = 512,
    num_val: int = 128,
    num_test: int = 256,
    generation: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    root_dir: str | None = None,
    accelerator: str = "auto",
) -> Prerequisite:
    """The ``+method=drift_rollouts`` build run of a parent run's reference rollouts (see the module docstring).

    Args:
        task, multiturn, backbone, base_policy, seed: the parent run's nodes (resolved).
        n_traj: trajectories per prompt (``module.n_traj``).
        num_prompts: training prompts collected (``datamodule.source.num_train``).
        num_val, num_test: the sizes of the held-out splits of the prompt source: keep them equal to the parent's
            held-out split sizes, so that its evaluation prompts are never among the collected ones.
        generation: sampling of the collection (``module.generation``; ``None``: the method's default).
        cache_dir, root_dir, accelerator: where the artifact is cached, the repository root, where it runs.
    """
    for name, value in (("n_traj", n_traj), ("num_prompts", num_prompts)):
        # named as the user sets them on the parent run (the build run's module.n_traj is not what they typed)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"datamodule.source.collect.{name} must be a whole number >= 1, got {value!r}")
    values: dict[str, Any] = {
        "task": dict(task),
        "multiturn": dict(multiturn),
        "backbone": dict(backbone),
        "base_policy": dict(base_policy),
        "seed": seed,
        "module.n_traj": n_traj,
        "datamodule.source.num_train": num_prompts,
        "datamodule.source.num_val": num_val,
        "datamodule.source.num_test": num_test,
    }
    if generation is not None:
        values["module.generation"] = dict(generation)
    return Prerequisite(
        "drift_rollouts",
        ("+method=drift_rollouts",),
        values,
        name=instantiate(dict(task)).name,
        reason=(
            f"datamodule.source.path is null: the offline method trains on its reference policy's rollouts "
            f"({n_traj} trajectories for each of {num_prompts} prompts)"
        ),
        product=ROLLOUT_FILE,
        cache_dir=cache_dir,
        root_dir=root_dir,
        execution={"trainer.accelerator": accelerator},
    )


def reference_rollouts_build(**kwargs: Any) -> ArtifactBuild:
    """The build run of :func:`reference_rollouts_request` (arguments: see there)."""
    return plan_request(reference_rollouts_request(**kwargs))


@prerequisite
def reference_rollouts(given: str | None = None, **kwargs: Any) -> Plan:
    """The parent run's reference rollout file, collected first if it is not cached (arguments: see
    :func:`reference_rollouts_request`): a prerequisite plan that the CLI builds before the job. ``given``: the run's
    own rollout file (``datamodule.source.path``); when set, nothing is collected and the plan returns ``None``."""
    if given:
        return None
    directory = yield reference_rollouts_request(**kwargs)
    return str(Path(directory) / ROLLOUT_FILE)


__all__ = ["ROLLOUT_FILE", "reference_rollouts", "reference_rollouts_build", "reference_rollouts_request"]
