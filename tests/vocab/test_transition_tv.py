"""TransitionTV (TV of a model's successor distributions to the Markov chain's true rows), its cores in
zoo.data.markov, and ForgettingMonitor's reversibility check (check_removal), on the real tiny Llama."""

from __future__ import annotations

import random

import lightning.pytorch as pl
import pytest
import torch
from vocab_helpers import SMALL_LLAMA

from zoo.backbones import TinyBackbone
from zoo.callbacks import ForgettingMonitor, TransitionTV
from zoo.data.markov import STATE_ALPHABET, MarkovChainTask, state_token_ids, transition_tv
from zoo.errors import ConfigError
from zoo.vocab import extend_vocabulary, register_new_tokens

from conftest import plain_trainer

torch.set_num_threads(1)


def test_transition_tv_by_hand():
    state_ids = [5, 7]
    probs = torch.zeros(3, 10, dtype=torch.float64)
    probs[0, 5] = 1.0  # all on state 0
    probs[1, 5] = probs[1, 7] = 0.5  # exactly the row
    probs[2, 9] = 1.0  # all on a token that is not a state
    rows = torch.tensor([[0.5, 0.5]] * 3, dtype=torch.float64)
    assert transition_tv(probs, rows, state_ids).tolist() == pytest.approx([0.5, 0.0, 1.0])
    with pytest.raises(ValueError, match="state ids"):
        transition_tv(probs, rows, [5])


def test_state_token_ids_of_the_char_tokenizer():
    tokenizer = TinyBackbone(**SMALL_LLAMA).tokenizer
    ids = state_token_ids(tokenizer, 64)
    assert len(set(ids)) == 64
    assert [tokenizer.convert_ids_to_tokens(i) for i in ids] == list(STATE_ALPHABET[:64])


def test_successor_contexts_end_in_the_token_whose_row_they_carry():
    task = MarkovChainTask(num_new_tokens=3, dictionary_size=2, length=12, prompt_length=2)
    rng = random.Random(0)
    for j in range(3):
        text, row = task.successor_context(rng, j)
        assert text.endswith(task.new_tokens[j]) and torch.equal(row, task.new.rows[j])
        assert 2 <= len(text) - len(task.new_tokens[j]) <= 10
    text, row = task.successor_context(rng)
    assert torch.equal(row, task.chain.transition[STATE_ALPHABET.index(text[-1])])


class ExtendedLM(pl.LightningModule):
    """The tiny Llama with the task's new tokens in ``dictionary`` mode (s = 1: a new token copies its dictionary
    token) and, with ``train_all``, full fine-tuning of every weight instead of the new rows only."""

    def __init__(self, task: MarkovChainTask, train_all: bool = False) -> None:
        super().__init__()
        backbone = TinyBackbone(**SMALL_LLAMA)
        self.tokenizer = backbone.tokenizer
        self.model = backbone.build_model()
        dictionaries = [[self.tokenizer.convert_tokens_to_ids(c) for c in d] for d in task.dictionaries]
        self.vocab_extension = extend_vocabulary(self.model, task.num_new_tokens, dictionaries, mode="dictionary")
        register_new_tokens(self.tokenizer, task.new_tokens, first_id=self.vocab_extension.first_new_id)
        if not train_all:
            self.vocab_extension.freeze_base()
        self.train_all = train_all

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.model(input_ids=batch).logits[:, :-1]
        targets = batch[:, 1:].masked_fill(batch[:, 1:] >= logits.shape[-1], -100)  # new tokens are not emitted
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = self.model.parameters() if self.train_all else self.vocab_extension.parameters()
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-2, weight_decay=0.1)


