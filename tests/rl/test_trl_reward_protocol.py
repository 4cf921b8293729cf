"""TRL's reward-function protocol in the zoo (TRL 1.16 ``GRPOTrainer._calculate_rewards``): ``None`` for rows a
function does not apply to (NaN, left out of the weighted sum), the ``trainer_state`` / ``log_metric`` / ``log_extra``
keyword arguments, and ``async def`` reward functions -- in the core (:func:`zoo.rl.reward_matrix`) and in the GRPO
family's rollouts."""

from __future__ import annotations

import asyncio
import math

import lightning.pytorch as pl
import pytest
import torch
from transformers import TrainerState

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.modules import GRPOModule
from zoo.rl import (
    ExactMatchReward,
    RewardContext,
    RewardFunctionError,
    WeightedSumReward,
    reward_matrix,
    score_rewards,
    weighted_rewards,
)

PROMPTS = ["1+2=", "3+4=", "5+5=", "2+2="]
COMPLETIONS = ["<think>1+2=3</think>3", "<think>3+4</think>8", "x", "<think></think>4"]
ANSWERS = ["3", "7", "10", "4"]


def only_even_rows(prompts, completions, **kwargs):
    """Scores rows 0 and 2 (2.0, 3.0) and does not apply to the others (TRL: return None)."""
    return [2.0 if i == 0 else 3.0 if i == 2 else None for i in range(len(completions))]


def test_none_rows_are_left_out_of_the_weighted_sum():
    matrix = reward_matrix([ExactMatchReward(), only_even_rows], PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert matrix[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert matrix[0, 1] == 2.0 and matrix[2, 1] == 3.0 and math.isnan(matrix[1, 1]) and math.isnan(matrix[3, 1])
    # TRL: (rewards_per_func * reward_weights).nansum(dim=1)
    expected = [0.5 * 1.0 + 2 * 2.0, 0.5 * 0.0, 0.5 * 0.0 + 2 * 3.0, 0.5 * 1.0]
    assert weighted_rewards(matrix, torch.tensor([0.5, 2.0])).tolist() == expected
    scored = score_rewards([ExactMatchReward(), only_even_rows], [0.5, 2.0], PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert scored.tolist() == expected
    # a combination passes None on where none of its functions applies
    combo = WeightedSumReward([only_even_rows, only_even_rows], weights=[1.0, 0.5])
    assert combo(PROMPTS, COMPLETIONS) == [3.0, None, 4.5, None]


def test_a_completion_no_function_scores_is_one_error_naming_it():
    with pytest.raises(RewardFunctionError, match=r"every reward function \('a'\) returned None for completion 1"):
        score_rewards({"a": only_even_rows}, None, PROMPTS, COMPLETIONS, {})


def test_reward_functions_receive_trainer_state_log_metric_and_log_extra():
    seen = {}

    def trl_style(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
        seen["step"] = trainer_state.global_step
        log_metric("mean_length", sum(map(len, completions)) / len(completions))
        log_extra("length", [len(c) for c in completions])
        return [float(trainer_state.global_step)] * len(completions)

    context = RewardContext(TrainerState(global_step=7, max_steps=10))
    matrix = reward_matrix([trl_style, ExactMatchReward()], PROMPTS, COMPLETIONS, {"answer": ANSWERS}, context)
    assert seen["step"] == 7 and matrix[:, 0].tolist() == [7.0] * 4
    assert context.metric_means() == {"mean_length": sum(map(len, COMPLETIONS)) / 4}
    assert context.extras == {"length": [len(c) for c in COMPLETIONS]}
    # and through a combination, which forwards them to its members
    context = RewardContext(TrainerState(global_step=3))
    reward_matrix([WeightedSumReward([trl_style])], PROMPTS, COMPLETIONS, {}, context)
    assert seen["step"] == 3 and context.extras["length"] == [len(c) for c in COMPLETIONS]


async def async_reward(prompts, completions, **kwargs):
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


class AsyncJudge:
    """An async callable class (its ``__call__`` is a coroutine function), e.g. an LLM judge client."""

    __name__ = "judge"

    async def __call__(self, prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [1.0 if "<think>" in c else None for c in completions]


def test_async_reward_functions_are_awaited_concurrently():
    matrix = reward_matrix([async_reward, AsyncJudge(), ExactMatchReward()], PROMPTS, COMPLETIONS, {"answer": ANSWERS})
    assert matrix[:, 0].tolist() == [float(len(c)) for c in COMPLETIONS]
    assert matrix[[0, 1, 3], 1].tolist() == [1.0, 1.0, 1.0] and math.isnan(matrix[2, 1])

    # two functions that each wait for the other finish only when they run at the same time (as asyncio.gather does)
    started = {}

    def waiting_for(other: str, me: str):
        async def fn(prompts, completions, **kwargs):
            started[me] = asyncio.Event()
            while other not in started:
                await asyncio.sleep(0)
            started[other].set()
            await asyncio.wait_for(started[me].wait(), timeout=30)
            return [0.0] * len(completions)

        fn.__name__ = me
        return fn

    assert reward_matrix([waiting_for("b", "a"), waiting_for("a", "b")], PROMPTS, COMPLETIONS).shape == (4, 2)

    # also from code that already runs an event loop (a notebook)
    async def inside_a_loop():
        return reward_matrix([async_reward], PROMPTS, COMPLETIONS)

    assert asyncio.run(inside_a_loop())[:, 0].tolist() == [float(len(c)) for c in COMPLETIONS]


def test_grpo_rollouts_follow_the_trl_protocol():
    """In the GRPO family: None rows left out of the weighted reward, TRL's keyword arguments (the trainer state
    read from Lightning), log_metric logged with the step's metrics, log_extra in the rollout, async functions."""
    seen = []

    def first_row_only(prompts, completions, trainer_state, log_metric, log_extra, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.max_steps, trainer_state.is_world_process_zero))
        log_metric("judge_calls", 1.0)
        log_extra("judge_note", ["n"] * len(completions))
        return [5.0] + [None] * (len(completions) - 1)

    torch.manual_seed(0)
    module = GRPOModule(
        TinyBackbone(hidden_size=32, intermediate_size=64, num_hidden_layers=1),
        rewards={"length": async_reward, "first": first_row_only},
        reward_weights={"first": 2.0},
        group_size=2,
        generation={"max_new_tokens": 6},
    )
    dm = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=4, num_val=2), batch_size=2)
    trainer = pl.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0
    )
    trainer.fit(module, datamodule=dm)
    assert seen == [(0, 2, True), (1, 2, True)]
    rollout = module.last_rollout
    lengths = [float(len(t)) for t in rollout["texts"]]
    assert rollout["rewards"].reshape(-1).tolist() == [lengths[0] + 10.0, *lengths[1:]]
    assert rollout["reward_extras"] == {"judge_note": ["n"] * 4}
    assert trainer.logged_metrics["train/judge_calls"] == 1.0
