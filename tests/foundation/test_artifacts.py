"""The artifact cache (``zoo.artifacts.ensure``) and artifacts trained by the normal app (``zoo.cli.artifacts``):
concurrent callers build once, a killed or failing build leaves nothing behind, the key is the composed config of
the build run, the caller's random and Hydra state survive a build, and no Trainer is built outside the CLI."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from zoo.artifacts import ARTIFACT_META, artifact_path, ensure, is_complete, read_meta, spec_key, temporaries
from zoo.errors import ConfigError

from conftest import REPO_ROOT, SMALL_BASE_POLICY

SPEC = {"recipe": {"steps": 3, "lr": 0.001}, "task": "addition"}

# A child process that calls ensure() with a build that records itself, optionally waits for a start signal, marks
# that it started building, and sleeps (so that it can be killed mid-way or raced by others).
CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from zoo.artifacts import ensure

    cache, spec, log_file, go, started, sleep = sys.argv[1:7]
    while go != "-" and not Path(go).exists():
        time.sleep(0.01)

    def build(directory):
        with open(log_file, "a") as handle:
            handle.write("build\\n")
        (directory / "half_written.bin").write_bytes(b"x" * 1000)
        Path(started).touch()
        time.sleep(float(sleep))
        (directory / "payload.txt").write_text("done")
        return {"builder": "child"}

    print(ensure("toy", json.loads(spec), build, cache, name="shared"))
    """
)


def _child(tmp_path: Path, spec: dict, go: str = "-", sleep: float = 0.0, tag: str = "0") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            CHILD,
            str(tmp_path / "cache"),
            json.dumps(spec),
            str(tmp_path / "builds.log"),
            go,
            str(tmp_path / f"started{tag}"),
            str(sleep),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _builds(tmp_path: Path) -> int:
    log_file = tmp_path / "builds.log"
    return len(log_file.read_text().splitlines()) if log_file.exists() else 0


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _write_payload(directory: Path) -> dict:
    (directory / "payload.txt").write_text("done")
    return {"builder": "test"}


# ------------------------------------------------------------------------------------------------------- ensure()


def test_concurrent_callers_build_once(tmp_path):
    go = tmp_path / "go"
    procs = [_child(tmp_path, SPEC, go=str(go), sleep=1.0, tag=str(i)) for i in range(4)]
    time.sleep(0.5)
    go.touch()  # all four call ensure() at about the same time
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    paths = {out.strip().splitlines()[-1] for out, _ in outputs}
    target = artifact_path("toy", SPEC, tmp_path / "cache", "shared")
    assert paths == {str(target)}
    assert _builds(tmp_path) == 1
    assert (target / "payload.txt").read_text() == "done"
    assert read_meta(target)["builder"] == "child"
    assert list(temporaries(target.parent)) == []


def test_a_killed_build_leaves_no_artifact_and_the_next_call_builds_it_anew(tmp_path, caplog):
    proc = _child(tmp_path, SPEC, sleep=600)
    _wait_for(tmp_path / "started0", proc)
    target = artifact_path("toy", SPEC, tmp_path / "cache", "shared")
    (left,) = temporaries(target.parent)
    assert (left / "half_written.bin").is_file()
    # a live build's temporary directory is not touched by another caller
    assert ensure("toy", {"other": 1}, _write_payload, tmp_path / "cache", name="other").is_dir()
    assert left.is_dir()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not target.exists() and not is_complete(target)
    with caplog.at_level(logging.INFO, logger="zoo"):
        path = ensure("toy", SPEC, _write_payload, tmp_path / "cache", name="shared", reason="a test needs it")
    assert path == target and (path / "payload.txt").read_text() == "done"
    assert not (path / "half_written.bin").exists()
    assert not left.exists() and list(temporaries(target.parent)) == []
    assert f"removed {left}, left by an interrupted build" in caplog.text
    assert read_meta(path)["builder"] == "test"


