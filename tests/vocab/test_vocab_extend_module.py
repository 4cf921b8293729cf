"""+method=vocab_extend: the module trains only the new rows (old-only contexts stay bit-identical, measured by
ForgettingMonitor every validation), the full and LoRA baselines forget on the same data, the export (base +
vocab_delta.safetensors) reloads exactly, and bad configs give one clear error."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file
from vocab_helpers import SMALL_LLAMA, save_tiny_gpt2

from zoo.backbones import TinyBackbone
from zoo.callbacks import ForgettingMonitor
from zoo.cli.train import build, run, user_message
from zoo.data.markov import MarkovChainTask, NewTokenSource
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError
from zoo.modules.vocab_extend import VocabExtendModule
from zoo.vocab import DELTA_FILE, ExtendedEmbedding

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory):
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


TASK = {"num_states": 16, "support": 4, "length": 12, "prompt_length": 3, "num_new_tokens": 3, "dictionary_size": 2}
SMALL_CLI = [
    "backbone.init_from=null",
    "backbone.hidden_size=32",
    "backbone.intermediate_size=64",
    "backbone.num_hidden_layers=2",
    "backbone.num_attention_heads=2",
    "backbone.num_key_value_heads=2",
    "task.num_states=16",
    "task.length=12",
    "task.prompt_length=3",
    "task.num_new_tokens=3",
    "task.dictionary_size=2",
    "datamodule.source.num_train=32",
    "datamodule.source.num_val=16",
    "datamodule.batch_size=8",
    "callbacks.forgetting.source.num_val=8",
    "trainer.max_epochs=1",
]


def fit(
    tmp_path: Path, tuning: str = "new_rows", monitors: tuple[ForgettingMonitor, ...] = (), **module_kwargs
) -> VocabExtendModule:
    """Fit 4 steps (AdamW, weight decay 0.1) with validation at the end; returns the module."""
    task = MarkovChainTask(**TASK)
    backbone = TinyBackbone(**SMALL_LLAMA, **module_kwargs.pop("backbone", {}))
    module = VocabExtendModule(
        backbone,
        optimizer=functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1),
        vocabulary=task,
        tuning=tuning,
        generate_on_eval=False,
        **module_kwargs,
    )
    datamodule = SFTDataModule(backbone.tokenizer, NewTokenSource(task, 32, 8, 8), batch_size=8, max_length=32)
    monitors = monitors or (ForgettingMonitor(source=TaskSource(task, 0, 8, 0)),)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(monitors),
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule)
    module.monitors = monitors
    return module


def base_state() -> dict[str, torch.Tensor]:
    return TinyBackbone(**SMALL_LLAMA).build_model().state_dict()


def test_new_rows_keep_old_contexts_bit_identical(tmp_path):
    module = fit(tmp_path, "new_rows")
    ext = module.vocab_extension
    metrics = module.monitors[0].last
    assert metrics == {"max_abs_logit_diff": 0.0, "kl_mean": 0.0, "kl_max": 0.0, "new_token_mass": 0.0}
    # the optimizer held the new rows only, and they moved; every old weight is the base model's, bit for bit
    optimized = {id(p) for group in module.trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in ext.parameters()}
    assert module.trainer.optimizers[0].param_groups[0]["weight_decay"] > 0
    table = module.model.get_input_embeddings().weight
    assert not torch.equal(ext.input_embeddings(), table[[module.tokenizer.convert_tokens_to_ids("0")] * 3])
    state = module.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base_state().items())
    assert module.new_token_ids == ext.new_token_ids == [len(module.base_tokenizer) + i for i in range(3)]


@pytest.mark.parametrize("tuning", ["full", "lora"])
def test_baselines_forget_on_the_same_data(tmp_path, tuning):
    module = fit(tmp_path, tuning)
    metrics = module.monitors[0].last
    assert metrics["max_abs_logit_diff"] > 0 and metrics["kl_mean"] > 0
    optimized = {id(p) for group in module.trainer.optimizers[0].param_groups for p in group["params"]}
    assert {id(p) for p in module.vocab_extension.parameters()} <= optimized  # the new rows train in every arm
    if tuning == "lora":
        names = [n for n, p in module.model.named_parameters() if p.requires_grad]
        assert names and all("lora_" in n or "new_rows" in n for n in names)
    # the export holds plain (merged) weights of the trained base, which differ from the original base
    written = load_file(str(module.export_pretrained(tmp_path / "export") / "model.safetensors"))
    original = base_state()
    assert not any("lora_" in k or "new_rows" in k for k in written)
    assert written.keys() <= original.keys() and any(not torch.equal(written[k], original[k]) for k in written)


def test_output_rows_shift_mass_unless_the_monitor_masks(tmp_path):
    task = MarkovChainTask(**TASK)
    plain = ForgettingMonitor(source=TaskSource(task, 0, 8, 0), log_prefix="forgetting")
    masked = ForgettingMonitor(source=TaskSource(task, 0, 8, 0), mask_new_logits=True, log_prefix="forgetting_masked")
    module = fit(tmp_path, "new_rows", monitors=(plain, masked), output_rows=True, mode="dictionary")
    assert plain.last["max_abs_logit_diff"] == 0.0  # old logits never move
    assert plain.last["kl_mean"] > 0 and plain.last["new_token_mass"] > 0
    assert masked.last == {"max_abs_logit_diff": 0.0, "kl_mean": 0.0, "kl_max": 0.0, "new_token_mass": 0.0}
    assert module.model.config.vocab_size == len(module.tokenizer)
    logged = module.trainer.callback_metrics
    assert float(logged["forgetting/kl_mean"]) > 0 and float(logged["forgetting_masked/kl_mean"]) == 0


def test_export_and_delta_init_reproduce_the_extended_model(tmp_path):
    module = fit(tmp_path / "fit", "new_rows", mode="dictionary")
    export = module.export_pretrained(tmp_path / "export")
    assert (export / DELTA_FILE).is_file() and (export / "model.safetensors").is_file()
    assert isinstance(module.model.get_input_embeddings(), ExtendedEmbedding)  # re-attached after export
    written = load_file(str(export / "model.safetensors"))
    original = base_state()
    assert all(torch.equal(written[k], original[k]) for k in written)  # the base, bit-identical
    batch = torch.tensor([module.tokenizer("ab<v0>cd<v2>e", add_special_tokens=False)["input_ids"]])
    module.model.eval()
    with torch.no_grad():
        expected = module.model(batch).logits
    reloaded = VocabExtendModule(
        TinyBackbone(**SMALL_LLAMA, init_from=str(export)),
        vocabulary=MarkovChainTask(**TASK),
        mode="dictionary",
        delta_init=str(export),
    )
    reloaded.configure_model()
    assert reloaded.tokenizer.get_vocab() == module.tokenizer.get_vocab()
    with torch.no_grad():
        assert torch.equal(reloaded.model.eval()(batch).logits, expected)
    # a delta for another extension is refused
    with pytest.raises(ConfigError, match="its mode is 'dictionary', the config says 'free'"):
        VocabExtendModule(
            TinyBackbone(**SMALL_LLAMA, init_from=str(export)),
            vocabulary=MarkovChainTask(**TASK),
            delta_init=str(export),
            mode="free",
        )


def test_method_runs_through_the_cli_config(train_cfg):
    cfg = train_cfg(["+method=vocab_extend", *SMALL_CLI])
    metrics = run(cfg)
    assert metrics["forgetting/max_abs_logit_diff"] == 0.0 and metrics["forgetting/kl_mean"] == 0.0
    assert "val/loss" in metrics
    export = Path(cfg.paths.output_dir) / "export"
    assert (export / DELTA_FILE).is_file() and (export / "model.safetensors").is_file()


@pytest.mark.parametrize(("tuning", "lr"), [("new_rows", 1e-2), ("full", 1e-3), ("lora", 1e-3)])
def test_baseline_configs_compose(train_cfg, tuning, lr):
    cfg = train_cfg(["+method=vocab_extend", f"module/vocab_extend/tuning={tuning}", *SMALL_CLI])
    assert cfg.module.tuning == tuning and cfg.module.optimizer.lr == lr
    module, _, _ = build(cfg)
    assert module.tuning == tuning and module.new_tokens == ["<v0>", "<v1>", "<v2>"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["module.vocabulary=null", "module.new_tokens=['<a>']", "module.dictionaries=[[cat]]"],
            "'cat' is not a token",
        ),
        (
            ["module.vocabulary=null", "module.new_tokens=['<a>']", "module.mode=dictionary"],
            "needs module.dictionaries",
        ),
        (["module.vocabulary=null"], "module.new_tokens is empty"),
        (["module.new_tokens=['<a>']"], "not both"),
        (["module.vocabulary=null", "module.new_tokens=[a]"], "already in the vocabulary"),
        (["module.tuning=prefix"], "module.tuning must be one of"),
    ],
)
def test_bad_configs_are_one_clear_error(train_cfg, overrides, message):
    assert re.search(message, build_error(train_cfg(["+method=vocab_extend", *SMALL_CLI, *overrides])))


def test_a_task_without_new_tokens_is_refused(train_cfg):
    cfg = train_cfg(["+method=vocab_extend", *SMALL_CLI[:6], "task=addition"])
    assert "task 'addition' defines no new tokens" in build_error(cfg)  # the data source says it first
    with pytest.raises(ConfigError, match=r"module.vocabulary \(Addition\) defines no new_tokens"):
        VocabExtendModule(TinyBackbone(**SMALL_LLAMA), vocabulary=Addition())


def build_error(cfg) -> str:
    """The one-line message train.py prints for the error ``build(cfg)`` raises (a ZooError in the chain)."""
    with pytest.raises(Exception) as info:  # Hydra wraps the ConfigError
        build(cfg)
    message = user_message(info.value)
    assert message is not None, f"not a user-facing error: {info.value!r}"
    return message


def test_padded_hf_vocabulary_gets_reserved_ids(tiny_gpt2_dir, tmp_path):
    """A checkpoint whose embedding has more rows than its tokenizer has tokens (as many real LMs do)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from zoo.backbones import HFBackbone

    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir, local_files_only=True)
    config = AutoConfig.from_pretrained(tiny_gpt2_dir, local_files_only=True)
    config.vocab_size = len(tokenizer) + 5
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    backbone = HFBackbone(str(tmp_path))
    assert backbone.num_embedding_rows() == len(tokenizer) + 5
    module = VocabExtendModule(backbone, new_tokens=["<pet>"], dictionaries=[["cat"]])
    module.configure_model()
    assert module.new_token_ids == module.vocab_extension.new_token_ids == [len(tokenizer) + 5]
    assert module.tokenizer("a <pet>", add_special_tokens=False)["input_ids"][-1] == len(tokenizer) + 5
    with pytest.raises(ConfigError, match="padded vocabulary"):
        VocabExtendModule(HFBackbone(str(tmp_path)), new_tokens=["<pet>"], pad_tokenizer=False)


