"""ForgettingMonitor from a plain Lightning script (no Hydra, no zoo module), its state round trip (the reference
survives a resume), hand-computed metrics of the core, and its errors."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from vocab_helpers import SMALL_LLAMA

from zoo.backbones import TinyBackbone
from zoo.callbacks import ForgettingMonitor
from zoo.errors import ConfigError, DataError
from zoo.vocab import extend_vocabulary, forgetting_metrics

torch.set_num_threads(1)
TEXTS = ["hello world", "the cat sat", "abcabc", "zyx"]


class PlainLM(pl.LightningModule):
    """A user's own module: a Hugging Face model and its tokenizer, full fine-tuning on fixed texts."""

    def __init__(self, extend: bool = False) -> None:
        super().__init__()
        backbone = TinyBackbone(**SMALL_LLAMA)
        self.tokenizer = backbone.tokenizer
        self.model = backbone.build_model()
        self.vocab_extension = extend_vocabulary(self.model, 1) if extend else None

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.model(input_ids=batch).logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader() -> torch.utils.data.DataLoader:
    data = torch.randint(10, 90, (8, 12), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(data, batch_size=4)


def trainer(tmp_path, monitor: ForgettingMonitor, **kwargs) -> pl.Trainer:
    return pl.Trainer(
        max_epochs=kwargs.pop("max_epochs", 1),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
        default_root_dir=tmp_path,
        **kwargs,
    )


def test_monitor_in_a_plain_lightning_script_sees_full_fine_tuning_forget(tmp_path):
    module = PlainLM()
    monitor = ForgettingMonitor(texts=TEXTS)
    trainer(tmp_path, monitor).fit(module, loader(), loader())
    assert monitor.reference.shape[:2] == monitor.input_ids.shape and monitor.old_vocab_size == len(module.tokenizer)
    assert monitor.last["max_abs_logit_diff"] > 0 and monitor.last["kl_mean"] > 0
    assert monitor.last["new_token_mass"] == 0  # no new output rows
    assert float(module.trainer.callback_metrics["forgetting/kl_max"]) == pytest.approx(monitor.last["kl_max"])


def test_reference_is_taken_once_and_survives_a_resume(tmp_path):
    module = PlainLM()
    monitor = ForgettingMonitor(texts=TEXTS)
    first = trainer(tmp_path, monitor, enable_checkpointing=True)
    first.fit(module, loader(), loader())
    reference = monitor.reference.clone()
    checkpoint = tmp_path / "one_epoch.ckpt"
    first.save_checkpoint(checkpoint)

    resumed = ForgettingMonitor(texts=TEXTS)
    trainer(tmp_path, resumed, max_epochs=2).fit(PlainLM(), loader(), loader(), ckpt_path=checkpoint)
    # the restored reference is the model before any training, not the checkpoint's model
    assert torch.equal(resumed.reference, reference)
    assert resumed.last["max_abs_logit_diff"] > monitor.last["max_abs_logit_diff"] > 0
    state = resumed.state_dict()
    other = ForgettingMonitor(texts=TEXTS)
    other.load_state_dict(state)
    assert torch.equal(other.reference, reference) and other.old_vocab_size == state["old_vocab_size"]


def test_validate_without_a_reference_logs_nothing_and_warns(tmp_path):
    monitor = ForgettingMonitor(texts=TEXTS)
    with pytest.warns(UserWarning, match="no reference logits"):
        trainer(tmp_path, monitor).validate(PlainLM(), loader())
    assert monitor.last == {}


def test_contexts_with_new_tokens_are_refused(tmp_path):
    module = PlainLM(extend=True)
    new_token = module.vocab_extension.new_token_ids[0]
    module.tokenizer.add_tokens(["<new>"])
    assert module.tokenizer.convert_tokens_to_ids("<new>") == new_token
    monitor = ForgettingMonitor(texts=["ab<new>c"])
    with pytest.raises(DataError, match=r"context 0 contains a new token \(id >= \d+\)"):
        trainer(tmp_path, monitor).fit(module, loader(), loader())


def test_module_and_argument_errors(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of"):
        ForgettingMonitor()
    with pytest.raises(ConfigError, match="texts is empty"):
        ForgettingMonitor(texts=[])

    monitor = ForgettingMonitor(texts=TEXTS)
    with pytest.raises(ConfigError, match="needs a module with `model`"):
        monitor.setup(trainer(tmp_path, monitor), pl.LightningModule(), "fit")


def test_forgetting_metrics_by_hand():
    reference = torch.tensor([[[0.0, 0.0]]])
    same = forgetting_metrics(reference, reference.clone())
    assert all(float(v) == 0.0 for v in same.values())
    # one new column with logit 0: p = (1/3, 1/3, 1/3); KL((1/2, 1/2) || (1/3, 1/3)) = log(3/2)
    grown = forgetting_metrics(reference, torch.tensor([[[0.0, 0.0, 0.0]]]))
    assert float(grown["kl_mean"]) == pytest.approx(math.log(1.5))
    assert float(grown["new_token_mass"]) == pytest.approx(1 / 3)
    assert float(grown["max_abs_logit_diff"]) == 0.0
    moved = forgetting_metrics(torch.zeros(1, 2, 2), torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0]]]))
    # p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 log(2/3) + 1/2 log(2); the second position is unchanged
    assert float(moved["kl_max"]) == pytest.approx(0.5 * math.log(2 / 3) + 0.5 * math.log(2))
    assert float(moved["kl_mean"]) == pytest.approx(float(moved["kl_max"]) / 2)
    assert float(moved["max_abs_logit_diff"]) == pytest.approx(math.log(3.0))
    masked = forgetting_metrics(torch.zeros(1, 2, 2), torch.tensor([[[9.0, 0.0], [0.0, 0.0]]]), torch.tensor([[0, 1]]))
    assert float(masked["max_abs_logit_diff"]) == 0.0  # the changed position is not compared
