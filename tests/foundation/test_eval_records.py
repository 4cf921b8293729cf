"""EvalRecords: per-row records of a generating module's evaluation, in the app and in a plain Lightning script."""

from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from zoo.backbones import TinyBackbone
from zoo.callbacks import EvalRecords
from zoo.callbacks.eval_records import read_records
from zoo.cli.train import run
from zoo.data.tasks import Addition
from zoo.errors import ConfigError

from conftest import plain_trainer


def test_records_of_the_app_agree_with_the_logged_exact_match(train_cfg, tmp_path):
    path = tmp_path / "run" / "eval_records.jsonl"
    cfg = train_cfg(
        [
            "stage=test",
            "datamodule.source.num_train=8",
            "datamodule.source.num_test=24",
            "datamodule.eval_batch_size=16",
            "module.generation.max_new_tokens=12",
            "+callbacks.eval_records._target_=zoo.callbacks.EvalRecords",
            f"+callbacks.eval_records.path={path}",
            "+callbacks.eval_records.stages=[test]",
            "+callbacks.eval_records.batch_fields=[prompt_ids]",
        ]
    )
    metrics = run(cfg)
    rows = read_records(path)
    assert len(rows) == 24  # two batches (16 + 8), one line per row
    assert {r["stage"] for r in rows} == {"test"}
    assert metrics["test/exact_match"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
    assert all(r["correct"] == Addition().verify(r["completion"], r["answer"]) for r in rows)
    # each row's prompt, answer and prompt ids belong together (an untrained model answers nothing correctly, so
    # the alignment is checked against the task itself)
    assert all(str(eval(r["prompt"].rstrip("="))) == r["answer"] for r in rows)
    tokenizer = TinyBackbone().tokenizer
    assert all(tokenizer.decode(r["prompt_ids"], skip_special_tokens=True) == r["prompt"] for r in rows)


class Echo(pl.LightningModule):
    """Test double of a generating module: its "completion" is the prompt reversed (no model needed to test the
    callback's bookkeeping)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def _eval(self, batch):
        texts = [p[::-1] for p in batch["prompts"]]
        correct = [t == p for t, p in zip(texts, batch["prompts"])]
        return {"texts": texts, "meta": {"prompts": batch["prompts"], "correct": correct}}

    def validation_step(self, batch, idx):
        return self._eval(batch)

    def test_step(self, batch, idx):
        return self._eval(batch)

    def predict_step(self, batch, idx):
        return self._eval(batch)


def loader():
    rows = ["aba", "ab", "xyx", "q"]
    return DataLoader(
        rows,
        batch_size=3,
        collate_fn=lambda b: {"prompts": b, "columns": {"size": torch.tensor([len(p) for p in b])}},
    )


def test_plain_lightning_records_every_row_with_batch_fields(tmp_path):
    cb = EvalRecords(str(tmp_path / "r.jsonl"), batch_fields=["size"])
    tr = plain_trainer([cb])
    tr.validate(Echo(), loader(), verbose=False)
    tr.predict(Echo(), loader())
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["prompt"], r["completion"], r["correct"], r["size"]) for r in rows[:4]] == [
        ("validate", "aba", "aba", True, 3),
        ("validate", "ab", "ba", False, 2),
        ("validate", "xyx", "xyx", True, 3),
        ("validate", "q", "q", True, 1),
    ]
    assert [r["stage"] for r in rows[4:]] == ["predict"] * 4
    assert read_records(tmp_path / "r.jsonl", "predict") == rows[4:]
    assert cb.written == 8


def test_other_ranks_write_their_own_file(tmp_path):
    from zoo.callbacks.evaluation import append_jsonl

    assert append_jsonl(tmp_path / "r.jsonl", [{"a": 1}], rank=0) == tmp_path / "r.jsonl"
    other = append_jsonl(tmp_path / "r.jsonl", [{"a": 2}, {"a": 3}], rank=2)
    assert other == tmp_path / "r.rank2.jsonl"
    assert [r["a"] for r in read_records(other)] == [2, 3] and [r["a"] for r in read_records(tmp_path / "r.jsonl")] == [
        1
    ]


def test_stages_and_max_batches_limit_what_is_written(tmp_path):
    cb = EvalRecords(str(tmp_path / "r.jsonl"), stages=["test"], max_batches=1)
    tr = plain_trainer([cb])
    tr.validate(Echo(), loader(), verbose=False)
    assert not (tmp_path / "r.jsonl").exists()
    tr.test(Echo(), loader(), verbose=False)
    assert [r["prompt"] for r in read_records(tmp_path / "r.jsonl")] == ["aba", "ab", "xyx"]


def test_bad_settings_and_missing_fields_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="stages"):
        EvalRecords(str(tmp_path / "r.jsonl"), stages=["fit"])
    with pytest.raises(ConfigError, match="path"):
        EvalRecords("")
    with pytest.raises(ConfigError, match="batch_fields asks for 'nope'"):
        plain_trainer([EvalRecords(str(tmp_path / "r.jsonl"), batch_fields=["nope"])]).validate(
            Echo(), loader(), verbose=False
        )
