"""Multi-turn feedback episodes: the chat format (turn markers = an HF chat template), the environment's rules
(rewards, feedback, first success stops, penalties), the batched loop on a real model, the synthetic reference
policy's data, the multi-turn metrics and their evaluation callback, and the multi-turn rollout seam of GRPO."""

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.callbacks import MultiTurnEvaluation, TrainingClock
from zoo.data.chat import ChatFormat, encode_conversation
from zoo.data.feedback import (
    INCORRECT,
    ChatPolicy,
    FeedbackEnvironment,
    RetryFeedbackSource,
    run_episodes,
    wrong_candidates,
)
from zoo.data.multiturn import MultiTurnAccuracy, trajectory_rows
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition, MultiSum, Reverse
from zoo.datamodules import MultiTurnPromptDataModule, MultiTurnSFTDataModule
from zoo.errors import ConfigError, DataError
from zoo.generation import SampleDecoder
from zoo.modules import CausalLMModule, GRPOModule, MultiTurnRollout
from zoo.protocols import GenerationResult, SamplingParams
from zoo.rl import ExactMatchReward

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}

CONVERSATION = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "37+45="},
    {"role": "assistant", "content": "<think>7+5=12\n3+4+1=8</think>81"},
    {"role": "user", "content": INCORRECT},
    {"role": "assistant", "content": "<think>7+5=12\n3+4+1=8</think>82"},
]


# -- chat format -----------------------------------------------------------------------------------------------------
def test_turn_markers_are_an_hf_chat_template_too():
    tok = build_char_tokenizer()
    fmt = ChatFormat(mode="auto")
    text = fmt.render(CONVERSATION[:4], tok)
    assert text == (
        f"[system]Add.\n[user]37+45=\n[assistant]<think>7+5=12\n3+4+1=8</think>81<eos>[user]{INCORRECT}\n[assistant]"
    )
    templated = tok.apply_chat_template(
        CONVERSATION[:4], chat_template=fmt.jinja(), tokenize=False, add_generation_prompt=True
    )
    assert templated == text
    tok.chat_template = fmt.jinja()
    assert fmt.uses_template(tok) and not ChatFormat(mode="markers").uses_template(tok)
    assert encode_conversation(tok, fmt, CONVERSATION) == encode_conversation(build_char_tokenizer(), fmt, CONVERSATION)


def test_labels_cover_the_assistant_turns_and_their_eos_only():
    tok = build_char_tokenizer()
    ids, labels = encode_conversation(tok, ChatFormat(), CONVERSATION, "all")
    assert ids[0] == tok.bos_token_id
    kept = tok.decode([t for t in labels if t != -100])
    assert kept == "<think>7+5=12\n3+4+1=8</think>81<eos><think>7+5=12\n3+4+1=8</think>82<eos>"
    _, last = encode_conversation(tok, ChatFormat(), CONVERSATION, "last")
    assert tok.decode([t for t in last if t != -100]) == "<think>7+5=12\n3+4+1=8</think>82<eos>"


