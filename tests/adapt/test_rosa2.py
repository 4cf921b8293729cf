"""ROSA / ROSA2 test-time adaptation: pi* and the one-step update (zoo.adapt.rosa), the words + weights turn loop
(zoo.adapt.rosa2), the AmbiguousOps world (zoo.data.ambiguous_ops) and the TestTimeAdaptationModule.

The model is the zoo's tiny Llama (random init, real tokenizer, real peft LoRA); no test double stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from zoo.adapt.rosa import candidate_logprobs, kl_to_optimum, optimum_weights, rosa_loss, rosa_step
from zoo.adapt.rosa2 import AdaptationSettings, ConversationRecord, run_conversation
from zoo.backbones import TinyBackbone
from zoo.data.ambiguous_ops import (
    AmbiguousOpsConversations,
    AmbiguousOpsTask,
    Conversation,
    Decomposition,
    Feedback,
    IntentWords,
    Reading,
)
from zoo.errors import ConfigError, DataError
from zoo.modules import TestTimeAdaptationModule
from zoo.quant.base import NoQuantizer

LORA = {"r": 2, "alpha": 4, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]}


def tiny_backbone(max_positions: int = 32, lora: dict | None = LORA) -> TinyBackbone:
    return TinyBackbone(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        seed=0,
        lora=lora,
    )


@pytest.fixture(scope="module")
def task() -> AmbiguousOpsTask:
    return AmbiguousOpsTask(intents=["add", "sub", "mul", "max"], modulus=10, intent_weights={"mul": 0.1})


def make_module(task: AmbiguousOpsTask, hint_prob: float = 0.5, **adapt: object) -> TestTimeAdaptationModule:
    module = TestTimeAdaptationModule(
        tiny_backbone(),
        AmbiguousOpsConversations(task, hint_prob=hint_prob, seed=3),
        IntentWords(),
        adapt={"lr": 5.0, **adapt},
    )
    module.configure_model()
    return module


def adapter_values(module: TestTimeAdaptationModule) -> list[torch.Tensor]:
    return [p.detach().clone() for _, p in module.adapters()]


# -- pi* -----------------------------------------------------------------------------------------------------------
def test_optimum_weights_match_the_closed_form_and_sum_to_one() -> None:
    logp = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    rewards = torch.tensor([0.0, 1.0, 0.5])
    weights = optimum_weights(logp, rewards, beta=0.5)
    expected = torch.tensor([0.5 * math.exp(0), 0.3 * math.exp(2), 0.2 * math.exp(1)])
    torch.testing.assert_close(weights, expected / expected.sum())
    assert weights.sum().item() == pytest.approx(1.0)


def test_large_beta_recovers_pi_and_small_beta_concentrates_on_the_best() -> None:
    pi = torch.tensor([0.6, 0.1, 0.2, 0.1])
    rewards = torch.tensor([0.0, 1.0, 0.3, 1.0])
    torch.testing.assert_close(optimum_weights(pi.log(), rewards, math.inf), pi)
    torch.testing.assert_close(optimum_weights(pi.log(), rewards, 1e6), pi, atol=1e-5, rtol=0)
    sharp = optimum_weights(pi.log(), rewards, 1e-3)
    # all mass on the two reward-1 answers, shared in proportion to pi (0.1 : 0.1)
    torch.testing.assert_close(sharp, torch.tensor([0.0, 0.5, 0.0, 0.5]), atol=1e-6, rtol=0)


def test_a_wrong_answer_loses_weight() -> None:
    pi = torch.tensor([0.7, 0.2, 0.1])
    weights = optimum_weights(pi.log(), torch.tensor([0.0, 0.5, 0.5]), beta=0.2)
    assert weights[0] < pi[0] and weights[1] > pi[1]


def test_beta_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="beta"):
        optimum_weights(torch.zeros(2), torch.zeros(2), beta=0.0)


def test_rosa_loss_has_the_gradient_of_the_kl() -> None:
    logits = torch.randn(5, requires_grad=True)
    target = optimum_weights(torch.log_softmax(logits, 0), torch.tensor([0.0, 1.0, 0.5, 0.5, 0.0]), 0.3)
    (g_kl,) = torch.autograd.grad(kl_to_optimum(target, torch.log_softmax(logits, 0)), logits)
    (g_loss,) = torch.autograd.grad(rosa_loss(target, torch.log_softmax(logits, 0)), logits)
    torch.testing.assert_close(g_kl, g_loss)
    p = target.double()
    q = torch.log_softmax(logits.detach().double(), 0)
    assert kl_to_optimum(target, torch.log_softmax(logits, 0)).item() == pytest.approx((p * (p.log() - q)).sum().item())


# -- the one step on the tiny model ----------------------------------------------------------------------------------
def test_one_rosa_step_strictly_lowers_the_kl_on_the_tiny_model(task: AmbiguousOpsTask) -> None:
    backbone = tiny_backbone()
    model = backbone.build_model(NoQuantizer())
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    prompt, candidates = task.prompt("mul", 3, 7), task.answers()
    logp = candidate_logprobs(model, backbone.tokenizer, prompt, candidates)
    rewards = torch.full((len(candidates),), 0.5)
    rewards[int(torch.argmax(logp))] = 0.0  # the answer the policy gave was judged wrong
    target = optimum_weights(logp, rewards, beta=0.1)
    before = kl_to_optimum(target, logp).item()
    step = rosa_step(adapters, rosa_loss(target, logp), lr=0.5)
    with torch.no_grad():
        after = kl_to_optimum(target, candidate_logprobs(model, backbone.tokenizer, prompt, candidates)).item()
    assert step.applied and not step.rolled_back and step.update_norm > 0
    assert after < before


def test_a_non_finite_step_is_rolled_back(task: AmbiguousOpsTask) -> None:
    backbone = tiny_backbone()
    model = backbone.build_model(NoQuantizer())
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    saved = [p.detach().clone() for p in adapters]
    logp = candidate_logprobs(model, backbone.tokenizer, task.prompt("add", 1, 2), task.answers())
    target = optimum_weights(logp, torch.rand(len(logp)), beta=0.1)
    step = rosa_step(adapters, rosa_loss(target, logp), lr=math.inf)
    assert step.rolled_back and not step.applied
    for p, old in zip(adapters, saved, strict=True):
        assert torch.equal(p, old)


def test_a_prompt_longer_than_the_context_is_a_clear_error(task: AmbiguousOpsTask) -> None:
    backbone = tiny_backbone(max_positions=4)
    model = backbone.build_model(NoQuantizer())
    with pytest.raises(DataError, match="exceeds the model context"):
        candidate_logprobs(model, backbone.tokenizer, task.prompt("add", 1, 2), task.answers())


# -- the AmbiguousOps world ------------------------------------------------------------------------------------------
def test_task_renders_and_under_trains(task: AmbiguousOpsTask) -> None:
    assert task.prompt("mul", 3, 5) == "3*5=" and task.execute("mul", 3, 5) == "5" and task.execute("sub", 2, 7) == "5"
    examples = task.examples(4000, seed=0)
    counts = {i: sum(e.meta["intent"] == i for e in examples) for i in task.intents}
    assert counts["mul"] < 0.3 * counts["add"]
    assert all(task.verify(e.completion, e.answer) for e in examples[:50])
    assert task.parse_hint(task.hint("max")) == "max"


@pytest.mark.parametrize(
    "kwargs", [{"intents": ["add", "pow"]}, {"intents": ["add"]}, {"modulus": 11}, {"intent_weights": {"xor": 1}}]
)
def test_task_rejects_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        AmbiguousOpsTask(**kwargs)


def test_conversations_are_a_function_of_seed_and_index(task: AmbiguousOpsTask) -> None:
    first, again = AmbiguousOpsConversations(task, seed=1), AmbiguousOpsConversations(task, seed=1)
    assert [first(i).describe() for i in range(20)] == [again(i).describe() for i in range(20)]
    other = AmbiguousOpsConversations(task, seed=2)
    assert [first(i).describe() for i in range(20)] != [other(i).describe() for i in range(20)]


@pytest.mark.parametrize("h", [0.0, 1.0])
def test_hints_come_with_probability_h_and_only_with_wrong_answers(task: AmbiguousOpsTask, h: float) -> None:
    conversation = AmbiguousOpsConversations(task, hint_prob=h, seed=0)(0)
    wrong = next(a for a in task.answers() if a != conversation.answer)
    hints = [conversation.feedback(wrong).hint for _ in range(20)]
    assert all((hint is not None) == (h == 1.0) for hint in hints)
    assert conversation.feedback(conversation.answer) == Feedback(True, 1.0, None)


def test_intent_words_decompose_and_revise(task: AmbiguousOpsTask) -> None:
    words = IntentWords()
    conversation = Conversation(task, 3, 5, "mul", "add", 0.0, 0)
    reading = conversation.initial_reading()
    faithful = task.execute("add", 3, 5)  # "8": what the reading asks for, wrong for the user
    parts = words.decompose(conversation, reading, faithful, Feedback(False, 0.0))
    assert (parts.ambiguity, parts.capability) == (True, False)
    assert words.revise(conversation, reading, faithful, Feedback(False, 0.0)) == Reading("sub", ("add",))
    unfaithful = "1"
    parts = words.decompose(conversation, reading, unfaithful, Feedback(False, 0.0))
    assert (parts.ambiguity, parts.capability) == (False, True)
    hinted = Feedback(False, 0.0, task.hint("mul"))
    assert words.decompose(conversation, reading, unfaithful, hinted).ambiguity
    assert words.revise(conversation, reading, unfaithful, hinted) == Reading("mul", ("add",))
    confirmed = Feedback(False, 0.0, task.hint("add"))
    parts = words.decompose(conversation, reading, unfaithful, confirmed)
    assert (parts.ambiguity, parts.capability) == (False, True)


# -- the turn loop and the module ------------------------------------------------------------------------------------
def first_answer(module: TestTimeAdaptationModule, task: AmbiguousOpsTask, intent: str, a: int, b: int) -> str:
    with torch.no_grad():
        logp = candidate_logprobs(module.model, module.tokenizer, task.prompt(intent, a, b), task.answers())
    return task.answers()[int(torch.argmax(logp))]


def first_two_turns(module: TestTimeAdaptationModule, conversation: Conversation) -> ConversationRecord:
    return run_conversation(
        module.model,
        module.tokenizer,
        [p for _, p in module.adapters()],
        conversation,
        replace(module.settings, max_turns=2),
        IntentWords(),
    )


def test_ambiguity_only_feedback_leaves_the_weights_unchanged(task: AmbiguousOpsTask) -> None:
    module = make_module(task)
    # a problem whose first answer is exactly the default reading's operation (add) but the user meant mul
    a, b = next(
        (a, b)
        for a in range(10)
        for b in range(10)
        if first_answer(module, task, "add", a, b) == task.execute("add", a, b) != task.execute("mul", a, b)
    )
    conversation = Conversation(task, a, b, "mul", "add", 0.0, 0)
    before = adapter_values(module)
    record = first_two_turns(module, conversation)
    first = record.turns[0]
    assert (first.ambiguity, first.capability, first.reading_changed, first.weight_step) == (True, False, True, False)
    assert record.turns[1].prompt == task.prompt("sub", a, b)
    assert all(torch.equal(x, y) for x, y in zip(before, adapter_values(module), strict=True))


def test_capability_only_feedback_leaves_the_context_unchanged(task: AmbiguousOpsTask) -> None:
    module = make_module(task)
    # the user means the default reading (add), the model gets it wrong, the hint confirms the reading
    a, b = next(
        (a, b)
        for a in range(10)
        for b in range(10)
        if first_answer(module, task, "add", a, b) != task.execute("add", a, b)
    )
    conversation = Conversation(task, a, b, "add", "add", 1.0, 0)
    before = adapter_values(module)
    record = first_two_turns(module, conversation)
    first = record.turns[0]
    assert first.hint == task.hint("add")
    assert (first.ambiguity, first.capability, first.reading_changed, first.weight_step) == (False, True, False, True)
    assert record.turns[1].prompt == record.turns[0].prompt == task.prompt("add", a, b)
    assert any(not torch.equal(x, y) for x, y in zip(before, adapter_values(module), strict=True))
    assert record.parameter_shift > 0


class BothStreamsWords(IntentWords):
    """IntentWords, except that a hint naming another operation on an answer that is not even the reading's
    operation is split into both errors (e_amb: the reading was wrong; e_cap: the model also failed the reading it
    had), the case where ROSA2 revises the context and then steps the weights on it."""

    def decompose(self, conversation, reading, response, feedback):
        parts = super().decompose(conversation, reading, response, feedback)
        faithful = response.strip() == conversation.task.execute(reading.intent, conversation.a, conversation.b)
        hinted = conversation.task.parse_hint(feedback.hint) if feedback.hint else None
        if hinted is not None and hinted != reading.intent and not faithful:
            return Decomposition(True, True)
        return parts


def reference_step(task: AmbiguousOpsTask, prompt: str, rewards: list[float]) -> list[torch.Tensor]:
    """The adapters of a fresh module (same init) after one ROSA step on ``prompt`` with these candidate rewards."""
    module = make_module(task)
    settings = module.settings
    with torch.enable_grad():
        logp = candidate_logprobs(module.model, module.tokenizer, prompt, task.answers())
        target = optimum_weights(logp, torch.tensor(rewards, dtype=logp.dtype), settings.beta)
        rosa_step([p for _, p in module.adapters()], rosa_loss(target, logp), settings.lr, settings.max_update_norm)
    return adapter_values(module)


def same(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6, rtol=1e-5) for x, y in zip(xs, ys, strict=True))


def test_rosa2_steps_the_weights_on_the_revised_context(task: AmbiguousOpsTask) -> None:
    """ROSA2's defining order: Revise(c_k, f_k) first, then the ROSA step on c_{k+1}, not on the prompt answered."""
    module = make_module(task)
    a, b = next(
        (a, b)
        for a in range(10)
        for b in range(10)
        if first_answer(module, task, "add", a, b) not in (task.execute("add", a, b), task.execute("mul", a, b))
    )
    conversation = Conversation(task, a, b, "mul", "add", 1.0, 0)  # the hint always comes: "I meant the product"
    record = run_conversation(
        module.model,
        module.tokenizer,
        [p for _, p in module.adapters()],
        conversation,
        replace(module.settings, max_turns=2),
        BothStreamsWords(),
    )
    first = record.turns[0]
    assert (first.ambiguity, first.capability, first.reading_changed, first.weight_step) == (True, True, True, True)
    revised, answered = task.prompt("mul", a, b), task.prompt("add", a, b)
    assert record.turns[1].prompt == revised and first.prompt == answered
    rewards = [0.0 if c == first.response else module.settings.unobserved_reward for c in task.answers()]
    on_revised, on_answered = reference_step(task, revised, rewards), reference_step(task, answered, rewards)
    assert not same(on_revised, on_answered)  # the two contexts give different steps: the test can tell them apart
    assert same(adapter_values(module), on_revised)


