"""WET: where the world probe is fitted (``probe_positions``: the last prompt token, the prompt anchors, or both) and
the calibrated gate threshold (``eta_quantile``).

Pins: the anchor mask marks exactly the world tag's digits of left-padded prompts (hand positions); the probe's
training rows are the residuals at those positions (compared with a plain forward) with the row's world; the three
choices give different probes and different cache keys; the calibrated ``eta`` is the quantile of ``H`` at the last
prompt token of the calibration prompts, so the gate opens on at most ``1 - q`` of them, and an uninformative probe is
refused; the callback's hook uses the calibrated threshold and the fit file records it; bad settings are named.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from interp_models import build_model, liven, quiet_trainer, single_thread  # noqa: F401  (single_thread: autouse)

from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.callbacks import WETCallback
from zoo.data.multiworld import MultiWorldRecallTask
from zoo.data.sources import TaskSource
from zoo.datamodules import SFTDataModule
from zoo.encoding import encode_prompts
from zoo.errors import ConfigError, DataError
from zoo.interp import LinearProbe
from zoo.interp.hooks import ActivationCache, forward_left_padded
from zoo.interp.wet import (
    PROBE_POSITIONS,
    ProbeAccuracyRanker,
    RandomRanker,
    WETArtifact,
    WorldBatch,
    WorldEntropyProbe,
    anchor_mask,
    calibrate_eta,
    entropy_gate,
    fit_wet,
    probe_rows,
    world_activations,
)
from zoo.modules import CausalLMModule

K = 4
PATTERN = r"^W(\d+)"


@pytest.fixture(scope="module")
def source():
    return TaskSource(MultiWorldRecallTask(max_distractors=4), num_train=96, num_val=48, num_test=8, seed=0)


def test_anchor_mask_marks_the_world_digits_of_left_padded_prompts():
    tok = build_char_tokenizer()
    prompts = ["W2:ab E07=", "W13:xyzuv E01="]
    ids, mask = encode_prompts(tok, prompts)
    anchors = anchor_mask(tok, prompts, PATTERN, ids.shape[1])
    assert anchors.shape == ids.shape and anchors.dtype == torch.bool
    bos = int(tok.bos_token_id is not None)
    width = ids.shape[1]
    for row, prompt in enumerate(prompts):
        start = width - (len(prompt) + bos)  # the char tokenizer: one token per character, left padding
        digits = [
            start + bos + i for i, c in enumerate(prompt) if i >= 1 and c.isdigit() and prompt[1 : i + 1].isdigit()
        ]
        assert anchors[row].nonzero().flatten().tolist() == digits
        assert bool(mask[row][anchors[row]].all())
    assert anchors.sum().tolist() == 3  # "2", then "1" and "3"
    # no group: the whole match
    assert anchor_mask(tok, ["W2:ab E07="], r"W\d").sum() == 2
    with pytest.raises(DataError, match="does not match"):
        anchor_mask(tok, ["X2:ab E07="], PATTERN)


def test_probe_rows_read_the_residual_at_the_chosen_positions(source):
    model, tok = build_model("llama", seed=1), build_char_tokenizer()
    rows = source.rows("train")[:10]
    batch = WorldBatch.from_rows(tok, rows, counterfactual_field=None, anchor_pattern=PATTERN)
    cache = ActivationCache(model, [1], site="residual")
    with torch.no_grad(), cache:
        forward_left_padded(model, batch.input_ids, batch.attention_mask)
    full = cache[1]
    anchors = batch.anchor_mask
    n_anchor = int(anchors.sum())

    last, worlds = probe_rows(model, batch, 1, "last")
    torch.testing.assert_close(last, full[:, -1].float())
    assert torch.equal(worlds, batch.worlds)
    torch.testing.assert_close(last, world_activations(model, batch, 1))

    at_anchors, worlds = probe_rows(model, batch, 1, "anchors", batch_size=3)
    assert at_anchors.shape == (n_anchor, full.shape[-1])
    torch.testing.assert_close(at_anchors, full[anchors].float())
    assert torch.equal(worlds, batch.worlds[:, None].expand_as(anchors)[anchors])

    both, worlds = probe_rows(model, batch, 1, "anchors+last", batch_size=4)
    assert both.shape[0] == n_anchor + len(rows)  # the last token is never an anchor here
    assert sorted(worlds.tolist()) == sorted(
        batch.worlds[:, None].expand_as(anchors)[anchors].tolist() + batch.worlds.tolist()
    )

    plain = WorldBatch.from_rows(tok, rows, counterfactual_field=None)
    with pytest.raises(ConfigError, match="anchor_pattern"):
        probe_rows(model, plain, 1, "anchors")
    with pytest.raises(ConfigError, match="probe_positions='first'"):
        probe_rows(model, batch, 1, "first")


def test_each_choice_of_positions_gives_its_own_probe(source):
    model, tok = build_model("llama", seed=1), build_char_tokenizer()
    liven(model, seed=1)
    batch = WorldBatch.from_rows(tok, source.rows("train"), counterfactual_field=None, anchor_pattern=PATTERN)
    fits = {p: fit_wet(model, batch, 1, K, RandomRanker(), probe_positions=p) for p in PROBE_POSITIONS}
    weights = [fits[p].probe.probe.weight for p in PROBE_POSITIONS]
    assert not torch.allclose(weights[0], weights[1]) and not torch.allclose(weights[1], weights[2])
    n = len(source.rows("train"))
    assert fits["last"].metrics["probe_rows"] == n and fits["anchors+last"].metrics["probe_rows"] > n
    assert fits["last"].metrics["probe_accuracy"] == fits["last"].metrics["probe_accuracy_last"]
    # at the anchors the world is named in the token itself: the anchor-only probe is (near) perfect in sample
    assert fits["anchors"].metrics["probe_accuracy"] >= 0.95
    assert fits["last"].eta is None and "eta" not in fits["last"].metrics


def test_calibrated_eta_is_the_quantile_of_h_on_held_out_prompts(tmp_path, source):
    model, tok = build_model("llama", seed=1), build_char_tokenizer()
    liven(model, seed=1)
    fit_rows = WorldBatch.from_rows(tok, source.rows("train"), counterfactual_field=None, anchor_pattern=PATTERN)
    held = WorldBatch.from_rows(tok, source.rows("val"), answer_field=None, counterfactual_field=None)
    q = 0.8
    artifact = fit_wet(
        model, fit_rows, 1, K, RandomRanker(), probe_positions="anchors+last", calibration=held, eta_quantile=q
    )
    entropy = artifact.probe.entropy(world_activations(model, held, 1))
    assert artifact.eta == pytest.approx(float(torch.quantile(entropy.double(), q, interpolation="higher")), abs=1e-6)
    assert artifact.metrics["eta"] == artifact.eta and artifact.metrics["calibration_rows"] == 48
    gate = entropy_gate(entropy, artifact.eta, K)
    assert float((gate > 0).float().mean()) <= 1 - q + 1e-9  # closed on at least q of the calibration prompts
    assert float((gate > 0).float().mean()) > 0  # and open on some (H varies across them)

    artifact.save(tmp_path / "wet")
    assert WETArtifact.load(tmp_path / "wet").eta == artifact.eta

    uniform = WorldEntropyProbe(
        1, K, LinearProbe.from_weights(torch.zeros(K, model.config.hidden_size), torch.zeros(K))
    )
    with pytest.raises(DataError, match="no information"):
        calibrate_eta(model, uniform, held, 0.5)
    with pytest.raises(ConfigError, match="eta_quantile=1.0"):
        calibrate_eta(model, artifact.probe, held, 1.0)
    with pytest.raises(ConfigError, match="both calibration"):
        fit_wet(model, fit_rows, 1, K, RandomRanker(), eta_quantile=0.9)


def test_the_callback_gates_with_the_calibrated_eta(tmp_path, source):
    task = MultiWorldRecallTask(max_distractors=4)
    module = CausalLMModule(
        TinyBackbone(seed=4, hidden_size=64, intermediate_size=128), generation={"max_new_tokens": 2}
    )
    module.configure_model()
    liven(module.model, seed=4)
    dm = SFTDataModule(module.tokenizer, source, batch_size=8, eval_batch_size=8)
    fit_file = tmp_path / "fit.json"
    callback = WETCallback(
        probe_layer=1,
        num_worlds=K,
        source=source,
        ranker=ProbeAccuracyRanker(),
        eta=0.5,
        eta_quantile=0.9,
        probe_positions="anchors+last",
        anchor_pattern=PATTERN,
        task=task,
        fit_file=str(fit_file),
        stages=["validate"],
    )
    quiet_trainer(callback).validate(module, datamodule=dm, verbose=False)
    eta = callback.artifact.eta
    assert eta is not None and eta != 0.5 and callback.hook.eta == eta == callback.eta_in_use
    fit = json.loads(fit_file.read_text())
    assert fit["eta"] == eta and fit["eta_quantile"] == 0.9 and fit["probe_positions"] == "anchors+last"
    assert callback.last_metrics["fit/eta"] == pytest.approx(eta)
    spec = callback.fit_spec("model")
    assert (spec["probe_positions"], spec["anchor_pattern"], spec["eta_quantile"]) == ("anchors+last", PATTERN, 0.9)
    other = WETCallback(probe_layer=1, num_worlds=K, source=source, probe_positions="last")
    assert other.fit_spec("model") != spec  # the cache key follows the positions and the calibration
    assert math.isclose(other.eta_in_use, 0.5)


def test_bad_position_and_calibration_settings_are_named(source):
    with pytest.raises(ConfigError, match="anchor_pattern"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, probe_positions="anchors")
    with pytest.raises(ConfigError, match="probe_positions='middle'"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, probe_positions="middle")
    with pytest.raises(ConfigError, match="eta_quantile=1.5"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, eta_quantile=1.5)
    with pytest.raises(ConfigError, match="the fit's split"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, eta_quantile=0.9, calibration_split="train")
