"""DRIFT (arXiv 2605.31455) cores: discounted return, per-prompt self-normalised weights (group mean 1, shift
invariance, beta limits, within- vs across-prompt normalisation), the bandit fixed point (weighted NLL on 10^5 offline
samples recovers pi_ref exp(R/beta) / Z), the weightings of a rollout file, and the loss through the SFT family's weight
seam (labels on the last assistant turn only; context logits do not matter; unit weights are plain SFT)."""

import math

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.data.feedback import FeedbackEnvironment
from zoo.data.sources import Row, RowSource
from zoo.datamodules import MultiTurnSFTDataModule
from zoo.errors import ConfigError, DataError
from zoo.losses import masked_nll
from zoo.modules import CausalLMModule
from zoo.rl.drift import (
    DriftWeighting,
    SuccessWeighting,
    UniformWeighting,
    discounted_return,
    drift_weights,
    repeat_penalty,
)


# -- discounted return ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [0.9, 0.7, 1.0])
def test_first_success_at_turn_t_gives_gamma_to_the_t_minus_one(gamma):
    for t in range(1, 6):
        rewards = [0.0] * (t - 1) + [1.0]
        assert discounted_return(rewards, gamma) == pytest.approx(gamma ** (t - 1))
    assert discounted_return([0.0, 0.0, 0.0], gamma) == 0.0


def test_penalties_enter_the_return_with_their_signs():
    # success at turn 2, one malformed turn (-0.1), two of three answers the same (0.5 * (1 - 2/3))
    penalty = repeat_penalty(["41", "41", "82"], 0.5)
    assert penalty == pytest.approx(0.5 / 3)
    assert discounted_return([0.0, 1.0], 0.9, -0.1, penalty) == pytest.approx(0.9 - 0.1 - 0.5 / 3)
    assert repeat_penalty([], 0.5) == 0.0
    assert repeat_penalty(["1", "2", "3"], 0.5) == 0.0


def test_discounted_return_rejects_bad_gamma_and_non_finite_rewards():
    with pytest.raises(ConfigError, match="gamma"):
        discounted_return([1.0], 1.5)
    with pytest.raises(DataError, match="non-finite"):
        discounted_return([0.0, float("nan")], 0.9)


