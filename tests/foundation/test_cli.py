"""The Hydra app: composition, stages, errors a researcher can act on, multirun, launcher/trainer presets."""

import json
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.cli.train import build, check_config, check_methods, run
from zoo.errors import CheckpointNotFoundError, ConfigError, NaNLossError

from conftest import SMALL_BASE_POLICY

TINY_RUN = [
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=32",
    "datamodule.source.num_test=32",
    "datamodule.batch_size=32",
    "trainer.max_epochs=1",
    "module.generation.max_new_tokens=16",
]


def test_default_config_composes_and_instantiates(train_cfg):
    cfg = train_cfg()
    assert cfg.stage == "fit" and cfg.methods == {}
    module, datamodule, trainer = build(cfg)
    assert type(module).__name__ == "CausalLMModule"
    assert type(datamodule).__name__ == "SFTDataModule"
    assert module.model is None  # built in configure_model, not in __init__


def test_fit_then_validate_test_predict_from_the_checkpoint(train_cfg, tmp_path):
    metrics = run(train_cfg([*TINY_RUN, "export=true"]))
    assert {"val/exact_match", "val/loss", "val/perplexity"} <= set(metrics)
    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    assert (run_dir / "export" / "model.safetensors").is_file()
    assert (run_dir / "resolved_config.yaml").is_file()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert "commit" in info and "versions" in info
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert checkpoint["zoo_config"]["task"]["_target_"] == "zoo.data.tasks.Addition"
    for stage in ("validate", "test"):
        out = run(train_cfg([*TINY_RUN, f"stage={stage}", f"ckpt_path={ckpt}"]))
        key = "val/loss" if stage == "validate" else "test/loss"
        assert out[key] == pytest.approx(out[key])  # finite
    run(train_cfg([*TINY_RUN, "stage=predict", f"ckpt_path={ckpt}"]))
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and {"completion", "prompts", "answers", "correct"} <= set(rows[0])


def test_sft_on_a_saved_hf_directory(train_cfg, tmp_path):
    from zoo.backbones import TinyBackbone

    saved = tmp_path / "tiny_hf"
    backbone = TinyBackbone(seed=5)
    backbone.build_model().save_pretrained(saved)
    backbone.tokenizer.save_pretrained(saved)
    cfg = train_cfg(["backbone=hf", f"backbone.name_or_path={saved}", *TINY_RUN, "trainer.limit_train_batches=3"])
    metrics = run(cfg)
    assert "val/loss" in metrics


def test_init_from_base_trains_once_then_reuses_the_cache(train_cfg, base_policy_cache, caplog):
    overrides = [*SMALL_BASE_POLICY, "backbone.init_from=base", *TINY_RUN, "trainer.limit_train_batches=1"]
    caplog.set_level("INFO", logger="zoo")
    run(train_cfg(overrides, cache_dir=base_policy_cache))
    assert "base_policy artifact" in caplog.text  # built here, or by an earlier test sharing the session cache
    caplog.clear()
    cfg = train_cfg(overrides, cache_dir=base_policy_cache)
    run(cfg)
    assert "using the cached base_policy artifact" in caplog.text and "building" not in caplog.text
    assert cfg.backbone.init_from.startswith(str(base_policy_cache / "base_policy" / "addition-"))
    assert (Path(cfg.backbone.init_from) / "config.json").is_file()


def test_missing_checkpoint_names_the_path(train_cfg, tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=str(tmp_path / "run" / "checkpoints" / "last.ckpt")):
        run(train_cfg([*TINY_RUN, "ckpt_path=last"]))


def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(train_cfg, tmp_path):
    cfg = train_cfg([*TINY_RUN, "callbacks.model_checkpoint.every_n_train_steps=2", "trainer.max_epochs=2"])
    module, datamodule, trainer = build(cfg)

    original = module.loss

    def poisoned(batch):
        loss, logits, num_tokens = original(batch)
        return (loss * float("nan") if module.global_step >= 5 else loss), logits, num_tokens

    module.loss = poisoned
    with pytest.raises(NaNLossError, match="global step 5"):
        trainer.fit(module, datamodule)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 4
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


