"""Packages that import their members on first use (PEP 562 module ``__getattr__``).

``zoo.callbacks`` and ``zoo.modules`` export one class per method family or method; importing every one of them (and
their libraries) when a run uses one or two cost every ``train.py`` start, and every test that starts one, about half
a second. A package lists its public names and their home modules once; the name is imported when it is first read
(``zoo.callbacks.RunGuard``, ``from zoo.modules import CausalLMModule``, a config's ``_target_``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], home_modules: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` of a package whose public names are imported on first use.

    Args:
        package: the package's ``__name__``.
        namespace: its ``globals()`` (a name read once is stored there, so later reads are plain lookups).
        home_modules: public name -> the submodule of ``package`` that defines it (e.g. ``{"RunGuard": "run_guard"}``).

    Usage in the package's ``__init__.py``::

        __all__ = list(HOME_MODULES)
        __getattr__, __dir__ = lazy_exports(__name__, globals(), HOME_MODULES)
    """

    def __getattr__(name: str) -> Any:
        module = home_modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(home_modules))

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
