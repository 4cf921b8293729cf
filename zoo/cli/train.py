"""``python train.py`` / ``zoo-train``: compose ``pkg://zoo.conf/train.yaml`` and run one stage.

Errors a researcher can act on (unknown options or keys, malformed data, missing or corrupt checkpoints, NaN losses,
an unwritable output directory, two training methods in one run) are printed as one message (``error: ...``),
without a traceback through Hydra internals, and the process exits with status 2; a run directory that the failed
launch created is removed. Inputs are checked before anything is written to the run directory where that is
possible (the optimizer's settings, the checkpoint to resume, the data files).

A run stopped by SIGINT/SIGTERM writes ``last.ckpt`` at the end of its current step (:class:`zoo.callbacks.RunGuard`),
prints the command that resumes it and exits with status 128 + the signal number. A run resumed in its own directory
(``run_id=<id> ckpt_path=last``) appends to its metrics and keeps the files of its earlier launches
(``run_info.<n>.json``, ``resolved_config.<n>.yaml``).
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import inspect
import json
import logging
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, HydraException, InstantiationException
from hydra.types import RunMode
from hydra.utils import get_object, instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from zoo.artifacts import artifacts_mark, artifacts_used
from zoo.callbacks.run_guard import describe_checkpoint, last_checkpoint_path
from zoo.catalogue import check_entries, method_entries, method_stages, option_refusals, stack_problems
from zoo.checkpoints import read_checkpoint
from zoo.cli.artifacts import APP
from zoo.cli.collectives import collective_timeout
from zoo.cli.help import render_help, wants_help
from zoo.cli.prerequisites import prepare
from zoo.cli.resolvers import register_resolvers
from zoo.errors import (
    CheckpointNotFoundError,
    ConfigError,
    DiskFullError,
    NaNLossError,
    RunInterrupted,
    ZooError,
)

log = logging.getLogger("zoo")
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
    :mod:`zoo.catalogue`, one message per problem); a stack of methods that cannot share a run is one message naming
    the two methods and why (:func:`zoo.catalogue.stack_problems`); a backbone or quantizer that a method refuses
    (``methods.<name>.refuses``) is an error naming the reason and what does work; one that it does not declare is
    warned about once (:func:`warn_undeclared_options`)."""
    node = cfg.get("methods")
    methods = OmegaConf.to_container(node, resolve=True) if node else {}
    check_entries(methods)
    for name, info in methods.items():
        if info["status"] == "experimental":
            log.warning("method '%s' is experimental (%s)", name, info["paper"])
    if len(methods) > 1:
        stage_chosen = any(o.split("=", 1)[0].lstrip("+~") == "stage" for o in task_overrides())
        problems = stack_problems(methods, method_stages(), stage_chosen)
        if problems:
            raise ConfigError("; ".join(problems))
    # a backbone or quantizer a method refuses (methods.<name>.refuses) is an error naming why; undeclared: a warning
    refused = [msg for name, info in methods.items() for msg in option_refusals(name, info, selected_options(cfg))]
    if refused:
        raise ConfigError("; ".join(refused))
    warn_undeclared_options(cfg, methods)
    return methods


_UNDECLARED_WARNED: set[tuple[str, ...]] = set()


def selected_options(cfg: DictConfig) -> dict[str, str]:
    """The config group options the run selected (``backbone``, ``quant``, ...): Hydra's runtime choices."""
    if "hydra" in cfg:
        choices = OmegaConf.select(cfg, "hydra.runtime.choices")
    else:
        choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else None
    return {str(k): str(v) for k, v in (choices or {}).items() if v is not None}


def warn_undeclared_options(cfg: DictConfig, methods: dict[str, Any]) -> None:
    """Warn (once per run directory) when the run's backbone or quantizer is not among those a method declares
    (``methods.<name>.backbones`` / ``.quantizers``: the pairs the catalogue's smoke test runs): the pair may work,
    but nothing tested it."""
    choices = selected_options(cfg)
    for name, info in methods.items():
        for group, field in (("backbone", "backbones"), ("quant", "quantizers")):
            option = choices.get(group)
            key = (str(OmegaConf.select(cfg, "paths.output_dir", default="")), name, group, str(option))
            if option is None or option in info[field] or key in _UNDECLARED_WARNED:
                continue
            _UNDECLARED_WARNED.add(key)
            log.warning(
                "method '%s' does not declare %s=%s: methods.%s.%s lists %s, the pairs that tests/test_catalogue.py "
                "runs; this combination is untested",
                name,
                group,
                option,
                name,
                field,
                info[field],
            )


