"""Shortest-of-N (``module/decoder=shortest_of_n``: SelfConsistencyDecoder with ``select=shortest``), the
compute-matched baseline of DTS-Greedy: N samples race in lockstep and the first to finish is returned."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

# the same tiny model, prompts and first-character verifier as the other anchor decoders' tests
from test_anchor_decoders import PROMPTS, FirstCharacter, tiny  # noqa: F401

from zoo.errors import ConfigError
from zoo.generation import SampleDecoder, SelfConsistencyDecoder
from zoo.protocols import SamplingParams


def test_shortest_of_n_returns_the_first_finished_sample_and_stops_the_race(tiny):  # noqa: F811 (the fixture)
    """The samples are the full samples cut where the first of the prompt's samples finished (same generator), the
    returned one is the shortest finished sample, and the work is sum_j min(len_j, shortest)."""
    model, tok, ids, mask = tiny
    n, params = 6, SamplingParams(12, do_sample=True, temperature=1.2)
    verifier = FirstCharacter()
    shortest = SelfConsistencyDecoder(num_samples=n, temperature=None, verifier=verifier, select="shortest")(
        model, tok, ids, mask, params=params, generator=torch.Generator().manual_seed(5)
    )
    full = SampleDecoder()(
        model,
        tok,
        ids.repeat_interleave(n, 0),
        mask.repeat_interleave(n, 0),
        params=params,
        generator=torch.Generator().manual_seed(5),
    )
    lengths, finished = full.lengths.tolist(), full.finished.tolist()
    races = 0
    for i in range(len(PROMPTS)):
        group = range(i * n, (i + 1) * n)
        first = min((lengths[j] for j in group if finished[j]), default=None)
        if first is None:  # nobody finished: the first sample, unfinished, after the whole budget
            chosen, work = i * n, sum(lengths[j] for j in group)
        else:
            chosen = next(j for j in group if finished[j] and lengths[j] == first)
            work = sum(min(lengths[j], first) for j in group)
            races += any(lengths[j] > first for j in group)
        assert shortest.texts[i] == full.texts[chosen]
        assert int(shortest.lengths[i]) == lengths[chosen] and bool(shortest.finished[i]) == finished[chosen]
        assert shortest.decoded_tokens[i] == work
    assert races >= 2, "some samples must have been stopped by the race"
    voted = SelfConsistencyDecoder(num_samples=n, temperature=None, verifier=verifier)(
        model, tok, ids, mask, params=params, generator=torch.Generator().manual_seed(5)
    )
    assert sum(voted.decoded_tokens) > sum(shortest.decoded_tokens)


def test_shortest_of_n_bad_select():
    with pytest.raises(ConfigError, match="module.decoder.select"):
        SelfConsistencyDecoder(select="longest")


def test_shortest_of_n_config_entry(train_cfg):
    cfg = train_cfg(["module/decoder=shortest_of_n", "task=forked"])
    decoder = instantiate(cfg.module.decoder, _convert_="all")
    assert isinstance(decoder, SelfConsistencyDecoder) and decoder.select == "shortest"
    assert type(decoder.verifier).__name__ == "ForkedTask"  # verifier: ${task}