def test_a_tokenizer_chat_template_is_used_with_its_own_markers_and_without_a_double_bos():
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}<|im_end|>{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = ChatFormat(mode="auto")
    text = fmt.render(CONVERSATION[1:4], tok)
    assert text.startswith("<|im_start|>user\n37+45=<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    ids, labels = encode_conversation(tok, fmt, CONVERSATION[1:])
    assert ids.count(tok.bos_token_id) == 1
    assert tok.decode([t for t in labels if t != -100]).count("<eos>") == 2
    with pytest.raises(ConfigError, match="no chat_template"):
        ChatFormat(mode="tokenizer").render(CONVERSATION, build_char_tokenizer())


# -- the environment ------------------------------------------------------------------------------------------------
def test_episode_rules_rewards_feedback_first_success_and_penalties():
    env = FeedbackEnvironment(Addition(), max_turns=3)
    ep = env.reset("37+45=", "82", "p0", 2)
    assert ep.messages == [{"role": "user", "content": "37+45="}]
    env.step(ep, "<think>7+5=12</think>81")
    assert ep.messages[-1] == {"role": "user", "content": INCORRECT} and not ep.done
    env.step(ep, "no reasoning block")  # malformed: format penalty
    env.step(ep, "<think>x</think>82")
    assert ep.done and ep.t_star == 3 and ep.turn_rewards == [0.0, 0.0, 1.0]
    assert ep.answers == ["81", None, "82"] and ep.format_penalty == pytest.approx(-0.1)
    assert ep.messages[-1]["role"] == "assistant"
    with pytest.raises(ValueError, match="over"):
        env.step(ep, "again")
    solved = env.reset("1+1=", "2")
    env.step(solved, "<think>1+1=2</think>2")
    assert solved.done and solved.t_star == 1 and solved.turns == 1
    failed = env.reset("1+1=", "2")
    for _ in range(3):
        env.step(failed, "<think>1+1=2</think>3")
    assert failed.done and failed.t_star is None and len(failed.messages) == 6
    assert env.episode_repeat_penalty(failed) == pytest.approx(0.5 * (1 - 1 / 3))


def test_rich_feedback_states_the_turn_and_the_attempts_left():
    env = FeedbackEnvironment(Addition(), max_turns=4, feedback="rich", instruction="Add the numbers.")
    first = env.initial_messages("3+4=")[0]["content"]
    assert first.startswith("Add the numbers.\nTurn 1:") and "3+4=" in first and "4 actions left" in first
    ep = env.reset("3+4=", "7")
    env.step(ep, "<think>3+4=7</think>8")
    feedback = ep.messages[-1]["content"]
    assert "Reward:\n0.0" in feedback and "Turn 2:" in feedback and "3 actions left" in feedback
    assert INCORRECT in feedback


def test_environment_settings_are_validated():
    for kwargs in ({"max_turns": 0}, {"feedback": "loud"}, {"format_penalty": 0.1}, {"repeat_penalty": -1.0}):
        with pytest.raises(ConfigError):
            FeedbackEnvironment(**kwargs)


@pytest.fixture(scope="module")
def tiny():
    backbone = TinyBackbone(**SMALL, num_key_value_heads=2, seed=1)
    return backbone, backbone.build_model()


def test_batched_episodes_on_a_real_model_follow_the_rules(tiny):
    backbone, model = tiny
    env = FeedbackEnvironment(Addition(), max_turns=3)
    examples = Addition().examples(4, seed=0)
    episodes = [env.reset(e.prompt, e.answer, str(i), j) for i, e in enumerate(examples) for j in range(2)]
    decoder = SampleDecoder()
    params = SamplingParams(max_new_tokens=12, do_sample=True)

    def generate(ids, mask, p, g):
        return decoder(model, backbone.tokenizer, ids, mask, params=p, generator=g)

    policy = ChatPolicy(generate, backbone.tokenizer, env.chat_format, params, torch.Generator().manual_seed(0))
    run_episodes(env, episodes, policy)
    for e in episodes:
        assert e.done and 1 <= e.turns <= 3
        assert len(e.messages) == 2 * e.turns - 1 + 1
        assert e.t_star in (None, e.turns)
        assert [m["role"] for m in e.messages] == ["user", "assistant"] * e.turns
    assert policy.calls == max(e.turns for e in episodes)
    assert policy.tokens_generated == sum(e.completion_tokens for e in episodes) > 0


def test_an_episode_whose_next_turn_does_not_fit_ends_there(tiny):
    backbone, model = tiny
    env = FeedbackEnvironment(Addition(), max_turns=3)
    decoder = SampleDecoder()
    params = SamplingParams(max_new_tokens=10)
    policy = ChatPolicy(
        lambda ids, mask, p, g: decoder(model, backbone.tokenizer, ids, mask, params=p, generator=g),
        backbone.tokenizer,
        env.chat_format,
        params,
        max_context=60,
    )
    short, long = env.reset("1+2=", "3"), env.reset("1234+5678=", "6912")
    first = [len(ids) for ids in policy.encode([short.messages, long.messages])]
    assert all(n + 10 <= 60 for n in first)
    run_episodes(env, [short, long], policy)
    for episode in (short, long):
        if episode.t_star is None:
            assert episode.out_of_context and episode.turns < 3  # 3 turns of 10 tokens cannot fit in 60 positions
            assert episode.messages[-1]["role"] == "assistant"
            assert len(policy.encode([[*episode.messages, env.feedback_message(0.0, 2)]])[0]) + 10 > 60


def test_a_context_longer_than_the_model_is_a_clear_error(tiny):
    backbone, model = tiny
    env = FeedbackEnvironment(Addition(), max_turns=3)
    decoder = SampleDecoder()
    policy = ChatPolicy(
        lambda ids, mask, p, g: decoder(model, backbone.tokenizer, ids, mask, params=p, generator=g),
        backbone.tokenizer,
        env.chat_format,
        SamplingParams(max_new_tokens=250),
    )
    with pytest.raises(ConfigError, match="turn 1: .*multiturn.max_turns"):
        run_episodes(env, [env.reset("1+2=", "3")], policy)


# -- the reference policy's data ------------------------------------------------------------------------------------
def test_wrong_candidates_are_different_plausible_answers():
    assert wrong_candidates("82") == ["72", "80", "81", "83", "84", "92"]
    assert wrong_candidates("3") == ["1", "2", "4", "5", "13"]
    assert "acb" in wrong_candidates("abc") and "abc" not in wrong_candidates("abc")


@pytest.mark.parametrize("task", [Addition(), MultiSum(), Reverse()])
def test_retry_feedback_rows_solve_at_the_set_rate_and_never_repeat_a_candidate(task):
    env = FeedbackEnvironment(task, max_turns=3)
    source = RetryFeedbackSource(
        task, env, first_turn_accuracy=0.4, retry_accuracy=0.5, rows="turns", num_train=3000, num_val=50
    )
    rows = source.rows("train")
    assert len(rows) == 3000
    first = [r for r in rows if r["turn"] == 1]
    accuracy = sum(task.verify(r["messages"][-1]["content"], r["answer"]) for r in first) / len(first)
    assert accuracy == pytest.approx(0.4, abs=0.04)
    later = [r for r in rows if r["turn"] > 1]
    assert sum(task.verify(r["messages"][-1]["content"], r["answer"]) for r in later) / len(later) == pytest.approx(
        0.5, abs=0.05
    )
    for row in rows:
        replies = [task.extract_answer(m["content"]) for m in row["messages"] if m["role"] == "assistant"]
        assert len(set(replies)) == len(replies) == row["turn"]
        assert all(m["content"] == INCORRECT for m in row["messages"][2::2])
    held_out = {r["prompt"] for r in source.rows("val")} | {r["prompt"] for r in source.rows("test")}
    assert not held_out & {r["prompt"] for r in rows}


def test_retry_feedback_episodes_train_every_assistant_turn():
    task = Addition()
    env = FeedbackEnvironment(task, max_turns=3)
    source = RetryFeedbackSource(task, env, num_train=400, num_val=8, num_test=8)
    rows = source.rows("train")
    assert len(rows) == 400  # one row per episode
    assert all(sum(m["role"] == "assistant" for m in r["messages"]) == r["turn"] for r in rows)
    solved_first = [task.verify(r["messages"][1]["content"], r["answer"]) for r in rows]
    assert sum(solved_first) / len(rows) == pytest.approx(0.4, abs=0.06)
    for row in rows:
        last = row["messages"][-1]["content"]
        assert task.verify(last, row["answer"]) or row["turn"] == 3
    backbone = TinyBackbone(**SMALL, num_key_value_heads=2)
    dm = MultiTurnSFTDataModule(backbone.tokenizer, source, environment=env, train_turns="all")
    tok = backbone.tokenizer
    for i, row in enumerate(rows[:20]):
        item = dm.encode(row, i, "train")
        trained = tok.decode([t for t in item["labels"] if t != -100])
        turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert trained == "".join(t + tok.eos_token for t in turns)
        assert tok.decode(item["input_ids"]) == tok.bos_token + env.chat_format.render(row["messages"], tok, False)
    batch = dm.collate([dm.encode(r, i, "train") for i, r in enumerate(rows[:4])])
    assert batch["labels"].shape == batch["input_ids"].shape
    with pytest.raises(ConfigError, match="train_turns"):
        MultiTurnSFTDataModule(tok, source, environment=env, train_turns="first")


# -- metrics and the evaluation callback ----------------------------------------------------------------------------
def test_multi_turn_accuracy_by_hand():
    metric = MultiTurnAccuracy(3)
    metric.update([1, None, 2, 1])
    metric.update([3, None])
    values = metric.compute()
    assert values["multi@1"].item() == pytest.approx(2 / 6)
    assert values["multi@2"].item() == pytest.approx(3 / 6)
    assert values["multi@3"].item() == pytest.approx(4 / 6)
    assert values["mean_turns_to_solve"].item() == pytest.approx((1 + 2 + 1 + 3) / 4)
    empty = MultiTurnAccuracy(2)
    empty.update([None])
    assert torch.isnan(empty.compute()["mean_turns_to_solve"])
    with pytest.raises(ValueError, match="exceeds"):
        metric.update([4])


def test_evaluation_callback_logs_multi_at_k_and_its_turn_one_is_the_modules_exact_match(tiny):
    backbone, _ = tiny
    env = FeedbackEnvironment(Addition(), max_turns=3)
    dm = MultiTurnSFTDataModule(
        backbone.tokenizer, TaskSource(Addition(), num_train=8, num_val=12), eval_batch_size=6, environment=env
    )
    module = CausalLMModule(backbone, generation={"max_new_tokens": 16, "do_sample": False})
    callback = MultiTurnEvaluation(env, max_new_tokens=16)
    trainer = pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[callback]
    )
    metrics = trainer.validate(module, dm, verbose=False)[0]
    assert {"val/multi@1", "val/multi@2", "val/multi@3", "val/mean_turns_to_solve"} <= set(metrics)
    assert metrics["val/multi@1"] == pytest.approx(metrics["val/exact_match"])
    assert metrics["val/multi@1"] <= metrics["val/multi@2"] <= metrics["val/multi@3"]
    # turn 1 of the greedy episodes is the module's own greedy generation of the same prompt, row by row
    batch = next(iter(dm.val_dataloader()))
    episodes = callback.evaluate_batch(module, batch, "val")
    output, _ = module.generate_output(batch)
    assert [e.messages[1]["content"] for e in episodes] == output["texts"]
    assert [e.turn_rewards[0] == 1.0 for e in episodes] == output["meta"]["correct"]
    assert all(e.turns == (e.t_star or 3) for e in episodes)
    with pytest.raises(ConfigError, match="splits"):
        MultiTurnEvaluation(env, splits=("train",))


def test_evaluation_finds_the_answers_that_a_scripted_module_gives_at_each_turn():
    """A stand-in module (a test double of the generation protocol, in place of a trained LLM) answers correctly
    only at turn 2 for the first prompt and never for the second: multi@1 = 0, multi@2 = multi@3 = 1/2."""

    class Scripted(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.tokenizer = build_char_tokenizer()
            self.model = torch.nn.Linear(1, 1)

        def generate(self, ids, mask, params=None, generator=None):
            texts = []
            for row in ids:
                context = self.tokenizer.decode(row, skip_special_tokens=False)
                turn = context.count("[assistant]")
                texts.append("<think></think>5" if "2+3=" in context and turn == 2 else "<think></think>0")
            n = len(texts)
            ones = torch.ones(n, 1, dtype=torch.long)
            return GenerationResult(ids, ones, ones, torch.zeros(n, 1), texts, torch.ones(n, dtype=torch.bool))

    env = FeedbackEnvironment(Addition(), max_turns=3)
    callback = MultiTurnEvaluation(env)
    module = Scripted()
    callback.evaluate_batch(module, {"prompts": ["2+3=", "4+4="], "answers": ["5", "8"]}, "val")
    values = callback.metrics["val"].compute()
    assert values["multi@1"].item() == 0.0 and values["multi@2"].item() == 0.5 and values["multi@3"].item() == 0.5
    assert values["mean_turns_to_solve"].item() == 2.0


# -- online multi-turn GRPO --------------------------------------------------------------------------------------------
def test_grpo_multi_turn_rollout_rewards_returns_and_trains_only_assistant_tokens(tiny):
    backbone, _ = tiny
    env = FeedbackEnvironment(Addition(), max_turns=2)
    module = GRPOModule(
        backbone,
        rewards={"accuracy": ExactMatchReward()},
        group_size=3,
        generation={"max_new_tokens": 10},
        rollout=MultiTurnRollout(env, gamma=0.9),
    )
    module.configure_model()
    dm = MultiTurnPromptDataModule(
        backbone.tokenizer, TaskSource(Addition(), num_train=4, num_val=2), batch_size=2, environment=env
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    torch.manual_seed(0)
    rollout = module.rollout(batch)
    assert rollout["rewards"].shape == (2, 3) and rollout["advantages"].shape == (6,)
    input_ids, attention_mask, _, labels = rollout["rows"]
    tok = backbone.tokenizer
    for i in range(6):
        text = tok.decode(input_ids[i][attention_mask[i].bool()])
        assert text.startswith("<bos>[user]" + batch["prompts"][i // 3])
        trained = tok.decode([t for t in labels[i].tolist() if t != -100])
        assert "[user]" not in trained and INCORRECT not in trained and "[assistant]" not in trained
        assert trained.count("<eos>") <= 2
    # the reward of each trajectory is its discounted return: gamma^(t*-1), -0.1 per malformed turn, minus
    # 0.5 (1 - unique / answers) over the well-formed answers
    expected = []
    for e in rollout["episodes"]:
        success = 0.9 ** (e.t_star - 1) if e.t_star is not None else 0.0
        formed = [a for a in e.answers if a is not None]
        repeat = 0.5 * (1 - len(set(formed)) / len(formed)) if formed else 0.0
        expected.append(success - 0.1 * e.answers.count(None) - repeat)
    torch.testing.assert_close(rollout["rewards"].flatten(), torch.tensor(expected))
    # a training step goes through the seam's rows
    module.policy_gradients(rollout["rows"], rollout["advantages"], None)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.model.parameters())


def test_grpo_multi_turn_needs_the_multi_turn_prompts(tiny):
    backbone, _ = tiny
    module = GRPOModule(backbone, rewards={"a": ExactMatchReward()}, rollout=MultiTurnRollout(FeedbackEnvironment()))
    with pytest.raises(ConfigError, match="multiturn_prompts"):
        module.rollout({"prompts": ["1+1="], "columns": {"answer": ["2"]}})
    with pytest.raises(ConfigError, match="train_turns"):
        MultiTurnRollout(FeedbackEnvironment(), train_turns="first")


def test_trajectory_rows_are_right_padded_with_positions(tiny):
    backbone, _ = tiny
    env = FeedbackEnvironment(Addition(), max_turns=2)
    a, b = env.reset("1+1=", "2"), env.reset("10+10=", "20")
    env.step(a, "<think>1+1=2</think>2")
    env.step(b, "<think>x</think>21")
    env.step(b, "<think>x</think>20")
    rows = trajectory_rows(backbone.tokenizer, env.chat_format, [a, b])
    assert rows["input_ids"].shape == rows["labels"].shape
    length_a = int(rows["attention_mask"][0].sum())
    assert rows["position_ids"][0, length_a - 1] == length_a - 1
    assert bool((rows["labels"][0, length_a:] == -100).all())
    with pytest.raises(DataError, match="end with a user"):
        env.reset([{"role": "assistant", "content": "hi"}], "1")


def test_training_clock_logs_training_seconds_and_the_tokens_of_multi_turn_rollouts(tiny):
    backbone, _ = tiny
    env = FeedbackEnvironment(Addition(), max_turns=2)
    module = GRPOModule(
        backbone,
        rewards={"accuracy": ExactMatchReward()},
        group_size=2,
        generation={"max_new_tokens": 8},
        rollout=MultiTurnRollout(env),
    )
    dm = MultiTurnPromptDataModule(
        backbone.tokenizer, TaskSource(Addition(), num_train=8, num_val=2), batch_size=2, environment=env
    )

    class Count(pl.Callback):  # the episodes' own token counts, step by step
        total = 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            Count.total += sum(e.completion_tokens for e in pl_module.last_rollout["episodes"])

    clock = TrainingClock(metrics=("val/exact_match",))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=3,
        val_check_interval=1,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[Count(), clock],
    )
    trainer.fit(module, dm)
    assert [step for step, *_ in clock.history] == [1, 2, 3]
    seconds = [s for _, s, _, _ in clock.history]
    assert seconds == sorted(seconds) and seconds[0] > 0
    assert clock.history[-1][2] == clock.tokens == Count.total > 0
    assert all("val/exact_match" in values for *_, values in clock.history)
    assert trainer.callback_metrics["clock/tokens_generated"].item() == clock.tokens
    restored = TrainingClock()
    restored.load_state_dict(clock.state_dict())
    assert (restored.seconds, restored.tokens) == (clock.seconds, clock.tokens)


def test_a_sampled_evaluation_beside_the_greedy_one_logs_its_own_names_and_repeats_its_noise(tiny):
    backbone, _ = tiny
    env = FeedbackEnvironment(Addition(), max_turns=2)
    dm = MultiTurnSFTDataModule(
        backbone.tokenizer, TaskSource(Addition(), num_train=8, num_val=4), eval_batch_size=4, environment=env
    )
    module = CausalLMModule(backbone, generation={"max_new_tokens": 8}, generate_on_eval=False)
    greedy = MultiTurnEvaluation(env, max_new_tokens=8)
    sampled = MultiTurnEvaluation(env, max_new_tokens=8, do_sample=True, samples=3, prefix="sampled_", seed=5)
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[greedy, sampled],
    )
    metrics = trainer.validate(module, dm, verbose=False)[0]
    assert {"val/multi@2", "val/sampled_multi@2", "val/sampled_mean_turns_to_solve"} <= set(metrics)
    batch = next(iter(dm.val_dataloader()))
    sampled._seed(module)
    first = sampled.evaluate_batch(module, batch, "val")
    sampled._seed(module)
    again = sampled.evaluate_batch(module, batch, "val")
    assert len(first) == 12 and [e.messages for e in first] == [e.messages for e in again]
    assert len({tuple(m["content"] for m in e.messages) for e in first}) > 4  # samples differ within a prompt
    with pytest.raises(ConfigError, match="samples"):
        MultiTurnEvaluation(env, samples=2)