def command_line_stack_problems(argv: list[str]) -> list[str]:
    """The conflicts (:func:`zoo.catalogue.stack_problems`) of the method stacks on a command line
    (``+method=[a,b]``, also inside a sweep), for a composition that failed before :func:`check_methods` could run;
    empty when there is none or the command line does not parse."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
        entries = method_entries()
    except (HydraException, ZooError, OSError):
        return []
    stacks = []
    for override in overrides:
        if override.key_or_group == "method":
            value = override.value()
            values = value.list if isinstance(value, ChoiceSweep) else [value]
            stacks += [[str(v) for v in stack] for stack in values if isinstance(stack, list)]
    stage_chosen = any(o.key_or_group == "stage" for o in overrides)
    problems: list[str] = []
    for stack in stacks:
        if len(stack) > 1 and all(name in entries for name in stack):
            found = stack_problems({n: entries[n] for n in stack}, method_stages(), stage_chosen)
            problems += [p for p in found if p not in problems]
    return problems


def instantiate_named(node: DictConfig | None) -> list[Any]:
    """Instantiate a dict of named ``_target_`` entries (callbacks, loggers); ``null`` entries are skipped."""
    if not node:
        return []
    return [instantiate(value) for _, value in node.items() if value is not None and "_target_" in value]


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """``null`` -> None; ``last`` -> ``<run dir>/checkpoints/last.ckpt``; else the path (must exist and be a readable
    checkpoint: a truncated or corrupt file is reported here, before anything is written)."""
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
    read_checkpoint(path, what=f"ckpt_path={ckpt}")
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


def keep_previous(path: Path) -> Path | None:
    """Move the file of an earlier launch in this run directory to ``<stem>.<n><suffix>`` (``n`` = 1, 2, ...: the
    launches in order) so that the new launch does not overwrite it; returns where it went."""
    if not path.exists():
        return None
    number = 1
    while (target := path.with_name(f"{path.stem}.{number}{path.suffix}")).exists():
        number += 1
    path.rename(target)
    return target


def is_rank_zero() -> bool:
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("RANK", "0") == "0"


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def machine_info() -> dict[str, Any]:
    """The machine a run ran on: CPU model and cores, torch/OpenMP threads, accelerator, load average at start."""
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
    directory (``resolved_config.yaml``, ``run_info.json``); the files of an earlier launch in the same directory (a
    resumed run) are kept as ``run_info.<n>.json`` and ``resolved_config.<n>.yaml``."""
    if not is_rank_zero():
        return
    import lightning
    import transformers

    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    earlier = keep_previous(out / "run_info.json")
    keep_previous(out / "resolved_config.yaml")
    (out / "resolved_config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(resolved(cfg))))
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    info = {
        "overrides": overrides,
        "argv": sys.argv,
        "stage": cfg.stage,
        "ckpt_path": cfg.get("ckpt_path"),
        "launch": 1 if earlier is None else int(earlier.stem.rsplit(".", 1)[1]) + 1,
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


def finish_run_info(
    cfg: DictConfig, start: float, artifacts_mark: int, metrics: dict[str, float] | None = None
) -> None:
    """Add the finish time, the wall time, the artifacts the run used (:func:`zoo.artifacts.artifacts_used`) and its
    final metrics (returned again when a resumed sweep skips the finished job) to ``run_info.json``."""
    path = Path(cfg.paths.output_dir) / "run_info.json"
    if not is_rank_zero() or not path.is_file():
        return
    info = json.loads(path.read_text())
    info.update(
        finished_at=_now(),
        wall_seconds=round(time.monotonic() - start, 1),
        artifacts=artifacts_used(artifacts_mark),
        metrics=metrics or {},
    )
    path.write_text(json.dumps(info, indent=2))


def check_slurm(cfg: DictConfig) -> None:
    """Under SLURM, one task per device is required (a mismatch misbehaves silently otherwise)."""
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE")
    devices = cfg.trainer.get("devices")
    if tasks and isinstance(devices, int) and int(tasks) != devices:
        raise ConfigError(f"SLURM_NTASKS_PER_NODE={tasks} but trainer.devices={devices}; they must match")


def check_strategy(cfg: DictConfig) -> None:
    """DeepSpeed is refused: under its precision plugin Lightning's ``clip_gradients`` does nothing, so the GRPO
    family (which clips in its manual optimization) would train unclipped without a word; FSDP shards instead."""
    strategy = cfg.get("trainer", {}).get("strategy")
    named = strategy.get("_target_", "") if isinstance(strategy, Mapping) else strategy
    if "deepspeed" in str(named or "").lower():
        raise ConfigError(
            f"trainer.strategy={named}: DeepSpeed is not supported (under its precision plugin gradient clipping is a "
            "no-op, so training would silently run unclipped); shard with trainer=fsdp, or replicate with trainer=ddp"
        )


def build(cfg: DictConfig) -> tuple[pl.LightningModule, pl.LightningDataModule, pl.Trainer]:
    """The prerequisites ``cfg`` declares (:func:`zoo.cli.prerequisites.prepare`, each its own run), then the
    objects of :func:`build_objects` (for Python callers; :func:`run` prepares before its job)."""
    prepare(cfg, run_job)
    return build_objects(cfg)


def build_objects(cfg: DictConfig) -> tuple[pl.LightningModule, pl.LightningDataModule, pl.Trainer]:
    """Instantiate backbone, quantizer, datamodule, module, callbacks, loggers and trainer from ``cfg`` (its
    prerequisites already built)."""
    if cfg.get("backbone") is None:
        return build_without_backbone(cfg)
    # _convert_="all": plain dicts/lists reach the objects (checkpoints then hold no OmegaConf types and load with
    # torch.load(weights_only=True)).
    backbone = instantiate(cfg.backbone, _convert_="all")
    backbone.check_init_from()  # a missing or corrupt checkpoint is reported before anything is written
    quantizer = instantiate(cfg.quant, _convert_="all")
    datamodule = instantiate(cfg.datamodule, tokenizer=backbone.tokenizer, _convert_="all")
    if hasattr(datamodule, "set_context_length"):
        datamodule.set_context_length(backbone.context_length())
    module = instantiate(cfg.module, backbone=backbone, quantizer=quantizer, _convert_="all")
    module.run_config = resolved(cfg)
    warn_random_init(cfg, backbone, quantizer)
    return module, datamodule, build_trainer(cfg)


def warn_random_init(cfg: DictConfig, backbone: Any, quantizer: Any) -> None:
    """Say loudly when a run evaluates or quantizes a randomly initialised model (no ``init_from``, no checkpoint),
    whose numbers measure nothing but noise."""
    if cfg.stage == "fit" or cfg.get("ckpt_path") not in (None, "", "none"):
        return
    if backbone.init_from is not None or backbone.source_pretrained() is not None:
        return
    what = f"quantizes (quant={quantizer.name}) and evaluates" if quantizer.name != "none" else "evaluates"
    log.warning(
        "stage=%s %s a randomly initialised %s (backbone.init_from is null and no ckpt_path): its numbers measure "
        "noise. Start from a trained model: backbone.init_from=base (the cached base SFT policy of the task), an "
        "exported directory or a .ckpt",
        cfg.stage,
        what,
        type(backbone).__name__,
    )


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
    try:
        return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    except InstantiationException as err:
        if not isinstance(err.__cause__, MisconfigurationException):  # a value Lightning refuses, e.g. devices=0
            raise
        raise ConfigError(trainer_message(cfg, err.__cause__)) from None


def trainer_message(cfg: DictConfig, cause: Exception) -> str:
    """``trainer.max_steps=-2: ...`` for a trainer setting that Lightning refuses (the settings its message names)."""
    text = str(cause).strip()
    named = [key for key in cfg.trainer if isinstance(key, str) and re.search(rf"\b{re.escape(key)}\b", text)]
    where = ", ".join(f"trainer.{key}={OmegaConf.select(cfg.trainer, key)}" for key in named) or "trainer"
    return f"{where}: {text}"


def check_optimizer(cfg: DictConfig) -> None:
    """Build the configured optimizer on a dummy parameter, so that a value it refuses (``module.optimizer.lr=nan``,
    a negative weight decay, ...) is reported before anything is built or written."""
    node = OmegaConf.select(cfg, "module.optimizer")
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return
    try:
        factory = instantiate(node, _convert_="all")
        factory([torch.nn.Parameter(torch.zeros(1))])
    except Exception as err:  # only a refused value is reported here; anything else is left to the run
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ is not None else err
        values = {k: v for k, v in node.items() if k not in ("_target_", "_partial_")}
        if isinstance(cause, TypeError):
            # a value of the wrong type (module.optimizer.lr=abc): name the settings whose default is a number
            try:
                defaults = {
                    name: p.default for name, p in inspect.signature(get_object(node._target_)).parameters.items()
                }
            except (ValueError, TypeError, ImportError, AttributeError):
                defaults = {}
            wrong = [
                f"module.optimizer.{k}={v!r}"
                for k, v in values.items()
                if isinstance(v, str) and isinstance(defaults.get(k), (int, float)) and not isinstance(v, bool)
            ]
            if wrong:
                raise ConfigError(
                    f"{', '.join(wrong)} must be a number ({node._target_} refused it: {cause})"
                ) from None
        if not isinstance(cause, ValueError):
            return
        raise ConfigError(f"module.optimizer ({node._target_}): {cause} (settings: {values})") from None


def check_seed(cfg: DictConfig) -> None:
    """``seed`` must be a whole number that numpy and Lightning accept (0 .. 2**32 - 1), or null (a random one)."""
    seed = cfg.get("seed")
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"seed={seed!r} must be a whole number from 0 to 4294967295 (e.g. seed=0)")


def check_config(cfg: DictConfig) -> None:
    """The checks of a run's settings that build nothing (stage, methods, SLURM, optimizer)."""
    if cfg.stage not in STAGES:
        raise ConfigError(f"stage={cfg.stage!r}; use one of {STAGES}")
    check_methods(cfg)
    check_slurm(cfg)
    check_strategy(cfg)
    check_seed(cfg)
    check_optimizer(cfg)
    if not isinstance(cfg.get("flush_denormal", True), bool):
        raise ConfigError(f"flush_denormal={cfg.flush_denormal!r} must be true or false")


def run(cfg: DictConfig) -> dict[str, float]:
    """Build the prerequisites ``cfg`` declares, each as its own run of :func:`run_job`, one after the other
    (:func:`zoo.cli.prerequisites.prepare`), then run ``cfg``'s job; return its final metrics."""
    check_config(cfg)  # a bad setting fails before any prerequisite is built
    start, mark = time.monotonic(), artifacts_mark()
    prepare(cfg, run_job)
    return run_job(cfg, start=start, mark=mark)


def flushing_denormals() -> bool:
    """Whether this process flushes denormal floats to zero now (torch has no getter: probed by one multiplication)."""
    return (torch.tensor([1e-39]) * 1.0).item() == 0.0


@contextlib.contextmanager
def float_mode(cfg: DictConfig) -> Iterator[None]:
    """Within the block, flush denormal floats to zero on the CPU when ``cfg.flush_denormal`` is set (the default):
    arithmetic on values below ``torch.finfo(torch.float32).tiny`` is many times slower on x86, and a model that has
    grown confident produces many. The process's earlier mode is restored after (runs in one process, e.g. tests,
    do not leak it)."""
    flush = bool(cfg.get("flush_denormal", True))
    previous = flushing_denormals()
    if not torch.set_flush_denormal(flush) and flush:
        log.info("this CPU cannot flush denormal floats to zero (flush_denormal=true has no effect)")
    try:
        yield
    finally:
        torch.set_flush_denormal(previous)


def run_job(cfg: DictConfig, start: float | None = None, mark: int | None = None) -> dict[str, float]:
    """Run ``cfg.stage`` of a config whose prerequisites are built (:func:`run` does that first) and return the final
    metrics; ``start``/``mark``: when the run began and where its record of used artifacts starts. Runs in the
    config's floating-point mode (:func:`float_mode`)."""
    check_config(cfg)
    with float_mode(cfg):
        return _run_stage(cfg, start, mark)


def _run_stage(cfg: DictConfig, start: float | None, mark: int | None) -> dict[str, float]:
    """:func:`run_job` after its checks, in the config's floating-point mode."""
    start = time.monotonic() if start is None else start
    mark = artifacts_mark() if mark is None else mark
    ckpt_path = resolve_ckpt_path(cfg)
    pl.seed_everything(cfg.seed, workers=True)
    module, datamodule, trainer = build_objects(cfg)
    if hasattr(datamodule, "setup"):
        # build the datasets now (Lightning reuses them): malformed data fails before the run directory is written
        datamodule.setup(cfg.stage)
    check_against_data(cfg, module, datamodule, trainer)
    save_run_info(cfg)
    if cfg.stage == "fit":
        fit(cfg, module, datamodule, trainer, ckpt_path)
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
    finish_run_info(cfg, start, mark, metrics)
    if trainer.is_global_zero:
        print(f"[zoo] {cfg.stage} done in {cfg.paths.output_dir}: {summary_text(cfg, trainer, metrics)}")
    return metrics


def check_against_data(cfg: DictConfig, module: Any, datamodule: Any, trainer: pl.Trainer) -> None:
    """The settings that can only be checked against the data the stage will use, checked before the run directory
    is written: the module's own checks (``module.check_data(datamodule, stage)``, e.g. a generating module's prompt
    lengths + ``max_new_tokens`` against the context) and, for a fit, the number of training batches."""
    check = getattr(module, "check_data", None)
    if callable(check):
        check(datamodule, cfg.stage)
    if cfg.stage == "fit":
        check_training_batches(trainer, datamodule)


def check_training_batches(trainer: pl.Trainer, datamodule: Any) -> None:
    """A fit with no training batch at all, or with ``trainer.val_check_interval`` (a number of batches) above the
    batches of an epoch while validation counts epochs (``check_val_every_n_epoch`` set), is one message naming the
    settings: Lightning otherwise stops with "No training batches" and exit status 0, or raises at the start of the
    fit, after the run directory was written."""
    if trainer.world_size > 1 or not hasattr(datamodule, "train_dataloader"):
        return  # each rank's share is Lightning's to count
    try:
        loader = datamodule.train_dataloader()
        batches = len(loader)
    except (TypeError, NotImplementedError, MisconfigurationException):
        return  # an iterable dataset (no length), or no training loader of its own
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        batches = min(batches, limit)
    elif isinstance(limit, float) and limit < 1.0:
        batches = int(batches * limit)
    rows = len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
    size = getattr(loader, "batch_size", None)
    source = f"{rows} training rows at datamodule.batch_size={size}" if rows is not None and size else "the data"
    if limit not in (1.0, None) and not trainer.fast_dev_run:
        source += f", trainer.limit_train_batches={limit}"
    if batches == 0 and not trainer.fast_dev_run:
        raise ConfigError(
            f"no training batch: {source} (an incomplete last batch is dropped); lower datamodule.batch_size or add "
            "training rows"
        )
    interval = trainer.val_check_interval
    if isinstance(interval, int) and interval > batches > 0 and trainer.check_val_every_n_epoch is not None:
        raise ConfigError(
            f"trainer.val_check_interval={interval} is more than the {batches} training batches of an epoch "
            f"({source}), so no validation would run. Use trainer.val_check_interval<={batches}, a fraction of an "
            f"epoch (e.g. 1.0), or trainer.check_val_every_n_epoch=null to validate every {interval} steps across "
            "epochs"
        )


def fit(
    cfg: DictConfig, module: pl.LightningModule, datamodule: Any, trainer: pl.Trainer, ckpt_path: str | None
) -> None:
    """``trainer.fit``, with an interruption or a non-finite value reported with what to do next."""
    try:
        trainer.fit(module, datamodule, ckpt_path=ckpt_path)
    except RunInterrupted as err:
        raise RunInterrupted(f"{err}. {resume_advice(cfg, trainer)}", err.exit_code) from None
    except DiskFullError as err:  # a checkpoint met a full disk (zoo.checkpoints.atomic_save): the previous one is kept
        raise DiskFullError(f"{err}. {resume_advice(cfg, trainer)}") from None
    except SIGTERMException:  # Lightning's own SIGTERM stop (no RunGuard in the callbacks, or before training)
        raise RunInterrupted(
            f"interrupted by SIGTERM at global step {trainer.global_step}, outside a training step: no checkpoint "
            f"was written now. {resume_advice(cfg, trainer)}",
            exit_code=128 + signal.SIGTERM,
        ) from None
    except NaNLossError as err:
        raise NaNLossError(f"{err}. {nan_advice(cfg, module, trainer)}") from None
    except RuntimeError as err:  # a collective that waited past the process group's timeout: one line, exit 2
        timed_out = collective_timeout(err, OmegaConf.select(cfg, "trainer.strategy.timeout.minutes", default=None))
        if timed_out is None:
            raise
        raise timed_out from None
    except ValueError as err:
        schedule_end = re.fullmatch(
            r"Tried to step (\d+) times?\. The specified number of total steps is (\d+)", str(err)
        )
        if schedule_end is None or ckpt_path is None:
            raise
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path}: the learning-rate schedule restored from the checkpoint ends after "
            f"{schedule_end.group(2)} steps (it was planned for the trainer.max_epochs/max_steps of the run that "
            "wrote it), so the resumed run cannot train past it. Resume with the original trainer.max_epochs/"
            "max_steps, or start a new run from its weights: backbone.init_from=<the checkpoint>"
        ) from None


