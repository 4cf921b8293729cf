"""The cached base SFT policy behind ``backbone.init_from: base``.

Methods that start from a trained policy (GRPO, GR3, SafeThink, ...) set ``backbone.init_from: base``. The policy is
the export of a ``+method=sft`` run on the parent run's task and backbone architecture with the ``base_policy``
recipe, built through the artifact cache (:func:`zoo.cli.artifacts.train_artifact`) on first use and kept at
``<paths.cache_dir>/base_policy/<task>-<key>/export``. The key is the build run's composed config, so it depends on
the task, the backbone (without ``init_from``, ``extra_tokens`` and ``lora``), the seed and the recipe, and not on any
other option of the parent run. The build uses the parent run's ``seed`` unless the recipe fixes one
(``base_policy.seed``): then every run of a seed sweep starts from the same base policy and the seeds vary only what
the run itself does (e.g. the RL phase).

Recipe field -> option of the ``+method=sft`` build run: :data:`RECIPE_FIELDS`. An optional ``datamodule`` field names
the build run's datamodule option (default ``sft``: the task's prompt/completion rows), e.g. ``retry_feedback`` for a
policy of multi-turn feedback episodes (DRIFT); the parent run's ``multiturn`` node (the episodes' environment, when
it has one) is then passed to the build with the task.

Only a random-init (synthetic) backbone is bootstrapped: a pretrained one (``backbone=hf``, whose class sets
:attr:`zoo.backbones.base.Backbone.pretrained`) starts from its own weights, since fine-tuning a real model on the
synthetic task at the recipe's learning rate (and without the run's LoRA and quantizer) is not what its user asked for;
``+base_policy.pretrained=sft`` builds the base policy from it all the same (:func:`bootstraps_base_policy`). One log
line of :func:`zoo.cli.prerequisites.prepare` says which start the run takes.

The orchestrator (:func:`zoo.cli.prerequisites.prepare`) builds it before the run's job, like any other declared
prerequisite (``backbone.init_from`` may also be a prerequisite node, e.g. :func:`zoo.modules.nmars.undo_policy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from zoo.backbones.base import BASE_POLICY
from zoo.cli.artifacts import ArtifactBuild, plan_artifact
from zoo.errors import ConfigError

RECIPE_FIELDS = {
    "num_train": "datamodule.source.num_train",
    "batch_size": "datamodule.batch_size",
    "max_epochs": "trainer.max_epochs",
    "lr": "module.optimizer.lr",
    "max_length": "datamodule.max_length",
}


QUICK_RECIPE = "base_policy.num_train=512 base_policy.max_epochs=1"
#: ``base_policy.pretrained``: what ``init_from: base`` means for a pretrained backbone -- its own weights (``own``,
#: the default) or the base SFT policy built from it like from a synthetic one (``sft``).
PRETRAINED_STARTS = ("own", "sft")


def backbone_is_pretrained(backbone: Any) -> bool:
    """Whether a backbone config node's class loads trained weights (:attr:`zoo.backbones.base.Backbone.pretrained`)."""
    target = backbone.get("_target_") if backbone is not None else None
    if not isinstance(target, str):
        return False
    try:
        cls = get_object(target)
    except Exception:  # a target that does not import is reported when it is instantiated
        return False
    return bool(getattr(cls, "pretrained", False))


def bootstraps_base_policy(cfg: DictConfig) -> bool:
    """Whether ``cfg``'s ``backbone.init_from: base`` builds (or reuses) the base SFT policy: always for a random-init
    backbone; for a pretrained one only with ``base_policy.pretrained=sft`` (else it keeps its own weights).

    Raises:
        ConfigError: ``base_policy.pretrained`` is not one of :data:`PRETRAINED_STARTS`.
    """
    if cfg.get("backbone") is None or cfg.backbone.get("init_from") != BASE_POLICY:
        return False
    start = (cfg.get("base_policy") or {}).get("pretrained", "own")
    if start not in PRETRAINED_STARTS:
        raise ConfigError(f"base_policy.pretrained={start!r}: use one of {list(PRETRAINED_STARTS)}")
    return not backbone_is_pretrained(cfg.backbone) or start == "sft"


def recipe_summary(recipe: Any) -> str:
    """``'3 epochs of 16000 rows at batch 64 = 750 optimizer steps'`` for a ``base_policy`` recipe."""
    epochs, rows, batch = (recipe.get(k) for k in ("max_epochs", "num_train", "batch_size"))
    steps = f" = {int(rows) // int(batch) * int(epochs)} optimizer steps" if rows and batch and epochs else ""
    return f"{epochs} epochs of {rows} rows at batch {batch}{steps}"


def base_policy_build(cfg: DictConfig) -> ArtifactBuild:
    """The ``+method=sft`` build run of the base policy that ``cfg`` (a run with ``init_from: base``) asks for."""
    recipe = OmegaConf.to_container(cfg.base_policy, resolve=True)
    recipe.pop("pretrained", None)  # whether a pretrained backbone is bootstrapped at all (bootstraps_base_policy)
    datamodule = recipe.pop("datamodule", None)
    seed = recipe.pop("seed", None)
    unknown = sorted(set(recipe) - set(RECIPE_FIELDS))
    if unknown:
        raise ConfigError(
            f"base_policy: unknown recipe fields {unknown}; known: {sorted(RECIPE_FIELDS)}, datamodule, seed and "
            "pretrained"
        )
    backbone = OmegaConf.to_container(cfg.backbone, resolve=True)
    backbone.update(init_from=None, extra_tokens=[])
    if seed is not None and "seed" in backbone:  # the backbone's init seed follows the build run's seed
        backbone["seed"] = int(seed)
    if "lora" in backbone:  # the base policy is a full fine-tune, whatever adapters the parent run trains
        backbone["lora"] = None
    values: dict[str, Any] = {
        "seed": cfg.seed if seed is None else int(seed),
        "task": OmegaConf.to_container(cfg.task, resolve=True),
        "backbone": backbone,
        **{RECIPE_FIELDS[field]: value for field, value in recipe.items()},
    }
    overrides = ["+method=sft"]
    if datamodule is not None:
        overrides.append(f"datamodule={datamodule}")
        if cfg.get("multiturn") is not None:
            values["multiturn"] = OmegaConf.to_container(cfg.multiturn, resolve=True)
    return plan_artifact(
        "base_policy",
        overrides,
        values,
        name=instantiate(cfg.task).name,
        cache_dir=cfg.paths.cache_dir,
        root_dir=cfg.paths.root_dir,
        execution={"trainer.accelerator": cfg.trainer.get("accelerator", "auto")},
    )


def base_policy_dir(cfg: DictConfig) -> Path:
    """Where the base policy of ``cfg`` lives (the build run's ``export/``), whether or not it exists."""
    return base_policy_build(cfg).export_dir


def base_policy_reason(cfg: DictConfig, build: ArtifactBuild) -> str:
    """Why the base policy is built (logged when it is)."""
    return (
        f"backbone.init_from=base asks for the base SFT policy of task '{build.name}', trained before this run starts: "
        f"{recipe_summary(cfg.base_policy)} (the run's trainer.max_steps does not apply to it; a quicker one: "
        f"{QUICK_RECIPE})"
    )


def ensure_base_policy(cfg: DictConfig) -> Path:
    """The base policy's directory (``save_pretrained`` layout), trained and cached first if it does not exist."""
    build = base_policy_build(cfg)
    return build.ensure(base_policy_reason(cfg, build))
