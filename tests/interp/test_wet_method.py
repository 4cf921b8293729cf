"""WET as a method (+method=wet): the fitted artifact, the WETHook through the decoder seam, WETCallback in a plain
Lightning script, the config (ranker choices, the evaluation task apart from the policy's task) and the multi-world
recall task as SFT data (task=multiworld).

Pins: the artifact round-trips through disk exactly; during a module's validation the callback's hook gives exactly
the completions of decoding inside a WETController (and, with an open gate, not the unhooked ones); alpha = 0 leaves
the completions bit-identical; gate statistics, accuracy and misattribution equal hand computations from the rows;
fits are reused or redone as configured; nothing stays attached after a run; bad settings are named.
"""

from __future__ import annotations

import json
import math
from functools import partial

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate
from interp_models import (  # noqa: F401  (single_thread: autouse fixture)
    build_model,
    liven,
    no_hooks_left,
    quiet_trainer,
    single_thread,
)

from zoo.artifacts import model_fingerprint
from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.callbacks import WETCallback
from zoo.cli.train import run
from zoo.data.multiworld import MultiWorldRecallTask
from zoo.data.sources import TaskSource
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError, DataError
from zoo.generation import SampleDecoder
from zoo.interp import LinearProbe
from zoo.interp.probes import auroc
from zoo.interp.wet import (
    HeadRanker,
    PatchingEffectRanker,
    ProbeAccuracyRanker,
    RandomRanker,
    ScoreMatchingRanker,
    WETArtifact,
    WETController,
    WETHook,
    WorldBatch,
    WorldEntropyProbe,
    fit_wet,
)
from zoo.modules import CausalLMModule
from zoo.protocols import SamplingParams

K = 4
GEN = {"max_new_tokens": 3}


@pytest.fixture(scope="module")
def task():
    return MultiWorldRecallTask(max_distractors=4)


@pytest.fixture(scope="module")
def source(task):
    return TaskSource(task, num_train=128, num_val=24, num_test=8, seed=0)


def small_module() -> CausalLMModule:
    module = CausalLMModule(TinyBackbone(seed=4, hidden_size=64, intermediate_size=128), generation=GEN)
    module.configure_model()
    liven(module.model, seed=4)  # larger weights: a random model whose answers vary with the prompt
    return module


def uniform_artifact(width: int, num_layers: int = 4, num_heads: int = 4) -> WETArtifact:
    """A probe with zero weights (H = log K everywhere: the gate fully open) and heads (2, 1), (3, 2) ranked top."""
    probe = WorldEntropyProbe(0, K, LinearProbe.from_weights(torch.zeros(K, width), torch.zeros(K)))
    scores = torch.zeros(num_layers, num_heads)
    scores[2, 1], scores[3, 2] = 2.0, 1.0
    return WETArtifact(probe, scores, "manual")


class Recorder(pl.Callback):
    def __init__(self) -> None:
        self.completions: list[torch.Tensor] = []
        self.texts: list[str] = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.completions.append(outputs["completion_ids"].clone())
        self.texts += outputs["texts"]


def validate(module, dm, *callbacks) -> Recorder:
    recorder = Recorder()
    quiet_trainer(*callbacks, recorder).validate(module, datamodule=dm, verbose=False)
    return recorder


# -- the artifact ---------------------------------------------------------------------------------------------------