def program() -> str:
    """How this app was launched, for the commands printed in messages."""
    argv0 = sys.argv[0] if sys.argv else ""
    return "zoo-train" if Path(argv0).name == "zoo-train" else "python train.py"


def task_overrides(drop: tuple[str, ...] = ()) -> list[str]:
    """The run's command-line overrides (without those setting a key in ``drop``)."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in drop]


def command(overrides: list[str]) -> str:
    return " ".join([program(), *(shlex.quote(o) for o in overrides)])


def follow_up(settings: list[str]) -> str:
    """A command that runs the composed config of this run again with ``settings`` added (``stage=validate
    ckpt_path=<its last.ckpt>``, ...): the run's own overrides (its method, presets, data, callbacks) minus those that
    name this launch (``stage``, ``ckpt_path``, ``run_id``, ``overwrite``) or that ``settings`` replace; it runs in
    a run directory of its own."""
    replaced = {s.split("=", 1)[0].lstrip("+~") for s in settings}
    return command([*task_overrides(("stage", "ckpt_path", "run_id", "overwrite", *replaced)), *settings])


def run_location(cfg: DictConfig) -> str:
    """The override that puts a new launch in this run's directory: ``run_id=<id>`` where that is enough."""
    output = Path(cfg.paths.output_dir).resolve()
    default = (Path(cfg.paths.log_dir) / str(cfg.task_name) / "runs" / str(cfg.run_id)).resolve()
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    return f"run_id={cfg.run_id}" if output == default and not multirun else f"hydra.run.dir={output}"


