"""The core dependencies of ``pyproject.toml`` are enough: ``pip install -e .`` runs every method.

Two checks, both against the *declared* dependencies rather than whatever this development environment has:

* every third-party module that the package imports (``zoo/``, ``callbacks/``, ``datamodules/``, ``train.py``) is
  provided by a core dependency or one of their requirements, or -- when it comes from an optional extra -- is
  imported lazily inside a function, so that the rest of the package never needs it;
* method smoke runs in a subprocess where every installed distribution that the core dependencies do not require is
  hidden (its modules are neither importable nor found by ``importlib.util.find_spec``, as if absent), which also
  catches third-party code importing an undeclared package on our behalf (transformers' PIL image processors).
  Two runs by default (a VLM method, a bitsandbytes quantizer); every method under ``-m slow``.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import REPO_ROOT, SMALL_BASE_POLICY

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

SOURCES = ("zoo", "callbacks", "datamodules", "train.py")
FIRST_PARTY = {"zoo", "conftest"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(requirements: list[str]) -> set[str]:
    """Normalized names of the distributions ``requirements`` pull in (recursively, without extras)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return seen


@cache
def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(distributions of the core dependencies, {extra: distributions it adds}) from ``pyproject.toml``."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    core = requirement_closure(project["dependencies"])
    extras = {
        extra: requirement_closure([r for r in reqs if not r.startswith("paperzoo")]) - core
        for extra, reqs in project.get("optional-dependencies", {}).items()
    }
    return core, extras


def top_level_imports(path: Path) -> list[tuple[str, int, bool]]:
    """``(top-level module, line, lazy)`` of every absolute import in ``path``; lazy = inside a function."""
    tree = ast.parse(path.read_text())
    lazy_nodes = {
        id(n)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(fn)
        if isinstance(n, ast.Import | ast.ImportFrom)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno, id(node) in lazy_nodes) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno, id(node) in lazy_nodes))
    return found


def source_files() -> list[Path]:
    files: list[Path] = []
    for entry in SOURCES:
        path = REPO_ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_every_imported_third_party_module_is_declared():
    core, extras = declared()
    providers = metadata.packages_distributions()
    problems = []
    for path in source_files():
        for module, line, lazy in top_level_imports(path):
            if module in sys.stdlib_module_names or module in FIRST_PARTY:
                continue
            dists = {normalize(d) for d in providers.get(module, [])}
            where = f"{path.relative_to(REPO_ROOT)}:{line} imports {module}"
            if dists & core:
                continue
            in_extras = sorted(extra for extra, names in extras.items() if dists & names)
            if not in_extras:
                problems.append(f"{where}: its distribution {sorted(dists) or '?'} is declared nowhere")
            elif not lazy:
                problems.append(f"{where} at module level, but it is only in the extras {in_extras}")
    assert not problems, "\n".join(problems)


def test_the_declaration_check_sees_an_undeclared_import(tmp_path):
    """The checker itself: an eager import of a package of an extra and an import of nothing declared are caught."""
    core, extras = declared()
    assert {"torch", "transformers", "pillow", "bitsandbytes"} <= core
    assert "matplotlib" in extras["plots"] and "matplotlib" not in core
    sample = tmp_path / "sample.py"
    sample.write_text("import matplotlib\n\ndef f():\n    import httpx\n")
    assert top_level_imports(sample) == [("matplotlib", 1, False), ("httpx", 4, True)]


# ------------------------------------------------------------------------------------------------ smoke runs
HIDE = r"""
import importlib.metadata as md, re, runpy, sys

allowed = set(sys.argv[1].split(",")) | {"paperzoo"}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
hidden = set()
for module, dists in md.packages_distributions().items():
    if module in sys.stdlib_module_names or module == "zoo":
        continue
    if not {norm(d) for d in dists} & allowed:
        hidden.add(module)


class Hide:
    # wraps a finder: modules of undeclared distributions are not found (imports fail, find_spec gives None)
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def find_distributions(self, *args, **kwargs):
        # metadata lookups (importlib.metadata.version, lightning's RequirementCache) do not see them either
        find = getattr(self.finder, "find_distributions", None)
        found = find(*args, **kwargs) if find else []
        return [d for d in found if norm(d.metadata["Name"] or "") in allowed]

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
for name in [m for m in sys.modules if m.split(".")[0] in hidden]:
    del sys.modules[name]
print("HIDDEN " + ",".join(sorted(hidden)), flush=True)
if sys.argv[2] == "--code":
    exec(sys.argv[3])
else:
    sys.argv = ["train.py", *sys.argv[2:]]
    runpy.run_path("train.py", run_name="__main__")
"""

SMALL_DATA = [
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.eval_batch_size=8",
]
# default runs: the two that failed after a plain `pip install -e .` (PIL for the VLM processors, bitsandbytes)
DEFAULT = {("valr_cot", ()), ("sft", ("quant=bnb_nf4",))}
METHODS = sorted(p.stem for p in (REPO_ROOT / "conf" / "method").glob("*.yaml"))
CASES = [(m, ()) for m in METHODS] + [("sft", ("quant=bnb_nf4",)), ("sft", ("quant=bnb_int8",))]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}


def run_hidden(allowed: set[str], args: list[str]) -> subprocess.CompletedProcess:
    """Run ``train.py <args>`` (or ``--code <python>``) with every distribution outside ``allowed`` hidden."""
    return subprocess.run(
        [sys.executable, "-c", HIDE, ",".join(sorted(allowed)), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env=ENV,
    )


def test_hidden_distributions_look_absent():
    """The hiding itself: with Pillow left out of the allowed set, PIL is neither importable nor found."""
    core, _ = declared()
    code = (
        "import importlib.util, torch\n"
        "assert importlib.util.find_spec('PIL') is None\n"
        "try:\n    import PIL\nexcept ImportError:\n    print('NO-PIL')\n"
    )
    proc = run_hidden(core - {"pillow"}, ["--code", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NO-PIL" in proc.stdout


@pytest.mark.parametrize(
    ("method", "extra"),
    [pytest.param(m, e, marks=() if (m, e) in DEFAULT else pytest.mark.slow) for m, e in CASES],
    ids=[f"{m}{'-' + '-'.join(e) if e else ''}" for m, e in CASES],
)
def test_smoke_run_with_core_dependencies_only(method, extra, tmp_path, train_cfg):
    """``python train.py +method=<m> debug=fdr`` (the catalogue's smoke settings) with the core dependencies only."""
    from omegaconf import OmegaConf

    from zoo.catalogue import method_entries

    core, _ = declared()
    overrides = [
        f"+method={method}",
        "debug=fdr",
        "trainer.accelerator=cpu",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"paths.log_dir={tmp_path / 'logs'}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        *SMALL_BASE_POLICY,
        *extra,
    ]
    composed = train_cfg(overrides[:2] + list(extra))
    absent = object()
    cheap = [
        s
        for s in [*SMALL_DATA, *(str(x) for x in method_entries()[method].get("smoke", []) or [])]
        if OmegaConf.select(composed, s.split("=", 1)[0], default=absent, throw_on_resolution_failure=False)
        is not absent
    ]
    proc = run_hidden(core, [*overrides, *cheap])
    hidden = next((line[7:] for line in proc.stdout.splitlines() if line.startswith("HIDDEN ")), "")
    assert proc.returncode == 0, (
        f"+method={method} {' '.join(extra)} fails with the core dependencies only "
        f"(hidden: {hidden[:300]}):\n{proc.stderr[-3000:]}"
    )
