"""``python train.py [overrides] --help``: the composed run's help, rendered from its ``hydra.help.template``.

Hydra's own ``--help`` lists the options of every config group through a freshly deep-copied config repository per
group; with the zoo's ~530 groups (and the launchers' structured configs in that repository) that cost ~4.5 s of CPU
per call before printing (measured in process, imports excluded). This renders the same template from one
composition and one walk of the config sources:

* ``$APP_CONFIG_GROUPS`` -- every non-``hydra`` group that holds a config, ``group: option, option`` sorted, as Hydra
  lists them (the zoo's package ``zoo.conf`` plus any ``hydra.searchpath`` entry);
* ``$CONFIG`` -- the composed config without its ``hydra`` node (resolved with ``--resolve``);
* ``${...}`` interpolations in the template (the header, ``${zoo.quick_settings:}``) resolve against the composed
  config, ``hydra`` node included.

``--hydra-help`` stays Hydra's own.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Iterator, Sequence
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, flag_override

#: the command-line flags that ask for this help
HELP_FLAGS = ("--help", "-h")
#: the only other flag this help reads; a command line with any other flag (``--config-name``, ``-m``, ...) gets
#: Hydra's own help
OTHER_HELP_FLAGS = ("--resolve",)
CONFIG_PACKAGE = "zoo.conf"
_SKIPPED = ("__pycache__", "__init__.py")


def _source_root(entry: str) -> Traversable | None:
    """The directory of a ``hydra.searchpath`` entry (``pkg://package`` or ``file://dir``); ``None`` for others."""
    if entry.startswith("pkg://"):
        return resources.files(entry.removeprefix("pkg://").replace("/", "."))
    if entry.startswith("file://"):
        return Path(entry.removeprefix("file://"))
    return None


def _groups_under(directory: Traversable, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(group, option)`` for every ``.yaml`` config below ``directory`` (the top level's configs are no group's)."""
    for entry in directory.iterdir():
        if entry.name in _SKIPPED or entry.name.startswith("."):
            continue
        if entry.is_dir():
            yield from _groups_under(entry, f"{prefix}{entry.name}/")
        elif prefix and entry.name.endswith(".yaml"):
            yield prefix.rstrip("/"), entry.name.removesuffix(".yaml")


def config_groups(searchpath: Sequence[str] = ()) -> dict[str, list[str]]:
    """Every config group of the app (``hydra/...`` excluded) and its options, sorted: ``zoo.conf``'s, then those of
    each ``searchpath`` entry (merged into the same groups)."""
    roots = [resources.files(CONFIG_PACKAGE), *(r for r in map(_source_root, searchpath) if r is not None)]
    groups: dict[str, set[str]] = {}
    for root in roots:
        for group, option in _groups_under(root):
            if group != "hydra" and not group.startswith("hydra/"):
                groups.setdefault(group, set()).add(option)
    return {group: sorted(options) for group, options in sorted(groups.items())}


def format_groups(groups: dict[str, list[str]]) -> str:
    """Hydra's compact listing: one ``group: option, option`` line per group."""
    return "".join(f"{group}: {', '.join(options)}\n" for group, options in groups.items())


def wants_help(argv: Sequence[str]) -> bool:
    """Whether a command line asks for this help: ``--help``/``-h`` among overrides (``--resolve`` allowed);
    ``--hydra-help`` and a command line with other flags are Hydra's."""
    flags = [arg for arg in argv if arg.startswith("-")]
    return any(f in HELP_FLAGS for f in flags) and all(f in (*HELP_FLAGS, *OTHER_HELP_FLAGS) for f in flags)


def render_help(argv: Sequence[str]) -> str:
    """The help text of ``python train.py <argv>`` (``argv`` holds ``--help``, maybe ``--resolve``, and overrides)."""
    overrides = [arg for arg in argv if not arg.startswith("-")]
    with initialize_config_module(config_module=CONFIG_PACKAGE, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # ``${hydra:...}`` in the config resolves under ``--resolve``
    help_cfg = cfg.hydra.help
    clean = copy.deepcopy(cfg)
    with flag_override(clean, ["struct", "readonly"], False):
        del clean["hydra"]
    searchpath = [str(entry) for entry in OmegaConf.select(cfg, "hydra.searchpath", default=None) or []]
    return string.Template(help_cfg.template).safe_substitute(
        APP_CONFIG_GROUPS=format_groups(config_groups(searchpath)),
        CONFIG=OmegaConf.to_yaml(clean, resolve="--resolve" in argv),
    )
