"""N-MARS methods: masked SFT (+method=nmars_sft: the gradient on error tokens, the plain-SFT switch, the merged
export with <UNDO>) and GRPO (+method=nmars_grpo: undo-aware rollouts scored by the N-MARS reward).

The chained runs use a tiny random policy (``backbone.init_from=null``) and small data so that each stage takes
seconds; the full chain through the artifact cache (base policy -> data stage -> masked SFT -> GRPO) is the slow test
at the end and the catalogue's smoke runs.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.cli.train import run
from zoo.data.sources import JsonlSource
from zoo.data.tasks import Addition
from zoo.data.undo import augmented_row, undo_vocabulary
from zoo.datamodules import SFTDataModule
from zoo.generation.undo import UNDO_TOKEN
from zoo.losses import masked_token_logprobs
from zoo.modules import VocabExtendModule
from zoo.vocab import extend_vocabulary

from conftest import SMALL_BASE_POLICY

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
FAST_SFT = [
    "+method=nmars_sft",
    "backbone.init_from=null",
    "datamodule.source.num_train=16",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.source.overrides=['module.generation.max_new_tokens=20','datamodule.eval_batch_size=8']",
    "datamodule.batch_size=8",
    "datamodule.eval_batch_size=8",
    "trainer.max_epochs=1",
    "module.generation.max_new_tokens=20",
    "callbacks.undo_metrics.temperatures=[1.0]",
]


def msft_module(seed: int = 0) -> VocabExtendModule:
    """The masked-SFT module of +method=nmars_sft (vocabulary extension, output rows, every weight trained)."""
    torch.manual_seed(seed)
    module = VocabExtendModule(
        TinyBackbone(**SMALL, num_key_value_heads=2, seed=seed),
        new_tokens=[UNDO_TOKEN],
        output_rows=True,
        tuning="full",
    )
    module.configure_model()
    return module


def augmented_batch(module: VocabExtendModule, tmp_path: Path, use_loss_mask: bool) -> dict:
    tok = module.tokenizer
    vocabulary = undo_vocabulary(tok, module.vocab_extension.first_new_id)  # the tokenizer already has <UNDO>
    rows = []
    for i, ex in enumerate(Addition(2).examples(8, seed=5)):
        reference = list(tok(ex.completion, add_special_tokens=False)["input_ids"])
        wrong = random.Random(i).choice(list(tok(")x?!", add_special_tokens=False)["input_ids"]))
        sample = reference[:5] + [wrong, wrong] + reference[6:]
        rows.append(
            augmented_row(
                tok, vocabulary, key=str(i), prompt=ex.prompt, answer=ex.answer, reference=ex.completion,
                deviation="sample", sample_ids=sample,
            )
        )  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    dm = SFTDataModule(tok, JsonlSource(str(path), str(path)), batch_size=8, shuffle=False, use_loss_mask=use_loss_mask)
    return next(iter(dm.val_dataloader()))


@torch.no_grad()
def error_logprob(module: VocabExtendModule, batch: dict) -> float:
    """Mean log-probability of the error tokens given their prefix."""
    logits = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp, mask = masked_token_logprobs(logits, batch["masked_out_labels"])
    return float(logp.sum() / mask.sum())


@pytest.mark.parametrize("use_loss_mask", [True, False], ids=["masked_sft", "plain_sft"])
def test_gradient_on_logits_that_predict_error_tokens(tmp_path, use_loss_mask):
    module = msft_module()
    batch = augmented_batch(module, tmp_path, use_loss_mask)
    loss, logits, _ = module.loss(batch)
    logits.retain_grad()
    loss.backward()
    errors = batch["masked_out_labels"] != -100  # positions holding an error token
    undo_id = module.new_token_ids[0]
    undos = batch["input_ids"] == undo_id
    assert errors.sum() == 16 and undos.sum() == 16
    # logits at position t predict token t + 1
    error_grads = logits.grad[:, :-1][errors[:, 1:]]
    undo_grads = logits.grad[:, :-1][undos[:, 1:]]
    assert undo_grads.abs().sum(-1).min() > 0  # both train the <UNDO> tokens
    if use_loss_mask:
        assert torch.count_nonzero(error_grads) == 0  # exactly zero: errors are context, never targets
    else:
        assert error_grads.abs().sum(-1).min() > 0
    # the new <UNDO> row trains in both
    assert module.vocab_extension.input_rows.rows.grad.abs().sum() > 0


def test_plain_sft_raises_the_probability_of_errors_more_than_masked_sft(tmp_path):
    """The safety gap on the training rows themselves: a few identical optimizer steps from the same start."""
    mean_logprob = {}
    start = None
    for use_loss_mask in (True, False):
        module = msft_module(seed=1)
        batch = augmented_batch(module, tmp_path, use_loss_mask)
        if start is None:
            start = error_logprob(module, batch)
        optimizer = torch.optim.SGD(module.trainable_parameters(), lr=0.5)
        for _ in range(5):
            optimizer.zero_grad()
            module.loss(batch)[0].backward()
            optimizer.step()
        mean_logprob[use_loss_mask] = error_logprob(module, batch)
    assert mean_logprob[False] > start + 0.5  # plain SFT trains the errors
    assert mean_logprob[False] > mean_logprob[True] + 0.2


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_merged_model_is_a_plain_checkpoint_with_the_same_outputs(tmp_path, tie):
    backbone = TinyBackbone(**SMALL, num_key_value_heads=2, tie_word_embeddings=tie, seed=4)
    model = backbone.build_model().eval()
    extension = extend_vocabulary(model, 1, output_rows=True)
    with torch.no_grad():
        for p in extension.parameters():
            p.add_(torch.randn_like(p))  # trained-looking new rows
    ids = torch.tensor([[1, 20, 30, extension.first_new_id, 40, extension.first_new_id]])
    expected = model(input_ids=ids).logits
    extension.remove()
    plain = __import__("copy").deepcopy(model)
    extension.attach()
    merged = extension.merge_into(plain)
    merged.save_pretrained(tmp_path)
    reloaded = type(merged).from_pretrained(tmp_path).eval()
    assert reloaded.config.vocab_size == extension.first_new_id + 1
    assert (reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight) == tie
    torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(model(input_ids=ids).logits, expected)  # the extended model is unchanged


@pytest.fixture(scope="module")
def msft_run(tmp_path_factory):
    """One +method=nmars_sft run through the app (data stage built through the artifact cache)."""
    from conftest import compose_train

    root = tmp_path_factory.mktemp("msft")
    cfg = compose_train(FAST_SFT, root, cache_dir=root / "cache")
    metrics = run(cfg)
    return root / "run", metrics


def test_masked_sft_through_the_app_logs_the_nmars_metrics_and_exports_undo(msft_run):
    run_dir, metrics = msft_run
    for key in ("val/exact_match", "val/undo_rate", "val/undos_per_generation", "val/deviation_logprob"):
        assert key in metrics
    assert metrics["val/deviation_logprob"] < 0
    # the extra sampled decode at T = 1 (UndoMetrics temperatures), scored on resolved outputs
    for key in ("val/T1/exact_match", "val/T1/undo_rate", "val/T1/undos_per_generation"):
        assert 0 <= metrics[key] <= (1 if "rate" in key or "match" in key else 20)
    export = TinyBackbone(init_from=str(run_dir / "export"))
    tok = export.tokenizer
    assert UNDO_TOKEN in tok.get_vocab()
    model = export.build_model()
    assert model.get_input_embeddings().num_embeddings == len(tok) == tok.convert_tokens_to_ids(UNDO_TOKEN) + 1


def test_plain_sft_switch_composes(train_cfg):
    cfg = train_cfg(["+method=nmars_sft", "datamodule.use_loss_mask=false"])
    assert cfg.datamodule.use_loss_mask is False
    assert cfg.module.new_tokens == [UNDO_TOKEN] and cfg.module.output_rows and cfg.module.export_merged
    assert cfg.hydra.runtime.choices["module/vocab_extend/tuning"] == "full"
    assert cfg.hydra.runtime.choices["module/decoder"] == "undo"


def test_grpo_from_the_masked_sft_export(msft_run, train_cfg, tmp_path):
    run_dir, _ = msft_run
    cfg = train_cfg(
        [
            "+method=nmars_grpo",
            f"backbone.init_from={run_dir / 'export'}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "datamodule.batch_size=2",
            "datamodule.source.num_val=4",
            "datamodule.eval_batch_size=4",
            "module.group_size=4",
            "module.generation.max_new_tokens=16",
            "callbacks.log_generations.every_n_steps=1",
        ]
    )
    from zoo.cli.train import build

    module, _, _ = build(cfg)
    reward = module.rewards["nmars"]
    assert reward.tokenizer is module.tokenizer  # bound by the module
    metrics = run(cfg)
    for key in ("train/reward", "val/exact_match", "val/undo_rate"):
        assert key in metrics
    # rewards of the rollouts are the N-MARS reward of their physical ids
    assert -2.0 <= metrics["train/reward"] <= 1.6


@pytest.mark.slow
def test_the_full_chain_through_the_artifact_cache(train_cfg, base_policy_cache):
    """base SFT policy -> data stage -> masked SFT -> GRPO, each built once through the artifact cache."""
    overrides = [
        "+method=nmars_grpo",
        *SMALL_BASE_POLICY,
        "backbone.init_from.num_train=32",
        "backbone.init_from.num_val=8",
        "backbone.init_from.max_epochs=1",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "datamodule.batch_size=2",
        "datamodule.source.num_val=4",
        "module.group_size=2",
        "module.generation.max_new_tokens=16",
    ]
    metrics = run(train_cfg(overrides, cache_dir=base_policy_cache))
    assert "val/undo_rate" in metrics
    for kind in ("base_policy", "nmars_data", "nmars_policy"):
        assert any((base_policy_cache / kind).iterdir())


def test_a_lora_masked_sft_export_is_a_plain_checkpoint_with_the_trained_outputs(tmp_path):
    """+method=nmars_sft with backbone.lora (QLoRA, +preset=qlora) trains adapters with tuning=full; its merged export
    folds them in: no peft layer names in the checkpoint, and the reloaded model computes what the trained one did."""
    torch.manual_seed(0)
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    module = VocabExtendModule(
        TinyBackbone(**SMALL, num_key_value_heads=2, seed=0, lora=lora),
        new_tokens=[UNDO_TOKEN],
        output_rows=True,
        tuning="full",
        export_merged=True,
    )
    module.configure_model()
    with torch.no_grad():
        for name, p in module.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5 * torch.randn_like(p))  # trained-looking adapters
    module.model.eval()
    undo = module.tokenizer.convert_tokens_to_ids(UNDO_TOKEN)
    ids = torch.tensor([[1, 20, 30, undo, 40]])
    with torch.no_grad():
        expected = module.model(input_ids=ids).logits
    module.export_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert not [k for k in keys if "lora_" in k or "base_layer" in k], keys[:5]
    reloaded = TinyBackbone(init_from=str(tmp_path)).build_model().eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, atol=1e-5, rtol=0)


def test_a_qlora_grpo_run_starts_from_a_fully_fine_tuned_masked_sft_policy(train_cfg):
    """+method=nmars_grpo +preset=qlora trains adapters on the quantized masked-SFT policy. That policy's build run
    (+method=nmars_sft, the undo_policy plan) is a full fine-tune like the base policy: it does not inherit the
    parent's adapters (whose unmerged peft layers the 4-bit load of its export could not read)."""
    from omegaconf import OmegaConf

    from zoo.modules.nmars import undo_policy

    cfg = train_cfg(["+method=nmars_grpo", "+preset=qlora"])
    backbone = OmegaConf.to_container(cfg.backbone, resolve=True)
    backbone.pop("init_from")  # what the CLI passes a plan at backbone.init_from
    assert backbone["lora"]
    request = next(undo_policy(backbone=backbone, task=OmegaConf.to_container(cfg.task, resolve=True), seed=0))
    assert request.overrides[0] == "+method=nmars_sft"
    assert request.values["backbone"]["lora"] is None and request.values["backbone"]["init_from"] == "base"
    assert {k: v for k, v in request.values["backbone"].items() if k not in ("lora", "init_from")} == {
        k: v for k, v in backbone.items() if k != "lora"
    }
