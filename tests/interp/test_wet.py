"""WET cores: entropy and gate values, the rankers on a planted world-dependent head, the controller's gate.

Pins: uniform probe => H = log K; the gate formula on hand values; the score-matching and probe-accuracy rankers
put a planted world-dependent head (synthetic Gaussian head outputs with distractor heads of large scale or a
world-independent offset) first, deterministically; a head whose output is discarded has patching effect 0; a
closed gate gives bit-identical logits and a fully open one equals static scaling; the gated decode with the KV
cache equals an uncached re-forward at every step; heads not above the probe layer are refused.
"""

from __future__ import annotations

import math

import pytest
import torch
from interp_models import build_model, record_step_logits, single_thread, uncached_greedy_check  # noqa: F401

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError, DataError
from zoo.generation import generate
from zoo.interp import HeadScaler, LinearProbe, model_layout
from zoo.interp.hooks import forward_left_padded
from zoo.interp.wet import (
    PatchingEffectRanker,
    ProbeAccuracyRanker,
    ScoreMatchingRanker,
    WETController,
    WorldBatch,
    WorldEntropyProbe,
    entropy_gate,
    fit_world_probe,
    top_heads,
    world_entropy,
)
from zoo.protocols import SamplingParams

K = 4
PLANTED = (1, 2)


def test_world_entropy_and_gate_hand_values():
    assert float(world_entropy(torch.zeros(K))) == pytest.approx(math.log(K), abs=1e-6)
    p = torch.tensor([0.25, 0.75])
    assert float(world_entropy(p.log())) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert float(world_entropy(torch.tensor([30.0, 0.0, 0.0, 0.0]))) < 1e-10
    eta = 0.5
    mid = (eta + math.log(K)) / 2
    gate = entropy_gate(torch.tensor([0.1, eta, mid, math.log(K), 5.0]), eta, K)
    torch.testing.assert_close(gate, torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]))
    with pytest.raises(ConfigError, match="below log K"):
        entropy_gate(torch.zeros(1), math.log(K), K)


def test_uniform_probe_gives_log_k_everywhere():
    probe = WorldEntropyProbe(0, K, LinearProbe.from_weights(torch.zeros(K, 16), torch.zeros(K)))
    h = torch.randn(3, 5, 16) * 100
    torch.testing.assert_close(probe.entropy(h), torch.full((3, 5), math.log(K)))
    assert probe.probabilities(h).shape == (3, 5, K)


def planted_head_outputs(seed: int = 0, n: int = 400, shift: float = 1.0):
    """Head outputs ``[N, L=2, H=4, d=8]``; only head PLANTED has a world-dependent mean. Distractors: heads of
    random scale up to ~4.5, one with a large world-independent offset and one with 10x the variance."""
    g = torch.Generator().manual_seed(seed)
    worlds = torch.randint(K, (n,), generator=g)
    scale = torch.rand(1, 2, 4, 1, generator=g) * 4 + 0.5
    z = torch.randn(n, 2, 4, 8, generator=g) * scale
    z[:, 0, 1] += torch.randn(8, generator=g) * 3
    z[:, 0, 2] *= 10
    means = torch.randn(K, 8, generator=g)
    z[:, PLANTED[0], PLANTED[1]] = torch.randn(n, 8, generator=g) + shift * means[worlds]
    return z, worlds


@pytest.mark.parametrize(
    "ranker", [ScoreMatchingRanker(steps=150, batch_size=128), ProbeAccuracyRanker()], ids=["score_matching", "probe"]
)
def test_rankers_recover_a_planted_world_dependent_head(ranker):
    z, worlds = planted_head_outputs()
    scores = ranker.score_head_outputs(z, worlds)
    assert scores.shape == (2, 4)
    assert top_heads(scores, 1) == [PLANTED]
    others = torch.cat(
        [scores.flatten()[: PLANTED[0] * 4 + PLANTED[1]], scores.flatten()[PLANTED[0] * 4 + PLANTED[1] + 1 :]]
    )
    assert float(scores[PLANTED]) > 2 * float(others.max())
    # Deterministic: the same scores after the global RNG moved on.
    torch.manual_seed(123)
    torch.rand(10)
    assert torch.equal(ranker.score_head_outputs(z, worlds), scores)


