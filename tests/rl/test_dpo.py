"""DPO (arXiv 2305.18290) in the PreferenceModule family: the masked DPO loss against hand-computed values and its
invariants (identical sides, masked positions, micro-batches), the frozen reference, the synthetic preference
pairs, and runs through train.py (+method=dpo, datamodule=prefs_jsonl)."""

import json
import math

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.cli.train import run
from zoo.data.sources import RowSource, TaskPreferenceSource
from zoo.data.tasks import Addition, Reverse
from zoo.datamodules import PreferenceDataModule
from zoo.errors import ConfigError, DataError
from zoo.losses import masked_sequence_logprobs
from zoo.modules import PreferenceModule
from zoo.rl import masked_dpo_loss

from conftest import SMALL_BASE_POLICY

SMALL_ARCH = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}


# -- the loss core --------------------------------------------------------------------------------------------------
def test_hand_computed_value_and_gradient():
    c = torch.tensor([-3.0, -5.0], requires_grad=True)
    r = torch.tensor([-4.0, -2.0], requires_grad=True)
    rc, rr = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -3.0])
    beta = 0.5
    loss = masked_dpo_loss(c, r, rc, rr, beta)
    # pair 0: z = 0.5 * ((-3 + 3.5) - (-4 + 3)) = 0.75;  pair 1: z = 0.5 * ((-5 + 4) - (-2 + 3)) = -1
    z = [0.75, -1.0]
    expected = (math.log1p(math.exp(-z[0])) + math.log1p(math.exp(-z[1]))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # dL/dc_i = -beta * sigmoid(-z_i) / B = -dL/dr_i
    expected_grad = torch.tensor([-beta / (1 + math.exp(zi)) / 2 for zi in z])
    torch.testing.assert_close(c.grad, expected_grad)
    torch.testing.assert_close(r.grad, -expected_grad)


def test_identical_sides_give_log_2_and_zero_gradient():
    logps = torch.tensor([-7.0, -1.5, -30.0], requires_grad=True)
    ref = torch.tensor([-6.0, -2.5, -10.0], requires_grad=True)
    loss = masked_dpo_loss(logps, logps, ref, ref, beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    loss.backward()
    assert torch.equal(logps.grad, torch.zeros(3))
    assert ref.grad is None  # the reference is detached


def test_split_into_micro_batches_with_a_fixed_normalizer_gives_the_full_gradient():
    generator = torch.Generator().manual_seed(0)
    c, r, rc, rr = (torch.randn(6, generator=generator) * 5 for _ in range(4))
    c.requires_grad_(True)
    r.requires_grad_(True)
    full = masked_dpo_loss(c, r, rc, rr, 0.2)
    full_grad = torch.autograd.grad(full, (c, r))
    parts = [masked_dpo_loss(c[s], r[s], rc[s], rr[s], 0.2, normalizer=6) for s in (slice(0, 4), slice(4, 6))]
    torch.testing.assert_close(sum(parts), full)
    for a, b in zip(torch.autograd.grad(sum(parts), (c, r)), full_grad):
        torch.testing.assert_close(a, b)


def test_masked_positions_do_not_affect_loss_or_gradient():
    generator = torch.Generator().manual_seed(1)
    logits = {side: torch.randn(2, 6, 9, generator=generator, requires_grad=True) for side in ("c", "r")}
    labels = {
        "c": torch.tensor([[-100, -100, 3, 4, -100, -100], [-100, 1, -100, 2, 5, 6]]),  # span masks
        "r": torch.tensor([[-100, 7, 8, -100, -100, -100], [-100, -100, -100, -100, 0, 1]]),
    }
    ref = {side: torch.randn(2, generator=generator) for side in ("c", "r")}

    def loss_of(tensors):
        c, r = (masked_sequence_logprobs(tensors[s], labels[s]) for s in ("c", "r"))
        return masked_dpo_loss(c, r, ref["c"], ref["r"], 0.1)

    loss = loss_of(logits)
    loss.backward()
    perturbed = {}
    for side, tensor in logits.items():
        scored = torch.zeros(2, 6, dtype=torch.bool)
        scored[:, :-1] = labels[side][:, 1:] != -100  # logits[t] scores labels[t + 1]
        assert torch.count_nonzero(tensor.grad[~scored]) == 0
        assert torch.count_nonzero(tensor.grad[scored].abs().sum(-1)) == scored.sum()
        noise = 100 * torch.randn(2, 6, 9, generator=generator)
        perturbed[side] = tensor.detach() + noise * (~scored)[..., None]
    assert torch.equal(loss_of(perturbed), loss.detach())


def test_bad_beta_and_shapes_are_errors():
    x = torch.zeros(3)
    with pytest.raises(ConfigError, match="beta must be > 0"):
        masked_dpo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match="must be \\[B\\] tensors of one shape"):
        masked_dpo_loss(x, torch.zeros(2), x, x, 0.1)
    with pytest.raises(ConfigError, match="module.beta"):
        PreferenceModule(TinyBackbone(**SMALL_ARCH), beta=-1.0)


# -- synthetic pairs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [Addition(2), Reverse()])
def test_synthetic_pairs_differ_only_in_a_wrong_final_answer(task):
    source = TaskPreferenceSource(task, num_train=64, num_val=16, num_test=16, seed=3)
    rows = source.rows("train")
    assert len(rows) == 64
    for row in rows:
        assert task.verify(row["chosen"], row["answer"]) and not task.verify(row["rejected"], row["answer"])
        head = row["chosen"][: row["chosen"].rindex("</think>")]
        assert row["rejected"].startswith(head + "</think>")
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in source.rows("val")}
    assert source.rows("train") == TaskPreferenceSource(task, 64, 16, 16, seed=3).rows("train")


