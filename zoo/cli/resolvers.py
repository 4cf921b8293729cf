"""OmegaConf resolvers of the zoo's configs (registered when ``zoo.conf`` is imported, i.e. before any composition).

* ``${zoo.quick_settings:}`` -- the "Quick settings" section of ``python train.py --help``: cheap settings for a
  first try, each selected method's catalogue ``smoke`` settings, and what the run builds before it trains.
* ``${zoo.precision:<backbone.dtype>}`` -- the default ``trainer.precision`` of a backbone dtype
  (:func:`precision_for`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf


def _select(cfg: DictConfig, key: str, default: Any = None) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)
    except Exception:  # help text: a value that does not resolve is simply not shown
        return default


def base_policy_note(cfg: DictConfig) -> str | None:
    """What a run with ``backbone.init_from: base`` builds before it trains (``None`` for other runs)."""
    if _select(cfg, "backbone.init_from") != "base":
        return None
    from zoo.cli.bootstrap import QUICK_RECIPE, backbone_is_pretrained, recipe_summary

    own_weights = _select(cfg, "base_policy.pretrained", "own") != "sft"
    if own_weights and backbone_is_pretrained(_select(cfg, "backbone") or {}):
        return (
            "This run starts from the pretrained backbone's own weights (backbone.init_from=base); "
            "+base_policy.pretrained=sft trains the task's base SFT policy from it first"
        )
    return (
        f"This run first trains the base SFT policy of its task (backbone.init_from=base): "
        f"{recipe_summary(_select(cfg, 'base_policy') or {})}, which trainer.max_steps does not shorten; it is "
        f"cached (paths.cache_dir) for later runs. A quick one: {QUICK_RECIPE}"
    )


def random_init_note(cfg: DictConfig) -> str | None:
    """A warning for a run that evaluates (and maybe quantizes) a randomly initialised model."""
    backbone = _select(cfg, "backbone") or {}
    stage = _select(cfg, "stage", "fit")
    if stage == "fit" or _select(cfg, "ckpt_path") or backbone.get("init_from") or "name_or_path" in backbone:
        return None
    quant = _select(cfg, "quant._target_", "")
    what = "quantizes and evaluates" if not str(quant).endswith("NoQuantizer") else "evaluates"
    return (
        f"This run (stage={stage}) {what} a randomly initialised model: add backbone.init_from=base (the cached base "
        "SFT policy), an exported directory or ckpt_path=<.ckpt>"
    )


def quick_settings(*, _root_: DictConfig) -> str:
    """The text of the "Quick settings" section of ``--help`` for the composed config ``_root_``."""
    from zoo.catalogue import method_entries

    lines = [
        "A short run of any command: append trainer.max_steps=20 (debug=fdr: one batch through every hook;",
        "debug=limit: 5 training batches). Each method's cheap settings (its catalogue smoke list):",
    ]
    selected = _select(_root_, "methods") or {}
    entries = {name: dict(entry) for name, entry in selected.items()} if selected else method_entries()
    for name, entry in sorted(entries.items()):
        smoke = list(entry.get("smoke") or [])
        if smoke or selected:
            lines.append(f"  +method={name}: {' '.join(str(s) for s in smoke) or '(none needed)'}")
    lines.extend(note for note in (base_policy_note(_root_), random_init_note(_root_)) if note)
    return "\n".join(lines)


#: ``backbone.dtype`` -> the Lightning precision of its mixed-precision training (``${zoo.precision:...}``).
MIXED_PRECISION = {"bfloat16": "bf16-mixed", "bf16": "bf16-mixed", "float16": "16-mixed", "fp16": "16-mixed"}


def precision_for(dtype: Any = None) -> str:
    """The default ``trainer.precision`` for a ``backbone.dtype``: ``bf16-mixed`` / ``16-mixed`` for a half-precision
    backbone (autocast compute over its half-precision frozen weights and float32 trainable ones, see
    :func:`zoo.backbones.base.upcast_trainable`), else ``32-true``. Never ``bf16-true``: pure half-precision weights and
    optimizer state lose small updates."""
    return MIXED_PRECISION.get(str(dtype), "32-true")


def register_resolvers() -> None:
    """Register the resolvers above (idempotent)."""
    OmegaConf.register_new_resolver("zoo.quick_settings", quick_settings, replace=True)
    OmegaConf.register_new_resolver("zoo.precision", precision_for, replace=True)


__all__ = ["base_policy_note", "precision_for", "quick_settings", "random_init_note", "register_resolvers"]
