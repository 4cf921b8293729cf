"""paperzoo: components for the methods of nineteen ICML 2026 papers, on Lightning and Hydra.

The import root is ``zoo``. The top-level folders ``callbacks/``, ``datamodules/`` and ``conf/`` of the
repository are installed as ``zoo.callbacks``, ``zoo.datamodules`` and ``zoo.conf``.
"""

__version__ = "0.1.0"