def test_unjudged_candidates_get_the_unobserved_reward(task: AmbiguousOpsTask) -> None:
    """pi* of the step: the judged answer at its reward (0), every candidate the user has not judged at
    ``unobserved_reward`` [reconstruction]."""
    module = make_module(task, unobserved_reward=0.9, words=False, decompose=False)
    a, b = next(
        (a, b)
        for a in range(10)
        for b in range(10)
        if first_answer(module, task, "add", a, b) != task.execute("add", a, b)
    )
    conversation = Conversation(task, a, b, "add", "add", 0.0, 0)
    record = run_conversation(
        module.model,
        module.tokenizer,
        [p for _, p in module.adapters()],
        conversation,
        replace(module.settings, max_turns=2),
    )
    wrong = record.turns[0].response
    assert record.turns[0].weight_step
    prompt = task.prompt("add", a, b)
    expected = reference_step(task, prompt, [0.0 if c == wrong else 0.9 for c in task.answers()])
    default = reference_step(task, prompt, [0.0 if c == wrong else 0.5 for c in task.answers()])
    assert not same(expected, default)
    assert same(adapter_values(module), expected)


def test_base_weights_are_bit_identical_and_adapters_reset(task: AmbiguousOpsTask) -> None:
    module = make_module(task)
    base, adapters = module.base_hash(), adapter_values(module)
    records = [module.play(i) for i in range(6)]
    assert sum(r.weight_steps for r in records) > 0 and max(r.parameter_shift for r in records) > 0
    assert module.base_hash() == base
    assert all(torch.equal(x, y) for x, y in zip(adapters, adapter_values(module), strict=True))