def resume_advice(cfg: DictConfig, trainer: pl.Trainer) -> str:
    last = last_checkpoint_path(trainer)
    if last is None or not last.is_file():
        return "There is no checkpoint to resume from; start the run again"
    resume = command([*task_overrides(("run_id", "ckpt_path", "hydra.run.dir")), run_location(cfg), "ckpt_path=last"])
    sweep = sweep_resume_command()
    rest = f". Resume the whole sweep (finished jobs are skipped, the others resume or start): {sweep}" if sweep else ""
    return f"Resume with: {resume}{rest}"


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def sweep_resume_command() -> str | None:
    """In a multirun job: the command that runs the sweep again in its directory with ``ckpt_path=last`` (its own
    overrides from ``multirun.yaml``; see :func:`sweep_job`)."""
    if not in_multirun():
        return None
    sweep_dir = Path(str(HydraConfig.get().sweep.dir)).resolve()
    saved = sweep_dir / "multirun.yaml"
    task, extra = [], []
    if saved.is_file():
        overrides = OmegaConf.load(saved).hydra.overrides
        task = [o for o in overrides.task if o.split("=", 1)[0].lstrip("+~") not in ("ckpt_path", "overwrite")]
        skip = ("hydra.mode", "hydra.sweep.dir", "hydra.run.dir")
        extra = [o for o in overrides.hydra if o.split("=", 1)[0] not in skip]
    return command(["-m", *task, *extra, f"hydra.sweep.dir={sweep_dir}", "ckpt_path=last"])


