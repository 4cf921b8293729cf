"""Weighted SFT (per-sample loss weights in the SFT family): unit weights change nothing (bit for bit), the
gradient follows ``sum_i w_i l_i / N`` for every reduction/normalization, the weight column comes from the rows
(JSONL included) under a configurable name, and bad weights are errors naming row and column."""

import json

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.cli.train import run
from zoo.data.sources import JsonlSource, TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError, DataError
from zoo.losses import NLL_NORMALIZERS, SAMPLE_REDUCTIONS, masked_nll, nll_normalizer
from zoo.modules import CausalLMModule

MODES = [(r, n) for r in SAMPLE_REDUCTIONS for n in NLL_NORMALIZERS]


@pytest.fixture(scope="module")
def backbone():
    return TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, seed=3
    )


@pytest.fixture(scope="module")
def batch(backbone):
    dm = SFTDataModule(backbone.tokenizer, TaskSource(Addition(2), num_train=16, num_val=6), batch_size=6)
    return next(iter(dm.val_dataloader()))


def module_for(backbone, sample_reduction, normalizer):
    module = CausalLMModule(backbone, sample_reduction=sample_reduction, normalizer=normalizer, generate_on_eval=False)
    module.configure_model()
    return module


def loss_and_grads(module, batch):
    module.zero_grad(set_to_none=True)
    loss, _, _ = module.loss(batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in module.model.parameters()]


@pytest.mark.parametrize(("sample_reduction", "normalizer"), MODES)
def test_unit_weights_give_exactly_the_unweighted_loss_and_gradient(backbone, batch, sample_reduction, normalizer):
    module = module_for(backbone, sample_reduction, normalizer)
    plain = {k: v for k, v in batch.items() if k != "loss_weight"}
    ones = {**plain, "loss_weight": torch.ones(batch["input_ids"].shape[0])}
    loss_plain, grads_plain = loss_and_grads(module, plain)
    loss_ones, grads_ones = loss_and_grads(module, ones)
    assert torch.equal(loss_plain, loss_ones)
    assert all(torch.equal(a, b) for a, b in zip(grads_plain, grads_ones))
    # the batch as the datamodule delivers it (a loss_weight column of ones) is that same loss
    assert torch.equal(loss_and_grads(module, batch)[0], loss_plain)


def test_default_mode_is_the_token_mean_cross_entropy(backbone, batch):
    """tokens + token_sum (the default) is the usual SFT loss: the mean CE over the completion tokens."""
    module = module_for(backbone, "token_sum", "tokens")
    loss, logits, num_tokens = module.loss(batch)
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(loss, expected)
    assert num_tokens == (batch["labels"] != -100).sum()


def hand_loss_and_grad(logits, labels, weights, sample_reduction, normalizer):
    """The weighted loss and its gradient w.r.t. the logits, written out per position:
    d(-log softmax(z)[y]) / dz = softmax(z) - onehot(y), scaled by w_i * c_i / N (c_i = 1 or 1 / n_i)."""
    batch, length, vocab = logits.shape
    probs = torch.softmax(logits.double(), dim=-1)
    grad = torch.zeros(batch, length, vocab, dtype=torch.float64)
    per_sample, counts = [], []
    for i in range(batch):
        positions = [t for t in range(length - 1) if labels[i, t + 1] != -100]
        nll = sum(-torch.log(probs[i, t, labels[i, t + 1]]) for t in positions)
        counts.append(len(positions))
        per_sample.append(nll / max(len(positions), 1) if sample_reduction == "token_mean" else nll)
    denominator = {"tokens": float(sum(counts)), "sequences": float(batch), "self_normalised": float(weights.sum())}
    n = denominator[normalizer]
    loss = sum(float(w) * sample for w, sample in zip(weights, per_sample)) / n
    for i in range(batch):
        scale = float(weights[i]) / n / (max(counts[i], 1) if sample_reduction == "token_mean" else 1)
        for t in range(length - 1):
            if labels[i, t + 1] != -100:
                onehot = torch.nn.functional.one_hot(labels[i, t + 1], vocab).double()
                grad[i, t] = scale * (probs[i, t] - onehot)
    return loss, grad


@pytest.mark.parametrize(("sample_reduction", "normalizer"), MODES)
def test_weights_change_loss_and_gradient_as_the_formula_says(sample_reduction, normalizer):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=generator, requires_grad=True)
    labels = torch.tensor([[-100, -100, 2, 3, 4], [-100, 1, 6, -100, -100], [-100, -100, -100, 0, 5]])
    weights = torch.tensor([0.5, 2.0, 0.0])
    normalizer_value = nll_normalizer(normalizer, 3, weights)
    loss, num_tokens = masked_nll(logits, labels, weights, normalizer_value, sample_reduction=sample_reduction)
    loss.backward()
    expected_loss, expected_grad = hand_loss_and_grad(logits.detach(), labels, weights, sample_reduction, normalizer)
    assert num_tokens == 7
    assert loss.item() == pytest.approx(float(expected_loss), rel=1e-6)
    torch.testing.assert_close(logits.grad.double(), expected_grad, rtol=1e-5, atol=1e-7)
    assert torch.count_nonzero(logits.grad[2]) == 0  # weight 0: no gradient from that sample