def test_resume_mid_epoch_ends_like_an_uninterrupted_run(train_cfg, tmp_path):
    """Kill after step 7 (checkpoint at step 6), resume with ckpt_path=last: identical final weights/metrics."""
    common = [*TINY_RUN, "trainer.max_epochs=2", "callbacks.model_checkpoint.every_n_train_steps=3", "export=false"]
    full = run(train_cfg([*common, "run_id=full", "hydra.run.dir=" + str(tmp_path / "full")]))
    full_state = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    import lightning.pytorch as pl

    class Killed(Exception):
        pass

    class Kill(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 7:
                raise Killed

    resumed_dir = tmp_path / "resumed"
    cfg = train_cfg(common)
    cfg.paths.output_dir = str(resumed_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(resumed_dir / "checkpoints")
    module, datamodule, trainer = build(cfg)
    trainer.callbacks.insert(0, Kill())
    with pytest.raises(Killed):
        trainer.fit(module, datamodule)
    assert torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    cfg = train_cfg([*common, "ckpt_path=last"])
    cfg.paths.output_dir = str(resumed_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(resumed_dir / "checkpoints")
    resumed = run(cfg)
    resumed_state = torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key, value in full_state.items():
        torch.testing.assert_close(resumed_state[key], value, atol=1e-6, rtol=1e-5, msg=key)
    assert resumed["val/loss"] == pytest.approx(full["val/loss"], rel=1e-5)
    assert resumed["val/exact_match"] == full["val/exact_match"]


def test_at_most_one_module_method(train_cfg):
    from zoo.catalogue import method_entries

    entries = method_entries()
    cfg = OmegaConf.create({"methods": {k: entries[k] for k in ("cuttlefish", "sft", "safethink")}})
    with pytest.raises(ConfigError, match=r"at most one of them"):
        check_methods(cfg)
    with pytest.raises(ConfigError, match=r"methods \['grpo', 'sft'\] each replace the training module"):
        check_methods(train_cfg(["+method=[grpo,sft]"]))
    assert set(check_methods(train_cfg(["+method=[grpo,safethink]"]))) == {"grpo", "safethink"}
    with pytest.raises(ConfigError, match=r"methods\.a\.kind is missing"):
        check_methods(OmegaConf.create({"methods": {"a": {"paper": "x"}}}))


@pytest.mark.parametrize("strategy", ["trainer=deepspeed", "trainer.strategy=deepspeed_stage_3"])
def test_deepspeed_is_refused_with_one_message_naming_what_works(train_cfg, strategy):
    """Under DeepSpeed's precision plugin Lightning's clip_gradients is a no-op (the GRPO family would train
    unclipped): asking for it is one message naming FSDP and DDP."""
    with pytest.raises(ConfigError, match="DeepSpeed is not supported.*trainer=fsdp.*trainer=ddp"):
        check_config(train_cfg([strategy]))


@pytest.mark.parametrize("preset", ["cpu", "gpu", "ddp", "fsdp"])
def test_trainer_presets_compose(train_cfg, preset):
    cfg = train_cfg([f"trainer={preset}"])
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
    if preset in ("cpu", "ddp"):
        trainer = instantiate(cfg.trainer, accelerator="cpu", logger=False)
        assert trainer.num_devices == cfg.trainer.devices


@pytest.mark.parametrize("launcher", ["joblib", "slurm", "ray"])
def test_launcher_presets_compose(train_cfg, launcher):
    if launcher == "ray":
        pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="hydra-ray-launcher is not installed")
    cfg = train_cfg([f"+launcher={launcher}"])
    assert launcher.split("_")[0] in cfg.hydra.launcher._target_.lower() or launcher == "slurm"
    if launcher == "slurm":
        assert "submitit" in cfg.hydra.launcher._target_.lower()
        assert cfg.hydra.launcher.tasks_per_node == cfg.trainer.devices


def test_unknown_method_lists_the_choices(zoo_main, tmp_path):
    code, _, err = zoo_main(["+method=does_not_exist"], tmp_path)
    assert code != 0
    assert "Could not find 'method/does_not_exist'" in err
    assert "Available options in 'method'" in err and "sft" in err
    assert "Traceback" not in err


def test_unknown_group_option_lists_the_choices(zoo_main, tmp_path):
    code, _, err = zoo_main(["backbone=nope"], tmp_path)
    assert code != 0
    assert "Available options in 'backbone'" in err and "tiny" in err
    assert "Traceback" not in err


def test_bad_data_and_missing_values_print_one_message(zoo_main, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    code, _, err = zoo_main(
        [
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={bad}",
            f"datamodule.source.val_path={bad}",
            f"paths.log_dir={tmp_path}",
        ],
        tmp_path,
    )
    assert code == 2, err[-2000:]
    assert f"error: {bad}:1: missing field 'completion'" in err
    assert "Traceback" not in err
    code, _, err = zoo_main(["datamodule=sft_jsonl", f"paths.log_dir={tmp_path}"], tmp_path)
    assert code == 2
    assert "Missing mandatory value" in err and "train_path" in err
    assert "Traceback" not in err


def test_multirun_with_the_basic_launcher(zoo_main, tmp_path, monkeypatch):
    """No paths on the command line: the sweep directory resolves from the defaults (paths.log_dir from
    $ZOO_LOG_DIR, else <cwd>/logs, both through ${hydra:runtime.cwd}) before the first job starts."""
    monkeypatch.setenv("ZOO_LOG_DIR", str(tmp_path / "logs"))
    code, _, err = zoo_main(
        [
            "-m",
            "seed=0,1",
            "debug=fdr",
            "trainer.accelerator=cpu",
            "datamodule.source.num_train=64",
            "datamodule.source.num_val=8",
            "datamodule.batch_size=8",
            "module.generate_on_eval=false",
        ],
        tmp_path,
    )
    assert code == 0, err[-3000:]
    runs = sorted(tmp_path.glob("logs/train/multiruns/*/*/run_info.json"))
    assert [p.parent.name for p in runs] == ["0", "1"]


def test_a_watermark_sentence_floor_above_the_ceiling_is_one_message(zoo_main, tmp_path):
    code, _, err = zoo_main(
        [
            "+method=xguard",
            "callbacks.watermark.decoder.scheme.encoder=hashing:64",
            "callbacks.watermark.decoder.max_sentences=2",
            "callbacks.watermark.decoder.min_sentences=3",
            f"paths.log_dir={tmp_path}",
        ],
        tmp_path,
    )
    assert code == 2, err[-2000:]
    assert "min_sentences must be >= 0 and <= max_sentences (2), got 3" in err
    assert "Traceback" not in err
