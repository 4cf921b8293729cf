"""Keyed green sets: deterministic given (key, previous region), CPU-generator based, validated gamma."""

from __future__ import annotations

import hashlib

import pytest
import torch

from zoo.errors import ConfigError
from zoo.watermark import GreenList, green_regions, green_seed


def test_green_sets_deterministic_given_key_and_previous_region():
    first = [green_regions(7, prev, 16, 0.25) for prev in range(16)]
    torch.manual_seed(999)  # the global RNG does not enter
    torch.rand(100)
    again = [green_regions(7, prev, 16, 0.25) for prev in range(16)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(len(g) == 4 and len(set(g.tolist())) == 4 for g in first)
    assert all(torch.equal(g, g.sort().values) for g in first)
    # the set depends on both the previous region and the key
    assert len({tuple(g.tolist()) for g in first}) > 8
    other_key = [green_regions(8, prev, 16, 0.25) for prev in range(16)]
    assert any(not torch.equal(a, b) for a, b in zip(first, other_key))


def test_green_set_is_the_seeded_cpu_permutation():
    # the documented derivation, recomputed here: SHA-256 of "key:previous" -> 63-bit seed -> randperm prefix
    digest = hashlib.sha256(b"12345:3").digest()
    seed = int.from_bytes(digest[:8], "little") >> 1
    assert green_seed(12345, 3) == seed
    g = torch.Generator(device="cpu").manual_seed(seed)
    expected = torch.randperm(8, generator=g)[:2].sort().values
    assert torch.equal(green_regions(12345, 3, 8, 0.25), expected)


def test_green_list_table_mask_and_membership():
    green = GreenList(key=3, num_regions=8, gamma=0.5)
    assert green.size == 4
    for prev in range(8):
        mask = green.mask(prev)
        assert int(mask.sum()) == 4
        assert mask.nonzero().flatten().tolist() == green.regions(prev).tolist()
    regions = torch.arange(8).repeat(8)
    previous = torch.arange(8).repeat_interleave(8)
    flags = green.is_green(regions, previous)
    expected = torch.tensor([int(r) in green.regions(int(p)).tolist() for r, p in zip(regions, previous)])
    assert torch.equal(flags, expected)
    # over all (previous, region) pairs exactly gamma of the regions are green
    assert float(flags.float().mean()) == 0.5


@pytest.mark.parametrize(
    ("gamma", "message"),
    [(0.0, "in \\(0, 1\\)"), (1.0, "in \\(0, 1\\)"), (-0.2, "in \\(0, 1\\)"), (0.3, "2.4 green regions")],
)
def test_gamma_must_be_valid(gamma, message):
    with pytest.raises(ConfigError, match=message):
        GreenList(0, 8, gamma)


def test_bad_key_and_region():
    with pytest.raises(ConfigError, match="integer"):
        GreenList("secret", 8, 0.25)
    with pytest.raises(ConfigError, match="previous_region=8"):
        green_regions(0, 8, 8, 0.25)
