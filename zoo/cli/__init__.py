"""Command-line entry points (``train.py`` / ``zoo-train``).

Importing this package -- the entry points do, before transformers, peft or bitsandbytes are imported -- keeps the
Hugging Face libraries off the network (:func:`zoo.cli.offline.stay_offline`; ``ZOO_ALLOW_NETWORK=1`` lets them on).
"""

from zoo.cli.offline import stay_offline

stay_offline()