# -- weights -------------------------------------------------------------------------------------------------------
def random_groups(num_groups=6, size=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    returns = torch.rand(num_groups * size, generator=gen) * 2 - 0.5
    group_ids = torch.arange(num_groups).repeat(size)  # interleaved, not contiguous blocks
    return returns, group_ids


@pytest.mark.parametrize("beta", [0.05, 0.1, 0.5, 3.0])
def test_weights_of_every_group_have_mean_one(beta):
    returns, groups = random_groups()
    weights = drift_weights(returns, groups, beta)
    assert weights.shape == returns.shape and weights.dtype == returns.dtype
    assert bool((weights > 0).all())
    for g in groups.unique():
        assert weights[groups == g].mean().item() == pytest.approx(1.0, abs=1e-6)


def test_weights_match_the_formula_written_out():
    returns = torch.tensor([1.0, 0.9, 0.0, -0.1, 0.81, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    beta = 0.1
    expected = []
    for g in (0, 1):
        r = [x.item() for x, h in zip(returns, groups) if h == g]
        e = [math.exp(x / beta) for x in r]
        expected += [v / (sum(e) / len(e)) for v in e]
    torch.testing.assert_close(drift_weights(returns, groups, beta), torch.tensor(expected, dtype=torch.float64))


def test_a_constant_added_to_a_groups_returns_leaves_the_weights_unchanged():
    returns, groups = random_groups()
    shifted = returns + (groups == 2).float() * 7.5 - (groups == 4).float() * 3.0
    torch.testing.assert_close(drift_weights(shifted, groups, 0.2), drift_weights(returns, groups, 0.2))


def test_beta_to_infinity_gives_uniform_weights():
    returns, groups = random_groups()
    assert torch.equal(drift_weights(returns, groups, float("inf")), torch.ones_like(returns))
    torch.testing.assert_close(drift_weights(returns, groups, 1e6), torch.ones_like(returns), atol=1e-5, rtol=0)


def test_beta_to_zero_puts_all_the_mass_on_the_argmax_return_trajectories():
    returns = torch.tensor([1.0, 0.9, 1.0, 0.0, 0.81, 0.5, 0.5, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    weights = drift_weights(returns, groups, 1e-4)
    torch.testing.assert_close(weights, torch.tensor([2.0, 0.0, 2.0, 0.0, 4.0, 0.0, 0.0, 0.0]))


def test_weights_are_normalised_within_each_prompt_not_across_prompts():
    """A prompt whose returns are all high must not take the weight of the others: each group keeps mean 1, so the
    weights of a group do not depend on the other groups' returns."""
    returns = torch.tensor([0.0, 0.9, 1.0, 0.9, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    weights = drift_weights(returns, groups, 0.1)
    across = torch.exp(returns / 0.1) / torch.exp(returns / 0.1).mean()  # the wrong, global normalisation
    assert not torch.allclose(weights, across, atol=1e-3)
    torch.testing.assert_close(weights[4:], torch.ones(2))  # an all-failed group keeps uniform weights
    alone = drift_weights(returns[:2], groups[:2], 0.1)
    torch.testing.assert_close(weights[:2], alone)


def test_a_prompt_with_a_single_trajectory_gets_weight_one_as_the_released_code():
    """``compute_weights([R], beta)`` of the released ``weight_sft.py`` is ``exp(0) / mean(exp(0)) = 1`` whatever
    ``R``; the other groups keep their own weights."""
    returns, groups = torch.tensor([0.0, 1.0, 0.5, -3.0]), torch.tensor([0, 0, 1, 2])
    weights = drift_weights(returns, groups, 0.1)
    torch.testing.assert_close(weights[2:], torch.ones(2))
    torch.testing.assert_close(weights[:2], drift_weights(returns[:2], groups[:2], 0.1))


def test_bad_weight_inputs_are_clear_errors():
    returns, groups = random_groups()
    for beta in (0.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match="beta must be > 0"):
            drift_weights(returns, groups, beta)
    with pytest.raises(DataError, match="non-finite returns at positions \\[3\\]"):
        drift_weights(torch.tensor([0.0, 1.0, 0.5, float("inf")]), torch.tensor([0, 0, 1, 1]), 0.1)
    with pytest.raises(ValueError, match=r"\[N\]"):
        drift_weights(returns, groups[:-1], 0.1)


# -- the bandit fixed point ------------------------------------------------------------------------------------------
def fit_tabular_logits(arms: torch.Tensor, weights: torch.Tensor, num_arms: int, steps: int = 500) -> torch.Tensor:
    """Minimise the weighted NLL ``-mean_i w_i log softmax(theta)[a_i]`` of the samples over tabular logits by gradient
    descent; returns ``softmax(theta)``. (The NLL is computed from its sufficient statistics, the weighted arm counts
    ``sum_i w_i [a_i = a] / N``: the same function of ``theta``, without a pass over the 10^5 samples per step.)"""
    weighted_counts = torch.bincount(arms, weights=weights.double(), minlength=num_arms) / len(arms)
    theta = torch.zeros(num_arms, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -(weighted_counts * torch.log_softmax(theta, 0)).sum()
        loss.backward()
        optimizer.step()
    return torch.softmax(theta.detach(), 0)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


BETA = 0.5


@pytest.fixture(scope="module")
def bandit():
    gen = torch.Generator().manual_seed(0)
    k, n = 10, 100_000
    pi_ref = torch.softmax(torch.randn(k, generator=gen, dtype=torch.float64), 0)
    rewards = torch.rand(k, generator=gen, dtype=torch.float64)
    arms = torch.multinomial(pi_ref, n, replacement=True, generator=gen)
    target = pi_ref * torch.exp(rewards / BETA)
    return {"k": k, "pi_ref": pi_ref, "rewards": rewards, "arms": arms, "target": target / target.sum()}


def test_bandit_fixed_point_weighted_nll_recovers_the_kl_regularised_optimum(bandit):
    arms, rewards = bandit["arms"], bandit["rewards"]
    weights = drift_weights(rewards[arms], torch.zeros_like(arms), BETA)
    fitted = fit_tabular_logits(arms, weights, bandit["k"])
    assert total_variation(fitted, bandit["target"]) < 0.01
    # the test can fail: weights linear in R, or exp(beta R) instead of exp(R / beta), land elsewhere
    linear = rewards[arms] / rewards[arms].mean()
    assert total_variation(fit_tabular_logits(arms, linear, bandit["k"]), bandit["target"]) > 0.03
    inverted = drift_weights(rewards[arms], torch.zeros_like(arms), 1 / BETA)
    assert total_variation(fit_tabular_logits(arms, inverted, bandit["k"]), bandit["target"]) > 0.03
    assert total_variation(bandit["pi_ref"], bandit["target"]) > 0.1  # the optimum is not pi_ref itself


def test_bandit_with_several_prompts_needs_within_prompt_normalisation(bandit):
    """Shared logits over three prompts whose rewards differ by a constant: per-prompt normalisation gives every
    prompt's optimum (all equal here) with its share of samples; a global normalisation lets the prompt with the
    largest returns dominate, which only matters when the prompts' optima differ -- so the prompts here have different
    rewards *and* different offsets."""
    gen = torch.Generator().manual_seed(1)
    k, pi_ref, arms = bandit["k"], bandit["pi_ref"], bandit["arms"]
    prompt = torch.randint(0, 3, arms.shape, generator=gen)
    rewards = torch.rand(3, k, generator=gen, dtype=torch.float64) + torch.tensor([[0.0], [2.0], [4.0]])
    returns = rewards[prompt, arms]
    optima = pi_ref * torch.exp(rewards / BETA)
    optima = optima / optima.sum(-1, keepdim=True)
    share = torch.bincount(prompt, minlength=3).double() / len(prompt)
    target = (share[:, None] * optima).sum(0)
    within = fit_tabular_logits(arms, drift_weights(returns, prompt, BETA), k)
    assert total_variation(within, target) < 0.01
    across = fit_tabular_logits(arms, drift_weights(returns, torch.zeros_like(prompt), BETA), k)
    assert total_variation(across, target) > 0.05


# -- weightings of a rollout file --------------------------------------------------------------------------------------
def rollout(prompt_id, turn_rewards, t_star, format_penalty=0.0, repeat=0.0, ret=0.0):
    return {
        "prompt_id": prompt_id,
        "turn_rewards": turn_rewards,
        "t_star": t_star,
        "format_penalty": format_penalty,
        "repeat_penalty": repeat,
        "return": ret,
    }


ROWS = [
    rollout("a", [1.0], 1, ret=1.0),
    rollout("a", [0.0, 1.0], 2, ret=0.9),
    rollout("a", [0.0, 0.0, 0.0], None, -0.1, 0.25, ret=-0.35),
    rollout("b", [0.0, 0.0, 1.0], 3, ret=0.81),
    rollout("b", [0.0, 0.0, 0.0], None, ret=0.0),
]


def test_drift_weighting_recomputes_returns_with_its_gamma_and_normalises_per_prompt():
    weighting = DriftWeighting(beta=0.1, gamma=0.5)
    returns = weighting.returns(ROWS)
    torch.testing.assert_close(returns, torch.tensor([1.0, 0.5, -0.35, 0.25, 0.0], dtype=torch.float64))
    weights = weighting(ROWS)
    expected = drift_weights(returns, torch.tensor([0, 0, 0, 1, 1]), 0.1).tolist()
    assert weights == pytest.approx(expected)
    assert sum(weights[:3]) / 3 == pytest.approx(1.0) and sum(weights[3:]) / 2 == pytest.approx(1.0)
    file_returns = DriftWeighting(beta=0.1, gamma=None).returns(ROWS)
    torch.testing.assert_close(file_returns, torch.tensor([1.0, 0.9, -0.35, 0.81, 0.0], dtype=torch.float64))


def test_baseline_weightings():
    assert UniformWeighting()(ROWS) == [1.0] * 5
    assert SuccessWeighting()(ROWS) == [1.0, 1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ConfigError, match="beta"):
        DriftWeighting(beta=0)
    with pytest.raises(ConfigError, match="gamma"):
        DriftWeighting(gamma=2.0)


# -- the loss through the SFT family's weight seam ---------------------------------------------------------------------
class ListSource(RowSource):
    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def rows(self, split, required_fields=()):
        return self._rows


CONVERSATIONS = [
    [
        {"role": "user", "content": "12+34="},
        {"role": "assistant", "content": "<think>2+4=6\n1+3=4</think>47"},
        {"role": "user", "content": "Incorrect. Please think again."},
        {"role": "assistant", "content": "<think>2+4=6\n1+3=4</think>46"},
    ],
    [{"role": "user", "content": "5+5="}, {"role": "assistant", "content": "<think>5+5=10</think>10"}],
    [
        {"role": "user", "content": "7+8="},
        {"role": "assistant", "content": "<think>7+8=15</think>14"},
        {"role": "user", "content": "Incorrect. Please think again."},
        {"role": "assistant", "content": "<think>7+8=15</think>16"},
        {"role": "user", "content": "Incorrect. Please think again."},
        {"role": "assistant", "content": "<think>7+8=15</think>15"},
    ],
]


@pytest.fixture(scope="module")
def drift_batch():
    backbone = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, seed=4
    )
    rows = [{"messages": m, "loss_weight": w} for m, w in zip(CONVERSATIONS, (0.5, 2.0, 0.5))]
    dm = MultiTurnSFTDataModule(backbone.tokenizer, ListSource(rows), batch_size=3, environment=FeedbackEnvironment())
    batch = dm.collate([dm.encode(r, i, "train") for i, r in enumerate(rows)])
    module = CausalLMModule(backbone, sample_reduction="token_mean", normalizer="sequences", generate_on_eval=False)
    module.configure_model()
    return backbone, batch, module


def test_only_the_last_assistant_turn_carries_labels(drift_batch):
    backbone, batch, _ = drift_batch
    tok = backbone.tokenizer
    for i, messages in enumerate(CONVERSATIONS):
        labelled = [t for t in batch["labels"][i].tolist() if t != -100]
        assert tok.decode(labelled) == messages[-1]["content"] + tok.eos_token
        assert batch["conversations"][i] == messages[:-1]
    # the context (earlier turns and feedback) is in the inputs but not labelled
    text = tok.decode(batch["input_ids"][0][batch["attention_mask"][0].bool()])
    assert "47" in text and "Incorrect. Please think again." in text


def test_the_loss_is_invariant_to_the_logits_at_context_positions(drift_batch):
    _, batch, module = drift_batch
    logits = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.detach()
    labels, weights = batch["labels"], batch["loss_weight"]
    loss = masked_nll(logits, labels, weights, float(len(labels)), sample_reduction="token_mean")[0]
    # positions t whose next label is -100 (prompt, earlier turns, feedback, padding) score nothing
    context = torch.zeros_like(labels, dtype=torch.bool)
    context[:, :-1] = labels[:, 1:] == -100
    context[:, -1] = True
    noise = torch.randn_like(logits) * 10 * context[..., None]
    perturbed = masked_nll(logits + noise, labels, weights, float(len(labels)), sample_reduction="token_mean")[0]
    assert torch.equal(loss, perturbed)
    trained = (~context)[..., None]
    changed = masked_nll(
        logits + torch.randn_like(logits) * trained, labels, weights, 3.0, sample_reduction="token_mean"
    )
    assert not torch.equal(loss, changed[0])


def test_unit_weights_give_exactly_the_plain_sft_loss_and_weights_scale_samples(drift_batch):
    _, batch, module = drift_batch
    ones = {**batch, "loss_weight": torch.ones(3)}
    loss, logits, _ = module.loss(ones)
    # plain SFT of the released trainer: mean over samples of each sample's mean token cross-entropy
    per_sample = []
    for i in range(3):
        mask = batch["labels"][i, 1:] != -100
        ce = torch.nn.functional.cross_entropy(logits[i, :-1][mask], batch["labels"][i, 1:][mask])
        per_sample.append(ce)
    torch.testing.assert_close(loss, torch.stack(per_sample).mean())
    unweighted = {k: v for k, v in batch.items() if k != "loss_weight"}
    assert torch.equal(module.loss(unweighted)[0], loss)
    weighted = module.loss(batch)[0]
    torch.testing.assert_close(weighted, (torch.stack(per_sample) * batch["loss_weight"]).mean())
