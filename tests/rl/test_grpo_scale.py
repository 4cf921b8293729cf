"""GRPO at scale on CPU: log-probs and entropy in one chunked pass (bounded float32 workspace, entropy optional), the
QLoRA reference is the policy with its adapters disabled (no second model; beta > 0 works on a 4-bit policy), and
the reference lives next to the policy (DESIGN "Scale")."""

from __future__ import annotations

import pytest
import torch
from test_grpo_module import rollout_batch

from zoo.backbones import TinyBackbone
from zoo.lora import AdapterFreeReference
from zoo.losses import masked_token_entropy, masked_token_logprobs, masked_token_logprobs_and_entropy
from zoo.modules import GRPOModule
from zoo.rl import ClippedPolicyLoss, ExactMatchReward


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_pass_log_probs_and_entropy_equal_the_separate_ones(dtype, temperature):
    """Blocks of 3 columns (the sequence cut in 4), masked-out positions and -inf logits: the log-probs and their
    gradient equal masked_token_logprobs; the summed entropy is torch.distributions.Categorical's (finite with a -inf
    logit, where the unchunked masked_token_entropy gives 0 * -inf = nan)."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 11, 50, generator=g) * 3).to(dtype)
    logits[0, 2, :10] = float("-inf")  # a banned slice of the vocabulary
    labels = torch.randint(10, 50, (2, 11), generator=g)
    labels[1, :4] = -100
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    logp, mask = masked_token_logprobs(a, labels, temperature=temperature)
    shifted, targets = logits[:, :-1].float() / temperature, labels[:, 1:]
    entropy = (torch.distributions.Categorical(logits=shifted).entropy() * (targets != -100)).sum()
    fused, fused_mask, fused_entropy = masked_token_logprobs_and_entropy(
        b, labels, temperature=temperature, block_elements=3 * 2 * 50
    )
    assert torch.equal(mask, fused_mask)
    torch.testing.assert_close(fused, logp)
    torch.testing.assert_close(fused_entropy, entropy)
    assert torch.isfinite(fused_entropy)
    weights = torch.randn(logp.shape, generator=g)
    (logp * weights).sum().backward()
    (fused * weights).sum().backward()
    torch.testing.assert_close(b.grad, a.grad)
    assert masked_token_logprobs_and_entropy(b, labels, with_entropy=False)[2] is None


def test_the_entropy_workspace_is_one_block_not_n_by_vocab():
    """The profiler's largest allocation: the unchunked entropy materialises float32 [n_labelled, V] copies; the
    one-pass version never allocates more than its block (here 1/8 of the sequence)."""
    from torch.profiler import ProfilerActivity, profile

    rows, width, vocab = 2, 64, 2000
    logits = torch.randn(rows, width, vocab, dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (rows, width))
    full = rows * (width - 1) * vocab * 4
    block = rows * 8 * vocab

    def largest(fn) -> int:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        return max(e.cpu_memory_usage for e in prof.events())

    assert largest(lambda: masked_token_entropy(logits, labels)) >= full
    chunked = largest(lambda: masked_token_logprobs_and_entropy(logits, labels, block_elements=block))
    assert chunked <= block * 4 < full


def tiny_grpo(**kwargs) -> GRPOModule:
    torch.manual_seed(0)
    options = {
        "rewards": {"accuracy": ExactMatchReward()},
        "group_size": 2,
        "micro_batch_size": 4,
        "generation": {"max_new_tokens": 6},
    }
    module = GRPOModule(kwargs.pop("backbone", TinyBackbone(seed=2)), **{**options, **kwargs})
    module.configure_model()
    return module


def test_entropy_metric_can_be_switched_off():
    module = tiny_grpo(policy_loss=ClippedPolicyLoss(beta=0.0), log_entropy=False)
    rollout = module.rollout(rollout_batch(module, num_prompts=2))
    rows = module.sequences(rollout["result"], rollout["prompt_mask"])
    _, metrics = module.policy_gradients(rows, rollout["advantages"], None)
    assert "entropy" not in metrics
    on = tiny_grpo(policy_loss=ClippedPolicyLoss(beta=0.0))
    _, metrics = on.policy_gradients(rows, rollout["advantages"], None)
    assert metrics["entropy"] > 0


def test_qlora_reference_is_the_policy_with_adapters_disabled_and_beta_works():
    """quant=bnb_nf4 + LoRA + beta > 0 (``load_state_dict`` of a 4-bit state dict into a second model used to fail on
    its absmax keys): the reference is the policy itself with its adapters off -- equal to the policy at start, unmoved
    by a change of the adapters, which keep training (requires_grad, train mode) after a reference pass."""
    from zoo.quant.bnb import BnbQuantizer

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    module = tiny_grpo(
        backbone=TinyBackbone(seed=2, lora=lora),
        quantizer=BnbQuantizer("nf4"),
        policy_loss=ClippedPolicyLoss(beta=0.1),
    )
    assert isinstance(module.ref_model, AdapterFreeReference) and module.ref_model.policy is module.model
    assert list(module.ref_model.parameters()) == []  # no second model
    rollout = module.rollout(rollout_batch(module, num_prompts=2))
    rows = module.sequences(rollout["result"], rollout["prompt_mask"])
    old, ref = module.reference_logprobs(rows)
    torch.testing.assert_close(ref, old)  # LoRA B = 0: the initial policy
    with torch.no_grad():
        for name, param in module.model.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    module.model.train()
    moved, ref_after = module.reference_logprobs(rows)
    torch.testing.assert_close(ref_after, ref)
    assert (moved - ref).abs().max() > 1e-3
    assert module.model.training
    assert all(p.requires_grad == ("lora_" in n) for n, p in module.model.named_parameters())
    loss, _ = module.policy_gradients(rows, rollout["advantages"], moved, ref_after)
    assert torch.isfinite(loss)
    assert all(p.grad is not None for n, p in module.model.named_parameters() if "lora_" in n)


def test_gradient_checkpointing_is_a_backbone_option_that_keeps_the_gradient(train_cfg):
    """``backbone.gradient_checkpointing=true`` turns transformers' checkpointing on; a GRPO update (shared-prompt
    forward included: its cache is only read by the checkpointed layers) then gives the gradient of the plain model."""
    from hydra.utils import instantiate

    assert instantiate(train_cfg(["backbone.gradient_checkpointing=true"]).backbone).gradient_checkpointing
    assert not instantiate(train_cfg([]).backbone).gradient_checkpointing
    plain = tiny_grpo(policy_loss=ClippedPolicyLoss(beta=0.0))
    checkpointed = tiny_grpo(
        backbone=TinyBackbone(seed=2, gradient_checkpointing=True), policy_loss=ClippedPolicyLoss(beta=0.0)
    )
    assert checkpointed.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in checkpointed.model.model.layers)
    rollout = plain.rollout(rollout_batch(plain, num_prompts=2))
    rows = plain.sequences(rollout["result"], rollout["prompt_mask"])
    for module in (plain, checkpointed):
        module.model.train()
        module.policy_gradients(rows, rollout["advantages"], None)
    for (name, a), b in zip(plain.model.named_parameters(), checkpointed.model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)
