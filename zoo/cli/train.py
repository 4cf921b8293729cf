"""``python train.py`` / ``zoo-train``: compose ``pkg://zoo.conf/train.yaml`` and run one stage.

Errors a researcher can act on (unknown options, malformed data, missing checkpoints, NaN losses, two
training methods in one run) are printed as one message, without a traceback through Hydra internals,
and the process exits with status 2.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zoo.artifacts import artifacts_mark, artifacts_used
from zoo.catalogue import KINDS, check_entries
from zoo.errors import CheckpointNotFoundError, ConfigError, ZooError

log = logging.getLogger("zoo")
METHOD_KINDS = KINDS
STAGES = ("fit", "validate", "test", "predict")


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as a plain resolved dict, without the ``hydra`` node (present when composed in tests)."""
    return {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in cfg.items()
        if key != "hydra"
    }


def check_methods(cfg: DictConfig) -> dict[str, Any]:
    """Validate the ``methods`` block contributed by ``+method=...`` files (the catalogue fields of
    :mod:`zoo.catalogue`, one message per problem); at most one ``kind: module``."""
    node = cfg.get("methods")
    methods = OmegaConf.to_container(node, resolve=True) if node else {}
    check_entries(methods)
    for name, info in methods.items():
        if info["status"] == "experimental":
            log.warning("method '%s' is experimental (%s)", name, info["paper"])
    modules = [name for name, info in methods.items() if info["kind"] == "module"]
    if len(modules) > 1:
        raise ConfigError(
            f"methods {modules} each replace the training module (kind: module); a run takes at most one of them. "
            "Stack one module method with callback methods instead, e.g. +method=[grpo,safethink]"
        )
    return methods


def instantiate_named(node: DictConfig | None) -> list[Any]:
    """Instantiate a dict of named ``_target_`` entries (callbacks, loggers); ``null`` entries are skipped."""
    if not node:
        return []
    return [instantiate(value) for _, value in node.items() if value is not None and "_target_" in value]


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """``null`` -> None; ``last`` -> ``<run dir>/checkpoints/last.ckpt``; else the path (must exist)."""
    ckpt = cfg.get("ckpt_path")
    if ckpt in (None, "", "none"):
        return None
    path = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt" if ckpt == "last" else Path(ckpt).expanduser()
    if not path.is_file():
        hint = (
            " (resume a run by reusing its run_id: python train.py run_id=<id> ckpt_path=last)"
            if ckpt == "last"
            else ""
        )
        raise CheckpointNotFoundError(f"ckpt_path={ckpt}: no checkpoint at {path.resolve()}{hint}")
    return str(path)