@pytest.mark.parametrize("other_cached", [False, True])
def test_a_dead_builds_temporary_is_removed_by_a_call_for_another_key(tmp_path, other_cached):
    if other_cached:
        ensure("toy", {"other": 1}, _write_payload, tmp_path / "cache", name="other")
    proc = _child(tmp_path, SPEC, sleep=600)
    _wait_for(tmp_path / "started0", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    kind_dir = artifact_path("toy", SPEC, tmp_path / "cache").parent
    assert len(list(temporaries(kind_dir))) == 1
    ensure("toy", {"other": 1}, _write_payload, tmp_path / "cache", name="other")
    assert list(temporaries(kind_dir)) == []


def test_a_failing_build_raises_and_leaves_nothing(tmp_path):
    def broken(directory: Path) -> None:
        (directory / "half_written.bin").write_bytes(b"x")
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        ensure("toy", SPEC, broken, tmp_path, name="shared")
    target = artifact_path("toy", SPEC, tmp_path, "shared")
    assert not target.exists() and list(temporaries(target.parent)) == []
    assert ensure("toy", SPEC, _write_payload, tmp_path, name="shared") == target


def test_an_unwritable_cache_is_one_clear_error(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache should be")
    with pytest.raises(ConfigError, match=r"cannot write the artifact cache .*paths.cache_dir"):
        ensure("toy", SPEC, _write_payload, blocker / "cache")


def test_the_key_is_the_spec_and_the_log_says_what_is_built_why_and_where(tmp_path, caplog):
    calls = []

    def build(directory: Path) -> dict:
        calls.append(directory)
        return _write_payload(directory)

    reordered = {"task": "addition", "recipe": {"lr": 0.001, "steps": 3}}
    assert spec_key(reordered) == spec_key(SPEC)
    with caplog.at_level(logging.INFO, logger="zoo"):
        first = ensure("toy", SPEC, build, tmp_path, name="addition", reason="a test asks for it")
    target = tmp_path.resolve() / "toy" / f"addition-{spec_key(SPEC)}"
    assert first == target
    building = [r.getMessage() for r in caplog.records if "building the toy artifact" in r.getMessage()]
    assert len(building) == 1
    assert "a test asks for it" in building[0] and str(target) in building[0] and calls[0].name in building[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        assert ensure("toy", reordered, build, tmp_path, name="addition") == target
    assert [r.getMessage() for r in caplog.records] == [f"using the cached toy artifact at {target}"]
    assert len(calls) == 1
    changed = ensure("toy", {**SPEC, "recipe": {"steps": 4, "lr": 0.001}}, build, tmp_path, name="addition")
    assert changed != target and len(calls) == 2
    meta = json.loads((target / ARTIFACT_META).read_text())
    assert meta["spec"] == SPEC and meta["reason"] == "a test asks for it" and meta["key"] == spec_key(SPEC)


# ------------------------------------------------------------------------------------------- built by the app


def test_base_policy_key_follows_its_build_config_only(train_cfg):
    from zoo.cli.bootstrap import base_policy_build

    base = base_policy_build(train_cfg([*SMALL_BASE_POLICY]))
    assert base.path.parent.name == "base_policy" and base.path.name.startswith("addition-")
    assert base.config.methods.sft.kind == "module"  # a +method=sft run
    assert base.config.datamodule.source.num_train == 512 and base.config.trainer.max_epochs == 1
    unrelated = [
        "trainer.max_steps=7",
        "module.optimizer.lr=0.5",
        "datamodule.batch_size=3",
        "callbacks=none",
        "backbone.extra_tokens=[x_tok]",
        "trainer.accelerator=auto",
        "quant=bnb_int8",
        "export=false",
    ]
    for option in unrelated:
        assert base_policy_build(train_cfg([*SMALL_BASE_POLICY, option])).path == base.path, option
    assert base_policy_build(train_cfg(["+method=grpo", *SMALL_BASE_POLICY, "task=addition"])).path == base.path
    related = ["base_policy.num_train=256", "base_policy.lr=0.01", "task=reverse", "task.digits=3", "seed=1"]
    related += ["backbone.hidden_size=64"]
    paths = {base_policy_build(train_cfg([*SMALL_BASE_POLICY, option])).path for option in related}
    assert len(paths) == len(related) and base.path not in paths


def test_a_fixed_base_policy_seed_shares_one_policy_across_run_seeds(train_cfg):
    from zoo.cli.bootstrap import base_policy_build

    fixed = [*SMALL_BASE_POLICY, "+base_policy.seed=0"]
    shared = {base_policy_build(train_cfg([*fixed, f"seed={s}"])).path for s in (0, 1, 2)}
    assert len(shared) == 1
    assert shared == {base_policy_build(train_cfg([*SMALL_BASE_POLICY, "seed=0"])).path}  # the key of seed 0
    assert base_policy_build(train_cfg([*fixed[:-1], "+base_policy.seed=1", "seed=0"])).config.seed == 1


def test_catalogue_entries_and_tags_do_not_key_an_artifact(tmp_path):
    from zoo.cli.artifacts import plan_artifact

    def path(*extra: str):
        overrides = ["+method=sft", *SMALL_BASE_POLICY, *extra]
        return plan_artifact("probe", overrides, cache_dir=tmp_path, root_dir=tmp_path).path

    base = path()
    assert path("methods.sft.summary=edited", "methods.sft.benchmark=SFT throughput", "tags=[x]") == base
    assert path("trainer.max_epochs=2") != base


def test_train_artifact_keeps_the_callers_random_and_hydra_state(train_cfg, tmp_path):
    from zoo.cli.bootstrap import ensure_base_policy

    cfg = train_cfg([*SMALL_BASE_POLICY, "base_policy.num_train=128"], cache_dir=tmp_path / "cache")
    hydra_config = HydraConfig.instance().cfg
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):  # as inside `python train.py`
        hydra_app = GlobalHydra.instance().hydra
        torch.manual_seed(123)
        random.seed(4)
        np.random.seed(5)
        states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
        seed_env = os.environ.get("PL_GLOBAL_SEED")
        export = ensure_base_policy(cfg)
        assert torch.equal(torch.get_rng_state(), states[0])
        assert random.getstate() == states[1]
        assert np.array_equal(np.random.get_state()[1], states[2])
        assert os.environ.get("PL_GLOBAL_SEED") == seed_env
        assert GlobalHydra.instance().hydra is hydra_app
    assert HydraConfig.instance().cfg is hydra_config
    # the artifact: the run's export (a working policy), its run files, and the metrics in artifact.json
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export, local_files_only=True)
    assert model.config.hidden_size == cfg.backbone.hidden_size
    artifact = export.parent
    assert (artifact / "resolved_config.yaml").is_file() and not (artifact / "checkpoints").exists()
    assert "val/loss" in read_meta(artifact)["metrics"]
    assert read_meta(artifact)["spec"]["datamodule"]["source"]["num_train"] == 128


def test_init_from_base_from_the_cli_survives_a_killed_build(tmp_path, zoo_main):
    """``python train.py backbone.init_from=base``: a build killed mid-way (SIGKILL) leaves no artifact; the next run
    (train.py's entry point in this process) removes its temporary directory, builds the policy anew and trains from
    it in the Hydra app's run directory."""
    cache = tmp_path / "cache"
    args = [
        sys.executable,
        str(REPO_ROOT / "train.py"),
        *SMALL_BASE_POLICY,
        "base_policy.num_train=128",
        "backbone.init_from=base",
        "datamodule.source.num_train=64",
        "datamodule.source.num_val=16",
        "datamodule.batch_size=16",
        "trainer.max_epochs=1",
        "module.generate_on_eval=false",
        # a small model for the base policy and the run (the build, its kill and the resume are what is tested)
        "backbone.num_hidden_layers=2",
        "backbone.hidden_size=64",
        "backbone.intermediate_size=192",
        f"paths.cache_dir={cache}",
        f"paths.log_dir={tmp_path / 'logs'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    killed = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kind_dir = cache / "base_policy"
    deadline = time.monotonic() + 300
    while not list(temporaries(kind_dir)):
        assert killed.poll() is None, "the first run ended before its base-policy build started"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    (left,) = temporaries(kind_dir)
    assert not [p for p in kind_dir.iterdir() if is_complete(p)]

    code, out, err = zoo_main(args[2:], tmp_path)
    assert code == 0, err[-3000:]
    log = out + err
    assert f"removed {left}, left by an interrupted build" in log
    assert "building the base_policy artifact 'addition': backbone.init_from=base asks for" in log
    assert list(temporaries(kind_dir)) == []
    (artifact,) = [p for p in kind_dir.iterdir() if is_complete(p)]
    assert (artifact / "export" / "model.safetensors").is_file()
    run_dir = tmp_path / "run"  # the parent run kept its Hydra run directory after the nested build
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "csv" / "metrics.csv").is_file()


def test_no_trainer_is_built_outside_the_cli():
    """Prerequisites are trained by the app (zoo.cli): no hand-built ``Trainer(`` in the package."""
    offenders = []
    for folder in ("zoo", "callbacks", "datamodules"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            rel = path.relative_to(REPO_ROOT).as_posix()
            if rel.startswith("zoo/cli/"):
                continue
            lines = enumerate(path.read_text().splitlines(), 1)
            # Lightning's Trainer (bare or pl./L.), not another library's e.g. tokenizers' BpeTrainer
            offenders += [f"{rel}:{i}" for i, line in lines if re.search(r"(?<![A-Za-z_])Trainer\(", line)]
    assert offenders == []


def test_a_prerequisite_is_composed_once_per_hydra_and_overrides_and_handed_out_as_copies(monkeypatch):
    """Every job of a sweep plans the same prerequisites: the composition is kept (per composing Hydra and
    overrides), and each caller gets its own copy."""
    import zoo.cli.artifacts as artifacts

    calls = []
    real = artifacts.compose
    monkeypatch.setattr(artifacts, "compose", lambda **kw: calls.append(kw["overrides"]) or real(**kw))
    monkeypatch.setattr(artifacts, "_COMPOSED", {})
    overrides = ["+method=sft", "trainer.max_steps=7"]
    first = artifacts.compose_config(overrides)
    with open_dict(first):
        first.trainer.max_steps = 123
        first.extra = "mine"
    second = artifacts.compose_config(overrides)
    assert calls == [overrides]
    assert second.trainer.max_steps == 7 and "extra" not in second
    assert artifacts.compose_config(["+method=sft"]).trainer.max_steps != 7 and len(calls) == 2
    # inside an app (here: a caller's own initialize_*), its Hydra composes: its search path may differ
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        assert artifacts.compose_config(overrides).trainer.max_steps == 7
        assert artifacts.compose_config(overrides).trainer.max_steps == 7
    assert len(calls) == 3
