"""Installed as ``zoo.datamodules``; the folder sits at the top level of the repository by design.

The datamodules are discovered, not listed: every public class of a module in this folder (or every name of its
``__all__``) is a name of ``zoo.datamodules``, imported on first use (``from zoo.datamodules import SFTDataModule``, a
config's ``_target_``; :mod:`zoo.lazy`), so a new datamodule is a new file here, with no edit of this one.
"""

from zoo.lazy import discovered_exports

if __name__ != "zoo.datamodules":
    raise ImportError(
        "The 'datamodules' folder of paperzoo is installed as 'zoo.datamodules'. Use 'import zoo.datamodules' "
        "(after 'pip install -e .' in the repository root)."
    )

__getattr__, __dir__ = discovered_exports(__name__, globals())
