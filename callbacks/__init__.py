"""Installed as ``zoo.callbacks``; the folder sits at the top level of the repository by design.

The callbacks are discovered, not listed: every public class of a module in this folder (or every name of its
``__all__``) is a name of ``zoo.callbacks``, imported on first use (``zoo.callbacks.RunGuard``,
``from zoo.callbacks import RunGuard``, a config's ``_target_: zoo.callbacks.RunGuard``; :mod:`zoo.lazy`), so a run
loads only the callbacks it uses and a new callback is a new file here, with no edit of this one.
"""

from zoo.lazy import discovered_exports

if __name__ != "zoo.callbacks":
    raise ImportError(
        "The 'callbacks' folder of paperzoo is installed as 'zoo.callbacks'. Use 'import zoo.callbacks' "
        "(after 'pip install -e .' in the repository root)."
    )

__getattr__, __dir__ = discovered_exports(__name__, globals())