def test_tokens_added_after_the_tokenizer_is_built_are_not_base_rows():
    """What lets the module add its tokens before the model is built: the backbone builds the base vocabulary."""
    backbone = TinyBackbone(**SMALL_LLAMA, extra_tokens=["<extra>"])
    size = len(backbone.tokenizer)
    backbone.tokenizer.add_tokens(["<late>"])
    assert backbone.base_vocab_size == backbone.num_embedding_rows() == size
    assert backbone.build_model().get_input_embeddings().num_embeddings == size


def test_full_tuning_on_a_quantized_base_trains_lora_and_the_new_rows_or_says_what_to_add():
    """tuning=full with backbone.lora on quant=bnb_nf4 (QLoRA, as +method=nmars_sft +preset=qlora): the adapters and
    the new rows train, the 4-bit base stays frozen; without adapters the quantized weights cannot train: one message
    naming +preset=qlora."""
    from zoo.quant.bnb import BnbQuantizer, is_bnb_quantized

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    module = VocabExtendModule(
        TinyBackbone(**SMALL_LLAMA, lora=lora), BnbQuantizer("nf4"), vocabulary=MarkovChainTask(**TASK), tuning="full"
    )
    module.configure_model()
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert is_bnb_quantized(module.model)
    assert any("lora_" in n for n in trainable) and any(".new_rows." in n for n in trainable)
    assert all("lora_" in n or ".new_rows." in n for n in trainable), trainable
    bare = VocabExtendModule(
        TinyBackbone(**SMALL_LLAMA), BnbQuantizer("nf4"), vocabulary=MarkovChainTask(**TASK), tuning="full"
    )
    with pytest.raises(ConfigError, match=r"tuning=full cannot train the quantized weights of quant=bnb_nf4.*qlora"):
        bare.configure_model()
