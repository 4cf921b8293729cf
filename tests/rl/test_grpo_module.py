"""GRPOModule: micro-batch invariance through the module, seams from config, the GR3 callback, bad input."""

import csv
import json

import lightning.pytorch as pl
import pytest
import torch
from test_catalogue import SMOKE_BACKBONE, SMOKE_SHAPE

from zoo.backbones import TinyBackbone
from zoo.callbacks import GR3AlphaCalibration, LogGenerations
from zoo.cli.train import build, run
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.errors import ConfigError
from zoo.generation.sampling import cache_kwarg_name
from zoo.modules import CausalLMModule, GRPOModule
from zoo.modules.grpo import completion_start
from zoo.rl import (
    ClippedPolicyLoss,
    ExactMatchReward,
    GR3Shaper,
    GRPOAdvantage,
    LossAggregator,
    NoShaping,
    RewardFunctionError,
    RewardShaper,
)

from conftest import SMALL_BASE_POLICY

GRPO_FAST = [
    *SMALL_BASE_POLICY,
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "datamodule.batch_size=2",
    "datamodule.source.num_val=8",
    "module.group_size=4",
    "module.generation.max_new_tokens=24",
    "callbacks.log_generations.every_n_steps=1",
]


def rollout_batch(module, num_prompts=3):
    dm = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=16, num_val=4), batch_size=num_prompts)
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def grads(module):
    return [p.grad.clone() for p in module.model.parameters() if p.grad is not None]


def gradient_case(mode: str, max_new_tokens: int):
    """A GRPO module (reference KL on, 12 rows per micro-batch) and one rollout: ``(module, rollout, rows)``."""
    torch.manual_seed(0)
    module = GRPOModule(
        TinyBackbone(seed=2),
        rewards={"accuracy": ExactMatchReward()},
        aggregation=LossAggregator(mode),
        policy_loss=ClippedPolicyLoss(beta=0.1),
        group_size=4,
        micro_batch_size=12,
        generation={"max_new_tokens": max_new_tokens},
    )
    module.configure_model()
    rollout = module.rollout(rollout_batch(module))
    return module, rollout, module.sequences(rollout["result"], rollout["prompt_mask"])


