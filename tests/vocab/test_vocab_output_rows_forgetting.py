"""What old-only contexts lose when the new tokens have output rows (issue 43 item 13), measured two ways and checked
against a computation by hand on the real tiny Llama: TransitionTV's ``old_new_mass`` (probability on the new tokens
after old-only contexts) and ``old_tv_change`` (TV to the true old rows minus the base model's), and
ForgettingMonitor's ``new_token_mass`` and ``kl_mean`` (which, with the old logits exact, must equal
``-log(1 - mass)`` position by position). Without output rows, or with the mask, both are exactly 0."""

from __future__ import annotations

import math
import random

import lightning.pytorch as pl
import pytest
import torch
from vocab_helpers import SMALL_LLAMA

from zoo.backbones import TinyBackbone
from zoo.callbacks import ForgettingMonitor, TransitionTV
from zoo.data.markov import MarkovChainTask, state_token_ids, transition_tv
from zoo.vocab import extend_vocabulary, register_new_tokens

torch.set_num_threads(1)

TASK = {"num_new_tokens": 3, "dictionary_size": 2, "length": 12, "prompt_length": 2}
OLD_TEXTS = ["0123", "abcABC", "Zz9y"]


class Extended(pl.LightningModule):
    """The tiny Llama (tied embeddings) with the task's new tokens in ``mode`` (free rows start at the mean of their
    dictionary's rows, so with output rows the new tokens take a share of the mass right away)."""

    def __init__(self, task: MarkovChainTask, output_rows: bool, mode: str = "free") -> None:
        super().__init__()
        backbone = TinyBackbone(**SMALL_LLAMA)
        self.tokenizer = backbone.tokenizer
        self.model = backbone.build_model().eval()
        dictionaries = [[self.tokenizer.convert_tokens_to_ids(c) for c in d] for d in task.dictionaries]
        self.vocab_extension = extend_vocabulary(
            self.model, task.num_new_tokens, dictionaries, mode=mode, output_rows=output_rows
        )
        register_new_tokens(self.tokenizer, task.new_tokens, first_id=self.vocab_extension.first_new_id)
        if output_rows:  # make the new tokens likelier: scale their (tied) rows up
            with torch.no_grad():
                for p in self.vocab_extension.parameters():
                    p.mul_(3.0)


def probs_by_hand(model: torch.nn.Module, tokenizer, text: str) -> torch.Tensor:
    """Next-token probabilities after BOS + text, one context at a time (no padding)."""
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]])
    with torch.no_grad():
        return torch.softmax(model(input_ids=ids).logits[0, -1].double(), -1)


@pytest.mark.parametrize("mode", ["free", "dictionary"])
def test_transition_tv_measures_the_mass_old_contexts_lose_to_output_rows(mode):
    task = MarkovChainTask(**TASK)
    module = Extended(task, output_rows=True, mode=mode)
    callback = TransitionTV(task, contexts_per_token=2, old_contexts=6, seed=5, batch_size=4)
    callback.on_fit_start(None, module)
    metrics, _ = callback.measure(module)

    # the same old-only contexts (drawn after the new-token ones), scored by hand by the base model (a fresh build:
    # the same weights) and by the extended model
    base = TinyBackbone(**SMALL_LLAMA).build_model().eval()
    rng = random.Random(5)
    for j in range(task.num_new_tokens):
        for _ in range(2):
            task.successor_context(rng, j)
    state_ids = state_token_ids(module.tokenizer, task.num_states)
    vocab = module.vocab_extension.first_new_id
    masses, tv_ext, tv_base = [], [], []
    for _ in range(6):
        text, row = task.successor_context(rng)
        p_ext, p_base = probs_by_hand(module.model, module.tokenizer, text), probs_by_hand(base, module.tokenizer, text)
        assert p_ext.shape[0] == vocab + task.num_new_tokens and p_base.shape[0] == vocab
        mass = float(p_ext[vocab:].sum())
        # the old logits are exact, so every old probability shrinks by the same factor 1 - mass
        assert torch.allclose(p_ext[:vocab], p_base * (1.0 - mass), atol=1e-6)
        masses.append(mass)
        tv_ext.append(float(transition_tv(p_ext[None], row[None], state_ids)))
        tv_base.append(float(transition_tv(p_base[None], row[None], state_ids)))
    mass = sum(masses) / 6
    assert mass > 0.01  # the case is not trivial
    assert metrics["old_new_mass"] == pytest.approx(mass, abs=1e-5)
    change = sum(tv_ext) / 6 - sum(tv_base) / 6
    assert metrics["old_tv_start"] == pytest.approx(sum(tv_base) / 6, abs=1e-5)
    assert metrics["old_tv_change"] == pytest.approx(change, abs=1e-5)
    assert 0.0 < metrics["old_tv_change"] <= metrics["old_new_mass"] + 1e-9  # TV moves by at most the lost mass
    assert metrics["new_tv_start"] == pytest.approx(metrics["new_tv"])  # nothing trained between the two


