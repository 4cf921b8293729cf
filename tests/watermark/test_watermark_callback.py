"""WatermarkCallback in a plain Lightning script: a real tiny Llama (its text shaped into sentences by a real logits
processor on the module's decoder, which the callback picks up), the real char tokenizer, the SFT datamodule over
the topic-text task, the hashing encoder; metrics, predictions, the saved partition and bad inputs."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch
from wm_helpers import SentenceShaper, small_backbone

from zoo.callbacks import WatermarkCallback
from zoo.data.sources import TaskSource
from zoo.data.topic_sentences import TopicText
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError
from zoo.generation import SampleDecoder
from zoo.modules import CausalLMModule
from zoo.watermark import SemanticWatermarkDecoder, SentenceMerge, SynonymSubstitution, load_partitioner
from zoo.watermark.detect import main as detect_main

KEY = 7


def make(tmp_path, **callback_options):
    backbone = small_backbone()
    tokenizer = backbone.tokenizer
    module = CausalLMModule(
        backbone,
        generation={"max_new_tokens": 16},
        decoder=SampleDecoder(processors=[SentenceShaper(tokenizer)]),
    )
    datamodule = SFTDataModule(
        tokenizer,
        TaskSource(TopicText(), num_train=8, num_val=4, num_test=4, seed=0),
        batch_size=4,
        eval_batch_size=4,
        max_length=208,
    )
    decoder = SemanticWatermarkDecoder(
        {"encoder": "hashing:64", "partition": {"kind": "lsh", "corpus_size": 100}, "key": KEY},
        max_trials=30,
        candidates_per_round=8,
        max_sentences=5,
        sentence_max_tokens=40,
        context_sentences=1,
    )
    options = {
        "stages": ["test", "predict"],
        "attacks": {"synonym": SynonymSubstitution(1.0), "merge": SentenceMerge(1.0)},
        "max_rows": 3,
        "temperature": 1.0,
        "save_dir": str(tmp_path / "wm"),
        "human": {"corpus": "topics", "texts": 20, "sentences": 6, "seed": 1},
        "keys": 50,
        **callback_options,
    }
    callback = WatermarkCallback(decoder, **options)
    trainer = pl.Trainer(
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        accelerator="cpu",
    )
    return module, datamodule, callback, trainer


def test_test_stage_logs_success_trials_and_detection_clean_attacked_and_unwatermarked(tmp_path):
    module, datamodule, callback, trainer = make(tmp_path)
    trainer.test(module, datamodule)
    m = callback.last_metrics
    assert m["wsr"] == 1.0 and m["sentences"] == 5.0
    assert 1.0 <= m["mean_trials"] <= 30.0
    assert m["sampled_per_kept_token"] >= 1.0
    assert m["detection_rate"] == 1.0 and m["z"] > 3.0 and m["undefined_rate"] == 0.0
    assert m["plain_detection_rate"] == 0.0 and m["plain_z"] < 3.0
    # the letters a-h have no synonyms: that attack leaves every text, hence every z, unchanged
    assert m["synonym/z"] == pytest.approx(m["z"]) and m["synonym/detection_rate"] == 1.0
    # merging sentence pairs changes the previous-region keys: z changes
    assert not math.isclose(m["merge/z"], m["z"])
    # calibration on 20 human grammar texts over 50 keys, and TPR at 1% FPR against their z under the run's key
    assert 0.5 < m["occupancy_entropy"] <= 1.0
    assert abs(m["human_green_rate"] - 0.25) < 0.1 and m["human_green_rate_sd"] > 0.0
    assert 0.0 <= m["human_fpr_mean"] <= m["human_fpr_max"] < 0.5
    assert m["tpr_at_fpr"] == 1.0 and m["synonym/tpr_at_fpr"] == 1.0 and m["merge/tpr_at_fpr"] <= 1.0
    per_key = json.loads((tmp_path / "wm" / "calibration.json").read_text())
    assert len(per_key["fpr"]) == len(per_key["green_rate"]) == 50
    assert max(per_key["fpr"]) == pytest.approx(m["human_fpr_max"])
    # the measured per-key FPR: the fraction of the 20 human texts detected under each key (multiples of 1/20)
    assert len(per_key["fpr_empirical"]) == 50 and max(per_key["fpr_empirical"]) == m["human_fpr_empirical_max"]
    assert all(abs(20 * f - round(20 * f)) < 1e-9 for f in per_key["fpr_empirical"])
    assert per_key["fpr_empirical"][KEY] == pytest.approx(m["human_detection_rate"])  # the run key is one of them
    assert m["threshold_at_fpr"] == max(z for z in callback._human_z if z is not None)  # 1% of 20: none flagged
    assert sum(per_key["green_rate"]) / 50 == pytest.approx(m["human_green_rate"])
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert logged["watermark/wsr"] == 1.0 and logged["watermark/z"] == pytest.approx(m["z"])


def test_quality_is_the_mean_negative_log_probability_of_the_kept_tokens(tmp_path):
    module, datamodule, callback, trainer = make(tmp_path, attacks={}, human=None)
    trainer.test(module, datamodule)
    m = callback.last_metrics
    prompts = list(next(iter(datamodule.test_dataloader()))["prompts"][:3])
    # the callback's two generations of batch 0, redrawn with the same seeds: their kept tokens' mean -log p
    for metric, seed, plain in (("nll", 0, False), ("plain_nll", 1_000_003, True)):
        result = callback._generate(module, prompts, seed, plain=plain)
        kept = result.completion_mask.bool()
        assert kept.sum() > 0 and (result.logprobs[~kept] == 0).all()
        assert m[metric] == pytest.approx(-float(result.logprobs[kept].mean()), rel=1e-5)
        assert m[metric] > 0.0


def test_predict_writes_watermark_columns_and_the_partition_detects_them_from_the_command_line(tmp_path, capsys):
    module, datamodule, callback, trainer = make(tmp_path)
    predictions = trainer.predict(module, datamodule)
    meta = predictions[0]["meta"]
    assert len(meta["watermarked"]) == len(predictions[0]["texts"]) == 4
    assert meta["watermarked"][3] is None and meta["watermark_z"][3] is None  # max_rows = 3
    assert all(meta["watermark_detected"][:3]) and all(z > 3.0 for z in meta["watermark_z"][:3])
    assert all(w == 1.0 for w in meta["watermark_wsr"][:3])
    assert all(z is None or z <= 3.0 for z in meta["plain_z"][:3])
    assert callback.last_metrics["detection_rate"] == 1.0
    # the run saved its partition and settings; the command line reproduces z
    settings = json.loads((tmp_path / "wm" / "watermark.json").read_text())
    assert settings["key"] == KEY and settings["encoder"] == "hashing:64" and settings["gamma"] == 0.25
    partition, encoder = load_partitioner(settings["partition"])
    assert encoder == "hashing:64" and torch.equal(partition.normals, callback.decoder.scheme.partitioner.normals)
    text = tmp_path / "row0.txt"
    text.write_text(meta["watermarked"][0])
    assert detect_main(["--key", str(KEY), "--partition", settings["partition"], "--json", str(text)]) == 0
    assert json.loads(capsys.readouterr().out)["z"] == pytest.approx(meta["watermark_z"][0])


def test_stages_not_listed_are_left_alone(tmp_path):
    module, datamodule, callback, trainer = make(tmp_path, stages=["predict"])
    trainer.test(module, datamodule)
    assert callback.last_metrics == {}
    assert not any(k.startswith("watermark/") for k in trainer.callback_metrics)


def test_bad_callback_settings_and_modules(tmp_path):
    decoder = SemanticWatermarkDecoder({"encoder": "hashing:64", "partition": {"kind": "lsh", "corpus_size": 100}})
    with pytest.raises(ConfigError, match="stages"):
        WatermarkCallback(decoder, stages=["fit"])
    with pytest.raises(ConfigError, match="max_rows"):
        WatermarkCallback(decoder, max_rows=0)
    with pytest.raises(ConfigError, match="temperature"):
        WatermarkCallback(decoder, temperature=0.0)
    with pytest.raises(ConfigError, match="attack 'a/b'"):
        WatermarkCallback(decoder, attacks={"a/b": SentenceMerge()})

    class NoGeneration(pl.LightningModule):
        pass

    callback = WatermarkCallback(decoder)
    with pytest.raises(ConfigError, match=r"NoGeneration lacks tokenizer, model, generate\(\)"):
        callback.setup(pl.Trainer(logger=False), NoGeneration(), "test")


def test_families_of_negatives_and_a_threshold_chosen_on_texts_that_are_not_reported(tmp_path):
    families = [
        {"name": "mixed", "corpus": "topics_mixed", "texts": 20, "sentences": 6, "seed": 1},
        {"name": "docs", "corpus": "python_docs", "texts": 10, "sentences": 6, "seed": 2},
    ]
    module, datamodule, callback, trainer = make(tmp_path, attacks={}, human=families, calibration=0.5)
    trainer.test(module, datamodule)
    m = callback.last_metrics
    z = callback._human_z
    chosen, reported = callback.calibration_texts
    # each family split in halves: 10 + 5 texts choose the threshold, the other 15 are reported
    assert len(chosen) == len(reported) == 15 and not set(chosen) & set(reported)
    assert len(set(chosen) & callback.families["docs"]) == 5 == len(set(reported) & callback.families["docs"])
    # 1% of 15 calibration texts: none may be flagged, so the threshold is their largest z
    assert m["threshold_at_fpr"] == max(z[i] for i in chosen if z[i] is not None)
    flagged = [z[i] is not None and z[i] > m["threshold_at_fpr"] for i in reported]
    assert m["human_fpr_at_threshold"] == pytest.approx(sum(flagged) / 15)
    for name in ("mixed", "docs"):
        shown = [i for i in reported if i in callback.families[name]]
        assert m[f"human/{name}/fpr_at_threshold"] == pytest.approx(
            sum(z[i] is not None and z[i] > m["threshold_at_fpr"] for i in shown) / len(shown)
        )
        assert 0.0 < m[f"human/{name}/occupancy_entropy"] <= 1.0
    assert m["human_detection_rate"] == pytest.approx(sum(z[i] is not None and z[i] > 3.0 for i in reported) / 15)
    plain = callback._z["plain_"]
    assert m["plain_fpr_at_threshold"] == sum(x is not None and x > m["threshold_at_fpr"] for x in plain) / len(plain)
    with pytest.raises(ConfigError, match="same sentences"):
        make(tmp_path, human=[families[0], {**families[1], "sentences": 5}])
    with pytest.raises(ConfigError, match="distinct names"):
        make(tmp_path, human=[families[0], {**families[1], "name": "mixed"}])