def test_a_task_without_think_blocks_is_a_data_error():
    class Plain(Addition):
        def sample(self, rng):
            example = super().sample(rng)
            return type(example)(example.prompt, example.answer, example.answer)

    with pytest.raises(DataError, match="has no '</think>'"):
        TaskPreferenceSource(Plain(), num_train=4, num_val=2, num_test=2).rows("train")


# -- the module -----------------------------------------------------------------------------------------------------
def pair_batch(tokenizer, rows):
    path_rows = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in rows]
    dm = PreferenceDataModule(tokenizer, _Rows(path_rows), batch_size=len(rows), shuffle=False)
    return next(iter(dm.train_dataloader()))


class _Rows(RowSource):
    """The same in-memory rows for every split."""

    def __init__(self, rows):
        self._rows = rows

    def rows(self, split, required_fields=()):
        return self._rows


def test_reference_is_the_frozen_initial_policy_so_the_first_loss_is_log_2():
    module = PreferenceModule(TinyBackbone(seed=4, **SMALL_ARCH), beta=0.1)
    module.configure_model()
    assert "ref_model" not in dict(module.named_children())
    assert not any(p.requires_grad for p in module.ref_model.parameters())
    batch = pair_batch(
        module.tokenizer, [("1+2=", "<think>1+2=3</think>3", "<think>1+2=3</think>4"), ("ab", "ba", "b")]
    )
    terms = module.pair_terms(batch)
    assert terms["loss"].item() == pytest.approx(math.log(2), abs=1e-6)
    assert torch.equal(terms["reward_chosen"], torch.zeros(2))
    # one optimizer step on the policy leaves the reference where it was
    before = [p.clone() for p in module.ref_model.parameters()]
    terms["loss"].backward()
    torch.optim.SGD(module.model.parameters(), lr=1.0).step()
    assert all(torch.equal(a, b) for a, b in zip(before, module.ref_model.parameters()))
    after = module.pair_terms(batch)
    assert after["loss"].item() < math.log(2)  # the step moved the policy toward the chosen side
    assert after["reward_margin"].mean() > 0