def test_a_one_token_dictionary_scores_like_its_dictionary_token():
    task = MarkovChainTask(num_new_tokens=2, dictionary_size=1, length=12, prompt_length=2)
    module = ExtendedLM(task).eval()
    callback = TransitionTV(task, contexts_per_token=5, old_contexts=4, seed=3, batch_size=3)
    metrics, records = callback.measure(module)
    # the same contexts with each new token replaced by its one dictionary character, scored by hand one at a time
    rng = random.Random(3)
    state_ids = state_token_ids(module.tokenizer, task.num_states)
    for j, record in enumerate(records):
        tvs = []
        for _ in range(5):
            text, row = task.successor_context(rng, j)
            copy = text[: -len(task.new_tokens[j])] + task.dictionaries[j][0]
            ids = torch.tensor(
                [[module.tokenizer.bos_token_id, *module.tokenizer(copy, add_special_tokens=False)["input_ids"]]]
            )
            with torch.no_grad():
                probs = torch.softmax(module.model(input_ids=ids).logits[:, -1].double(), -1)
            assert torch.allclose(row, task.chain.transition[STATE_ALPHABET.index(task.dictionaries[j][0])])
            tvs.append(float(transition_tv(probs, row[None], state_ids)))
        assert record["tv"] == pytest.approx(sum(tvs) / 5, abs=1e-5)
        assert record["dictionary"] == task.dictionaries[j]
    assert metrics["new_tv"] == pytest.approx(sum(r["tv"] for r in records) / 2, abs=1e-9)
    assert 0.0 <= metrics["old_tv"] <= 1.0


def loader(module: ExtendedLM, task: MarkovChainTask) -> torch.utils.data.DataLoader:
    rng = random.Random(1)
    rows = []
    for r in range(8):
        example = task.new_token_example(rng, r % task.num_new_tokens)
        rows.append(module.tokenizer(example.prompt + example.completion, add_special_tokens=False)["input_ids"])
    width = min(len(r) for r in rows)
    return torch.utils.data.DataLoader(torch.tensor([r[:width] for r in rows]), batch_size=4)


def fit(tmp_path, module: ExtendedLM, task: MarkovChainTask, callbacks: list) -> pl.Trainer:
    trainer = plain_trainer(callbacks, max_steps=4, num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, loader(module, task), loader(module, task))
    return trainer


@pytest.mark.parametrize("train_all", [False, True])
def test_removal_restores_the_base_only_when_only_new_rows_trained(tmp_path, train_all):
    task = MarkovChainTask(num_new_tokens=2, dictionary_size=3, length=12, prompt_length=2)
    module = ExtendedLM(task, train_all=train_all)
    monitor = ForgettingMonitor(texts=["0123", "abcABC"], check_removal=True)
    tv = TransitionTV(task, contexts_per_token=2, old_contexts=2)
    trainer = fit(tmp_path, module, task, [monitor, tv])
    diffs = [monitor.last["removed_max_abs_param_diff"], monitor.last["removed_max_abs_logit_diff"]]
    if train_all:
        assert all(d > 0 for d in diffs)
    else:
        assert diffs == [0.0, 0.0] and monitor.last["max_abs_logit_diff"] == 0.0
    assert module.vocab_extension.attached  # spliced back after the check
    assert set(trainer.callback_metrics) >= {"transition_tv/new_tv", "forgetting/removed_max_abs_param_diff"}
    assert float(trainer.callback_metrics["transition_tv/new_tv"]) == pytest.approx(tv.last["new_tv"])


def test_bad_setups_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="Markov task"):
        TransitionTV(object())
    task = MarkovChainTask(num_new_tokens=2, dictionary_size=1, length=12, prompt_length=2)
    with pytest.raises(ConfigError, match="contexts_per_token"):
        TransitionTV(task, contexts_per_token=0)
    plain = ExtendedLM(task)
    plain.tokenizer = TinyBackbone(**SMALL_LLAMA).tokenizer  # a tokenizer without the new tokens
    with pytest.raises(ConfigError, match="new tokens"):
        TransitionTV(task).setup(None, plain, "fit")
    no_extension = pl.LightningModule()
    no_extension.model, no_extension.tokenizer = plain.model, plain.tokenizer
    with pytest.raises(ConfigError, match="vocab_extension"):
        ForgettingMonitor(texts=["ab"], check_removal=True).setup(None, no_extension, "fit")
