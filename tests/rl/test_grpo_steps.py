"""GRPO family: what a step is (num_iterations > 1), the shaper's output reaching the loss, DAPO's dynamic sampling
and truncated-completion masking. Real tiny Llama, real Trainer; reward functions are small scripted functions."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.errors import ConfigError
from zoo.modules import GRPOModule
from zoo.optim import warmup_cosine
from zoo.rl import ClippedPolicyLoss, GRPOAdvantage, LossAggregator, RewardShaper

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def text_hash_reward(prompts, completions, **kw):
    """A reward that differs between completions (a random model rarely stops, so lengths alone would not)."""
    return [float(sum(map(ord, c)) % 13) for c in completions]


def make_module(cls=GRPOModule, **kw):
    base = {
        "rewards": {"hash": text_hash_reward},
        "group_size": 3,
        "generation": {"max_new_tokens": 6},
        "optimizer": functools.partial(torch.optim.AdamW, lr=1e-3),
    }
    return cls(TinyBackbone(seed=0, num_key_value_heads=2, **SMALL), **{**base, **kw})


def datamodule(module, batch_size=2, num_train=32):
    return PromptDataModule(
        module.tokenizer, TaskSource(MultiSum(), num_train=num_train, num_val=2), batch_size=batch_size, shuffle=False
    )


def fit(module, max_steps, batch_size=2, callbacks=(), num_train=32):
    trainer = pl.Trainer(
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(module, datamodule(module, batch_size, num_train))
    return trainer


class RecordSteps(pl.Callback):
    def __init__(self):
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append(trainer.global_step)


class CountingGRPO(GRPOModule):
    """Records the global step of every rollout and the prompts of every policy update."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollout_steps: list[int] = []
        self.updates: list[list[str]] = []

    def rollout(self, batch):
        self.rollout_steps.append(self.global_step)
        return super().rollout(batch)

    def update_policy(self, rollout):
        self.updates.append(list(rollout["prompts"]))
        return super().update_policy(rollout)


# -- item: num_iterations > 1 -----------------------------------------------------------------------------------
def test_num_iterations_keeps_one_step_per_rollout_for_max_steps_scheduler_and_callbacks():
    totals = []

    def scheduler(optimizer, total_steps):
        totals.append(total_steps)
        return warmup_cosine(optimizer, total_steps, warmup_ratio=0.34)

    module = make_module(CountingGRPO, num_iterations=2, scheduler=scheduler)
    recorder = RecordSteps()
    trainer = fit(module, max_steps=3, callbacks=[recorder])
    assert module.rollout_steps == [0, 1, 2]  # max_steps=3 -> 3 rollouts, not 3 / num_iterations
    assert trainer.global_step == 3
    assert recorder.steps == [1, 2, 3]  # callbacks keyed on global_step see rollout steps
    assert totals == [3]  # the schedule spans the run's rollout steps
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3  # stepped once per rollout step
    optimizer = trainer.optimizers[0]
    assert {int(optimizer.state[p]["step"]) for p in module.trainable_parameters()} == {6}  # 2 updates each


# -- item: the loss sees the shaper's output --------------------------------------------------------------------
class ReversingShaper(RewardShaper):
    """Reverses the order of rewards within the batch (a shaper whose effect on advantages is unmistakable)."""

    def __call__(self, rewards, lengths, max_length=None):
        return rewards.max() - rewards


class RecordingLoss(ClippedPolicyLoss):
    def __init__(self):
        super().__init__()
        self.advantages: list[torch.Tensor] = []

    def __call__(self, logp, old_logp, advantages, mask=None, ref_logp=None):
        self.advantages.append(advantages.detach().clone())
        return super().__call__(logp, old_logp, advantages, mask, ref_logp)


def test_the_loss_uses_the_advantages_of_the_shaped_rewards():
    loss = RecordingLoss()
    module = make_module(shaper=ReversingShaper(), policy_loss=loss, group_size=4)
    fit(module, max_steps=1, batch_size=3)
    rollout = module.last_rollout
    used = torch.cat(loss.advantages)
    shaped = GRPOAdvantage()(ReversingShaper()(rollout["rewards"], rollout["lengths"])).reshape(-1)
    unshaped = GRPOAdvantage()(rollout["rewards"]).reshape(-1)
    assert not torch.allclose(shaped, unshaped)  # the test can tell the two apart
    torch.testing.assert_close(used, shaped.to(used))


# -- item: DAPO dynamic sampling ---------------------------------------------------------------------------------
def informative_first_two(batch_size):
    """Reward: varies within the groups of the first two prompts of each batch, constant for the others."""
    rows = TaskSource(MultiSum(), num_train=32, num_val=2).rows("train")
    informative = {r["prompt"] for i, r in enumerate(rows) if i % batch_size < 2}

    def reward(prompts, completions, **kw):
        return [text_hash_reward([p], [c])[0] if p in informative else 1.0 for p, c in zip(prompts, completions)]

    return reward, informative


