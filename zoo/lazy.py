"""Packages whose public names are discovered from their submodules and imported on first use (PEP 562).

``zoo.callbacks``, ``zoo.modules`` and ``zoo.datamodules`` export one class per method family or method. Their
``__init__.py`` lists none of them: :func:`discovered_exports` scans the package's submodules once, on the first
attribute read, with :mod:`ast` (no submodule is imported to build the index, so ``import zoo.callbacks`` stays
cheap), and imports a submodule only when one of its names is read (``zoo.callbacks.RunGuard``,
``from zoo.modules import CausalLMModule``, a config's ``_target_: zoo.callbacks.RunGuard``). A new callback is a new
file in ``callbacks/``; no registry is edited.

A submodule's public names are its ``__all__`` when it declares one (a literal list or tuple of strings), else the
public classes it defines (and public names bound to such a class, e.g. ``ZooModule = ZooBaseModule``). Files whose
name starts with ``_`` are skipped. A name that two submodules export is an error naming both, unless both export
the same object (a re-export: ``from zoo.losses import IGNORE_INDEX`` in two ``__all__`` lists).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, looking inside ``if``/``try`` blocks (conditional definitions and imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(block)


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def public_names(source: str, module: str) -> dict[str, str]:
    """The public names of one module's source text, each with the object it denotes as ``"<module>:<name>"``.

    Args:
        source: the module's Python source (parsed, never executed).
        module: its dotted name (``zoo.callbacks.run_guard``), which resolves relative imports and names the names
            the module defines itself.

    Returns:
        public name -> origin, where the origin of a name the module defines is ``"<module>:<name>"`` and that of a
        name imported with ``from X import Y`` is ``"X:Y"`` (so two modules re-exporting one object agree).
    """
    tree = ast.parse(source, filename=module)
    package = module.rpartition(".")[0]
    origins: dict[str, str] = {}
    classes: set[str] = set()
    aliases: dict[str, str] = {}
    declared: list[str] | None = None
    for node in _statements(tree.body):
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
            origins[node.name] = f"{module}:{node.name}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            origins[node.name] = f"{module}:{node.name}"
        elif isinstance(node, ast.ImportFrom):
            source_module = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source_module = f"{base}.{source_module}" if source_module else base
            for alias in node.names:
                origins[alias.asname or alias.name] = f"{source_module}:{alias.name}"
        else:
            for name in _bound_names(node):
                if name == "__all__":
                    try:
                        declared = list(ast.literal_eval(node.value))  # type: ignore[union-attr]
                    except ValueError as err:
                        raise ImportError(
                            f"{module}: __all__ must be a literal list of strings (it is read without importing "
                            "the module)"
                        ) from err
                    continue
                origins[name] = f"{module}:{name}"
                value = getattr(node, "value", None)
                if isinstance(value, ast.Name):
                    aliases[name] = value.id
    if declared is not None:
        return {name: origins.get(name, f"{module}:{name}") for name in declared}
    public = {name for name in classes if not name.startswith("_")}
    public |= {name for name, target in aliases.items() if target in classes and not name.startswith("_")}
    return {name: origins[name] for name in sorted(public)}


def submodule_index(package: str, search_path: Iterable[str]) -> dict[str, str]:
    """Public name -> the submodule of ``package`` that exports it, from the ``*.py`` files on ``search_path``.

    Raises:
        ImportError: a name is exported by two submodules as two different objects; the message names both.
    """
    index: dict[str, str] = {}
    origins: dict[str, str] = {}
    for directory in search_path:
        for path in sorted(Path(directory).glob("*.py")):
            if path.stem.startswith("_"):
                continue
            module = f"{package}.{path.stem}"
            for name, origin in public_names(path.read_text(encoding="utf-8"), module).items():
                if name in index and origins[name] != origin:
                    raise ImportError(
                        f"{package}: {name!r} is exported by both {package}.{index[name]} and {module}; rename one "
                        "(or leave it out of that module's __all__)"
                    )
                # a re-export resolves to the module that defines the object, when it is a sibling
                if name not in index or origin == f"{module}:{name}":
                    index[name] = path.stem
                    origins[name] = origin
    return index


def discovered_exports(package: str, namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` of a package whose public names are discovered in its submodules.

    Args:
        package: the package's ``__name__``.
        namespace: its ``globals()``; its ``__path__`` is scanned on the first read (so a test may point it
            elsewhere), and a name read once is stored there, so later reads are plain lookups.

    The package's ``__all__`` is generated too (read through ``__getattr__``), so ``from zoo.callbacks import *``
    and ``dir(zoo.callbacks)`` list every discovered name. Usage in the package's ``__init__.py``::

        __getattr__, __dir__ = discovered_exports(__name__, globals())
    """
    cache: dict[str, str] = {}
    built: list[bool] = []

    def index() -> Mapping[str, str]:
        if not built:
            cache.update(submodule_index(package, namespace["__path__"]))
            built.append(True)
        return cache

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            return sorted(index())
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = index().get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(index()))

    return __getattr__, __dir__


__all__ = ["discovered_exports", "public_names", "submodule_index"]