def test_forgetting_monitor_kl_is_minus_log_of_the_mass_left_to_old_tokens():
    task = MarkovChainTask(**TASK)
    module = Extended(task, output_rows=True)
    raw = ForgettingMonitor(texts=OLD_TEXTS)
    masked = ForgettingMonitor(texts=OLD_TEXTS, mask_new_logits=True, log_prefix="masked")
    for monitor in (raw, masked):
        monitor.setup(None, module, "fit")
    # the reference is the base model's logits (the extension removed), as at fit start of a new-rows run
    module.vocab_extension.remove()
    for monitor in (raw, masked):
        monitor.old_vocab_size = module.vocab_extension.first_new_id
        monitor.reference = monitor._logits(module).clone()
    module.vocab_extension.attach()
    values, zero = raw.measure(module), masked.measure(module)

    vocab = module.vocab_extension.first_new_id
    per_position = []
    for text in OLD_TEXTS:
        ids = torch.tensor(
            [[module.tokenizer.bos_token_id, *module.tokenizer(text, add_special_tokens=False)["input_ids"]]]
        )
        with torch.no_grad():
            probs = torch.softmax(module.model(input_ids=ids).logits[0].double(), -1)
        per_position += probs[:, vocab:].sum(-1).tolist()
    mass = sum(per_position) / len(per_position)
    kl = sum(-math.log1p(-q) for q in per_position) / len(per_position)
    assert mass > 0.01
    assert values["max_abs_logit_diff"] == 0.0
    assert values["new_token_mass"] == pytest.approx(mass, rel=1e-5)
    assert values["kl_mean"] == pytest.approx(kl, rel=1e-4)
    assert values["kl_max"] == pytest.approx(max(-math.log1p(-q) for q in per_position), rel=1e-4)
    # the mask restores the base model's distribution on old-only contexts exactly
    assert zero["max_abs_logit_diff"] == 0.0 and zero["kl_mean"] == 0.0 and zero["new_token_mass"] == 0.0


def test_without_output_rows_old_contexts_lose_nothing():
    task = MarkovChainTask(**TASK)
    module = Extended(task, output_rows=False)
    callback = TransitionTV(task, contexts_per_token=2, old_contexts=6, seed=5, batch_size=4)
    callback.on_fit_start(None, module)
    metrics, _ = callback.measure(module)
    assert metrics["old_new_mass"] == 0.0 and metrics["old_tv_change"] == 0.0
    assert metrics["old_tv"] == metrics["old_tv_start"]


def test_the_untrained_reference_survives_a_resume():
    task = MarkovChainTask(**TASK)
    module = Extended(task, output_rows=True)
    callback = TransitionTV(task, contexts_per_token=2, old_contexts=4, seed=5)
    callback.on_fit_start(None, module)
    restored = TransitionTV(task, contexts_per_token=2, old_contexts=4, seed=5)
    restored.load_state_dict(callback.state_dict())
    with torch.no_grad():  # training moved the new rows after the reference was taken
        for p in module.vocab_extension.parameters():
            p.add_(0.5)
    restored.on_fit_start(None, module)  # a resumed fit keeps the reference it restored
    assert restored.start == callback.start
    assert restored.measure(module)[0]["new_tv_start"] == callback.start["new_tv_start"]
    assert TransitionTV(task, seed=1).state_key != TransitionTV(task, seed=2).state_key
