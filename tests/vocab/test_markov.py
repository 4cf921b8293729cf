"""zoo.data.markov: the sparse chain, new tokens whose successor rows mix dictionary rows, and the row sources."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from zoo.backbones import build_char_tokenizer
from zoo.data.markov import STATE_ALPHABET, MarkovChain, MarkovChainTask, NewTokens, NewTokenSource, total_variation
from zoo.data.sources import TaskSource
from zoo.errors import ConfigError


def test_chain_rows_are_sparse_and_stochastic():
    chain = MarkovChain(num_states=20, support=4, seed=3)
    p = chain.transition
    assert torch.allclose(p.sum(-1), torch.ones(20, dtype=torch.float64))
    assert ((p > 0).sum(-1) == 4).all()
    assert torch.equal(p, MarkovChain(num_states=20, support=4, seed=3).transition)
    assert not torch.equal(p, MarkovChain(num_states=20, support=4, seed=4).transition)


def test_entropy_rate_of_a_uniform_dense_chain_is_log_T():
    chain = MarkovChain(num_states=8, support=8, concentration=1e6, seed=0)  # ~uniform rows
    assert chain.entropy_rate() == pytest.approx(math.log(8), rel=1e-3)
    pi = chain.stationary()
    torch.testing.assert_close(pi @ chain.transition, pi)


def empirical(draws: list[int], num_states: int) -> torch.Tensor:
    counts = Counter(draws)
    return torch.tensor([counts[k] / len(draws) for k in range(num_states)], dtype=torch.float64)


def test_chain_samples_follow_the_transition_matrix():
    chain = MarkovChain(num_states=6, support=3, seed=1)
    rng = random.Random(0)
    draws = [chain.step(rng, 2) for _ in range(20_000)]
    assert float(total_variation(empirical(draws, 6), chain.transition[2])) < 0.02


def test_new_token_rows_mix_the_dictionary_rows():
    chain = MarkovChain(num_states=16, support=4, seed=0)
    new = NewTokens(chain, num_new_tokens=3, dictionary_size=4, seed=5)
    for j in range(3):
        assert len(set(new.dictionaries[j])) == 4
        expected = sum(new.weights[j, i] * chain.transition[d] for i, d in enumerate(new.dictionaries[j]))
        torch.testing.assert_close(new.rows[j], expected)
    torch.testing.assert_close(new.rows.sum(-1), torch.ones(3, dtype=torch.float64))
    rng = random.Random(1)
    draws = [new.step(rng, 1) for _ in range(30_000)]
    assert float(total_variation(empirical(draws, 16), new.rows[1])) < 0.02


def test_dictionary_of_one_token_copies_its_row():
    chain = MarkovChain(num_states=10, support=3, seed=0)
    new = NewTokens(chain, num_new_tokens=2, dictionary_size=1, weights="uniform", seed=0)
    assert torch.equal(new.rows[0], chain.transition[new.dictionaries[0][0]])


def test_task_rows_are_characters_of_the_chain():
    task = MarkovChainTask(num_states=12, length=10, prompt_length=3, num_new_tokens=2, dictionary_size=2)
    example = task.sample(random.Random(0))
    assert len(example.prompt) == 3 and len(example.prompt + example.completion) == 10
    assert set(example.prompt + example.completion) <= set(STATE_ALPHABET[:12])
    tokenizer = build_char_tokenizer()
    assert len(tokenizer(example.prompt + example.completion, add_special_tokens=False)["input_ids"]) == 10
    assert task.new_tokens == ["<v0>", "<v1>"]
    assert all(len(d) == 2 and all(c in STATE_ALPHABET[:12] for c in d) for d in task.dictionaries)


def test_new_token_rows_hold_one_new_token_and_keep_the_length():
    task = MarkovChainTask(num_states=12, length=10, prompt_length=3, num_new_tokens=3, dictionary_size=2)
    source = NewTokenSource(task, num_train=30, num_val=6, num_test=6, seed=0)
    rows = source.rows("train")
    assert [r["new_token_index"] for r in rows[:6]] == [0, 1, 2, 0, 1, 2]  # balanced over the new tokens
    for row in rows:
        token = row["new_token"]
        assert row["prompt"].endswith(token) and token not in row["completion"]
        prefix = row["prompt"][: -len(token)]
        assert len(prefix) >= task.prompt_length and len(prefix) + 1 + len(row["completion"]) == task.length
    assert rows == NewTokenSource(task, num_train=30, num_val=6, num_test=6, seed=0).rows("train")
    assert rows != source.rows("val")[:6] and source.rows("val") != source.rows("test")


def test_successors_of_new_tokens_follow_the_mixture():
    task = MarkovChainTask(num_states=8, support=3, length=8, prompt_length=2, num_new_tokens=1, dictionary_size=3)
    rows = NewTokenSource(task, num_train=20_000, num_val=1, num_test=1, seed=0).rows("train")
    draws = [STATE_ALPHABET.index(r["completion"][0]) for r in rows]
    assert float(total_variation(empirical(draws, 8), task.new.rows[0])) < 0.02


def test_task_source_of_the_chain_holds_out_validation_prompts():
    task = MarkovChainTask(num_states=16, length=12)
    source = TaskSource(task, num_train=200, num_val=20, num_test=20, seed=0)
    train_prompts = {r["prompt"] for r in source.rows("train")}
    assert not train_prompts & source.held_out_prompts()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_states": 200}, "at most 88 states"),
        ({"length": 4, "prompt_length": 3}, "prompt_length"),
        ({"new_token_format": "<new>"}, "must contain"),
        ({"dictionary_size": 0}, "dictionary_size"),
        ({"support": 0}, "support"),
    ],
)
def test_bad_task_settings_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MarkovChainTask(**kwargs)
