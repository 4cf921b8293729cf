"""Command-line entry points (``train.py`` / ``zoo-train``).

Importing this package -- the entry points do, before transformers, peft or bitsandbytes are imported -- keeps the
Hugging Face libraries off the network (:func:`zoo.cli.offline.stay_offline`; ``ZOO_ALLOW_NETWORK=1`` lets them on),
then imports :mod:`zoo.cli.train`, which registers the app's run and job for prerequisite builds.
"""

from zoo.cli.offline import stay_offline

stay_offline()

# the app registers its run and job (zoo.cli.artifacts.APP), which prerequisite builds call
import zoo.cli.train  # noqa: E402, F401