def test_self_normalised_loss_is_invariant_to_scaling_the_weights():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[-100, 1, 2, 3, 4], [-100, 1, 6, 2, -100], [-100, -100, 3, 0, 5]])
    weights = torch.tensor([0.2, 1.0, 3.0])

    def loss(w, mode):
        return masked_nll(logits, labels, w, nll_normalizer(mode, 3, w), sample_reduction="token_mean")[0]

    torch.testing.assert_close(loss(weights, "self_normalised"), loss(10 * weights, "self_normalised"))
    torch.testing.assert_close(10 * loss(weights, "sequences"), loss(10 * weights, "sequences"))
    assert nll_normalizer("self_normalised", 3, torch.zeros(3)) == 1.0  # all-zero weights: loss 0, not NaN


def test_the_module_reads_loss_weight_from_the_batch(backbone, batch):
    module = module_for(backbone, "token_mean", "self_normalised")
    weights = torch.tensor([1.0, 0.0, 3.0, 0.5, 0.0, 2.0])
    loss, logits, _ = module.loss({**batch, "loss_weight": weights})
    expected, _ = hand_loss_and_grad(logits.detach(), batch["labels"], weights, "token_mean", "self_normalised")
    assert loss.item() == pytest.approx(float(expected), rel=1e-5)


def test_loss_ignores_logits_at_masked_positions():
    """Label masks choose the trained tokens: changing the logits where labels are -100 changes nothing."""
    logits = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([[-100, -100, -100, 1, 2, -100], [-100, 3, -100, -100, 4, 0]])
    weights = torch.tensor([2.0, 0.5])
    perturbed = logits.clone()
    for i, t in [(0, 0), (0, 1), (0, 4), (0, 5), (1, 1), (1, 2), (1, 5)]:  # logits[t] scores labels[t + 1]
        perturbed[i, t] += 10 * torch.randn(5, generator=torch.Generator().manual_seed(i * 10 + t))
    for reduction, normalizer in MODES:
        a = masked_nll(logits, labels, weights, nll_normalizer(normalizer, 2, weights), sample_reduction=reduction)
        b = masked_nll(perturbed, labels, weights, nll_normalizer(normalizer, 2, weights), sample_reduction=reduction)
        assert torch.equal(a[0], b[0])


def test_unknown_modes_are_config_errors(backbone):
    with pytest.raises(ConfigError, match="module.normalizer"):
        CausalLMModule(backbone, normalizer="batch")
    with pytest.raises(ConfigError, match="module.sample_reduction"):
        CausalLMModule(backbone, sample_reduction="mean")


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_weight_column_is_read_from_jsonl_under_a_configurable_name(backbone, tmp_path):
    rows = [{"prompt": f"{i}+1=", "completion": f"<think></think>{i + 1}", "w": i * 0.5} for i in range(4)]
    rows[3].pop("w")  # a row without the column weighs 1
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    dm = SFTDataModule(backbone.tokenizer, JsonlSource(path, path), batch_size=4, shuffle=False, weight_column="w")
    batch = next(iter(dm.train_dataloader()))
    assert batch["loss_weight"].tolist() == [0.0, 0.5, 1.0, 1.0]
    default = SFTDataModule(backbone.tokenizer, JsonlSource(path, path), batch_size=4, shuffle=False)
    assert next(iter(default.train_dataloader()))["loss_weight"].tolist() == [1.0] * 4


@pytest.mark.parametrize(("value", "shown"), [(-1.0, "-1.0"), ("2", "'2'"), (float("nan"), "nan"), (True, "True")])
def test_bad_weight_is_an_error_naming_row_and_column(backbone, tmp_path, value, shown):
    rows = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "1+2=", "completion": "3", "loss_weight": value}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    dm = SFTDataModule(backbone.tokenizer, JsonlSource(path, path))
    with pytest.raises(DataError, match=rf"train row 1: column 'loss_weight' .* got {shown}"):
        dm.setup("fit")


def test_a_weight_column_no_row_has_is_an_error(backbone, tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "completion": "2", "weight": 2.0}])
    dm = SFTDataModule(backbone.tokenizer, JsonlSource(path, path), weight_column="wieght")
    with pytest.raises(DataError, match="weight_column='wieght': no training row has this column"):
        dm.setup("fit")


def test_weighted_sft_from_jsonl_through_train_py(train_cfg, tmp_path):
    rows = [{"prompt": f"{i}+{i}=", "completion": f"<think></think>{2 * i}", "loss_weight": i % 3} for i in range(8)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = train_cfg(
        [
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={path}",
            f"datamodule.source.val_path={path}",
            "datamodule.batch_size=4",
            "module.sample_reduction=token_mean",
            "module.normalizer=self_normalised",
            "module.generation.max_new_tokens=4",
            "debug=fdr",
        ]
    )
    metrics = run(cfg)
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