def test_conversation_b_does_not_depend_on_conversation_a(task: AmbiguousOpsTask) -> None:
    alone, after_a = make_module(task), make_module(task)
    a_index, b_index = 0, 1
    assert after_a.play(a_index).weight_steps > 0 or after_a.play(a_index + 2).weight_steps > 0
    conversation_b = alone.conversations(b_index)
    prompt = conversation_b.prompt(conversation_b.initial_reading())
    with torch.no_grad():
        logits_alone = alone.model(**alone.tokenizer(prompt, return_tensors="pt")).logits
        logits_after = after_a.model(**after_a.tokenizer(prompt, return_tensors="pt")).logits
    assert torch.equal(logits_alone, logits_after)
    assert alone.play(b_index).to_dict() | {"adapt_seconds": 0} == after_a.play(b_index).to_dict() | {
        "adapt_seconds": 0
    }


def test_static_arm_changes_nothing(task: AmbiguousOpsTask) -> None:
    module = TestTimeAdaptationModule(
        tiny_backbone(lora=None),
        AmbiguousOpsConversations(task, seed=0),
        None,
        adapt={"words": False, "weights": False},
    )
    records = [module.play(i) for i in range(6)]
    for record in records:
        assert record.weight_steps == record.words_updates == 0
        assert len({t.prompt for t in record.turns}) == 1 and len({t.response for t in record.turns}) == 1