def test_dynamic_sampling_drops_zero_variance_groups_and_refills_the_batch():
    reward, informative = informative_first_two(4)
    module = make_module(CountingGRPO, rewards={"r": reward}, dynamic_sampling=True, max_refill_rounds=3)
    trainer = fit(module, max_steps=2, batch_size=4)
    assert trainer.global_step == 2
    assert len(module.rollout_steps) == 4  # two generation batches per update
    assert [len(u) for u in module.updates] == [4 * 3, 4 * 3]  # full batches of 4 groups of G = 3
    assert all(p in informative for update in module.updates for p in update)
    assert trainer.callback_metrics["train/refill_rounds"] == 1
    assert trainer.callback_metrics["train/groups_kept"] == 4


def test_dynamic_sampling_stops_refilling_at_the_cap():
    reward, informative = informative_first_two(4)
    module = make_module(CountingGRPO, rewards={"r": reward}, dynamic_sampling=True, max_refill_rounds=0)
    trainer = fit(module, max_steps=2, batch_size=4)
    assert len(module.rollout_steps) == 2  # no refill: each batch is trained on as it is
    assert [len(u) for u in module.updates] == [2 * 3, 2 * 3]  # its two informative groups
    assert all(p in informative for update in module.updates for p in update)
    assert trainer.callback_metrics["train/groups_kept"] == 2


def test_dynamic_sampling_config_errors():
    with pytest.raises(ConfigError, match="max_refill_rounds"):
        make_module(dynamic_sampling=True, max_refill_rounds=-1)


# -- item: mask_truncated_completions ----------------------------------------------------------------------------
@pytest.mark.parametrize("mask_truncated", [True, False])
def test_mask_truncated_completions_removes_truncated_rows_from_the_loss(mask_truncated):
    torch.manual_seed(0)
    module = make_module(
        mask_truncated_completions=mask_truncated, aggregation=LossAggregator("token_mean"), group_size=4
    )
    module.configure_model()
    dm = datamodule(module, batch_size=2)
    dm.setup("fit")
    rollout = module.rollout(next(iter(dm.train_dataloader())))
    result = rollout["result"]
    result.finished = torch.tensor([True, False] * 4)  # rows 1, 3, 5, 7 hit max_new_tokens
    rows = module.sequences(result, rollout["prompt_mask"])
    advantages = torch.randn(8)

    def gradient(adv):
        module.model.zero_grad(set_to_none=True)
        module.policy_gradients(rows, adv, None)
        return torch.cat([p.grad.flatten() for p in module.model.parameters() if p.grad is not None])

    changed = advantages.clone()
    changed[1::2] = 5.0  # only the truncated rows' advantages differ
    same = torch.allclose(gradient(advantages), gradient(changed), atol=1e-7)
    assert same is mask_truncated


# -- the training forward computes what it needs, and reuses what the rollout has --------------------------------
def rollout_rows(module, batch_size=2):
    module.configure_model()
    dm = datamodule(module, batch_size=batch_size)
    dm.setup("fit")
    rollout = module.rollout(next(iter(dm.train_dataloader())))
    return rollout, module.sequences(rollout["result"], rollout["prompt_mask"])


@pytest.mark.parametrize("logits_to_keep", [True, False])
def test_completion_logprobs_equal_the_full_forward(logits_to_keep):
    from zoo.losses import masked_token_logprobs
    from zoo.modules.grpo import completion_start

    module = make_module(generation={"max_new_tokens": 6, "temperature": 0.7})
    rollout, rows = rollout_rows(module)
    module._logits_to_keep = logits_to_keep  # the sliced path of models without `logits_to_keep`
    start = completion_start(rows[3])
    assert start == rollout["result"].prompt_ids.shape[1]
    logp, mask, entropy = module.token_logprobs(module.model, rows, with_entropy=True)
    full = module.model(input_ids=rows[0], attention_mask=rows[1], position_ids=rows[2]).logits / 0.7
    expected, expected_mask = masked_token_logprobs(full, rows[3])
    torch.testing.assert_close(logp, expected[:, start - 1 :], atol=1e-5, rtol=1e-5)
    assert torch.equal(mask, expected_mask[:, start - 1 :])
    assert torch.equal(mask, rollout["result"].completion_mask.bool())
    probs = torch.softmax(full[:, :-1].float(), -1)
    token_entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    torch.testing.assert_close(entropy, (token_entropy * expected_mask).sum(), atol=1e-4, rtol=1e-5)


def test_rollout_logprobs_are_the_old_policy_logprobs():
    module = make_module(num_iterations=2, generation={"max_new_tokens": 6, "temperature": 0.7})
    rollout, rows = rollout_rows(module)
    from zoo.modules.grpo import completion_start

    start = completion_start(rows[3])
    reused = module.rollout_logprobs(rollout, start)
    recomputed, _ = module.reference_logprobs(rows)
    torch.testing.assert_close(reused, recomputed, atol=1e-5, rtol=1e-5)
    module.decoder.processors.append(lambda ids, scores: scores)  # log-probs after processors are not the policy's
    assert module.rollout_logprobs(rollout, start) is None
