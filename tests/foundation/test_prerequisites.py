"""Prerequisites are declared by configs and built by the CLI before the job (DESIGN.md, "Floors"):

* no module below the CLI imports ``zoo.cli`` (module level, function level or under ``TYPE_CHECKING``);
* nothing touches Hydra's private state (``Singleton._instances``);
* ``run`` builds a chain of prerequisites as runs one after the other, never one inside another;
* the orchestrator resolves a node only once the nodes its arguments refer to are resolved.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from zoo.artifacts import Plan, prerequisite
from zoo.errors import ConfigError

from conftest import REPO_ROOT, SMALL_BASE_POLICY

BELOW_THE_CLI = ("zoo", "callbacks", "datamodules")


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Every module an ``import`` statement anywhere in ``tree`` names (relative imports made absolute)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def python_files(folder: str):
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        rel = path.relative_to(REPO_ROOT).as_posix()
        if not rel.startswith("zoo/cli/"):
            yield rel, path


def test_no_module_below_the_cli_imports_it():
    offenders = []
    for folder in BELOW_THE_CLI:
        root = {"zoo": "zoo", "callbacks": "zoo.callbacks", "datamodules": "zoo.datamodules"}[folder]
        for rel, path in python_files(folder):
            inner = path.relative_to(REPO_ROOT / folder).with_suffix("").parts
            package = ".".join([root, *inner[:-1]]) if inner[-1] != "__init__" else ".".join([root, *inner[:-1]])
            for line, name in imported_modules(ast.parse(path.read_text()), package):
                if name == "zoo.cli" or name.startswith("zoo.cli."):
                    offenders.append(f"{rel}:{line} imports {name}")
    assert offenders == [], "modules below the CLI import it (declare a prerequisite plan instead):\n" + "\n".join(
        offenders
    )


def test_nothing_touches_hydras_private_singleton_state():
    offenders = []
    for folder in (*BELOW_THE_CLI, "conf", "demos", "benchmarks"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            text = path.read_text()
            for needle in ("Singleton._instances", "hydra.core.singleton"):
                if needle in text:
                    offenders.append(f"{path.relative_to(REPO_ROOT)}: {needle}")
    assert offenders == []


# -- the orchestrator on a plain config: ordering, results in place, cycles ------------------------------------------
@prerequisite
def joined(*parts: str) -> Plan:
    """A plan that builds nothing (no ``yield`` reached) and returns its arguments joined."""
    if False:  # pragma: no cover - makes this a generator function
        yield
    return "/".join(str(p) for p in parts)


def joined_target() -> str:
    return f"{__name__}.joined"


def test_a_node_is_resolved_after_the_nodes_its_arguments_refer_to():
    from zoo.cli.prerequisites import declared, prepare

    cfg = OmegaConf.create(
        {
            "module": {"teacher": {"_target_": joined_target(), "_args_": ["${datamodule.source}", "teacher"]}},
            "datamodule": {"source": {"_target_": joined_target(), "_args_": ["data", "${seed}"]}},
            "seed": 3,
        }
    )
    assert [d for d, _, _ in declared(cfg)] == ["module.teacher", "datamodule.source"]

    def no_job(_cfg):
        raise AssertionError("nothing to build")

    prepare(cfg, no_job)
    assert cfg.datamodule.source == "data/3"
    assert cfg.module.teacher == "data/3/teacher"
    assert list(declared(cfg)) == []


# -- the app: a chain of prerequisites runs as jobs one after the other ----------------------------------------------
def test_run_builds_a_chain_of_prerequisites_one_job_after_another(train_cfg, tmp_path, monkeypatch):
    """``backbone.init_from`` = a ``train_artifact`` node whose build run starts from ``init_from=base``: the base
    policy's job, then the artifact's job, then the run's job -- never a job inside another, and ``run`` once."""
    import zoo.cli.train as train

    events: list[str] = []
    real_job, real_run = train.run_job, train.run

    def job(cfg, *args, **kwargs):
        events.append(f"enter {cfg.run_id}")
        try:
            return real_job(cfg, *args, **kwargs)
        finally:
            events.append(f"exit {cfg.run_id}")

    def run(cfg):
        events.append("run")
        return real_run(cfg)

    monkeypatch.setattr(train, "run_job", job)
    monkeypatch.setattr(train, "run", run)
    node = {
        "_target_": "zoo.cli.artifacts.train_artifact",
        "kind": "chain_policy",
        "name": "toy",
        "overrides": [
            "+method=sft",
            "backbone.init_from=base",
            *SMALL_BASE_POLICY,
            "base_policy.num_train=128",
            "datamodule.source.num_train=32",
            "datamodule.source.num_val=8",
            "datamodule.batch_size=16",
            "trainer.max_steps=2",
            "module.generation.max_new_tokens=4",
        ],
        "cache_dir": str(tmp_path / "cache"),
    }
    items = ", ".join(f"{k}: {json.dumps(v)}" for k, v in node.items())
    cfg = train_cfg(
        [
            f"backbone.init_from={{{items}}}",
            "stage=validate",
            "datamodule.source.num_val=8",
            "module.generation.max_new_tokens=4",
        ]
    )
    main_run_id = str(cfg.run_id)
    train.run(cfg)
    assert events == [
        "run",
        "enter artifact",  # the base policy of the artifact's build run
        "exit artifact",
        "enter artifact",  # the artifact
        "exit artifact",
        f"enter {main_run_id}",
        f"exit {main_run_id}",
    ]
    assert Path(cfg.backbone.init_from).parent.parent.name == "chain_policy"
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert [a["kind"] for a in info["artifacts"]] == ["base_policy", "chain_policy"]