def test_rosa_rollback_is_reported_per_turn(task: AmbiguousOpsTask) -> None:
    module = make_module(task, lr=math.inf, words=False, decompose=False)
    records = [module.play(i) for i in range(4)]
    assert sum(r.rollbacks for r in records) > 0
    assert all(r.parameter_shift == 0 for r in records)


def test_module_refuses_inference_mode_and_bad_settings(task: AmbiguousOpsTask) -> None:
    module = make_module(task)
    with torch.inference_mode(), pytest.raises(ConfigError, match="inference_mode=false"):
        module.play(0)
    with pytest.raises(ConfigError, match="backbone.lora"):
        TestTimeAdaptationModule(tiny_backbone(lora=None), AmbiguousOpsConversations(task), IntentWords())
    with pytest.raises(ConfigError, match="module.adapt"):
        TestTimeAdaptationModule(tiny_backbone(), AmbiguousOpsConversations(task), IntentWords(), adapt={"bta": 1})
    with pytest.raises(ConfigError, match="beta"):
        AdaptationSettings(beta=-1.0)


def test_train_py_plays_rosa2_conversations(zoo_main, tmp_path) -> None:
    """``python train.py +method=rosa2`` (random-init policy, 4 conversations): metrics and conversations.jsonl."""
    import json

    from conftest import REPO_ROOT

    run = tmp_path / "run"
    code, out, err = zoo_main(
        [
            "+method=rosa2",
            "backbone.init_from=null",
            "datamodule.episodes=4",
            "datamodule.batch_size=2",
            f"hydra.run.dir={run}",
            f"paths.log_dir={tmp_path / 'logs'}",
            "trainer.enable_progress_bar=false",
        ],
        REPO_ROOT,
    )
    assert code == 0, err[-2000:]
    lines = [json.loads(line) for line in (run / "conversations.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and {line["arm"] for line in lines} == {"rosa2"}
    assert "test/acc@5" in out and "test/parameter_shift" in out


def test_plain_lightning_trainer_runs_the_module(task: AmbiguousOpsTask, tmp_path) -> None:
    """No Hydra: ``Trainer(inference_mode=False).test`` plays the conversations; Lightning's default inference mode is
    refused with the setting to change."""
    import csv

    import lightning.pytorch as pl

    from zoo.datamodules import EpisodeDataModule

    def trainer(inference_mode: bool) -> pl.Trainer:
        return pl.Trainer(
            accelerator="cpu",
            inference_mode=inference_mode,
            logger=pl.loggers.CSVLogger(tmp_path, name="csv"),
            enable_progress_bar=False,
            enable_model_summary=False,
        )

    module = make_module(task)
    module.records_dir = str(tmp_path)
    results = trainer(False).test(module, EpisodeDataModule(episodes=3, batch_size=2), verbose=False)
    assert 0.0 <= results[0]["test/acc@1"] <= results[0]["test/acc@5"] <= 1.0
    assert len((tmp_path / "conversations.jsonl").read_text().splitlines()) == 3
    with next(tmp_path.rglob("metrics.csv")).open() as handle:
        unchanged = [row["test/base_unchanged"] for row in csv.DictReader(handle) if row.get("test/base_unchanged")]
    assert unchanged == ["1.0"]
    with pytest.raises(ConfigError, match="inference_mode=false"):
        trainer(True).test(make_module(task), EpisodeDataModule(episodes=1), verbose=False)