def sweep_job(cfg: DictConfig) -> dict[str, float] | None:
    """A job of a resumed sweep (``-m ... hydra.sweep.dir=<it> ckpt_path=last``): the final metrics of a job that
    finished earlier with the same overrides (it is skipped); otherwise ``None``, after setting ``ckpt_path`` to null
    for a job that wrote no checkpoint (it starts). A job that ran with other overrides is refused."""
    if not in_multirun() or cfg.get("ckpt_path") != "last":
        return None
    output = Path(cfg.paths.output_dir)
    info_path = output / "run_info.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        launch_keys = ("ckpt_path", "overwrite")
        before = [o for o in info.get("overrides") or [] if o.split("=", 1)[0].lstrip("+~") not in launch_keys]
        now = task_overrides(launch_keys)
        if before != now:
            raise ConfigError(
                f"job {HydraConfig.get().job.num} of the sweep in {output} ran with {before}, not {now}: resume the "
                "sweep with its own overrides, or choose another hydra.sweep.dir"
            )
        if info.get("finished_at") and info.get("stage") == cfg.stage:
            print(f"[zoo] job {HydraConfig.get().job.num} finished earlier in {output}: skipped")
            return dict(info.get("metrics") or {})
    if not (output / "checkpoints" / "last.ckpt").is_file():
        log.info("job %s of the sweep wrote no checkpoint in %s: it starts", HydraConfig.get().job.num, output)
        with open_dict(cfg):
            cfg.ckpt_path = None
    return None


