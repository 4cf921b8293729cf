"""Keyed green sets: which regions a sentence may land in, given the key and the previous sentence's region.

SemStamp draws its valid set with ``randperm`` seeded by ``15485863 * region(previous sentence)`` on the model's
device and warns that generation and detection must then run on the same kind of device (research notes
``inference.md`` 0.6). Here the seed mixes the secret key and the previous region through SHA-256 and the
permutation comes from a CPU ``torch.Generator``: the same green set on every machine and device.

``G(key, r_prev)`` = the first ``gamma R`` entries of ``randperm(R)`` under seed ``H(key, r_prev)``.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache

import torch

from zoo.errors import ConfigError
from zoo.watermark.partition import seeded_generator


def check_gamma(gamma: float) -> float:
    """``gamma`` as a float, refused unless ``0 < gamma < 1``."""
    try:
        gamma = float(gamma)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"gamma must be a number in (0, 1), got {gamma!r}") from err
    if not 0.0 < gamma < 1.0:
        raise ConfigError(f"gamma (the green fraction of regions) must be in (0, 1), got {gamma}")
    return gamma


def green_size(num_regions: int, gamma: float) -> int:
    """``|G| = gamma R``, which must be a whole number in ``[1, R - 1]`` (otherwise the z-test's ``gamma`` would
    not be the true green fraction)."""
    gamma = check_gamma(gamma)
    size = gamma * num_regions
    if not math.isclose(size, round(size), abs_tol=1e-9) or not 1 <= round(size) <= num_regions - 1:
        raise ConfigError(
            f"gamma={gamma} with num_regions={num_regions} gives {size:g} green regions; choose gamma so that "
            f"gamma * num_regions is a whole number between 1 and {num_regions - 1} (e.g. gamma=0.25 with 8 regions)"
        )
    return round(size)


def green_seed(key: int, previous_region: int) -> int:
    """Seed of ``G(key, previous_region)``: the first 63 bits of ``SHA-256("key:previous_region")``."""
    digest = hashlib.sha256(f"{int(key)}:{int(previous_region)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@lru_cache(maxsize=4096)
def _green_tuple(key: int, previous_region: int, num_regions: int, size: int) -> tuple[int, ...]:
    permutation = torch.randperm(num_regions, generator=seeded_generator(green_seed(key, previous_region)))
    return tuple(sorted(permutation[:size].tolist()))


def green_regions(key: int, previous_region: int, num_regions: int, gamma: float) -> torch.Tensor:
    """Sorted green region ids ``[gamma R]`` (long) for ``(key, previous_region)``."""
    if not 0 <= previous_region < num_regions:
        raise ConfigError(f"previous_region={previous_region} is not a region id in [0, {num_regions})")
    size = green_size(num_regions, gamma)
    return torch.tensor(_green_tuple(int(key), int(previous_region), int(num_regions), size), dtype=torch.long)


class GreenList:
    """The green sets of one key over ``num_regions`` regions.

    Args:
        key: the secret key (any integer).
        num_regions: ``R`` of the partition.
        gamma: green fraction; ``gamma R`` must be a whole number in ``[1, R - 1]``.
    """

    def __init__(self, key: int, num_regions: int, gamma: float) -> None:
        if isinstance(key, bool) or not isinstance(key, int):
            raise ConfigError(f"the watermark key must be an integer, got {key!r}")
        self.key = key
        self.num_regions = int(num_regions)
        self.gamma = check_gamma(gamma)
        self.size = green_size(self.num_regions, self.gamma)
        self._masks: dict[int, torch.Tensor] = {}  # previous region -> [R] bool, filled on first use

    def regions(self, previous_region: int) -> torch.Tensor:
        """Sorted green ids ``[gamma R]`` after a sentence in ``previous_region``."""
        return green_regions(self.key, previous_region, self.num_regions, self.gamma)

    def mask(self, previous_region: int) -> torch.Tensor:
        """``[R]`` bool: which regions are green after a sentence in ``previous_region``."""
        previous_region = int(previous_region)
        if previous_region not in self._masks:
            mask = torch.zeros(self.num_regions, dtype=torch.bool)
            mask[self.regions(previous_region)] = True
            self._masks[previous_region] = mask
        return self._masks[previous_region].clone()

    def is_green(self, regions: torch.Tensor, previous_regions: torch.Tensor) -> torch.Tensor:
        """``[N]`` bool: ``regions[i] in G(key, previous_regions[i])`` (both long ``[N]``, any device)."""
        regions = torch.as_tensor(regions, dtype=torch.long).cpu()
        previous_regions = torch.as_tensor(previous_regions, dtype=torch.long).cpu()
        if regions.shape != previous_regions.shape:
            raise ConfigError(
                f"is_green needs regions and previous_regions of one shape, got {tuple(regions.shape)} "
                f"and {tuple(previous_regions.shape)}"
            )
        out = torch.zeros(regions.shape, dtype=torch.bool)
        for previous in previous_regions.unique().tolist():
            rows = previous_regions == previous
            out[rows] = self.mask(previous)[regions[rows]]
        return out
