"""Seam groups live under the family module that owns them (``conf/module/<family>/<seam>/``), yet their values stay
at ``module.<seam>`` (or ``module`` for options that set module fields): each option file declares its package, and
``module/<family>/<seam>=<option>`` on the command line selects it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from conftest import REPO_ROOT

MODULE_DIR = REPO_ROOT / "conf" / "module"
FAMILIES = sorted(p.name for p in MODULE_DIR.iterdir() if p.is_dir() and (MODULE_DIR / f"{p.name}.yaml").is_file())
OPTIONS = sorted(
    (family, seam.name, option.stem)
    for family in FAMILIES
    for seam in (MODULE_DIR / family).iterdir()
    if seam.is_dir()
    for option in seam.glob("*.yaml")
)


def _package(path: Path) -> str | None:
    first = path.read_text().splitlines()[0]
    return first.removeprefix("# @package").strip() if first.startswith("# @package") else None


def test_the_families_own_their_seams():
    assert {"grpo", "structure_lm"} <= set(FAMILIES)
    seams = {(family, seam) for family, seam, _ in OPTIONS}
    for seam in ("rewards", "shaper", "advantage", "policy_loss", "aggregation"):
        assert ("grpo", seam) in seams
    assert {("structure_lm", "connector"), ("structure_lm", "stage")} <= seams
    # nothing is left in the old flat namespace
    flat = {"rewards", "shaper", "advantage", "policy_loss", "aggregation", "connector", "stage"}
    assert not flat & {p.name for p in MODULE_DIR.iterdir() if p.is_dir()}


@pytest.mark.parametrize(("family", "seam", "option"), OPTIONS, ids=["/".join(o) for o in OPTIONS])
def test_option_selected_from_the_command_line_lands_at_its_package(family, seam, option):
    path = MODULE_DIR / family / seam / f"{option}.yaml"
    package = _package(path)
    assert package in (f"module.{seam}", "module"), (
        f"{path.relative_to(REPO_ROOT)} must start with '# @package module.{seam}' (or '# @package module'), "
        f"else its values land at module.{family}.{seam}"
    )
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"module={family}", f"module/{family}/{seam}={option}"])
    GlobalHydra.instance().clear()
    assert family not in cfg.module, f"module.{family} appeared: a seam option leaked under its folder name"
    body = {k: v for k, v in (yaml.safe_load(path.read_text()) or {}).items() if k != "defaults"}
    node = OmegaConf.to_container(OmegaConf.select(cfg, package), resolve=False)
    for key, value in body.items():
        expected = value
        # the option's own values win over the family file (e.g. a stage's optimizer.lr) but dicts merge
        got = node[key]
        if isinstance(expected, dict):
            assert {k: got[k] for k in expected} == expected, f"{package}.{key}"
        else:
            assert got == expected, f"{package}.{key}"