def test_fit_wet_and_the_artifact_round_trip(tmp_path, source):
    model, tok = build_model("llama", seed=1), build_char_tokenizer()
    batch = WorldBatch.from_rows(tok, source.rows("train"), counterfactual_field=None)
    artifact = fit_wet(model, batch, probe_layer=0, num_worlds=K, ranker=ProbeAccuracyRanker())
    assert artifact.head_scores.shape == (3, 4) and artifact.ranker == "ProbeAccuracyRanker"
    heads = artifact.heads(3)
    assert len(heads) == 3 and all(layer >= 1 for layer, _ in heads)
    assert 0.0 <= artifact.metrics["probe_accuracy"] <= 1.0 and artifact.metrics["rows"] == 128

    artifact.save(tmp_path / "wet")
    loaded = WETArtifact.load(tmp_path / "wet")
    assert torch.equal(loaded.probe.probe.weight, artifact.probe.probe.weight)
    assert torch.equal(loaded.probe.probe.bias, artifact.probe.probe.bias)
    assert torch.equal(loaded.head_scores, artifact.head_scores)
    assert (loaded.probe.layer, loaded.probe.num_worlds, loaded.ranker) == (0, K, "ProbeAccuracyRanker")
    assert loaded.metrics == pytest.approx(artifact.metrics) and loaded.heads(3) == heads
    with pytest.raises(DataError, match="no WET artifact"):
        WETArtifact.load(tmp_path / "missing")


def test_random_ranker_is_seeded_and_fit_wet_checks_its_inputs(source):
    model, tok = build_model("llama", seed=1), build_char_tokenizer()
    batch = WorldBatch.from_rows(tok, source.rows("val"), counterfactual_field=None)
    first = RandomRanker(seed=3).score(model, batch)
    assert torch.equal(first, RandomRanker(seed=3).score(model, batch)) and first.shape == (3, 4)
    assert not torch.equal(first, RandomRanker(seed=4).score(model, batch))
    assert PatchingEffectRanker.needs_counterfactuals and not ScoreMatchingRanker.needs_counterfactuals

    class WrongShape(HeadRanker):
        def score(self, model, batch):
            return torch.zeros(2, 2)

    with pytest.raises(DataError, match=r"expected \[3, 4\]"):
        fit_wet(model, batch, 0, K, WrongShape())
    with pytest.raises(DataError, match="num_worlds=2"):
        fit_wet(model, batch, 0, 2, RandomRanker())


# -- the hook and the callback in module validation -----------------------------------------------------------------


