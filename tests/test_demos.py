"""Demos as Hydra experiments (docs/demos.md): every conf/demo/<paper>.yaml follows the contract and has a page
builder in demos/ (outside the package); the slow tests run each demo's multirun with its ``quick`` overrides and
build its page from the run directories."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from zoo.report import Sweep, build_demo_page, latest_sweep

from conftest import REPO_ROOT

PAPERS = sorted(p.stem for p in (REPO_ROOT / "conf" / "demo").glob("*.yaml"))


def demo_config(paper: str) -> dict:
    """``+demo=<paper>`` composed with its Hydra node, unresolved."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"+demo={paper}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    return OmegaConf.to_container(cfg, resolve=False)


def test_demo_code_lives_outside_the_package():
    assert not (REPO_ROOT / "zoo" / "demos").exists()
    assert importlib.util.find_spec("zoo.demos") is None
    builders = sorted(p.stem for p in (REPO_ROOT / "demos").glob("*.py") if not p.stem.startswith("_"))
    assert builders == PAPERS and PAPERS  # one page builder per demo config and no other
    for folder in ("zoo", "callbacks", "datamodules"):  # nothing in the installed code finds the checkout by depth
        for path in (REPO_ROOT / folder).rglob("*.py"):
            assert "parents[2]" not in path.read_text(), path


@pytest.mark.parametrize("paper", PAPERS)
def test_demo_config_follows_the_contract(paper):
    cfg = demo_config(paper)
    sweep = cfg["hydra"]["sweep"]
    assert sweep["dir"].startswith(f"${{paths.log_dir}}/demos/{paper}/")
    assert sweep["subdir"].endswith("seed${seed}")
    params = {k: str(v) for k, v in cfg["hydra"]["sweeper"]["params"].items()}
    assert len(params.pop("seed").split(",")) >= 3  # at least three seeds
    assert params and all("," in v for v in params.values())  # at least one arm axis, each with several arms
    assert cfg["demo"]["paper"] == paper
    quick = cfg["demo"]["quick"]
    assert isinstance(quick, list) and "seed=0" in quick
    assert cfg["task_name"] == "demo"


@pytest.mark.slow
@pytest.mark.parametrize("paper", PAPERS)
def test_demo_quick_multirun_builds_its_page(paper, tmp_path):
    quick = demo_config(paper)["demo"]["quick"]
    command = [
        sys.executable,
        str(REPO_ROOT / "train.py"),
        "-m",
        f"+demo={paper}",
        *quick,
        f"paths.log_dir={tmp_path / 'logs'}",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    sweep_dir = latest_sweep(paper, tmp_path / "logs")
    sweep = Sweep.load(sweep_dir)
    arms = yaml.safe_load((sweep_dir / "multirun.yaml").read_text())["hydra"]["sweeper"]["params"]
    expected = 1
    for key, values in arms.items():
        if key != "seed":
            expected *= len(str(values).split(","))
    assert len(sweep.runs) == expected and all(r.finished for r in sweep.runs)
    assert sweep.seeds == [0]
    paths = build_demo_page(paper, sweep_dir, tmp_path / "out", REPO_ROOT / "demos")
    page = (tmp_path / "out" / f"{paper}.md").read_text()
    assert f"`python train.py -m +demo={paper} " in page and "Regenerate:" in page
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    labels = demo_config(paper)["demo"].get("labels", {})
    names = {v for r in sweep.runs for v in r.arm.values()}
    assert all(labels.get(n, n) in page for n in names if n in labels)