def nan_advice(cfg: DictConfig, module: pl.LightningModule, trainer: pl.Trainer) -> str:
    """What to do after a non-finite loss/gradient/weight, true for the settings of this run (ends with a command)."""
    last = last_checkpoint_path(trainer)
    lr = OmegaConf.select(cfg, "module.optimizer.lr", default=None)
    lower = f"module.optimizer.lr={lr / 10:g}" if isinstance(lr, (int, float)) else "module.optimizer.lr=<lower>"
    keep = task_overrides(("run_id", "ckpt_path", "backbone.init_from", "module.optimizer.lr", "hydra.run.dir"))
    clip = cfg.trainer.get("gradient_clip_val") if getattr(module, "automatic_optimization", True) else None
    if not getattr(module, "automatic_optimization", True):
        clipping = ""
    elif clip:
        clipping = f"Gradient clipping is already on (trainer.gradient_clip_val={clip}). "
    else:
        clipping = "Gradient clipping is off: trainer.gradient_clip_val=1.0 may help too. "
    restart = f"Start again with a lower learning rate: {command([*keep, lower])}"
    if last is None or not last.is_file():
        return f"No checkpoint was written before this step. {clipping}{restart}"
    return (
        f"{clipping}{restart}. The last checkpoint with finite values is {describe_checkpoint(last)}; its weights "
        "were trained at this learning rate and may already be unusable (compare its train/loss with the first "
        "ones). To continue from them with a lower learning rate, start a new run from its weights: "
        f"{command([*keep, f'backbone.init_from={last}', lower])} (resuming it with ckpt_path=last would restore its "
        "optimizer state and learning-rate schedule as saved, so a new module.optimizer.lr would not apply)"
    )


