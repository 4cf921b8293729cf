"""Imports go one way: a floor imports only the floors below it (DESIGN.md "Floors", ``docs/architecture.md``).

The floors, from the ground up (:data:`FLOORS` places every room -- a package or a top-level module of ``zoo``):

1. utilities every floor may use: errors, text encoding (:mod:`zoo.encoding`), special tokens (:mod:`zoo.tokens`),
   the completion format and answer verifier (:mod:`zoo.answers`), the protocols (:mod:`zoo.protocols`), statistics,
   checkpoints, the artifact cache, LoRA and optimizer helpers, lazy exports;
2. shared machinery: backbones, quantizers, generation (the decoder seam and its sampler), losses, sentence encoders;
3. method cores: rl, safety, interp, watermark, vocab, mixing, multimodal, agents, memory, textopt, adapt;
4. synthetic tasks and data sources (``zoo.data``), which may use cores to build their data (cores never import it);
5. datamodules, LightningModules, callbacks, loggers and the report / catalogue / verdict writers;
6. the CLI.

Every ``import`` of a ``zoo`` module in ``zoo/``, ``callbacks/`` (``zoo.callbacks``) and ``datamodules/``
(``zoo.datamodules``) is read with :mod:`ast`, including imports inside functions and under ``TYPE_CHECKING`` (a
lazy import is still a dependency). An import must stay inside its room, go to a lower floor, or be one of the
same-floor edges of :data:`SAME_FLOOR`, each with its reason. A module in no room fails the test: a new package is
placed here first. A second test finds import cycles between files (Tarjan's strongly connected components); a cycle
is allowed only inside one registry package whose ``__init__`` imports its members to register them
(:data:`REGISTRY_PACKAGES`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from conftest import REPO_ROOT

# the folders that hold the package: folder -> import name of its root
SOURCE_ROOTS = {"zoo": "zoo", "callbacks": "zoo.callbacks", "datamodules": "zoo.datamodules"}

# room -> floor (a room is a package or a top-level module; the longest matching name wins)
FLOORS: dict[str, int] = {
    # 1. utilities every floor may use
    "zoo": 1,  # the package's own __init__
    "zoo.errors": 1,
    "zoo.lazy": 1,
    "zoo.tokens": 1,
    "zoo.encoding": 1,
    "zoo.answers": 1,
    "zoo.protocols": 1,
    "zoo.stats": 1,
    "zoo.checkpoints": 1,
    "zoo.artifacts": 1,
    "zoo.lora": 1,
    "zoo.optim": 1,
    # 2. shared machinery
    "zoo.backbones": 2,
    "zoo.quant": 2,
    "zoo.generation": 2,
    "zoo.losses": 2,
    "zoo.text": 2,
    # 3. method cores
    "zoo.rl": 3,
    "zoo.safety": 3,
    "zoo.interp": 3,
    "zoo.watermark": 3,
    "zoo.vocab": 3,
    "zoo.mixing": 3,
    "zoo.multimodal": 3,
    "zoo.agents": 3,
    "zoo.memory": 3,
    "zoo.textopt": 3,
    "zoo.adapt": 3,
    # 4. synthetic tasks and data sources
    "zoo.data": 4,
    # 5. Lightning layers and writers of results
    "zoo.datamodules": 5,
    "zoo.modules": 5,
    "zoo.callbacks": 5,
    "zoo.loggers": 5,
    "zoo.report": 5,
    "zoo.verdict": 5,
    "zoo.catalogue": 5,
    # 6. the CLI
    "zoo.cli": 6,
}

# (importer room, imported room) on the same floor -> why that direction (the reverse stays forbidden)
SAME_FLOOR: dict[tuple[str, str], str] = {
    # every ground-floor room may raise the zoo's errors; the rest of floor 1 builds on tokens and encoding
    **{(room, "zoo.errors"): "errors are the bottom of floor 1" for room, f in FLOORS.items() if f == 1},
    ("zoo.answers", "zoo.tokens"): "the completion format is written with the special tokens",
    ("zoo.protocols", "zoo.encoding"): "GenerationResult.concat pads with pad_width",
    ("zoo.backbones", "zoo.quant"): "a backbone is built quantized; quantizers receive modules, never a backbone",
    ("zoo.memory", "zoo.agents"): "memory systems run agent episodes; agents know memories only as a protocol",
    ("zoo.textopt", "zoo.agents"): "text optimisers call the agents' LLM backends",
    ("zoo.callbacks", "zoo.datamodules"): "a callback may read its trainer's datamodule (never the reverse)",
    ("zoo.callbacks", "zoo.loggers"): "a callback may write through the zoo's loggers",
    ("zoo.catalogue", "zoo.verdict"): "the paper index shows each results page's verdict",
    ("zoo.report", "zoo.verdict"): "a results page opens with its verdict",
}

# packages whose __init__ imports every member to register it: a cycle inside one of them is the registry itself
REGISTRY_PACKAGES: tuple[str, ...] = ()


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    path: Path
    line: int
    target: str  # the zoo module imported (a submodule when ``from package import submodule``)


def module_name(path: Path, folder: str) -> str:
    parts = list(path.relative_to(REPO_ROOT / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([SOURCE_ROOTS[folder], *parts])


@cache
def modules() -> dict[str, Path]:
    """Every module of the package: import name -> file."""
    found = {}
    for folder in SOURCE_ROOTS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            found[module_name(path, folder)] = path
    return found


def resolve(name: str) -> str | None:
    """The module (file) that ``name`` lives in: the longest prefix of ``name`` that is a module."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, source: str | None = None) -> Iterator[Import]:
    """Every import of a zoo module in ``path`` (or in ``source``, the text of a module at ``path``), wherever it
    stands (top level, function, ``TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "zoo" or alias.name.startswith("zoo."):
                    target = resolve(alias.name)
                    if target:
                        yield Import(module, path, node.lineno, target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source != "zoo" and not source.startswith("zoo."):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                target = sub if sub in modules() else resolve(source)
                if target:
                    yield Import(module, path, node.lineno, target)


@cache
def all_imports() -> tuple[Import, ...]:
    """Every import of a zoo module in the package (one entry per statement and imported module)."""
    return tuple(dict.fromkeys(i for module, path in modules().items() for i in imports_of(module, path)))


def room(module: str) -> str | None:
    """The room of ``module``: the longest name in :data:`FLOORS` that is ``module`` or a package above it."""
    candidates = [r for r in FLOORS if module == r or (r != "zoo" and module.startswith(r + "."))]
    return max(candidates, key=len, default=None)


def where(imp: Import) -> str:
    return f"{imp.path.relative_to(REPO_ROOT)}:{imp.line}"


def direction_offences(imports: tuple[Import, ...]) -> list[str]:
    offences = []
    for imp in imports:
        src, dst = room(imp.importer), room(imp.target)
        if src is None or dst is None or src == dst:
            continue
        if FLOORS[dst] < FLOORS[src] or (FLOORS[dst] == FLOORS[src] and (src, dst) in SAME_FLOOR):
            continue
        relation = "the same floor, no SAME_FLOOR rule" if FLOORS[dst] == FLOORS[src] else "a higher floor"
        offences.append(
            f"{where(imp)}: {imp.importer} (floor {FLOORS[src]}, {src}) imports {imp.target} "
            f"(floor {FLOORS[dst]}, {dst}): {relation}"
        )
    return offences


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), those with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def in_one_registry(component: list[str]) -> bool:
    return any(all(m == p or m.startswith(p + ".") for m in component) for p in REGISTRY_PACKAGES)


def cycle_offences(imports: tuple[Import, ...]) -> list[str]:
    graph: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if imp.target != imp.importer:
            graph.setdefault(imp.importer, set()).add(imp.target)
            graph.setdefault(imp.target, set())
            lines.setdefault((imp.importer, imp.target), imp)
    offences = []
    for component in strongly_connected(graph):
        if in_one_registry(component):
            continue
        members = set(component)
        edges = sorted(where(lines[a, b]) + f" {a} -> {b}" for a in component for b in graph[a] & members)
        offences.append("import cycle between " + ", ".join(component) + ":\n    " + "\n    ".join(edges))
    return offences


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in modules() if room(m) is None)
    assert not unplaced, f"modules in no room of FLOORS (place the package in this test's table): {unplaced}"
    assert all(FLOORS[a] == FLOORS[b] for a, b in SAME_FLOOR), "SAME_FLOOR names rooms of different floors"


def test_imports_go_down_the_floors():
    offences = direction_offences(all_imports())
    assert not offences, f"{len(offences)} import(s) against the floors:\n" + "\n".join(offences)


def test_no_import_cycle_between_files():
    offences = cycle_offences(all_imports())
    assert not offences, "\n".join(offences)


def test_the_checks_catch_an_upward_import_a_cycle_and_an_unplaced_module():
    """The checks themselves: a core importing a task, two files importing each other, a function-level import."""
    up = Import("zoo.rl.rewards", REPO_ROOT / "zoo/rl/rewards.py", 7, "zoo.data.tasks")
    down = Import("zoo.data.tasks", REPO_ROOT / "zoo/data/tasks.py", 3, "zoo.answers")
    sideways = Import("zoo.agents.x", REPO_ROOT / "zoo/agents/x.py", 2, "zoo.memory.system")
    allowed = Import("zoo.memory.x", REPO_ROOT / "zoo/memory/x.py", 2, "zoo.agents.types")
    found = direction_offences((up, down, sideways, allowed))
    assert len(found) == 2
    assert found[0].startswith("zoo/rl/rewards.py:7: ") and "(floor 3, zoo.rl)" in found[0]
    assert "(floor 4, zoo.data)" in found[0]
    assert found[1].startswith("zoo/agents/x.py:2: ") and "same floor" in found[1]
    a = Import("zoo.quant.base", REPO_ROOT / "zoo/quant/base.py", 5, "zoo.quant.bnb")
    b = Import("zoo.quant.bnb", REPO_ROOT / "zoo/quant/bnb.py", 9, "zoo.quant.base")
    cycles = cycle_offences((a, b, down))
    assert len(cycles) == 1 and "zoo/quant/base.py:5 zoo.quant.base -> zoo.quant.bnb" in cycles[0]
    assert "zoo/quant/bnb.py:9" in cycles[0]
    assert room("zoo.newthing.core") is None
    lazy = "def f():\n    from zoo.data.tasks import Task\n    from . import rewards\n"
    found_lazy = imports_of("zoo.rl.fake", REPO_ROOT / "zoo/rl/fake.py", lazy)
    assert [(i.line, i.target) for i in found_lazy] == [(2, "zoo.data.tasks"), (3, "zoo.rl.rewards")]


@pytest.mark.parametrize("folder", list(SOURCE_ROOTS))
def test_every_source_folder_is_read(folder):
    assert any(m == SOURCE_ROOTS[folder] or m.startswith(SOURCE_ROOTS[folder] + ".") for m in modules())
