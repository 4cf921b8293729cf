"""Sentence-level rejection sampling with scripted proposers (the candidate source a model will replace).

The proposers are scripts over real grammar sentences whose regions are computed with the real hashing encoder
and a fitted X-Guard partition, so each expectation (which candidate is accepted, after how many trials) follows
from the scheme, not from a stub.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import pytest
import torch
from wm_helpers import ENCODER, GRAMMAR, anisotropic_gaussian, fitted

from zoo.errors import ConfigError, DataError
from zoo.watermark import LSHPartitioner, RejectionSampler, RowState, WatermarkScheme, detect

PREVIOUS = 5


class CountingEncoder:
    """The real hashing encoder, counting its calls (to check that a round embeds all rows at once)."""

    def __init__(self) -> None:
        self.dim, self.name, self.calls = ENCODER.dim, ENCODER.name, 0

    def encode(self, sentences: Sequence[str]) -> torch.Tensor:
        self.calls += 1
        return ENCODER.encode(sentences)


@cache
def pool() -> dict[str, list[tuple[str, float]]]:
    """Grammar sentences split by the acceptance test after a sentence in region PREVIOUS (key 11, gamma .25)."""
    scheme = WatermarkScheme(ENCODER, fitted("balanced"), key=11, gamma=0.25)
    sentences = list(dict.fromkeys(GRAMMAR.corpus(400, seed=9)))
    regions, margins = scheme.regions(sentences)
    green = scheme.green.is_green(regions, torch.full_like(regions, PREVIOUS))
    out: dict[str, list[tuple[str, float]]] = {"green": [], "red": []}
    for s, g, m in zip(sentences, green.tolist(), margins.tolist()):
        out["green" if g else "red"].append((s, m))
    assert len(out["green"]) >= 10 and len(out["red"]) >= 30
    return out


def script(sentences: list[str]):
    """A proposer returning the scripted sentences in order; records the ``n`` of each call."""
    queue, calls = list(sentences), []

    def propose(n: int) -> list[str]:
        calls.append(n)
        out, queue[:] = queue[:n], queue[n:]
        return out

    return propose, calls


def sampler(**kwargs) -> RejectionSampler:
    return RejectionSampler(WatermarkScheme(ENCODER, fitted("balanced"), key=11, gamma=0.25), **kwargs)


def test_accepts_first_green_candidate_and_counts_trials():
    red = [s for s, _ in pool()["red"][:3]]
    green = pool()["green"][0][0]
    propose, calls = script([*red, green, "never drawn."])
    sample = sampler(max_trials=10).sample(propose, PREVIOUS)
    assert sample.text == green and sample.passed and sample.green
    assert sample.trials == 4 and calls == [1, 1, 1, 1]


def test_rounds_of_n_candidates_and_trials_inside_a_round():
    red = [s for s, _ in pool()["red"][:4]]
    green = pool()["green"][1][0]
    propose, calls = script([*red, green, "x.", "y."])
    sample = sampler(max_trials=10, candidates_per_round=3).sample(propose, PREVIOUS)
    assert sample.text == green and sample.trials == 5 and calls == [3, 3]


def test_max_trials_then_accept_the_last_candidate():
    red = [s for s, _ in pool()["red"][:7]]
    propose, calls = script(red)
    sample = sampler(max_trials=7, candidates_per_round=3).sample(propose, PREVIOUS)
    assert calls == [3, 3, 1]  # the last round is cut to the trials left
    assert sample.text == red[-1] and not sample.passed and not sample.green and sample.trials == 7


def test_margin_test_rejects_green_candidates_too_close_to_a_boundary():
    greens = sorted(pool()["green"], key=lambda item: item[1])
    (low, low_margin), (high, high_margin) = greens[0], greens[-1]
    threshold = 0.5 * (low_margin + high_margin)
    propose, _ = script([low, high])
    sample = sampler(margin=threshold, max_trials=5).sample(propose, PREVIOUS)
    assert sample.text == high and sample.trials == 2 and sample.margin >= threshold
    # without the margin test the first green candidate is taken
    propose, _ = script([low, high])
    assert sampler(margin=0.0).sample(propose, PREVIOUS).text == low


def test_fallback_best_keeps_the_green_candidate_with_the_largest_margin():
    greens = sorted(pool()["green"], key=lambda item: item[1])
    red = pool()["red"][0][0]
    margin = greens[-1][1] + 1.0  # nothing passes
    order = [greens[1][0], red, greens[2][0], greens[0][0], red]
    propose, _ = script(order)
    best = sampler(margin=margin, max_trials=5, fallback="best").sample(propose, PREVIOUS)
    assert best.text == greens[2][0] and best.green and not best.passed and best.trials == 5
    propose, _ = script(order)
    assert sampler(margin=margin, max_trials=5, fallback="last").sample(propose, PREVIOUS).text == red


def test_candidates_are_cut_at_their_first_sentence():
    green = pool()["green"][0][0]
    propose, _ = script([f"{green} And then something else happened."])
    assert sampler().sample(propose, PREVIOUS).text == green


def test_one_round_for_many_rows_embeds_once():
    encoder = CountingEncoder()
    scheme = WatermarkScheme(encoder, fitted("balanced"), key=11, gamma=0.25)
    rejection = RejectionSampler(scheme, max_trials=4, candidates_per_round=2)
    red = [s for s, _ in pool()["red"][:6]]
    green = pool()["green"][0][0]
    states = [RowState(PREVIOUS), RowState(PREVIOUS), RowState(PREVIOUS, trials=2)]
    out = rejection.choose([[red[0], green], [red[1], red[2]], [red[3], red[4]]], states)
    assert encoder.calls == 1
    assert out[0] is not None and out[0].text == green and out[0].trials == 2
    assert out[1] is None and states[1].trials == 2  # needs another round
    assert out[2] is not None and not out[2].passed and out[2].text == red[4] and out[2].trials == 4


def test_generate_and_detect_with_the_grammar_proposer():
    rejection = sampler(max_trials=60, candidates_per_round=4)
    text = rejection.generate(GRAMMAR.proposer(3), "The weather was cold.", 12)
    assert len(text.sentences) == 12 and text.mean_trials >= 1
    assert text.success_rate > 0.8
    passed = [s.passed for s in text.samples]
    result = detect(text.text, rejection.scheme)
    assert result.sentences == text.sentences
    assert result.regions == [s.region for s in text.samples]
    # every sentence that passed is green in detection (sentence 1 is not scored)
    assert all(g for g, p in zip(result.green[1:], passed[1:]) if p)
    assert result.detected


def test_bad_configuration_and_proposer():
    with pytest.raises(ConfigError, match="max_trials"):
        sampler(max_trials=0)
    with pytest.raises(ConfigError, match="fallback"):
        sampler(fallback="first")
    with pytest.raises(ConfigError, match="margin"):
        sampler(margin=-1)
    with pytest.raises(DataError, match="propose\\(2\\) returned 1"):
        sampler(candidates_per_round=2).sample(lambda n: ["Only one."], PREVIOUS)
    other_dim = LSHPartitioner(8).fit(anisotropic_gaussian(64, 0))
    with pytest.raises(ConfigError, match="gives 128-dim embeddings but the partition was fit on 24-dim"):
        WatermarkScheme(ENCODER, other_dim, key=0)
