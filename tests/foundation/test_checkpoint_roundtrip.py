"""Every checkpoint the zoo writes can be resumed and evaluated (docs/reliability.md).

* Per quantizer (every ``conf/quant/*.yaml``, and QLoRA): a fit killed mid-run and resumed with ``ckpt_path=last``
  ends with the weights and validation numbers of the uninterrupted run, and ``stage=validate ckpt_path=<its
  last.ckpt>`` gives that run's validation numbers.
* Per method of the catalogue: the checkpoint its module writes holds only what ``torch.load(weights_only=True)``
  reads (no pickled objects among the hyper-parameters) and loads back into a module built from the same config.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from test_catalogue import smoke_settings

from zoo.catalogue import load_catalogue
from zoo.checkpoints import read_checkpoint
from zoo.cli.resolvers import register_resolvers
from zoo.cli.train import build, run
from zoo.modules.base import is_plain_data

from conftest import REPO_ROOT, SMALL_BASE_POLICY, compose_train

_, CATALOGUE = load_catalogue()
register_resolvers()  # what python train.py registers before composing (${zoo.precision:...}, ...)

QUANTIZERS = sorted(p.stem for p in (REPO_ROOT / "conf" / "quant").glob("*.yaml"))
# the smallest settings of each quantizer that still quantize (NanoQuant: a few ADMM steps, no reconstruction)
QUANT_SETTINGS = {
    "nanoquant": [
        "quant.rank_multiple=8",
        "quant.admm.outer_iters=5",
        "quant.block_reconstruction=false",
        "quant.model_reconstruction=false",
        "quant.calibration.num_samples=4",
        "quant.calibration.seq_len=32",
    ],
}
# 4 optimizer steps of 16 rows, a checkpoint every 2, validation (loss only) at the end; a constant learning rate
TINY_FIT = [
    "datamodule.source.num_train=64",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.batch_size=16",
    "datamodule.eval_batch_size=8",
    "module.generate_on_eval=false",
    "module.scheduler=null",
    "trainer.max_epochs=1",
    "callbacks.model_checkpoint.every_n_train_steps=2",
    "export=false",
]
CASES = [(q, [f"quant={q}", *QUANT_SETTINGS.get(q, [])]) for q in QUANTIZERS]
# QLoRA: adapters on the 4-bit layers (dropout off: the global RNG is not part of a checkpoint)
CASES.append(("qlora", ["+preset=qlora", "backbone.lora.dropout=0.0"]))


class Killed(Exception):
    pass


class KillAt(pl.Callback):
    """Stops a fit by an exception after the optimizer step that makes ``global_step == at`` (a crash, not a stop)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.at:
            raise Killed


def last_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.parametrize(("name", "quant"), [pytest.param(n, q, id=n) for n, q in CASES])
def test_a_quantized_run_resumes_and_validates_with_the_numbers_of_the_uninterrupted_run(name, quant, tmp_path):
    common = [*TINY_FIT, *quant]

    def cfg(where: str, *extra: str):
        return compose_train([*common, *extra], tmp_path / where)

    full = run(cfg("full"))
    full_state = last_state(tmp_path / "full" / "run")
    assert "val/loss" in full

    module, datamodule, trainer = build(cfg("killed"))
    trainer.callbacks.insert(0, KillAt(3))
    with pytest.raises(Killed):
        trainer.fit(module, datamodule)
    killed = tmp_path / "killed" / "run"
    assert torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2
    resumed = run(cfg("killed", "ckpt_path=last"))
    resumed_state = last_state(killed)
    assert resumed_state.keys() == full_state.keys()
    for key, value in full_state.items():
        torch.testing.assert_close(resumed_state[key], value, atol=1e-6, rtol=1e-5, msg=key)
    assert resumed["val/loss"] == pytest.approx(full["val/loss"], rel=1e-6)

    full_last = tmp_path / "full" / "run" / "checkpoints" / "last.ckpt"
    validated = run(cfg("validate", "stage=validate", f"ckpt_path={full_last}"))
    assert validated["val/loss"] == pytest.approx(full["val/loss"], rel=1e-6)