def summary_text(cfg: DictConfig, trainer: pl.Trainer, metrics: dict[str, float]) -> str:
    """The final metrics of the stage; after a fit that ran no validation, the last training metrics and why."""
    shown = {k: v for k, v in metrics.items() if not k.startswith(("train/", "lr-"))}
    if shown:
        return " ".join(f"{k}={v:.4f}" for k, v in sorted(shown.items()))
    if cfg.stage != "fit":
        return "no metrics were logged"
    train = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if k.startswith("train/"))
    last = last_checkpoint_path(trainer)
    validate = follow_up(["stage=validate", f"ckpt_path={last}"]) if last is not None and last.is_file() else None
    why = (
        f"trainer.max_steps={trainer.max_steps} ended training at step {trainer.global_step}, before the first "
        "validation"
        if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps
        else "training ended before the first validation"
    )
    hint = f"; validate it with: {validate}" if validate else ""
    return f"{train + ' ' if train else ''}(no validation ran: {why}{hint})"


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
        if isinstance(seen, ConfigCompositionException):
            return composition_message(seen)
        if isinstance(seen, OmegaConfBaseException):
            return str(seen).strip().splitlines()[0] + _full_key(seen)
        if isinstance(seen, InstantiationException) and isinstance(seen.__cause__, TypeError):
            message = signature_message(seen, seen.__cause__)
            if message is not None:
                return message
        if isinstance(seen, InstantiationException) and seen.__cause__ is None:
            return str(seen).strip()
        seen = seen.__cause__ or seen.__context__
    return None


def _full_key(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None)
    return f" (config key: {key})" if key else ""


def closest(name: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)


def unknown_key_message(err: OmegaConfBaseException) -> str:
    """``trainer.max_step: no such key ...; did you mean trainer.max_steps?`` for a key missing from the config."""
    full_key = str(getattr(err, "full_key", "") or getattr(err, "key", ""))
    key = str(getattr(err, "key", "") or full_key.rsplit(".", 1)[-1])
    parent = getattr(err, "parent_node", None)
    prefix = full_key[: -len(key)] if full_key.endswith(key) else ""
    keys = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
    matches = closest(key, keys)
    if matches:
        hint = "did you mean " + " or ".join(f"{prefix}{m}" for m in matches) + "?"
    elif keys:
        shown = sorted(k for k in keys if not k.startswith("_"))
        hint = f"the keys under {prefix.rstrip('.') or 'the top level'} are: {', '.join(shown[:30])}"
    else:
        hint = "check its spelling"
    return (
        f"{full_key}: no such key in the config; {hint} (+{full_key}=... would add it, which only works where the "
        "object it configures accepts it)"
    )


def composition_message(err: ConfigCompositionException) -> str:
    cause = err.__cause__
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and "not in struct" in str(cause):
        return unknown_key_message(cause)
    text = str(err).strip()
    if isinstance(cause, OmegaConfBaseException):
        text += ": " + str(cause).strip().splitlines()[0] + _full_key(cause)
    return text


def signature_message(err: InstantiationException, cause: TypeError) -> str | None:
    """One message for a config node whose keys do not match its ``_target_``'s arguments (an unexpected or a
    missing argument), with the closest argument names; ``None`` for other type errors (bugs)."""
    text = str(cause)
    unexpected = re.search(r"unexpected keyword argument '(\w+)'", text)
    if unexpected is None and "required positional argument" not in text and "required keyword" not in text:
        return None
    target = re.search(r"target '([^']+)'", str(err))
    node = re.search(r"full_key: (\S+)", str(err))
    where = node.group(1) if node else (target.group(1) if target else "a config node")
    if unexpected is None:
        return f"{where}: {text}"
    name = unexpected.group(1)
    hint = ""
    if target is not None:
        try:
            parameters = list(inspect.signature(get_object(target.group(1))).parameters)
        except (ValueError, TypeError, ImportError, AttributeError):
            parameters = []
        matches = closest(name, parameters)
        if matches:
            hint = "; did you mean " + " or ".join(f"{where}.{m}" for m in matches) + "?"
    owner = target.group(1) if target else where
    return f"{where}.{name}: {owner} takes no argument '{name}'{hint}"


