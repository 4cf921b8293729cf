"""Registries are discovered: ``zoo.callbacks``, ``zoo.modules`` and ``zoo.datamodules`` list no member by hand.

Every public name of every submodule (its ``__all__``, else its public classes) is a name of the package; a new
submodule is found without editing ``__init__.py``; a name two submodules export is an error naming both.
"""

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zoo.lazy import public_names, submodule_index

from conftest import REPO_ROOT

PACKAGES = ["zoo.callbacks", "zoo.modules", "zoo.datamodules"]


def _submodules(package: str) -> list[Path]:
    module = importlib.import_module(package)
    return [p for d in module.__path__ for p in sorted(Path(d).glob("*.py")) if not p.stem.startswith("_")]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_of_every_submodule_is_importable_from_the_package(package):
    """The ast index agrees with the imported modules: their ``__all__`` (or public classes) resolve to the object the
    submodule defines, through ``getattr`` and ``from package import name``."""
    module = importlib.import_module(package)
    for path in _submodules(package):
        sub = importlib.import_module(f"{package}.{path.stem}")
        names = public_names(path.read_text(), sub.__name__)
        if hasattr(sub, "__all__"):
            assert sorted(names) == sorted(sub.__all__), path
        else:
            classes = {n for n, v in vars(sub).items() if isinstance(v, type) and v.__module__ == sub.__name__}
            assert set(names) == {n for n in classes if not n.startswith("_")}, path
        assert names, f"{path} exports nothing"
        for name in names:
            assert getattr(module, name) is getattr(sub, name), (package, name)
            assert name in dir(module)
            assert name in module.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_the_names_configs_and_users_import_resolve():
    """Names users and configs read (DESIGN.md: ``from zoo.callbacks import SafeThinkMonitor``)."""
    from zoo.callbacks import RunGuard, SafeThinkMonitor, auto_progress
    from zoo.datamodules import SFTDataModule
    from zoo.modules import CausalLMModule, ZooModule, exact_answer_match

    assert SafeThinkMonitor.__module__ == "zoo.callbacks.safethink"
    assert RunGuard.__module__ == "zoo.callbacks.run_guard"
    assert auto_progress.__module__ == "zoo.callbacks.progress"
    assert SFTDataModule.__module__ == "zoo.datamodules.sft"
    assert CausalLMModule.__module__ == "zoo.modules.causal_lm" and callable(exact_answer_match)
    assert ZooModule.__module__ == "zoo.modules.base"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_new_submodule_is_found_without_editing_init(package, tmp_path):
    """A file dropped on the package's search path exports its class; ``__init__.py`` is untouched."""
    (tmp_path / "brand_new_thing.py").write_text("class BrandNewThing:\n    pass\n\n\nclass _Private:\n    pass\n")
    code = textwrap.dedent(f"""
        import {package} as pkg
        pkg.__path__.append({str(tmp_path)!r})
        from {package} import BrandNewThing
        assert BrandNewThing.__module__ == "{package}.brand_new_thing", BrandNewThing.__module__
        assert "BrandNewThing" in pkg.__all__ and "BrandNewThing" in dir(pkg)
        assert "_Private" not in pkg.__all__
        print("found")
    """)
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "found"


def test_a_name_exported_by_two_submodules_is_an_error_naming_both(tmp_path):
    (tmp_path / "my_guard.py").write_text("class RunGuard:\n    pass\n")
    proc = _run(
        f"import zoo.callbacks as pkg; pkg.__path__.append({str(tmp_path)!r}); from zoo.callbacks import RunGuard"
    )
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "zoo.callbacks.run_guard" in proc.stderr and "zoo.callbacks.my_guard" in proc.stderr


def test_index_rules(tmp_path):
    """``__all__`` wins; else public classes and names bound to them; re-exports of one object do not clash."""
    (tmp_path / "a.py").write_text(
        "from zoo.losses import IGNORE_INDEX\n\nclass Alpha:\n    pass\n\nAlias = Alpha\n_hidden = Alpha\n"
        "def helper():\n    pass\n\nCONSTANT = 1\n"
    )
    (tmp_path / "b.py").write_text(
        "from zoo.losses import IGNORE_INDEX\nfrom pkg.a import Alpha\n\n"
        "def beta():\n    pass\n\n__all__ = ['IGNORE_INDEX', 'Alpha', 'beta']\n"
    )
    (tmp_path / "_private.py").write_text("class Gamma:\n    pass\n")
    index = submodule_index("pkg", [str(tmp_path)])
    assert index == {"Alpha": "a", "Alias": "a", "IGNORE_INDEX": "b", "beta": "b"}
    (tmp_path / "c.py").write_text("IGNORE_INDEX = -100\n__all__ = ['IGNORE_INDEX']\n")
    with pytest.raises(ImportError, match=r"'IGNORE_INDEX' is exported by both pkg\.b and pkg\.c"):
        submodule_index("pkg", [str(tmp_path)])


def test_importing_a_registry_imports_none_of_its_members():
    """The index is read with ast: ``import zoo.callbacks`` and listing its names load no callback module."""
    code = (
        "import sys, zoo.callbacks, zoo.modules, zoo.datamodules; "
        "names = zoo.callbacks.__all__ + zoo.modules.__all__ + zoo.datamodules.__all__; "
        "print(sorted(m for m in sys.modules if m.startswith(('zoo.callbacks.', 'zoo.modules.', 'zoo.datamodules.'))))"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