def test_a_4bit_model_loads_its_own_state_dict_and_evaluating_it_changes_nothing():
    """bitsandbytes writes a 4-bit layer's quantization state into its state dict but cannot read it back
    (zoo.quant.bnb.prepare_4bit_layers); and on a CPU with AVX512-BF16 its first eval-mode forward re-packs the weight
    in place (bf16 scales), which then served training without an input gradient and made every state dict lossy.
    (On a CPU without AVX512-BF16 the second half holds without the fix.)"""
    from zoo.backbones import TinyBackbone
    from zoo.quant.bnb import BnbQuantizer

    quantizer = BnbQuantizer("nf4")
    model = TinyBackbone(seed=0).build_model(quantizer)
    other = TinyBackbone(seed=1).build_model(quantizer)
    ids = torch.randint(4, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained_mode = model(ids).logits
        model.eval()
        evaluated = model(ids).logits
        state = model.state_dict()
        after_state_dict = model(ids).logits
        assert not torch.equal(other.eval()(ids).logits, evaluated)
    assert any(k.endswith("weight.absmax") for k in state)
    torch.testing.assert_close(evaluated, trained_mode, rtol=0, atol=0)
    torch.testing.assert_close(after_state_dict, evaluated, rtol=0, atol=0)
    other.load_state_dict(state)  # strict: the quantization state is consumed, nothing unexpected
    with torch.no_grad():
        torch.testing.assert_close(other(ids).logits, evaluated, rtol=0, atol=0)
    layer = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, layer.in_features, requires_grad=True)
    layer.train()(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


class Injected:
    """An object handed to a module's constructor (like a decoder or a verifier)."""


def test_hyperparameters_keep_plain_data_only_whatever_a_module_ignores():
    """The one rule of ZooBaseModule.save_hyperparameters: objects (also those passed through **kwargs) never reach
    the hyper-parameters, so a checkpoint loads with torch.load(weights_only=True)."""
    from zoo.modules.base import ZooBaseModule

    class Module(ZooBaseModule):
        def __init__(self, width: int = 4, decoder: Injected | None = None, **rest) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["optimizer"])

    module = Module(8, decoder=Injected(), verifier=Injected(), names=["a", "b"], table={"k": [1, 2.5, None]})
    assert dict(module.hparams) == {"width": 8, "names": ["a", "b"], "table": {"k": [1, 2.5, None]}}
    assert dict(module.hparams_initial) == dict(module.hparams)
    module.hparams.update({"late": Injected(), "kept": (1, "x")})
    checkpoint = {"hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["hyper_parameters"] == {**dict(module.hparams_initial), "kept": (1, "x")}
    assert not is_plain_data(Injected()) and not is_plain_data({1.5: 1}) and is_plain_data([{"a": (None, True)}])


# -- every method's checkpoint loads back -----------------------------------------------------------------------------
def smoke_config(method: str, train_cfg, cache_dir: Path):
    """``+method=<method>`` with one fast_dev_run step and the settings of its catalogue smoke run (the same
    composition as tests/test_catalogue.py's cells, so both share the cached prerequisites)."""
    overrides = [f"+method={method}", "debug=fdr", "trainer.accelerator=cpu", *SMALL_BASE_POLICY]
    return train_cfg(
        [*overrides, *smoke_settings(method, train_cfg(overrides, cache_dir=cache_dir))], cache_dir=cache_dir
    )


def write_checkpoint(cfg, path: Path) -> Path:
    """What Lightning's ``Trainer.save_checkpoint`` writes of the method's module, built from its config as a run
    builds it (the checkpoint's hyper-parameters, state dict and callbacks' states are those a fit's ``last.ckpt``
    holds; the resume tests above cover optimizer state and a fit's own checkpoints)."""
    module, _, trainer = build(cfg)
    module.configure_model()
    trainer.strategy.connect(module)
    trainer.save_checkpoint(path)
    return path


@pytest.mark.parametrize("method", sorted(CATALOGUE))
def test_every_methods_checkpoint_loads_back(method, train_cfg, base_policy_cache, tmp_path):
    cfg = smoke_config(method, train_cfg, base_policy_cache)
    checkpoint = read_checkpoint(write_checkpoint(cfg, tmp_path / "saved.ckpt"))  # weights_only: no pickled objects
    for name, value in checkpoint.get("hyper_parameters", {}).items():
        assert is_plain_data(value), f"{method}: hyper-parameter {name} is a {type(value).__name__}"
    module, _, _ = build(cfg)
    module.configure_model()
    module.on_load_checkpoint(checkpoint)
    module.load_state_dict(checkpoint["state_dict"], strict=module.strict_loading)
    loaded = module.state_dict()
    for key, value in checkpoint["state_dict"].items():
        assert torch.equal(loaded[key], value), f"{method}: {key} did not load"