def launch_message(err: BaseException) -> str | None:
    """The one-line message for an error raised by Hydra before or around the task (composition, overrides, creating
    the run directory); None for anything else (a bug: keep the traceback)."""
    if isinstance(err, ConfigCompositionException):
        # a stack of methods that cannot share a run often fails to compose (e.g. one method overrides a group the
        # other removed): say which methods conflict and why rather than what Hydra could not override
        stack = command_line_stack_problems(sys.argv[1:])
        return "; ".join(stack) if stack else composition_message(err)
    if isinstance(err, HydraException) and not isinstance(err, InstantiationException):
        return str(err).strip()
    if isinstance(err, OmegaConfBaseException):
        return str(err).strip().splitlines()[0] + _full_key(err)
    if isinstance(err, OSError) and not raised_in_task(err):
        where = f" {err.filename}" if err.filename else ""
        return (
            f"cannot create the run directory{where}: {err.strerror or err}; set paths.log_dir (or ZOO_LOG_DIR) to "
            "a writable directory"
        )
    return user_message(err)


# what a launch writes to its run directory before its stage starts (Hydra's files, then save_run_info's)
HYDRA_FILES = (".hydra",)
RUN_INFO_FILES = ("run_info.json", "resolved_config.yaml")


def holds_only(path: Path, names: tuple[str, ...]) -> bool:
    """Whether the directory ``path`` holds nothing but entries named in ``names`` (and the Hydra job's log)."""
    if not path.is_dir():
        return False
    job_log = f"{HydraConfig.get().job.name}.log" if HydraConfig.initialized() else "train.log"
    return all(entry.name in (*names, job_log) for entry in path.iterdir())


def remove_run_dir(path: Path, stop: Path) -> None:
    """Remove a run directory and its parents that became empty, up to (not including) ``stop``."""
    shutil.rmtree(path, ignore_errors=True)
    parent, stop = path.parent.resolve(), stop.resolve()
    while parent != stop and stop in parent.parents and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def raised_in_task(err: BaseException) -> bool:
    """Whether ``err`` came out of :func:`task_function` (the run itself), not out of Hydra's launch around it (e.g.
    creating the run directory): the task's frame is on its traceback."""
    return any(frame.f_code is task_function.__code__ for frame, _ in traceback.walk_tb(err.__traceback__))


def task_function(cfg: DictConfig) -> float | None:
    """The Hydra task: run, print actionable errors plainly, return the optimized metric for sweepers.

    After an actionable error (exit status 2) the run directory is removed when this launch created it (it held only
    Hydra's own files when the task started) and the stage wrote nothing to it yet (no logs, no checkpoint): a bad
    input leaves nothing behind, a run that failed while training keeps its logs and checkpoints. An earlier run's
    directory is left as it was.
    """
    output = Path(cfg.paths.output_dir)
    fresh = holds_only(output, HYDRA_FILES)
    try:
        skipped = sweep_job(cfg)
        metrics = run(cfg) if skipped is None else skipped
    except RunInterrupted as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except Exception as err:
        message = user_message(err)
        if message is None:
            raise
        if fresh and is_rank_zero() and holds_only(output, (*HYDRA_FILES, *RUN_INFO_FILES)):
            remove_run_dir(output, Path(cfg.paths.log_dir))
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    metric = cfg.get("optimized_metric")
    return metrics.get(metric) if metric else None


# prerequisite builds run through the app's own run and job (zoo.cli.artifacts.APP)
APP.run, APP.job = run, run_job


def main() -> None:
    """Console entry point (``zoo-train``).

    Hydra is asked to raise its errors (``HYDRA_FULL_ERROR=1`` for the call, unless the user set it) so that they are
    reported here as one message with exit status 2: an unknown group option (with the choices), a misspelled key
    (with the closest existing keys), an unwritable output directory. Anything else keeps its traceback.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    register_resolvers()
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        if wants_help(sys.argv[1:]):
            print(render_help(sys.argv[1:]))
            return
        hydra.main(config_path="pkg://zoo.conf", config_name="train", version_base="1.3")(task_function)()
    except Exception as err:
        message = None if full_error else launch_message(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)


if __name__ == "__main__":
    main()
