"""zoo.rl.nmars_attribution: the first-order change of held-out error tokens' log-prob under a masked-SFT step, split
by target group and parameter path, on a small real Llama."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from zoo.rl.nmars_attribution import (
    GROUPS,
    MASKED_SFT_GROUPS,
    deviation_attribution,
    row_targets,
    target_logprob_sum,
    untied_copy,
)

UNDO = 11


def llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=12,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config).float()


def rows(n: int, seed: int):
    """Rows like the data stage's: a prompt, then either the reference (clean) or prefix, error, <UNDO>, rest."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(1, 11) for _ in range(3)]
        reference = [rng.randrange(1, 11) for _ in range(4)]
        if i % 2:
            cut = rng.randrange(0, 4)
            error = (reference[cut] % 10) + 1
            completion = [*reference[:cut], error, UNDO, *reference[cut:], 0]
            mask = [True] * cut + [False] + [True] * (len(reference) - cut + 2)
        else:
            completion, mask = [*reference, 0], [True] * 5
        out.append(row_targets(prompt, completion, mask, UNDO))
    return out


def test_row_targets_groups_each_completion_token():
    row = row_targets([5, 6], [1, 2, 9, UNDO, 3, 0], [True, True, False, True, True, True], UNDO)
    assert row.input_ids == [5, 6, 1, 2, 9, UNDO, 3, 0]
    assert row.targets == {"clean": [], "before": [2, 3], "undo": [5], "after": [6, 7], "error": [4]}
    clean = row_targets([5], [1, 0], [True, True], UNDO)
    assert clean.targets["clean"] == [1, 2] and not clean.targets["error"]


def test_untied_copy_computes_the_same_function_and_leaves_the_model_alone():
    model = llama(tied=True)
    copy = untied_copy(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(model(input_ids=ids).logits, copy(input_ids=ids).logits)
    assert copy.get_output_embeddings().weight is not copy.get_input_embeddings().weight
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def tied_inner_product(model, train, held, group: str) -> float:
    """<grad D, grad L_group> computed directly in the tied model (one tensor for the rows)."""
    count = sum(len(r.targets[g]) for r in train for g in MASKED_SFT_GROUPS)
    n_held = sum(len(r.targets["error"]) for r in held)
    params = list(model.parameters())
    g_d = torch.autograd.grad(target_logprob_sum(model, held, "error", 8) / n_held, params, allow_unused=True)
    g_g = torch.autograd.grad(target_logprob_sum(model, train, group, 8) / count, params, allow_unused=True)
    return float(sum((a * b).sum() for a, b in zip(g_d, g_g) if a is not None and b is not None))


@pytest.mark.parametrize("tied", [True, False])
def test_paths_add_up_to_the_first_order_change_of_the_real_model(tied):
    model, train, held = llama(tied), rows(12, 0), rows(6, 1)
    result = deviation_attribution(model, train, held, tied=tied, batch_size=5)
    for group in GROUPS:
        parts = result[group]
        assert parts["sgd"] == pytest.approx(sum(parts[p] for p in ("body", "out_out", "tied", "in_in")))
        assert parts["sgd"] == pytest.approx(tied_inner_product(model, train, held, group), rel=1e-4, abs=1e-9)
    assert tied or all(result[g]["tied"] == 0.0 for g in GROUPS)
    assert result["masked_sft"]["share"] == pytest.approx(1.0)
    # a small step along the masked-SFT gradient changes D by about lr * the predicted sum
    lr = 1e-3
    count = sum(len(r.targets[g]) for r in train for g in MASKED_SFT_GROUPS)
    n_held = sum(len(r.targets["error"]) for r in held)
    before = float(target_logprob_sum(model, held, "error", 8).detach()) / n_held
    loss = sum(target_logprob_sum(model, train, g, 8) for g in MASKED_SFT_GROUPS) / count
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for p, g in zip(model.parameters(), grads):
            p += lr * g
    after = float(target_logprob_sum(model, held, "error", 8).detach()) / n_held
    assert (after - before) / lr == pytest.approx(result["masked_sft"]["sgd"], rel=0.05)


def test_a_group_without_targets_contributes_nothing():
    deviating = [r for r in rows(12, 0) if not r.targets["clean"]]
    result = deviation_attribution(llama(tied=True), deviating, rows(6, 1), tied=True)
    assert result["clean"] == {
        "share": 0.0,
        "body": 0.0,
        "out_out": 0.0,
        "tied": 0.0,
        "in_in": 0.0,
        "sgd": 0.0,
        "adam": 0.0,
    }
    assert result["after"]["sgd"] != 0.0
