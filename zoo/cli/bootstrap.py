"""The cached base SFT policy behind ``backbone.init_from: base``.

Methods that start from a trained policy (GRPO, GR3, SafeThink, ...) set ``backbone.init_from: base``.
The policy is keyed by the task, the backbone architecture and the recipe in ``base_policy``; it is trained
on first use (with a progress display and a log line saying so) and exported with ``save_pretrained`` under
``<paths.cache_dir>/base_policy/<task>-<hash>``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("zoo")


def _recipe(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg.base_policy, resolve=True)  # type: ignore[return-value]


def _fresh_backbone_cfg(cfg: DictConfig) -> DictConfig:
    backbone_cfg = OmegaConf.to_container(cfg.backbone, resolve=True)
    backbone_cfg["init_from"] = None
    backbone_cfg["extra_tokens"] = []
    return OmegaConf.create(backbone_cfg)


def base_policy_dir(cfg: DictConfig) -> Path:
    """Where the base policy of this config's task + backbone + recipe lives (whether or not it exists)."""
    task = instantiate(cfg.task)
    backbone = instantiate(_fresh_backbone_cfg(cfg))
    blob = json.dumps(
        {"task": task.describe(), "backbone": backbone.describe(), "recipe": _recipe(cfg), "seed": cfg.seed},
        sort_keys=True,
        default=str,
    )
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return Path(cfg.paths.cache_dir).expanduser().resolve() / "base_policy" / f"{task.name}-{key}"


def ensure_base_policy(cfg: DictConfig) -> Path:
    """Return the base policy directory, training and caching it first if it does not exist yet."""
    from zoo.callbacks.progress import auto_progress
    from zoo.data.sources import TaskSource
    from zoo.datamodules.sft import SFTDataModule
    from zoo.modules.causal_lm import CausalLMModule
    from zoo.optim import one_cycle

    target = base_policy_dir(cfg)
    if (target / "config.json").is_file():
        log.info("using the cached base policy at %s", target)
        return target
    recipe = _recipe(cfg)
    task = instantiate(cfg.task)
    log.info(
        "no cached base policy for task '%s' with this backbone: training it now (first use; %d epochs of %d "
        "rows), it will be cached at %s",
        task.name,
        recipe["max_epochs"],
        recipe["num_train"],
        target,
    )
    backbone = instantiate(_fresh_backbone_cfg(cfg))
    datamodule = SFTDataModule(
        backbone.tokenizer,
        TaskSource(task, num_train=recipe["num_train"], num_val=256, num_test=256, seed=cfg.seed),
        batch_size=recipe["batch_size"],
        eval_batch_size=256,
        max_length=recipe["max_length"],
        seed=cfg.seed,
    )
    module = CausalLMModule(
        backbone,
        optimizer=functools.partial(torch.optim.AdamW, lr=recipe["lr"], weight_decay=0.01),
        scheduler=one_cycle,
        generation={"max_new_tokens": 64},
    )
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    trainer = pl.Trainer(
        accelerator=cfg.trainer.get("accelerator", "auto"),
        devices=1,
        max_epochs=recipe["max_epochs"],
        logger=pl.loggers.CSVLogger(str(tmp), name="csv", version=""),
        callbacks=[auto_progress(log_every_n_steps=100)],
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        gradient_clip_val=1.0,
        enable_model_summary=False,
    )
    with torch.random.fork_rng():
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        trainer.fit(module, datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    module.export_pretrained(tmp)
    (tmp / "base_policy.json").write_text(json.dumps({"task": task.describe(), "metrics": metrics}, indent=2))
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, target)
    log.info("base policy ready at %s (val/exact_match=%.3f)", target, metrics.get("val/exact_match", float("nan")))
    return target
