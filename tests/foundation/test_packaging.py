"""Packaging: one import root `zoo`, the top-level folders refuse their bare names."""

import ast
import importlib
import importlib.resources
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.parametrize("name", ["callbacks", "datamodules", "conf"])
def test_bare_import_fails_naming_the_right_import(name):
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert f"zoo.{name}" in proc.stderr


def test_mapped_packages_resolve_to_the_top_level_folders():
    import zoo.callbacks
    import zoo.conf
    import zoo.datamodules

    assert zoo.callbacks.__file__.startswith(str(REPO_ROOT / "callbacks"))
    assert zoo.datamodules.__file__.startswith(str(REPO_ROOT / "datamodules"))
    assert importlib.resources.files("zoo.conf").joinpath("train.yaml").is_file()


def test_train_yaml_has_no_method_default():
    text = importlib.resources.files("zoo.conf").joinpath("train.yaml").read_text()
    assert "- method" not in text


def test_importing_a_callback_loads_only_its_module():
    """``zoo.callbacks`` and ``zoo.modules`` import their members on first use (start-up time of every run)."""
    code = (
        "import sys; from zoo.callbacks import RunGuard; from zoo.modules import CausalLMModule; "
        "print(sorted(m for m in sys.modules if m.startswith(('zoo.callbacks.', 'zoo.modules.'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(proc.stdout))
    assert {"zoo.callbacks.run_guard", "zoo.modules.causal_lm"} <= loaded
    assert not loaded & {"zoo.callbacks.watermark", "zoo.callbacks.af_eval", "zoo.modules.grpo", "zoo.modules.valr"}
