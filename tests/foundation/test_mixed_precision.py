"""Mixed precision (DESIGN "Scale"): ``backbone.dtype=bfloat16`` computes in bf16 with float32 trainable weights and
optimizer state; temperatures divide float32 logits; GRPO reuses rollout log-probs as old log-probs only where they
are the training forward's exactly. Real tiny Llama, real Lightning trainers on CPU (bf16 autocast runs on CPU)."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.cli.resolvers import precision_for
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition, MultiSum
from zoo.datamodules import PromptDataModule, SFTDataModule
from zoo.generation.sampling import sample_next
from zoo.losses import masked_token_logprobs
from zoo.modules import CausalLMModule, GRPOModule
from zoo.protocols import SamplingParams
from zoo.rl import ClippedPolicyLoss

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def trainer(max_steps: int, precision: str) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        precision=precision,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8, "dropout": 0.0}], ids=["full", "lora"])
def test_ten_steps_at_lr_1e_6_change_the_trainable_weights_of_a_bf16_backbone(lora):
    """Pure bf16 AdamW at lr 1e-6 changed 0% of the weights (each update is below bf16's rounding step): trainable
    weights and optimizer state are float32, frozen ones stay bf16, and compute runs under bf16 autocast."""
    backbone = TinyBackbone(seed=1, num_key_value_heads=2, dtype="bfloat16", lora=lora, **SMALL)
    module = CausalLMModule(
        backbone, optimizer=functools.partial(torch.optim.AdamW, lr=1e-6, weight_decay=0.0), generate_on_eval=False
    )
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.model.named_parameters() if p.requires_grad}
    assert before and all(p.dtype == torch.float32 for p in before.values())
    frozen = [p.dtype for p in module.model.parameters() if not p.requires_grad]
    assert all(dtype == torch.bfloat16 for dtype in frozen) and bool(frozen) == bool(lora)
    fit = trainer(10, precision_for("bfloat16"))
    assert fit.precision == "bf16-mixed"
    dm = SFTDataModule(backbone.tokenizer, TaskSource(Addition(2), num_train=40, num_val=4), batch_size=4)
    fit.fit(module, dm)
    after = dict(module.model.named_parameters())
    changed = sum(int((after[n].detach() != p).sum()) for n, p in before.items())
    assert changed / sum(p.numel() for p in before.values()) > 0.5
    states = [v for s in fit.optimizers[0].state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    assert states and all(v.dtype == torch.float32 for v in states)


def test_sampling_divides_bf16_logits_by_the_temperature_after_the_upcast():
    torch.manual_seed(0)
    logits = (torch.randn(4, 50) * 3).to(torch.bfloat16)
    params = SamplingParams(do_sample=True, temperature=0.7)
    tokens, logprobs = sample_next(logits, params, torch.Generator().manual_seed(1))
    expected = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    assert logprobs.dtype == torch.float32
    assert torch.equal(logprobs, expected)
    # training scores the same distribution: masked_token_logprobs of the bf16 logits at that temperature
    trained, _ = masked_token_logprobs(logits[:, None], tokens[:, None], shift=False, temperature=0.7)
    torch.testing.assert_close(trained[:, 0], expected, atol=1e-6, rtol=0)


class RecordingLoss(ClippedPolicyLoss):
    """The clipped loss, recording the (current, old) log-probs of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, logp, old_logp, advantages, mask=None, ref_logp=None):
        self.calls.append((logp.detach().clone(), old_logp.detach().clone(), mask.clone()))
        return super().__call__(logp, old_logp, advantages, mask, ref_logp)


@pytest.mark.parametrize(
    ("lora", "precision"),
    [(None, "bf16-mixed"), ({"r": 4, "alpha": 8, "dropout": 0.0}, "32-true")],
    ids=["autocast", "bf16_frozen_weights"],
)
def test_grpo_old_logprobs_under_bf16_are_the_training_forwards(lora, precision):
    """With num_iterations=2 the first update's ratio is exactly 1: under bf16 compute (autocast, or bf16 frozen
    weights) the rollout's sampling log-probs (KV-cached bf16 decode: mean |diff| ~1e-3) are not reused; the old
    log-probs are recomputed with the training forward."""
    torch.manual_seed(0)
    loss = RecordingLoss()
    module = GRPOModule(
        TinyBackbone(seed=0, num_key_value_heads=2, dtype="bfloat16", lora=lora, **SMALL),
        rewards={"hash": lambda prompts, completions, **kw: [float(sum(map(ord, c)) % 13) for c in completions]},
        group_size=3,
        num_iterations=2,
        policy_loss=loss,
        generation={"max_new_tokens": 8, "temperature": 0.7},
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
    )
    dm = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=8, num_val=2), batch_size=2, shuffle=False)
    trainer(1, precision).fit(module, dm)
    assert not module.full_precision()
    first_update = loss.calls[: len(loss.calls) // 2]
    assert first_update
    for logp, old, mask in first_update:
        assert torch.equal(logp * mask, old * mask)
