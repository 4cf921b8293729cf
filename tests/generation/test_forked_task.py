"""The forked task (``task=forked``, zoo.data.forked): the DTS demo's data with an explicit fork after the question."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from zoo.backbones import build_char_tokenizer
from zoo.data.forked import BRANCHES, ForkedTask
from zoo.data.sources import TaskSource
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError


def test_branches_are_drawn_with_their_probabilities():
    task = ForkedTask(p_short=0.5, p_loop=0.35, p_wrong=0.15)
    n = 6000
    counts = Counter(e.meta["branch"] for e in task.examples(n, seed=1))
    for branch, p in zip(BRANCHES, (0.5, 0.35, 0.15)):
        assert abs(counts[branch] - n * p) < 4 * math.sqrt(n * p * (1 - p)), counts
    skewed = Counter(e.meta["branch"] for e in ForkedTask(p_short=0.0, p_loop=0.0, p_wrong=1.0).examples(50, seed=0))
    assert skewed == {"wrong": 50}


def test_only_the_short_branch_is_correct_and_the_fork_is_the_first_reasoning_token():
    task, tok = ForkedTask(), build_char_tokenizer()
    for example in task.examples(40, seed=2):
        word = example.answer
        assert example.prompt == f"{word}=" and example.completion == task.branch_completion(
            word, example.meta["branch"]
        )
        encoded = {b: tok(task.branch_completion(word, b), add_special_tokens=False)["input_ids"] for b in BRANCHES}
        assert len({ids[0] for ids in encoded.values()}) == 1  # <think>
        assert len({ids[1] for ids in encoded.values()}) == 3  # the fork token
        assert [task.verify(task.branch_completion(word, b) + "<eos>", word) for b in BRANCHES] == [True, False, False]
        assert len(encoded["short"]) < len(encoded["wrong"]) < 48 < len(encoded["loop"])  # loop: no EOS in 48 tokens
        for branch in BRANCHES:  # a generated completion (cut anywhere after the fork word) is read back
            completion = task.branch_completion(word, branch)
            assert task.branch_of(completion) == branch and task.branch_of(completion[:14]) == branch
    assert ForkedTask.branch_of("<think>check abc</think>abc") is None and ForkedTask.branch_of("say abc") is None


def test_held_out_splits_and_sft_rows_fit_the_default_max_length():
    tok = build_char_tokenizer()
    source = TaskSource(ForkedTask(), num_train=16000, num_val=256, num_test=256, seed=0)
    datamodule = SFTDataModule(tok, source, batch_size=8, max_length=160)
    datamodule.setup("fit")
    train_prompts = {r["prompt"] for r in source.rows("train")}
    assert not train_prompts & {r["prompt"] for r in source.rows("val")}
    assert max(len(item["prompt_ids"]) + len(item["completion_ids"]) for item in datamodule.dataset("train")) <= 160


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"p_short": 0.6}, "p_short \\+ task.p_loop"),
        ({"p_short": -0.1, "p_loop": 0.95}, "task.p_short"),
        ({"min_length": 0}, "task.min_length"),
        ({"alphabet": "a"}, "alphabet"),
    ],
)
def test_bad_knobs_are_one_clear_error(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ForkedTask(**kwargs)