# -- backbone.init_from=base: the base policy bootstraps a random-init backbone, not a pretrained one ----------------
def saved_tiny_model(path: Path) -> Path:
    """A tiny Llama and its tokenizer written by ``save_pretrained`` (a stand-in for a real ``backbone=hf`` model)."""
    from zoo.backbones import TinyBackbone

    backbone = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    backbone.build_model().save_pretrained(path)
    backbone.tokenizer.save_pretrained(path)
    return path


class BuildStarted(Exception):
    """Raised by the test job: the base policy's build run reached its job."""


def test_init_from_base_keeps_a_pretrained_backbones_own_weights(train_cfg, tmp_path, caplog):
    """``+method=gr3 backbone=hf``: no base-policy build run (no job), ``init_from`` cleared, one log line says so."""
    import logging

    from zoo.cli.prerequisites import prepare

    model = saved_tiny_model(tmp_path / "model")
    cfg = train_cfg(["+method=gr3", "backbone=hf", f"backbone.name_or_path={model}"])
    assert cfg.backbone.init_from == "base"  # the GRPO family's default
    jobs = []
    with caplog.at_level(logging.INFO, logger="zoo.cli.prerequisites"):
        prepare(cfg, lambda sub: jobs.append(sub) or {})
    assert jobs == []
    assert cfg.backbone.init_from is None
    said = [r.getMessage() for r in caplog.records if r.name == "zoo.cli.prerequisites"]
    assert len(said) == 1 and "own weights" in said[0] and str(model) in said[0]


def test_base_policy_pretrained_sft_builds_the_base_policy_from_a_pretrained_backbone(train_cfg, tmp_path):
    """``+base_policy.pretrained=sft`` asks for the bootstrap anyway: the build run is the ``+method=sft`` run of the
    pretrained model (without the parent's LoRA); the synthetic backbone is bootstrapped by default."""
    from zoo.cli.prerequisites import prepare

    def job(sub):
        seen.append(sub)
        raise BuildStarted

    model = saved_tiny_model(tmp_path / "model")
    seen: list = []
    cfg = train_cfg(
        [
            "+method=gr3",
            "backbone=hf",
            f"backbone.name_or_path={model}",
            "+base_policy.pretrained=sft",
            "+backbone.lora={r: 2}",
        ]
    )
    with pytest.raises(BuildStarted):
        prepare(cfg, job)
    assert "sft" in seen[0].methods and seen[0].backbone.name_or_path == str(model)
    assert seen[0].backbone.lora is None and seen[0].backbone.init_from is None
    seen.clear()
    with pytest.raises(BuildStarted):
        prepare(train_cfg(["+method=gr3"]), job)
    assert "sft" in seen[0].methods and seen[0].backbone._target_.endswith("TinyBackbone")
    bad = train_cfg(["+method=gr3", "backbone=hf", f"backbone.name_or_path={model}", "+base_policy.pretrained=yes"])
    with pytest.raises(ConfigError, match="base_policy.pretrained='yes'"):
        prepare(bad, job)
