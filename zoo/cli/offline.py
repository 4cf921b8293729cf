"""No network at run time: the switches that keep the Hugging Face libraries (and ``kernels``) off the network.

``transformers``, ``peft`` and ``bitsandbytes`` import ``kernels`` (a dependency of transformers), which asks the
Hugging Face Hub for kernel repositories -- e.g. importing bitsandbytes' CPU backend calls
``kernels.get_kernel("kernels-community/quantization-bitsandbytes")``, a DNS query and an HTTPS request to
huggingface.co on every ``quant=bnb_nf4`` run. ``kernels`` has no switch of its own: it asks the Hub through
``huggingface_hub`` and stays off the network when ``huggingface_hub.constants.HF_HUB_OFFLINE`` is set (read from
``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` when huggingface_hub is imported). ``datasets`` reads
``HF_DATASETS_OFFLINE``.

:func:`stay_offline` runs when ``zoo.cli`` is imported, i.e. at the start of ``python train.py`` / ``zoo-train``
before any of those libraries: it sets each switch the user did not set. ``ZOO_ALLOW_NETWORK=1`` turns this off (the
user asks for the network, e.g. to download a hub model once); a switch the user set (``HF_HUB_OFFLINE=0``) is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

ALLOW_NETWORK = "ZOO_ALLOW_NETWORK"
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "true", "yes", "on"}


def network_allowed(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether the user asked for the network (``ZOO_ALLOW_NETWORK`` is 1/true/yes/on)."""
    environ = os.environ if environ is None else environ
    return environ.get(ALLOW_NETWORK, "").strip().lower() in _TRUE


def stay_offline(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set the offline switches that are not set in ``environ`` (default ``os.environ``) to ``1``, unless
    :func:`network_allowed`; returns the names it set.

    When ``huggingface_hub`` was imported before (a script that imports transformers and then the zoo's CLI), its
    offline flag was read already: it is set too, as the environment variable would have set it.
    """
    target = os.environ if environ is None else environ
    if network_allowed(target):
        return []
    added = [name for name in OFFLINE_SWITCHES if name not in target]
    for name in added:
        target[name] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    # neither HF_HUB_OFFLINE nor TRANSFORMERS_OFFLINE was set by the user: a flag already read is off
    if environ is None and constants is not None and {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"} <= set(added):
        constants.HF_HUB_OFFLINE = True
    return added


__all__ = ["ALLOW_NETWORK", "OFFLINE_SWITCHES", "network_allowed", "stay_offline"]
