"""``python train.py +method=nanoquant backbone.init_from=<dir> quant.bits=0.8``: quantize a trained tiny model,
evaluate it, export it packed, reload it with identical generation; bad bit targets and damaged exports fail loudly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from zoo.errors import ConfigError

from conftest import compose_train

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small linear-algebra calls (ADMM's r x r solves) slow down by orders of magnitude when two OpenMP threads
    compete with other processes for two cores; the quantization tests run single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SMALL = [
    "backbone.hidden_size=64",
    "backbone.intermediate_size=128",
    "backbone.num_hidden_layers=2",
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.batch_size=32",
    "datamodule.eval_batch_size=8",
    "module.generation.max_new_tokens=12",
    "logger=none",
    "callbacks=none",
    "trainer.enable_progress_bar=false",
]
FAST_NANOQUANT = [
    "quant.admm.outer_iters=20",
    "quant.block.ep_epochs=1",
    "quant.block.fact_epochs=1",
    "quant.block.fact_batch_size=4",
    "quant.kd_epochs=2",
    "quant.kd_lr=1e-4",
    "quant.kd_batch_size=4",
    "quant.calibration.num_samples=4",
    "quant.calibration.seq_len=32",
]


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory) -> Path:
    """A tiny model trained for a few steps by ``train.py`` and exported with ``save_pretrained``."""
    from zoo.cli.train import run

    tmp = tmp_path_factory.mktemp("sft")
    run(compose_train([*SMALL, "trainer.max_epochs=1", "trainer.limit_train_batches=6", "export=true"], tmp))
    export = tmp / "run" / "export"
    assert (export / "config.json").is_file()
    return export


@pytest.fixture(scope="module")
def nanoquant_run(trained_export, tmp_path_factory) -> tuple[Path, dict]:
    """``+method=nanoquant backbone.init_from=<export> quant.bits=0.8`` through ``zoo.cli.train.run``."""
    from zoo.cli.train import run

    tmp = tmp_path_factory.mktemp("nq")
    cfg = compose_train(
        [*SMALL, "+method=nanoquant", f"backbone.init_from={trained_export}", "quant.bits=0.8", *FAST_NANOQUANT], tmp
    )
    assert cfg.stage == "validate"
    assert cfg.methods.nanoquant.kind == "quantizer"
    metrics = run(cfg)
    return tmp / "run" / "nanoquant", metrics


def test_method_nanoquant_quantizes_evaluates_and_exports(nanoquant_run):
    out, metrics = nanoquant_run
    assert math.isfinite(metrics["val/loss"])  # evaluated on the quantized model
    assert 0 < metrics["quant/bits_per_weight"] <= 0.8
    for name in ("nanoquant.safetensors", "nanoquant_config.json", "config.json", "nanoquant_report.json"):
        assert (out / name).is_file(), name
    meta = json.loads((out / "nanoquant_config.json").read_text())
    assert meta["config"]["bits"] == 0.8
    assert len(meta["layers"]) == 2 * 7  # every decoder-layer linear, nothing else
    spec = meta["layers"]["model.layers.0.mlp.down_proj"]
    assert (spec["out_features"], spec["in_features"]) == (64, 128)
    tensors = load_file(str(out / "nanoquant.safetensors"))
    # packed bits, no full-precision copy of any quantized weight
    assert tensors["model.layers.0.mlp.down_proj.u_packed"].dtype == torch.uint8
    assert tensors["model.layers.0.mlp.down_proj.v_packed"].shape == (spec["rank"], 128 // 8)
    assert not any(k.startswith("model.layers.") and k.endswith("_proj.weight") for k in tensors)
    report = json.loads((out / "nanoquant_report.json").read_text())
    assert report["bits_per_weight"] == pytest.approx(metrics["quant/bits_per_weight"])
    assert report["kl_after_distill"] <= report["kl_before_distill"]
    assert report["probe"]["texts"]


def test_reloaded_export_generates_identically(nanoquant_run):
    from zoo.generation.decoders import generate_text
    from zoo.protocols import SamplingParams
    from zoo.quant.nanoquant import NanoQuantLinear, model_bits_per_weight
    from zoo.quant.nanoquant_quantizer import load_nanoquant_causal_lm

    out, metrics = nanoquant_run
    model, tokenizer = load_nanoquant_causal_lm(out)
    assert sum(isinstance(m, NanoQuantLinear) for m in model.modules()) == 14
    assert model_bits_per_weight(model) == pytest.approx(metrics["quant/bits_per_weight"])
    probe = json.loads((out / "nanoquant_report.json").read_text())["probe"]
    params = SamplingParams(max_new_tokens=probe["max_new_tokens"], do_sample=False)
    result = generate_text(model, tokenizer, probe["prompts"], params)
    assert result.texts == probe["texts"]
    width = len(probe["completion_ids"][0])
    assert result.completion_ids[:, :width].tolist() == probe["completion_ids"]


def test_load_with_missing_or_mismatched_tensor_names_it(nanoquant_run, tmp_path):
    from zoo.quant.nanoquant_quantizer import load_nanoquant_causal_lm

    out, _ = nanoquant_run
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    tensors = load_file(str(out / "nanoquant.safetensors"))
    gone = "model.layers.1.self_attn.v_proj.v_packed"
    save_file({k: v for k, v in tensors.items() if k != gone}, str(damaged / "nanoquant.safetensors"))
    with pytest.raises(KeyError, match=gone.replace(".", r"\.")):
        load_nanoquant_causal_lm(damaged)
    bad = dict(tensors)
    bad["model.layers.0.mlp.up_proj.s_post"] = bad["model.layers.0.mlp.up_proj.s_post"][:-1].clone()
    save_file(bad, str(damaged / "nanoquant.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.s_post"):
        load_nanoquant_causal_lm(damaged)


def test_bad_bit_target_names_layer_and_minimum(train_cfg):
    from zoo.cli.train import run

    # a 64x64 projection: the two fp16 scale vectors alone take 16 (64 + 64) / 64^2 = 0.5 bpw
    cfg = train_cfg([*SMALL, "+method=nanoquant", "quant.bits=0.3", *FAST_NANOQUANT])
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.self_attn\.q_proj.*minimum achievable is 0\.7500"):
        run(cfg)


def test_cli_bad_bit_target_prints_one_line_and_exits_2(tmp_path, zoo_main):
    """Through ``train.py``'s entry point: the error names the layer and the minimum, without a traceback."""
    code, _, stderr = zoo_main(
        [*SMALL, "+method=nanoquant", "quant.bits=0.2", f"paths.log_dir={tmp_path}", f"hydra.run.dir={tmp_path}/run"],
        tmp_path,
    )
    assert code == 2, stderr[-2000:]
    assert "layer 'model.layers.0.self_attn.q_proj'" in stderr
    assert "minimum achievable" in stderr
    assert "Traceback" not in stderr