@pytest.mark.parametrize("rows_per_micro_batch", [None, 5], ids=["full_width", "token_budget"])
def test_the_shared_prompt_forward_keeps_log_probs_and_gradient(rows_per_micro_batch):
    """The prompt of a group runs once (its keys/values copied to the G rows): the old/reference log-probs and the
    gradient equal those of the plain forward, where every row runs its prompt."""
    module, _, rows = gradient_case("token_mean", max_new_tokens=16)
    if rows_per_micro_batch is not None:
        module.micro_batch_tokens = rows_per_micro_batch * rows[0].shape[1]
    advantages = torch.randn(rows[0].shape[0])
    module.share_prompt_forward = False
    old_plain, ref_plain = module.reference_logprobs(rows)
    old = old_plain + 0.05 * torch.randn_like(old_plain)
    module.policy_gradients(rows, advantages, old, ref_plain)
    plain = grads(module)
    module.model.zero_grad(set_to_none=True)

    module.share_prompt_forward = True
    fed_rows = []  # (rows, columns, whether the pass starts from scratch: no key/value cache given)
    cache_kwarg = cache_kwarg_name(module.model)
    hook = module.model.register_forward_pre_hook(
        lambda _m, _a, kw: fed_rows.append((*kw["input_ids"].shape, kw.get(cache_kwarg) is None)), with_kwargs=True
    )
    try:
        old_shared, ref_shared = module.reference_logprobs(rows)
        module.policy_gradients(rows, advantages, old, ref_shared)
    finally:
        hook.remove()
    torch.testing.assert_close(old_shared, old_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(ref_shared, ref_plain, atol=1e-5, rtol=0)
    shared = grads(module)
    assert len(shared) == len(plain)
    for a, b in zip(plain, shared):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    # 3 prompts x G=4: one prompt pass of 3 rows per model pass (the old log-probs' and the loss's), whatever the
    # micro-batches; the micro-batches run only the columns after it
    split = completion_start(rows[3]) - 1
    assert [(n, width) for n, width, from_scratch in fed_rows if from_scratch] == [(3, split), (3, split)]
    assert sum(n for n, _, from_scratch in fed_rows if not from_scratch) == 2 * rows[0].shape[0]


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batch_split_does_not_change_the_gradient(mode):
    module, _, rows = gradient_case(mode, max_new_tokens=20)
    advantages = torch.randn(rows[0].shape[0])  # exercise the loss with non-trivial advantages
    old, ref = module.reference_logprobs(rows)
    old = old + 0.05 * torch.randn_like(old)  # off-policy, so ratios and clipping matter
    module.policy_gradients(rows, advantages, old, ref)
    full = grads(module)
    module.model.zero_grad(set_to_none=True)
    module.micro_batch_size = 5  # 12 rows -> micro-batches of 5, 5, 2 with different padded widths
    loss_split, _ = module.policy_gradients(rows, advantages, old, ref)
    for a, b in zip(full, grads(module)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert loss_split.isfinite()


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum_norm"])
def test_token_budget_micro_batches_cut_padding_and_keep_the_gradient(mode):
    module, rollout, rows = gradient_case(mode, max_new_tokens=24)
    num_rows, width = rows[0].shape
    # a random-init policy rarely ends early: end the completions at chosen lengths, as EOS would
    prompt_width = rollout["result"].prompt_ids.shape[1]
    lengths = torch.tensor([24, 3, 17, 9, 24, 1, 12, 20, 5, 24, 8, 15])[:num_rows]
    cut = torch.arange(width)[None] >= prompt_width + lengths[:, None]
    rows = (rows[0], rows[1].masked_fill(cut, 0), rows[2], rows[3].masked_fill(cut, -100))
    advantages = torch.randn(num_rows)
    old_full, ref_full = module.reference_logprobs(rows)
    old = old_full + 0.05 * torch.randn_like(old_full)
    module.policy_gradients(rows, advantages, old, ref_full)
    full = grads(module)
    module.model.zero_grad(set_to_none=True)

    module.micro_batch_tokens = 3 * width
    start = completion_start(rows[3])
    chunks = module.row_micro_batches(rows, start)
    seen = torch.cat([index for index, _ in chunks]).sort().values
    assert torch.equal(seen, torch.arange(num_rows))  # every row exactly once
    assert all(len(index) * w <= 3 * width for index, w in chunks)
    for index, w in chunks:  # each micro-batch is cut to its longest row: nothing attended or labelled is cut
        assert rows[1][index, w:].sum() == 0 and (rows[3][index, w:] == -100).all()
        assert rows[1][index, w - 1].any() or w == start + 1
    assert sum(len(index) * w for index, w in chunks) < num_rows * width  # padding columns were not computed

    old_split, ref_split = module.reference_logprobs(rows)  # the no-grad passes take the same micro-batches
    mask = rows[3][:, start:] != -100
    torch.testing.assert_close(old_split * mask, old_full * mask, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ref_split * mask, ref_full * mask, atol=1e-6, rtol=1e-5)
    module.policy_gradients(rows, advantages, old, ref_full)
    for a, b in zip(full, grads(module)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_micro_batch_tokens_must_be_positive():
    with pytest.raises(ConfigError, match="micro_batch_tokens"):
        GRPOModule(TinyBackbone(), rewards={"a": ExactMatchReward()}, micro_batch_tokens=0)


def test_reference_model_only_when_beta_positive():
    module = GRPOModule(TinyBackbone(), rewards={"a": ExactMatchReward()}, group_size=2)
    module.configure_model()
    assert module.ref_model is None
    with_kl = GRPOModule(TinyBackbone(), rewards={"a": ExactMatchReward()}, policy_loss=ClippedPolicyLoss(beta=0.04))
    with_kl.configure_model()
    assert with_kl.ref_model is not None
    assert not any(p.requires_grad for p in with_kl.ref_model.parameters())
    assert "ref_model" not in dict(with_kl.named_children())  # never saved or optimized


def test_group_size_below_two_is_a_config_error():
    with pytest.raises(ConfigError, match="group_size=1"):
        GRPOModule(TinyBackbone(), rewards={"a": ExactMatchReward()}, group_size=1)


def test_bad_reward_names_the_function():
    def broken_reward(prompts, completions, **kw):
        return [0.0] * (len(completions) - 1)

    module = GRPOModule(
        TinyBackbone(), rewards={"broken": broken_reward}, group_size=2, generation={"max_new_tokens": 8}
    )
    module.configure_model()
    with pytest.raises(RewardFunctionError, match="'broken' returned 5 rewards for 6 completions"):
        module.rollout(rollout_batch(module))


def test_rollout_groups_are_contiguous_and_columns_reach_rewards():
    seen = {}

    def spy(prompts, completions, answer, step, **kw):
        seen.update(prompts=prompts, answer=answer, step=step)
        return [float(len(c)) for c in completions]

    module = GRPOModule(TinyBackbone(), rewards={"spy": spy}, group_size=3, generation={"max_new_tokens": 8})
    module.configure_model()
    batch = rollout_batch(module, num_prompts=2)
    rollout = module.rollout(batch)
    assert seen["prompts"] == [batch["prompts"][0]] * 3 + [batch["prompts"][1]] * 3
    assert seen["answer"][:3] == [batch["columns"]["answer"][0]] * 3
    assert seen["step"] == [0] * 6
    assert rollout["rewards"].shape == (2, 3)
    assert rollout["rewards"].reshape(-1).tolist() == [float(len(t)) for t in rollout["texts"]]
    assert torch.equal(rollout["lengths"].reshape(-1), rollout["result"].lengths.float())


@pytest.mark.parametrize("method", ["grpo", "gr3"])
def test_method_runs_from_the_cached_base_policy_and_logs_diagnostics(method, train_cfg, base_policy_cache, tmp_path):
    metrics = run(train_cfg([f"+method={method}", *GRPO_FAST], cache_dir=base_policy_cache))
    for key in [
        "train/completion_length",
        "train/completion_length_min",
        "train/completion_length_max",
        "train/terminated_length",
        "train/clipped_ratio",
        "train/frac_reward_zero_std",
        "train/reward",
        "train/reward_std",
        "train/shaped_reward",
        "train/shaped_reward_std",
        "train/entropy",
        "train/clip_frac",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/kl_mean",
        "train/accuracy",
        "val/exact_match",
    ]:
        assert key in metrics, key
    generations = [json.loads(x) for x in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert {"train", "val"} <= {g["split"] for g in generations}
    if method == "gr3":
        assert metrics["train/gr3_alpha"] == pytest.approx(0.3)  # calibration first runs at step 10
        if metrics["train/gr3_calibration_groups"] > 0:  # the rate is taken over groups with an advantage
            assert 0.0 <= metrics["train/gr3_satisfaction"] <= 1.0


def test_grpo_step_on_a_saved_hf_model(train_cfg, tmp_path, base_policy_cache):
    backbone = TinyBackbone(seed=7)
    backbone.build_model().save_pretrained(tmp_path / "hf")
    backbone.tokenizer.save_pretrained(tmp_path / "hf")
    cfg = train_cfg(
        [
            "+method=grpo",
            *GRPO_FAST,
            "backbone=hf",
            f"backbone.name_or_path={tmp_path / 'hf'}",
            "trainer.max_steps=1",
            # a pretrained backbone starts from its own weights (no base policy): a length-biased reward varies
            # across this random model's completions (it ends a row with EOS now and then: in 64 tokens about every
            # other row), so the first update moves the weights
            "module/grpo/rewards=proxy_rm",
            "module.generation.max_new_tokens=64",
            "module.group_size=8",
        ],
        cache_dir=base_policy_cache,
    )
    module, datamodule, trainer = build(cfg)
    assert cfg.backbone.init_from is None  # the saved model's own weights, not a base policy
    before = [p.detach().clone() for p in TinyBackbone(init_from=str(tmp_path / "hf")).build_model().parameters()]
    trainer.fit(module, datamodule)
    after = list(module.model.parameters())
    assert trainer.global_step == 1
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_gr3_calibration_callback_adapts_alpha_and_round_trips_state():
    class FakeGRPO(pl.LightningModule):  # test double: only what the callback reads, no LLM needed
        def __init__(self):
            super().__init__()
            self.shaper = GR3Shaper(alpha=0.6)
            # all groups: one max-reward response among zero-reward ones -> constraint holds for every alpha
            self.last_rollout = {
                "rewards": torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 4),
                "lengths": torch.tensor([[10.0, 20.0, 30.0, 40.0]] * 4),
            }
            self.logged = {}

        def log(self, name, value, **kw):
            self.logged[name] = value

    class Trainer:
        global_step = 10

    module = FakeGRPO()
    callback = GR3AlphaCalibration(alpha_grid=(0.0, 0.1, 0.3), target_fraction=0.99, adapt=True, every_n_steps=5)
    callback.setup(Trainer(), module, "fit")
    callback.on_train_batch_end(Trainer(), module, None, None, 0)
    assert module.shaper.alpha == 0.3
    assert module.logged["train/gr3_satisfaction"] == 1.0
    # all-correct groups with unequal lengths violate the constraint for every alpha > 0 (rl.md 2(e))
    module.last_rollout = {"rewards": torch.ones(4, 4), "lengths": torch.tensor([[10.0, 20.0, 30.0, 40.0]] * 4)}
    fresh = GR3AlphaCalibration(
        alpha_grid=(0.0, 0.1, 0.3), target_fraction=0.99, adapt=True, every_n_steps=5, exclude_constant_groups=False
    )
    fresh.on_train_batch_end(Trainer(), module, None, None, 0)
    assert module.shaper.alpha == 0.0
    restored = GR3AlphaCalibration(alpha_grid=(0.0, 0.1, 0.3), target_fraction=0.99, adapt=True)
    restored.load_state_dict(fresh.state_dict())
    assert restored.history == fresh.history
    assert len(restored.buffer) == 1
    assert callback.state_key != GR3AlphaCalibration(target_fraction=0.5).state_key


def test_gr3_calibration_refuses_a_module_without_a_gr3_shaper():
    with pytest.raises(ValueError, match="needs a GRPO-family module"):
        GR3AlphaCalibration().setup(None, CausalLMModule(TinyBackbone()), "fit")


def test_log_generations_writes_jsonl(tmp_path):
    class Trainer:
        default_root_dir = str(tmp_path)
        global_step = 0
        loggers = []

    callback = LogGenerations(every_n_steps=1, num_samples=2)
    outputs = {"texts": ["a", "b", "c"], "meta": {"prompts": ["p1", "p2", "p3"], "correct": [True, False, True]}}
    callback.on_validation_batch_end(Trainer(), None, outputs, None, 0)
    rows = [json.loads(x) for x in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert rows == [
        {"split": "val", "step": 0, "completion": "a", "prompt": "p1", "correct": True},
        {"split": "val", "step": 0, "completion": "b", "prompt": "p2", "correct": False},
    ]


def test_on_policy_shortcut_equals_precomputed_old_logprobs():
    """num_iterations=1 skips the old-policy forward (old = detached current log-probs): same gradient."""
    torch.manual_seed(0)
    module = GRPOModule(
        TinyBackbone(seed=3), rewards={"a": ExactMatchReward()}, group_size=4, generation={"max_new_tokens": 16}
    )
    module.configure_model()
    rollout = module.rollout(rollout_batch(module, num_prompts=2))
    rows = module.sequences(rollout["result"], rollout["prompt_mask"])
    advantages = torch.randn(rows[0].shape[0])
    old, _ = module.reference_logprobs(rows)
    module.policy_gradients(rows, advantages, old)
    precomputed = grads(module)
    module.model.zero_grad(set_to_none=True)
    assert module.reference_logprobs(rows, need_old=False) == (None, None)
    module.policy_gradients(rows, advantages, None)
    for a, b in zip(precomputed, grads(module)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_safethink_stacks_on_grpo(train_cfg, base_policy_cache):
    """A callback method rides on the GRPO module: +method=[grpo,safethink] runs and logs the monitor's metrics."""
    cfg = train_cfg(
        ["+method=[grpo,safethink]", "task=jailbreak", "debug=fdr", *SMALL_BASE_POLICY, *SMOKE_SHAPE, *SMOKE_BACKBONE],
        cache_dir=base_policy_cache,
    )
    assert set(cfg.methods) == {"grpo", "safethink"}
    metrics = run(cfg)
    assert {"safethink/asr", "safethink/intervention_rate", "val/exact_match"} <= set(metrics)


def test_log_generations_writes_a_table_to_tensorboard(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(str(tmp_path), name="tb", version="")

    class Trainer:
        default_root_dir = str(tmp_path)
        global_step = 3
        loggers = [logger]

    outputs = {"texts": ["x"], "meta": {"prompts": ["p"]}}
    LogGenerations(every_n_steps=1).on_validation_batch_end(Trainer(), None, outputs, None, 0)
    logger.experiment.flush()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert "val/generations/text_summary" in events.Tags()["tensors"]


class DoublingShaper(RewardShaper):
    """A shaper whose state is visible only through metrics(); its `alpha` attribute must not be logged."""

    def __init__(self):
        self.scale = 2.0
        self.alpha = 0.7

    def __call__(self, rewards, lengths, max_length=None):
        return rewards * self.scale

    def metrics(self):
        return {"shaper_scale": self.scale}


@pytest.mark.parametrize(
    ("shaper", "logged", "absent"),
    [
        (GR3Shaper(alpha=0.25), {"gr3_alpha": 0.25}, "shaper_scale"),
        (DoublingShaper(), {"shaper_scale": 2.0}, "gr3_alpha"),
    ],
)
def test_the_family_logs_the_seams_metrics_and_reads_no_attribute(shaper, logged, absent):
    backbone = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    module = GRPOModule(
        backbone,
        rewards={"accuracy": ExactMatchReward()},
        shaper=shaper,
        group_size=2,
        generation={"max_new_tokens": 6},
    )
    datamodule = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=8, num_val=2), batch_size=2)
    trainer = pl.Trainer(
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    for key, value in logged.items():
        assert trainer.callback_metrics[f"train/{key}"] == pytest.approx(value)
    assert f"train/{absent}" not in trainer.callback_metrics
    assert "train/alpha" not in trainer.callback_metrics


def test_gr3_metrics_follow_alpha_updates():
    shaper = GR3Shaper(alpha=0.3)
    assert shaper.metrics() == {"gr3_alpha": 0.3}
    shaper.alpha = 0.5  # what GR3AlphaCalibration(adapt=True) does
    assert shaper.metrics() == {"gr3_alpha": 0.5}
    assert NoShaping().metrics() == {} and GRPOAdvantage().metrics() == {}


def test_max_steps_governs_a_run_over_a_prompt_set_smaller_than_the_validation_interval(train_cfg, tmp_path):
    # 8 prompts at batch 2 = 4 batches per epoch; 6 rollout steps with validation every 5 run over two epochs (a
    # user's small JSONL set used to stop Lightning with "val_check_interval must be <= the number of batches")
    overrides = [
        "+method=grpo",
        "backbone.init_from=null",
        "datamodule.source.num_train=8",
        "datamodule.source.num_val=2",
        "datamodule.batch_size=2",
        "module.group_size=2",
        "module.generation.max_new_tokens=4",
        "trainer.max_steps=6",
        "trainer.val_check_interval=5",
        "trainer.log_every_n_steps=1",
        "callbacks.log_generations=null",
        "callbacks.model_checkpoint=null",
    ]
    metrics = run(train_cfg(overrides))
    assert "val/exact_match" in metrics
    (metrics_csv,) = tmp_path.rglob("metrics.csv")
    rows = list(csv.DictReader(metrics_csv.open()))
    # logged steps are 0-based: six rollout steps (two epochs of 4 batches), validation after the fifth
    assert max(int(r["step"]) for r in rows if r.get("train/accuracy")) == 5
    assert [int(r["step"]) for r in rows if r.get("val/exact_match")] == [4]
