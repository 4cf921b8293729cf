"""Cores import neither Lightning nor Hydra (DESIGN.md, "Three kinds of code").

One subprocess installs a meta-path finder that refuses ``lightning``, ``lightning_fabric``, ``pytorch_lightning`` and
``hydra``, then imports every module of every core package and also executes every import statement that a core
makes lazily (inside a function), since those run only when the function is called. Each refused import that zoo code
asked for is charged to the innermost *core* module on the import chain, and the test of that core's package fails
naming the chain (e.g. ``zoo.generation.sampling:285 -> zoo.datamodules -> zoo.datamodules.base:15 -> lightning``).

The cores are every top-level entry of ``zoo/`` except the Lightning and Hydra layers below, so a new core package
(``zoo.interp``, ``zoo.watermark``, ...) is covered the day it appears.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest

from conftest import REPO_ROOT

# the layers that are meant to use Lightning / Hydra; everything else in zoo/ is a core (zoo.loggers holds Lightning
# loggers; zoo.report reads Hydra run and sweep directories and parses their overrides with Hydra's own parser)
LAYERS = (
    "zoo.modules",
    "zoo.cli",
    "zoo.demos",
    "zoo.callbacks",
    "zoo.datamodules",
    "zoo.conf",
    "zoo.report",
    "zoo.loggers",
)
# named by the design; each must be checked whenever it exists
NAMED_CORES = (
    "zoo.rl",
    "zoo.generation",
    "zoo.data",
    "zoo.quant",
    "zoo.multimodal",
    "zoo.safety",
    "zoo.losses",
    "zoo.interp",
    "zoo.watermark",
    "zoo.vocab",
    "zoo.mixing",
    "zoo.agents",
)
ZOO = REPO_ROOT / "zoo"
CORES = sorted(
    f"zoo.{p.stem}"
    for p in ZOO.iterdir()
    if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")
    if f"zoo.{p.stem}" not in LAYERS
)

PROBE = r"""
import ast, importlib, json, pkgutil, sys
from importlib.abc import MetaPathFinder

BLOCKED = {"lightning", "lightning_fabric", "pytorch_lightning", "hydra"}
LAYERS = tuple(sys.argv[1].split(","))
CORES = sys.argv[2].split(",")
offences = {core: [] for core in CORES}
errors = {core: [] for core in CORES}


def is_core(name):
    return name.startswith("zoo.") and not name.startswith(LAYERS) and name.split(".")[1:2] != [""]


class Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in BLOCKED:
            return None
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if not module.startswith(("importlib", "_frozen_importlib")) and module != "__main__":
                frames.append((module, frame.f_lineno))
            frame = frame.f_back
        frames.reverse()
        chain = []
        for module, line in frames:
            if chain and chain[-1][0] == module:
                chain[-1] = (module, line)
            else:
                chain.append((module, line))
        if chain and chain[-1][0].startswith("zoo"):  # zoo code asked for it (third-party probes are theirs)
            cores = [m for m, _ in chain if is_core(m)]
            owner = next((c for c in CORES if cores and (cores[-1] == c or cores[-1].startswith(c + "."))), None)
            text = " -> ".join(f"{m}:{line}" for m, line in chain) + f" -> {name}"
            if owner is not None and text not in offences[owner]:
                offences[owner].append(text)
        raise ImportError(f"import of {name!r} refused: cores must not import Lightning or Hydra")


sys.meta_path.insert(0, Refuse())


def lazy_imports(module):
    # import statements inside functions of ``module``: they run only when the function is called
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return []
    tree = ast.parse(open(path).read())
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


for core in CORES:
    try:
        package = importlib.import_module(core)
    except Exception as err:
        errors[core].append(f"import {core}: {type(err).__name__}: {err}")
        continue
    modules = [package]
    if hasattr(package, "__path__"):
        for info in pkgutil.walk_packages(package.__path__, core + "."):
            try:
                modules.append(importlib.import_module(info.name))
            except Exception as err:
                errors[core].append(f"import {info.name}: {type(err).__name__}: {err}")
    for module in modules:
        for node in lazy_imports(module):
            namespace = {"__name__": module.__name__, "__package__": module.__package__}
            try:
                exec(compile(ast.Module([node], []), module.__file__, "exec"), namespace)
            except Exception:
                pass  # an optional package missing here is not this test's business; refusals are recorded
print("PROBE" + json.dumps({"offences": offences, "errors": errors}))
"""


@cache
def probe() -> dict[str, dict[str, list[str]]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(LAYERS), ",".join(CORES)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE")]
    assert lines, f"the import probe did not finish:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("PROBE"))


def test_every_named_core_that_exists_is_checked():
    present = [
        name for name in NAMED_CORES if (ZOO / name.split(".")[1]).is_dir() or (ZOO / f"{name[4:]}.py").is_file()
    ]
    assert set(present) <= set(CORES)
    assert {"zoo.rl", "zoo.generation", "zoo.quant", "zoo.losses"} <= set(CORES)
    assert not set(CORES) & set(LAYERS)


def test_the_probe_catches_a_core_that_imports_lightning(tmp_path):
    """The finder itself works: a throw-away core that imports Lightning lazily and one through a layer are caught."""
    fake = tmp_path / "zoo_fake_root"
    (fake / "zoo" / "fakecore").mkdir(parents=True)
    (fake / "zoo" / "__init__.py").write_text(f"__path__.append({str(ZOO)!r})\n")
    (fake / "zoo" / "fakecore" / "__init__.py").write_text("def f():\n    import lightning.pytorch\n")
    (fake / "zoo" / "fakecore" / "eager.py").write_text("import zoo.modules.base\n")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(LAYERS), "zoo.fakecore"],
        capture_output=True,
        text=True,
        cwd=fake,
        env={"PYTHONPATH": str(fake), "PATH": "", "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    result = json.loads(next(s for s in proc.stdout.splitlines() if s.startswith("PROBE")).removeprefix("PROBE"))
    found = result["offences"]["zoo.fakecore"]
    assert any(c.startswith("zoo.fakecore:2 -> lightning") for c in found), found
    assert any(c.startswith("zoo.fakecore.eager:1 -> zoo.modules") and c.endswith("-> lightning") for c in found), found
    assert any(e.startswith("import zoo.fakecore.eager: ImportError") for e in result["errors"]["zoo.fakecore"])


# every test of this file on one xdist worker, so the probe subprocess (the cached ``probe()``) runs once per session
pytestmark = pytest.mark.xdist_group("core_imports")

# core -> reason, for a known offender marked xfail(strict=True) until it is fixed (none today)
KNOWN: dict[str, str] = {}


@pytest.mark.parametrize(
    "core",
    [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=KNOWN[c])) if c in KNOWN else c for c in CORES],
)
def test_core_does_not_import_lightning_or_hydra(core):
    result = probe()
    assert not result["errors"][core], "\n".join(result["errors"][core])
    assert not result["offences"][core], f"{core} imports Lightning/Hydra:\n" + "\n".join(result["offences"][core])
