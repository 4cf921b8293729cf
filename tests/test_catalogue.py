"""The method catalogue: every conf/method/*.yaml composes, instantiates, runs fast_dev_run on the tiny
backbone, declares methods.<name>, and has a docs page and a test that names it."""

from pathlib import Path

import pytest

from zoo.cli.train import check_methods, run

from conftest import REPO_ROOT, SMALL_BASE_POLICY

METHODS = sorted(p.stem for p in (REPO_ROOT / "conf" / "method").glob("*.yaml"))


def test_catalogue_is_not_empty():
    assert "sft" in METHODS


@pytest.mark.parametrize("method", METHODS)
def test_method_declares_itself_and_has_docs_and_a_test(method, train_cfg):
    cfg = train_cfg([f"+method={method}"])
    methods = check_methods(cfg)
    assert method in methods, f"conf/method/{method}.yaml must declare methods.{method}"
    assert (REPO_ROOT / "docs" / "methods" / f"{method}.md").is_file(), f"docs/methods/{method}.md is missing"
    named = [
        p for p in (REPO_ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name and method in p.read_text()
    ]
    assert named, f"no test besides the catalogue names the method '{method}'"


@pytest.mark.parametrize("method", METHODS)
def test_method_runs_fast_dev_run_on_the_tiny_backbone(method, train_cfg, base_policy_cache):
    """A method may list cheap settings for this smoke run under methods.<name>.smoke (e.g. fewer ADMM steps)."""
    smoke = list(check_methods(train_cfg([f"+method={method}"]))[method].get("smoke", []))
    cfg = train_cfg(
        [f"+method={method}", "debug=fdr", "trainer.accelerator=cpu", *SMALL_BASE_POLICY, *smoke],
        cache_dir=base_policy_cache,
    )
    run(cfg)