def git_commit(root: Path) -> dict[str, Any]:
    """The repository commit (and whether the tree is dirty) of the code that ran."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10)
        return {"commit": sha.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _is_rank_zero() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0"


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine_info() -> dict[str, Any]:
    """The machine a run ran on: CPU model and cores, torch/OpenMP threads, accelerator, load average at start."""
    import torch

    processor = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            processor = next((ln.split(":", 1)[1].strip() for ln in handle if ln.startswith("model name")), processor)
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "processor": processor or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": load,
    }


def save_run_info(cfg: DictConfig) -> None:
    """Write the resolved config, the overrides, the git commit, versions, the machine and the start time to the run
    directory (``resolved_config.yaml``, ``run_info.json``)."""
    if not _is_rank_zero():
        return
    import lightning
    import torch
    import transformers

    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "resolved_config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved(cfg))))
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    info = {
        "overrides": overrides,
        "argv": sys.argv,
        "started_at": _now(),
        "machine": machine_info(),
        **git_commit(Path(cfg.paths.root_dir)),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "transformers": transformers.__version__,
            "hydra": hydra.__version__,
        },
    }
    (out / "run_info.json").write_text(json.dumps(info, indent=2))


def finish_run_info(cfg: DictConfig, start: float, artifacts_mark: int) -> None:
    """Add the finish time, the wall time and the artifacts the run used (:func:`zoo.artifacts.artifacts_used`) to
    ``run_info.json``."""
    path = Path(cfg.paths.output_dir) / "run_info.json"
    if not _is_rank_zero() or not path.is_file():
        return
    info = json.loads(path.read_text())
    info.update(
        finished_at=_now(),
        wall_seconds=round(time.monotonic() - start, 1),
        artifacts=artifacts_used(artifacts_mark),
    )
    path.write_text(json.dumps(info, indent=2))


def check_slurm(cfg: DictConfig) -> None:
    """Under SLURM, one task per device is required (a mismatch misbehaves silently otherwise)."""
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE")
    devices = cfg.trainer.get("devices")
    if tasks and isinstance(devices, int) and int(tasks) != devices:
        raise ConfigError(f"SLURM_NTASKS_PER_NODE={tasks} but trainer.devices={devices}; they must match")


def build(cfg: DictConfig) -> tuple[pl.LightningModule, pl.LightningDataModule, pl.Trainer]:
    """Instantiate backbone, quantizer, datamodule, module, callbacks, loggers and trainer from ``cfg``."""
    if cfg.get("backbone") is None:
        return build_without_backbone(cfg)
    from zoo.cli.bootstrap import resolve_init_from

    resolve_init_from(cfg)
    # _convert_="all": plain dicts/lists reach the objects (checkpoints then hold no OmegaConf types and load with
    # torch.load(weights_only=True)).
    backbone = instantiate(cfg.backbone, _convert_="all")
    quantizer = instantiate(cfg.quant, _convert_="all")
    datamodule = instantiate(cfg.datamodule, tokenizer=backbone.tokenizer, _convert_="all")
    module = instantiate(cfg.module, backbone=backbone, quantizer=quantizer, _convert_="all")
    module.run_config = resolved(cfg)
    return module, datamodule, build_trainer(cfg)


def build_without_backbone(cfg: DictConfig) -> tuple[pl.LightningModule, pl.LightningDataModule, pl.Trainer]:
    """``backbone: none`` (episode methods: agents, environments): no model, no tokenizer, no quantizer."""
    try:
        datamodule = instantiate(cfg.datamodule, _convert_="all")
        module = instantiate(cfg.module, _convert_="all")
    except InstantiationException as err:
        if "'backbone'" in str(err) or "'tokenizer'" in str(err):
            raise ConfigError(
                f"backbone=none builds no model and no tokenizer, but datamodule={cfg.datamodule.get('_target_')} / "
                f"module={cfg.module.get('_target_')} need them; choose a backbone (backbone=tiny or hf) or an "
                "episode method (+method=ultrahorizon)"
            ) from err
        raise
    module.run_config = resolved(cfg)
    return module, datamodule, build_trainer(cfg)


def build_trainer(cfg: DictConfig) -> pl.Trainer:
    """The trainer with the named callbacks and loggers of ``cfg``."""
    callbacks = instantiate_named(cfg.get("callbacks"))
    loggers = instantiate_named(cfg.get("logger"))
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)


def run(cfg: DictConfig) -> dict[str, float]:
    """Run ``cfg.stage`` and return the final metrics."""
    if cfg.stage not in STAGES:
        raise ConfigError(f"stage={cfg.stage!r}; use one of {STAGES}")
    check_methods(cfg)
    check_slurm(cfg)
    start, mark = time.monotonic(), artifacts_mark()
    pl.seed_everything(cfg.seed, workers=True)
    save_run_info(cfg)
    ckpt_path = resolve_ckpt_path(cfg)
    module, datamodule, trainer = build(cfg)
    if cfg.stage == "fit":
        trainer.fit(module, datamodule, ckpt_path=ckpt_path)
        if cfg.get("export") and trainer.is_global_zero and not trainer.fast_dev_run:
            path = module.export_pretrained(Path(cfg.paths.output_dir) / "export")
            log.info("exported the trained %s to %s", type(module).__name__, path)
    elif cfg.stage == "validate":
        trainer.validate(module, datamodule, ckpt_path=ckpt_path)
    elif cfg.stage == "test":
        trainer.test(module, datamodule, ckpt_path=ckpt_path)
    else:
        predictions = trainer.predict(module, datamodule, ckpt_path=ckpt_path)
        write_predictions(predictions or [], Path(cfg.paths.output_dir) / "predictions.jsonl")
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    finish_run_info(cfg, start, mark)
    if trainer.is_global_zero:
        summary = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if not k.startswith(("train/", "lr-")))
        print(f"[zoo] {cfg.stage} done in {cfg.paths.output_dir}: {summary}")
    return metrics


def write_predictions(batches: list[dict[str, Any]], path: Path) -> None:
    """Predictions (generation-protocol dicts) as JSONL: prompt, completion and meta per row."""
    with path.open("w") as handle:
        for batch in batches:
            meta = batch.get("meta", {})
            for i, text in enumerate(batch.get("texts", [])):
                row = {"completion": text, **{k: v[i] for k, v in meta.items() if isinstance(v, list)}}
                handle.write(json.dumps(row) + "\n")


def user_message(err: BaseException) -> str | None:
    """The one-line message for an error a researcher can act on (None: a bug, keep the traceback)."""
    seen = err
    while seen is not None:
        if isinstance(seen, ZooError):
            return str(seen)
        if isinstance(seen, OmegaConfBaseException):
            return str(seen).strip().splitlines()[0] + _full_key(seen)
        if isinstance(seen, InstantiationException) and seen.__cause__ is None:
            return str(seen).strip()
        seen = seen.__cause__ or seen.__context__
    return None


def _full_key(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None)
    return f" (config key: {key})" if key else ""


def task_function(cfg: DictConfig) -> float | None:
    """The Hydra task: run, print actionable errors plainly, return the optimized metric for sweepers."""
    try:
        metrics = run(cfg)
    except Exception as err:
        message = user_message(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    metric = cfg.get("optimized_metric")
    return metrics.get(metric) if metric else None


def main() -> None:
    """Console entry point (``zoo-train``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    hydra.main(config_path="pkg://zoo.conf", config_name="train", version_base="1.3")(task_function)()


if __name__ == "__main__":
    main()