def test_score_matching_ranks_nothing_high_without_a_world_signal():
    z, worlds = planted_head_outputs(shift=0.0)
    scores = ScoreMatchingRanker(steps=150, batch_size=128).score_head_outputs(z, worlds)
    z_planted, _ = planted_head_outputs(shift=1.0)
    with_signal = ScoreMatchingRanker(steps=150, batch_size=128).score_head_outputs(z_planted, worlds)
    assert float(scores.max()) < 0.25 * float(with_signal[PLANTED])


def test_top_heads_respects_min_layer_ties_and_bounds():
    scores = torch.tensor([[9.0, 1.0], [2.0, 2.0], [0.5, 3.0]])
    assert top_heads(scores, 2) == [(0, 0), (2, 1)]
    assert top_heads(scores, 3, min_layer=1) == [(2, 1), (1, 0), (1, 1)]
    with pytest.raises(ConfigError, match="k=5"):
        top_heads(scores, 5, min_layer=1)


def test_ranker_inputs_are_checked():
    with pytest.raises(DataError, match=r"\[N, L, H, d_head\]"):
        ProbeAccuracyRanker().score_head_outputs(torch.zeros(4, 8), torch.zeros(4))
    with pytest.raises(DataError, match="two worlds"):
        ProbeAccuracyRanker().score_head_outputs(torch.zeros(4, 1, 2, 3), torch.zeros(4))
    with pytest.raises(ConfigError, match="sigmas"):
        ScoreMatchingRanker(sigmas=(0.0,))


# -- on a model -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    return build_model("llama", seed=3), build_char_tokenizer()


def world_batch(tok, n_per_world=6):
    """Prompts ``W<k>:<entity>=`` whose world is the first character after W; counterfactuals swap the world."""
    prompts, sources, worlds = [], [], []
    for k in range(K):
        for i in range(n_per_world):
            prompts.append(f"W{k}: item {i}=")
            sources.append(f"W{(k + 1) % K}: item {i}=")
            worlds.append(k)
    ids, mask = encode_prompts(tok, prompts)
    src_ids, src_mask = encode_prompts(tok, sources)
    answers = torch.tensor(tok.convert_tokens_to_ids([str(w) for w in worlds]))
    return WorldBatch(ids, mask, torch.tensor(worlds), answers, src_ids, src_mask)


def test_fit_world_probe_and_head_output_ranker_on_a_model(lm):
    model, tok = lm
    batch = world_batch(tok)
    probe = fit_world_probe(model, batch, layer=1, num_worlds=K)
    assert probe.layer == 1 and probe.probe.fitted
    scores = ProbeAccuracyRanker(holdout_fraction=0.5).score(model, batch)
    assert scores.shape == (3, 4) and bool(((scores >= 0) & (scores <= 1)).all())


def test_patching_effect_is_zero_for_a_head_whose_output_is_discarded(lm):
    model, tok = lm
    model = build_model("llama", seed=3)
    layout = model_layout(model)
    d = layout.head_dim
    with torch.no_grad():
        layout.attn_out_projs[1].weight[:, 2 * d : 3 * d] = 0.0  # head (1, 2) writes nothing
    batch = world_batch(tok)
    effects = PatchingEffectRanker(batch_size=10).score(model, batch)
    assert effects.shape == (3, 4)
    assert float(effects[1, 2]) == 0.0
    assert float(effects.abs().sum()) > 0.0
    with pytest.raises(DataError, match="answer_ids"):
        PatchingEffectRanker().score(model, WorldBatch(batch.input_ids, batch.attention_mask, batch.worlds))


def fixed_probe(layer, bias, width=32):
    return WorldEntropyProbe(layer, K, LinearProbe.from_weights(torch.zeros(K, width), torch.tensor(bias)))