def test_wet_hook_acts_in_module_validation_like_a_controller(tmp_path, task, source):
    module = small_module()
    dm = SFTDataModule(module.tokenizer, source, batch_size=8, eval_batch_size=8)
    plain = validate(module, dm)

    artifact = uniform_artifact(module.model.config.hidden_size)
    artifact.save(tmp_path / "wet")
    callback = WETCallback(
        probe_layer=0,
        num_worlds=K,
        artifact_dir=str(tmp_path / "wet"),
        num_heads=2,
        alpha=3.0,
        eta=0.5,
        task=task,
        records_file=str(tmp_path / "run" / "wet_records.jsonl"),
        fit_file=str(tmp_path / "run" / "wet_fit.json"),
    )
    hooked = validate(module, dm, callback)
    assert callback.heads == [(2, 1), (3, 2)]
    assert module.decoder.hooks == [] and no_hooks_left(module.model)

    reference = []
    with WETController(module.model, artifact.probe, [(2, 1), (3, 2)], alpha=3.0, eta=0.5):
        for batch in dm.val_dataloader():
            ids, mask = batch["prompt_ids"], batch["prompt_attention_mask"]
            out = SampleDecoder()(module.model, module.tokenizer, ids, mask, params=SamplingParams(**GEN))
            reference.append(out.completion_ids)
    assert torch.equal(torch.cat(hooked.completions), torch.cat(reference))
    assert not torch.equal(torch.cat(hooked.completions), torch.cat(plain.completions))

    # gate statistics: H = log K at every position, so g = 1 everywhere
    metrics = callback.last_metrics
    assert metrics["prompt_entropy"] == pytest.approx(math.log(K), abs=1e-5)
    assert metrics["gate_mean"] == pytest.approx(1.0) and metrics["gate_open_rate"] == 1.0
    assert metrics["step_gate_mean"] == pytest.approx(1.0)
    # accuracy and misattribution from the rows, by hand
    rows = source.rows("val")
    answers = [t.split("<eos>")[0].strip() for t in hooked.texts]
    correct = [a == r["answer"] for a, r in zip(answers, rows)]
    wrong_world = [a in r["world_values"] and a != r["answer"] for a, r in zip(answers, rows)]
    assert metrics["accuracy"] == pytest.approx(sum(correct) / len(rows))
    assert metrics["misattribution_rate"] == pytest.approx(sum(wrong_world) / len(rows))
    # the per-row records: one per validation row, in order, with the row's ground truth and the same judgements
    records = [json.loads(line) for line in (tmp_path / "run" / "wet_records.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == [r["prompt"] for r in rows]
    for record, row, answer, ok, wrong in zip(records, rows, answers, correct, wrong_world):
        assert record["stage"] == "validate"
        assert {k: record[k] for k in ("world", "entity", "distance", "conflict_world")} == {
            k: row[k] for k in ("world", "entity", "distance", "conflict_world")
        }
        assert (record["answer"], record["correct"], record["misattributed"]) == (answer, ok, wrong)
        attributed = task.attribute(row["entity"], answer) if answer else None
        assert record["attributed_world"] == (-1 if attributed is None else attributed)
        assert record["entropy"] == pytest.approx(math.log(K), abs=1e-5) and record["gate"] == pytest.approx(1.0)
    fit = json.loads((tmp_path / "run" / "wet_fit.json").read_text())
    assert fit["heads"] == [[2, 1], [3, 2]] and fit["head_scores"] == artifact.head_scores.tolist()
    assert (fit["alpha"], fit["eta"], fit["beta"], fit["probe_layer"]) == (3.0, 0.5, 0.0, 0)


def test_alpha_zero_is_the_model_and_fits_follow_the_weights(tmp_path, task, source):
    module = small_module()
    dm = SFTDataModule(module.tokenizer, source, batch_size=8, eval_batch_size=8)
    plain = validate(module, dm)

    def counting(callback: WETCallback) -> list[int]:
        fits, fit = [], callback.fit
        callback.fit = lambda pl_module: fits.append(1) or fit(pl_module)
        return fits

    settings = {"probe_layer": 1, "num_worlds": K, "source": source, "alpha": 0.0, "eta": 0.2, "task": task}
    ranker = partial(ScoreMatchingRanker, steps=20, batch_size=64)
    callback = WETCallback(**settings, ranker=ranker())
    fits = counting(callback)
    first = validate(module, dm, callback)
    assert torch.equal(torch.cat(first.completions), torch.cat(plain.completions)), "alpha = 0 is the model"
    assert len(fits) == 1 and all(layer >= 2 for layer, _ in callback.heads)
    assert "fit/probe_accuracy" in callback.last_metrics and 0 <= callback.last_metrics["gate_open_rate"] <= 1
    validate(module, dm, callback)
    assert len(fits) == 1, "the same weights reuse the fit"
    with torch.no_grad():
        module.model.model.layers[0].mlp.down_proj.weight.mul_(1.01)  # as if the model trained in between
    validate(module, dm, callback)
    assert len(fits) == 2, "changed weights are fitted again"

    # Through the artifact cache: a second callback with the same settings and weights reads the first one's fit.
    cached = WETCallback(**settings, ranker=ranker(), cache_dir=str(tmp_path / "cache"))
    cached_fits = counting(cached)
    validate(module, dm, cached)
    assert len(cached_fits) == 1 and len(list((tmp_path / "cache" / "wet_fit").glob("*/wet.json"))) == 1
    again = WETCallback(**settings, ranker=ranker(), cache_dir=str(tmp_path / "cache"))
    again.fit = lambda pl_module: pytest.fail("must read the cached fit")
    validate(module, dm, again)
    assert again.heads == cached.heads
    assert torch.equal(again.artifact.probe.probe.weight, cached.artifact.probe.probe.weight)
    other = WETCallback(**{**settings, "probe_l2": 0.5}, ranker=ranker(), cache_dir=str(tmp_path / "cache"))
    validate(module, dm, other)
    assert len(list((tmp_path / "cache" / "wet_fit").glob("*/wet.json"))) == 2, "other settings, another fit"

    # state round trip: a restored callback reuses the restored fit while the weights are the same
    restored = WETCallback(**settings)
    restored.load_state_dict(callback.state_dict())
    restored.fit = lambda pl_module: pytest.fail("must reuse the restored fit")
    validate(module, dm, restored)
    assert torch.equal(restored.artifact.probe.probe.weight, callback.artifact.probe.probe.weight)
    assert restored.heads == callback.heads


def test_model_fingerprint_follows_the_weights():
    first, same = build_model("llama", seed=1), build_model("llama", seed=1)
    assert model_fingerprint(first) == model_fingerprint(same)
    assert model_fingerprint(first) != model_fingerprint(build_model("llama", seed=2))
    with torch.no_grad():
        same.lm_head.weight[3, 5] += 1e-3  # one value, possibly outside the strided sample
    assert model_fingerprint(first) != model_fingerprint(same)


def test_entropy_auroc_and_rates_from_counters(task, source):
    callback = WETCallback(probe_layer=0, num_worlds=K, source=source, task=task)
    counters = {
        "rows": 4,
        "entropy_sum": 2.0,
        "gate_sum": 1.0,
        "gate_open": 2,
        "step_positions": 0,
        "step_gate_sum": 0,
        "step_gate_open": 0,
        "judged_rows": 4,
        "correct": 3,
        "misattributed": 1,
    }
    callback._entropies, callback._misattributed = [0.1, 0.9, 0.3, 0.2], [False, True, False, True]
    metrics = callback.compute_metrics(counters)
    assert metrics == pytest.approx(
        {
            "prompt_entropy": 0.5,
            "gate_mean": 0.25,
            "gate_open_rate": 0.5,
            "accuracy": 0.75,
            "misattribution_rate": 0.25,
            "entropy_auroc": auroc(torch.tensor([0.1, 0.9, 0.3, 0.2]), torch.tensor([0, 1, 0, 1])),
        }
    )
    assert metrics["entropy_auroc"] == pytest.approx(0.75)


def test_wet_hook_records_gates_per_decode():
    model, tok = build_model("llama", seed=2), build_char_tokenizer()
    probe = WorldEntropyProbe(0, K, LinearProbe.from_weights(torch.zeros(K, 32), torch.zeros(K)))
    hook = WETHook(probe, [(1, 0)], alpha=1.0, eta=0.5)
    decoder = SampleDecoder(hooks=[hook])
    from zoo.encoding import encode_prompts

    ids, mask = encode_prompts(tok, ["W1:ab E01=", "W2: E03="])
    decoder(model, tok, ids, mask, params=SamplingParams(max_new_tokens=3))
    decoder(model, tok, ids[:1], mask[:1], params=SamplingParams(max_new_tokens=3))
    records = hook.take()
    assert [r.prompt_entropy.shape[0] for r in records] == [2, 1] and hook.take() == []
    assert all(torch.allclose(r.prompt_gate, torch.ones_like(r.prompt_gate)) for r in records)
    assert records[0].step_gates.numel() > 0
    assert no_hooks_left(model)


def test_bad_settings_are_named(tmp_path, source):
    with pytest.raises(ConfigError, match="below log K"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, eta=1.5)
    with pytest.raises(ConfigError, match="beta=2"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, beta=2)
    with pytest.raises(ConfigError, match="give source"):
        WETCallback(probe_layer=0, num_worlds=K)
    with pytest.raises(ConfigError, match="stages"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, stages=["fit"])
    with pytest.raises(ConfigError, match="MultiWorldRecallTask"):
        WETCallback(probe_layer=0, num_worlds=K, source=source, task="multiworld")

    class NoDecoder(pl.LightningModule):
        tokenizer = build_char_tokenizer()
        model = torch.nn.Linear(2, 2)

        def generate(self, *args):
            return None

    with pytest.raises(ConfigError, match="decoder.hooks"):
        WETCallback(probe_layer=0, num_worlds=K, source=source).setup(None, NoDecoder(), "validate")

    # an artifact fitted at another layer, and gated heads not above the probe layer, fail before any decode
    module = small_module()
    dm = SFTDataModule(module.tokenizer, source, batch_size=8, eval_batch_size=8)
    uniform_artifact(64).save(tmp_path / "wet")
    mismatched = WETCallback(probe_layer=1, num_worlds=K, artifact_dir=str(tmp_path / "wet"))
    with pytest.raises(ConfigError, match="probe_layer=0"):
        validate(module, dm, mismatched)
    assert module.decoder.hooks == []
    too_many = WETCallback(probe_layer=0, num_worlds=K, artifact_dir=str(tmp_path / "wet"), num_heads=13)
    with pytest.raises(ConfigError, match="k=13"):
        validate(module, dm, too_many)


# -- configs --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranker", "cls"),
    [
        ("score_matching", ScoreMatchingRanker),
        ("probe_accuracy", ProbeAccuracyRanker),
        ("patching", PatchingEffectRanker),
        ("random", RandomRanker),
    ],
)
def test_method_wet_config_chooses_the_ranker_and_keeps_the_eval_task_apart(train_cfg, ranker, cls):
    cfg = train_cfg(["+method=wet", f"callbacks/wet/ranker={ranker}", "eval_task.max_distractors=30"])
    callback = instantiate(cfg.callbacks.wet, _convert_="all")
    assert isinstance(callback, WETCallback) and isinstance(callback.ranker, cls)
    assert cfg.stage == "test" and cfg.backbone.init_from == "base"
    # the policy's task (which keys the cached base policy, and the probe's fit data) is untouched by eval_task
    assert cfg.task.max_distractors == 8 and callback.source.task.max_distractors == 8
    assert cfg.datamodule.source.task.max_distractors == 30 and callback.task.max_distractors == 30


def test_method_wet_runs_fast_dev_run(train_cfg):
    smoke = ["backbone.init_from=null", "callbacks.wet.ranker.steps=5", "callbacks.wet.max_rows=64"]
    metrics = run(train_cfg(["+method=wet", "debug=fdr", *smoke]))
    assert {"wet/prompt_entropy", "wet/gate_open_rate", "wet/misattribution_rate", "test/exact_match"} <= set(metrics)


def test_sft_trains_on_the_multiworld_task(train_cfg):
    cfg = train_cfg(["+method=sft", "task=multiworld", "debug=fdr", "datamodule.source.num_train=128"])
    task = instantiate(cfg.task)
    assert isinstance(task, MultiWorldRecallTask)
    metrics = run(cfg)
    assert {"train/loss", "val/exact_match"} <= set(metrics)
    row = TaskSource(task, num_train=4, num_val=4, num_test=4).rows("val")[0]
    assert task.parse_prompt(row["prompt"]) == (row["world"], row["entity"])
    assert task.verify(row["answer"] + "<eos>", row["answer"])


def test_describe_prompt_reads_back_what_sample_recorded():
    task = MultiWorldRecallTask(min_distractors=0, max_distractors=30, conflict_prob=0.5)
    rows = TaskSource(task, num_train=200, seed=3).rows("train")
    assert {r["conflict_world"] >= 0 for r in rows} == {True, False}
    for row in rows:
        assert task.describe_prompt(row["prompt"]) == {
            k: row[k] for k in ("world", "entity", "distance", "conflict_world")
        }
    assert task.describe_prompt("not a prompt") is None


def test_method_wet_on_a_hugging_face_model_saved_locally(train_cfg, tmp_path):
    saved = tmp_path / "hf"
    build_model("gpt2", seed=2).save_pretrained(saved)
    build_char_tokenizer().save_pretrained(saved)
    smoke = ["callbacks.wet.ranker.steps=5", "callbacks.wet.max_rows=64", "debug=fdr"]
    cfg = train_cfg(["+method=wet", "backbone=hf", f"backbone.name_or_path={saved}", "backbone.init_from=null", *smoke])
    metrics = run(cfg)
    assert {"wet/gate_mean", "wet/prompt_entropy", "wet/fit/probe_accuracy", "test/exact_match"} <= set(metrics)