def test_side_logprobs_equal_separate_forwards_of_each_side():
    module = PreferenceModule(TinyBackbone(seed=5, **SMALL_ARCH))
    module.configure_model()
    batch = pair_batch(
        module.tokenizer, [("12+3=", "<think>2+3=5\n1+0=1</think>15", "<think></think>9"), ("x", "yy", "z")]
    )
    chosen, rejected = module.side_logprobs(module.model, batch)
    for side, value in (("chosen", chosen), ("rejected", rejected)):
        logits = module.model(
            input_ids=batch[f"{side}_input_ids"], attention_mask=batch[f"{side}_attention_mask"]
        ).logits
        torch.testing.assert_close(
            value, masked_sequence_logprobs(logits, batch[f"{side}_labels"]), atol=1e-5, rtol=1e-5
        )


def test_identical_pairs_give_zero_gradient_through_the_module():
    module = PreferenceModule(TinyBackbone(seed=6, **SMALL_ARCH), beta=0.5)
    module.configure_model()
    with torch.no_grad():  # move the policy away from the reference so that the log-ratios are not zero
        for p in module.model.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def largest_gradient(pairs):
        module.model.zero_grad(set_to_none=True)
        terms = module.pair_terms(pair_batch(module.tokenizer, pairs))
        terms["loss"].backward()
        return terms["loss"].item(), max(p.grad.abs().max().item() for p in module.model.parameters())

    loss, largest = largest_gradient([("3+4=", "<think>3+4=7</think>7", "<think>3+4=7</think>7")] * 2)
    assert loss == pytest.approx(math.log(2), abs=1e-6)
    _, scale = largest_gradient([("3+4=", "<think>3+4=7</think>7", "<think>3+4=7</think>8")] * 2)
    assert largest < 1e-5 * scale  # zero up to float32 rounding of +g and -g summed over the batch


def test_reference_from_an_export_directory(tmp_path):
    other = TinyBackbone(seed=9, **SMALL_ARCH)
    other.build_model().save_pretrained(tmp_path / "ref")
    other.tokenizer.save_pretrained(tmp_path / "ref")
    module = PreferenceModule(TinyBackbone(seed=1, **SMALL_ARCH), reference=str(tmp_path / "ref"))
    module.configure_model()
    expected = other.build_model().state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in module.ref_model.state_dict().items())
    assert not torch.equal(
        module.model.state_dict()["model.embed_tokens.weight"], expected["model.embed_tokens.weight"]
    )


# -- through train.py -----------------------------------------------------------------------------------------------
def test_dpo_method_runs_on_synthetic_pairs_from_the_base_policy(train_cfg, base_policy_cache):
    cfg = train_cfg(
        ["+method=dpo", *SMALL_BASE_POLICY, "debug=fdr", "datamodule.source.num_train=64", "datamodule.batch_size=8"],
        cache_dir=base_policy_cache,
    )
    metrics = run(cfg)
    assert metrics["train/loss"] == pytest.approx(math.log(2), abs=1e-5)  # first step: policy == reference
    assert {"val/loss", "val/reward_accuracy", "val/reward_margin", "train/logp_chosen"} <= set(metrics)


def test_dpo_on_prefs_jsonl(train_cfg, base_policy_cache, tmp_path):
    rows = [
        {"prompt": f"{i}+{i}=", "chosen": f"<think></think>{2 * i}", "rejected": f"<think></think>{2 * i + 1}"}
        for i in range(6)
    ]
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = train_cfg(
        [
            "+method=dpo",
            *SMALL_BASE_POLICY,
            "datamodule=prefs_jsonl",
            f"datamodule.source.train_path={path}",
            f"datamodule.source.val_path={path}",
            "datamodule.batch_size=3",
            "trainer.max_steps=4",
            "trainer.max_epochs=2",
            "trainer.val_check_interval=2",
            "module.optimizer.lr=1e-3",
            "module.scheduler.warmup_steps=1",
        ],
        cache_dir=base_policy_cache,
    )
    metrics = run(cfg)
    assert metrics["val/reward_accuracy"] > 0.5  # four steps on these six pairs separate the sides
    assert metrics["val/reward_margin"] > 0