def test_closed_gate_is_bit_identical_and_open_gate_equals_static_scaling(lm):
    model, tok = lm
    ids, mask = encode_prompts(tok, ["W1: item 3=", "W2: a longer item 4="])
    with torch.no_grad():
        base = forward_left_padded(model, ids, mask)
        confident = fixed_probe(0, [12.0, 0.0, 0.0, 0.0])  # H ~ 2e-5 everywhere: gate closed
        with WETController(model, confident, heads=[(1, 0), (2, 3)], alpha=2.0, beta=0.5, eta=0.3) as wet:
            closed = forward_left_padded(model, ids, mask)
        assert torch.equal(closed, base)
        assert all(bool((g == 0).all()) for g in wet.gates) and wet.gates[0].shape == ids.shape

        uniform = fixed_probe(0, [0.0, 0.0, 0.0, 0.0])  # H = log K: gate fully open
        with WETController(model, uniform, heads=[(1, 0), (2, 3)], alpha=2.0, beta=0.5, eta=0.3) as wet:
            opened = forward_left_padded(model, ids, mask)
        static = {(layer, head): 0.5 for layer in (1, 2) for head in range(4)}
        static.update({(1, 0): 3.0, (2, 3): 3.0})
        with HeadScaler(model, static):
            expected = forward_left_padded(model, ids, mask)
        assert torch.equal(opened, expected)
        assert not torch.equal(opened, base)
        torch.testing.assert_close(wet.entropies[0], torch.full(ids.shape, math.log(K)))


def test_gated_generation_with_cache_equals_uncached_reforward(lm):
    model, tok = lm
    batch = world_batch(tok)
    probe = fit_world_probe(model, batch, layer=0, num_worlds=K)
    ids, mask = encode_prompts(tok, ["W1: item 3=", "W3: other item 2="])
    with torch.no_grad(), WETController(model, probe, heads=[(1, 1), (2, 0)], alpha=3.0, eta=0.0) as wet:
        forward_left_padded(model, ids, mask)
    entropies = torch.cat([e.flatten() for e in wet.entropies])
    eta = float(entropies.median())  # half the positions gate open, half closed
    controller = WETController(model, probe, heads=[(1, 1), (2, 0)], alpha=3.0, beta=0.3, eta=eta)
    step_logits, handle = record_step_logits(model)
    try:
        with controller:
            result = generate(model, tok, ids, mask, SamplingParams(max_new_tokens=8))
    finally:
        handle.remove()
    gates = torch.cat([g.flatten() for g in controller.gates])
    assert bool((gates == 0).any()) and bool((gates > 0).any())
    with controller:
        uncached_greedy_check(model, ids, mask, result.completion_ids, step_logits, result.completion_mask)


def test_controller_refuses_bad_settings(lm):
    model, _ = lm
    probe = fixed_probe(1, [0.0] * K)
    with pytest.raises(ConfigError, match="not above the probe layer 1"):
        WETController(model, probe, heads=[(1, 0)], alpha=1.0, eta=0.5)
    with pytest.raises(ConfigError, match="below log K"):
        WETController(model, probe, heads=[(2, 0)], alpha=1.0, eta=2.0)
    with pytest.raises(ConfigError, match="beta"):
        WETController(model, probe, heads=[(2, 0)], alpha=1.0, eta=0.5, beta=1.5)
    with pytest.raises(ConfigError, match="head index out of range"):
        WETController(model, probe, heads=[(2, 4)], alpha=1.0, eta=0.5)
    with pytest.raises(ConfigError, match="not fitted"):
        WETController(model, WorldEntropyProbe(1, K), heads=[(2, 0)], alpha=1.0, eta=0.5)
    with pytest.raises(ConfigError, match="probe layer=3 is out of range"):
        WETController(model, fixed_probe(3, [0.0] * K), heads=[(2, 0)], alpha=1.0, eta=0.5)
