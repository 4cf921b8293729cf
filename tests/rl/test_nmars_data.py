"""N-MARS data pipeline: the resumable offline writer, the data stage through the app (+method=nmars_data: sampled
deviations and the random-error baseline), pre-tokenized rows with loss masks in the SFT datamodule, and the
tokenizer checks."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.cli.train import run
from zoo.data.offline import ResumableJsonlWriter
from zoo.data.sources import JsonlSource, TaskSource
from zoo.data.tasks import Addition
from zoo.data.undo import augmented_row, error_token_pool, undo_vocabulary
from zoo.datamodules import PromptDataModule, SFTDataModule
from zoo.encoding import tokenizer_fingerprint
from zoo.errors import DataError
from zoo.generation.undo import UNDO_TOKEN, resolve_undo
from zoo.modules import VocabExtendModule

# a tiny random policy (no base-policy build): its samples deviate a lot, which is what the stage must handle
FAST_DATA = [
    "+method=nmars_data",
    "backbone.init_from=null",
    "datamodule.source.num_train=16",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.eval_batch_size=6",
    "module.generation.max_new_tokens=16",
    "module.max_undos_per_row=null",
]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the resumable writer -----------------------------------------------------------------------------------------
def test_writer_resumes_after_an_interruption_without_duplicates_or_cut_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    batches = {b: [{"batch": b, "i": i} for i in range(3)] for b in range(4)}
    uninterrupted = ResumableJsonlWriter(tmp_path / "full.jsonl", {"seed": 1})
    assert uninterrupted.open() == set()
    for b, rows in batches.items():
        uninterrupted.write_batch(b, rows)

    writer = ResumableJsonlWriter(path, {"seed": 1})
    writer.open()
    writer.write_batch(0, batches[0])
    writer.write_batch(1, batches[1])
    # killed while writing batch 2: two whole rows and a cut line reached the file, its progress line did not
    with path.open("a") as handle:
        handle.write(json.dumps(batches[2][0]) + "\n" + json.dumps(batches[2][1]) + "\n" + '{"batch": 2, "i"')
    resumed = ResumableJsonlWriter(path, {"seed": 1})
    assert resumed.open() == {0, 1}
    assert len(read_rows(path)) == 6  # cut back to the end of batch 1
    resumed.write_batch(1, batches[1])  # already on disk: not written twice
    for b in (2, 3):
        resumed.write_batch(b, batches[b])
    assert path.read_text() == (tmp_path / "full.jsonl").read_text()
    assert resumed.num_rows == 12


def test_writer_ignores_a_cut_progress_line_and_refuses_another_spec(tmp_path):
    path = tmp_path / "rows.jsonl"
    writer = ResumableJsonlWriter(path, {"seed": 1, "task": "a"})
    writer.open()
    writer.write_batch(0, [{"x": 1}])
    writer.write_batch(1, [{"x": 2}])
    progress = writer.progress_path.read_text()
    writer.progress_path.write_text(progress[:-5])  # the last progress line was cut
    assert ResumableJsonlWriter(path, {"seed": 1, "task": "a"}).open() == {0}
    assert read_rows(path) == [{"x": 1}]
    with pytest.raises(DataError, match=r"another configuration \(differs in \['task'\]\)"):
        ResumableJsonlWriter(path, {"seed": 1, "task": "b"}).open()
    path.write_text("")
    with pytest.raises(DataError, match="truncated or edited"):
        ResumableJsonlWriter(path, {"seed": 1, "task": "a"}).open()


# -- rows and the SFT datamodule ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rows_and_tokenizer():
    """Augmented rows of a few addition examples (one sampled-deviation row each, one random row each), made with the
    char tokenizer for a model of ``len(tokenizer)`` rows (where <UNDO> will be registered)."""
    tok = build_char_tokenizer()
    vocabulary = undo_vocabulary(tok, len(tok))
    examples = Addition(2).examples(6, seed=3)
    rows = []
    for i, ex in enumerate(examples):
        reference = list(tok(ex.completion, add_special_tokens=False)["input_ids"])
        sample = reference[:4] + [tok.convert_tokens_to_ids("x")] + reference[6:]  # one wrong char, one dropped
        common = {"prompt": ex.prompt, "answer": ex.answer, "reference": ex.completion}
        rows.append(augmented_row(tok, vocabulary, key=f"s{i}", deviation="sample", sample_ids=sample, **common))
        rows.append(
            augmented_row(
                tok, vocabulary, key=f"r{i}", deviation="random", rng=random.Random(i),
                error_ids=error_token_pool(tok), num_errors=2, **common,
            )
        )  # fmt: skip
    return tok, vocabulary, rows


def test_rows_resolve_to_the_reference_and_name_their_tokenizer(rows_and_tokenizer):
    tok, vocabulary, rows = rows_and_tokenizer
    assert vocabulary.undo_id == len(tok)  # the id the vocabulary extension will give <UNDO>
    for row in rows:
        ids, mask = row["completion_ids"], row["loss_mask"]
        assert ids[-1] == tok.eos_token_id and mask[-1]
        content = ids[:-1]
        assert resolve_undo(content, vocabulary.undo_id) == list(
            tok(row["reference"], add_special_tokens=False)["input_ids"]
        )
        assert mask.count(False) == row["num_undos"] == content.count(vocabulary.undo_id) > 0
        assert row["completion"].count(UNDO_TOKEN) == row["num_undos"]
    # the fingerprint is that of the tokenizer once <UNDO> is registered, as the SFT stage registers it
    module = VocabExtendModule(TinyBackbone(), new_tokens=[UNDO_TOKEN], output_rows=True, tuning="full")
    assert module.new_token_ids == [vocabulary.undo_id]
    assert tokenizer_fingerprint(module.tokenizer) == vocabulary.fingerprint != tokenizer_fingerprint(tok)


def _write(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _extended_tokenizer():
    module = VocabExtendModule(TinyBackbone(), new_tokens=[UNDO_TOKEN], output_rows=True, tuning="full")
    return module.tokenizer


@pytest.mark.parametrize("use_loss_mask", [True, False])
def test_sft_labels_follow_the_loss_mask(rows_and_tokenizer, tmp_path, use_loss_mask):
    _, vocabulary, rows = rows_and_tokenizer
    path = _write(tmp_path, rows)
    dm = SFTDataModule(
        _extended_tokenizer(), JsonlSource(path, path), batch_size=4, shuffle=False, use_loss_mask=use_loss_mask
    )
    batch = next(iter(dm.val_dataloader()))
    for i in range(4):
        row = rows[i]
        prompt_len = int(batch["prompt_attention_mask"][i].sum())
        n = len(row["completion_ids"])
        assert batch["input_ids"][i, prompt_len : prompt_len + n].tolist() == row["completion_ids"]
        labels = batch["labels"][i, prompt_len : prompt_len + n].tolist()
        out = batch["masked_out_labels"][i, prompt_len : prompt_len + n].tolist()
        for token, keep, label, excluded in zip(row["completion_ids"], row["loss_mask"], labels, out):
            assert label == (token if keep or not use_loss_mask else -100)
            assert excluded == (-100 if keep else token)
        assert (batch["labels"][i, :prompt_len] == -100).all()
        assert batch["answers"][i] == row["answer"]


def test_rows_of_another_tokenizer_and_bad_masks_are_refused(rows_and_tokenizer, tmp_path):
    tok, _, rows = rows_and_tokenizer
    path = _write(tmp_path, rows[:2])
    # the plain tokenizer (no <UNDO>) is not the one the ids were made for
    with pytest.raises(DataError, match="made with another tokenizer"):
        SFTDataModule(tok, JsonlSource(path, path)).dataset("train")
    other = build_char_tokenizer(["<extra>"])
    with pytest.raises(DataError, match="made with another tokenizer"):
        SFTDataModule(other, JsonlSource(path, path)).dataset("train")
    bad = dict(rows[0], loss_mask=rows[0]["loss_mask"][:-1])
    path = _write(tmp_path, [bad])
    with pytest.raises(DataError, match="'loss_mask' must be a list of"):
        SFTDataModule(_extended_tokenizer(), JsonlSource(path, path)).dataset("train")
    bad = dict(rows[0], completion_ids=[10**6])
    path = _write(tmp_path, [bad])
    with pytest.raises(DataError, match="'completion_ids' must be a non-empty list of token ids"):
        SFTDataModule(_extended_tokenizer(), JsonlSource(path, path)).dataset("train")


def test_prompt_batches_can_carry_the_reference_and_predict_any_split():
    tok = build_char_tokenizer()
    source = TaskSource(Addition(2), num_train=16, num_val=4, num_test=4)
    dm = PromptDataModule(tok, source, batch_size=4, completion_column="reference", predict_split="train")
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    train = source.rows("train")
    assert batch["prompts"] == [r["prompt"] for r in train[:4]]
    assert batch["columns"]["reference"] == [r["completion"] for r in train[:4]]
    assert "reference" not in next(iter(PromptDataModule(tok, source, batch_size=4).val_dataloader()))["columns"]


# -- the data stage through the app --------------------------------------------------------------------------------
def test_data_stage_writes_augmented_rows_and_resumes_exactly(train_cfg, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="zoo"):
        metrics = run(train_cfg(FAST_DATA))
    path = tmp_path / "run" / "export" / "undo_train.jsonl"
    rows = read_rows(path)
    assert len(rows) == 16
    # the stage reports its rows (OfflineRowWriter summary_keys: [num_undos]) like any other stage's metrics
    assert metrics["offline/rows"] == 16
    assert metrics["offline/mean_num_undos"] == pytest.approx(sum(r["num_undos"] for r in rows) / 16)
    assert metrics["offline/nonzero_num_undos"] == pytest.approx(sum(r["num_undos"] > 0 for r in rows) / 16)
    assert "predict: batch 3/3" in caplog.text  # the progress display of offline stages
    tok = build_char_tokenizer()
    undo_id = len(tok)
    for row in rows:
        assert row["deviation"] == "sample" and row["undo_id"] == undo_id
        reference = list(tok(row["reference"], add_special_tokens=False)["input_ids"])
        assert resolve_undo(row["completion_ids"][:-1], undo_id) == reference
        # the kept tokens and errors are the policy's sample: drop corrections, i.e. replay the sample's alignment
        assert row["loss_mask"].count(False) == row["num_undos"]
    assert sum(r["num_undos"] > 0 for r in rows) >= 8, "a random policy deviates on most prompts"
    first = path.read_text()

    resumed = run(train_cfg(FAST_DATA))  # finished: nothing is generated or written again
    assert path.read_text() == first
    assert resumed["offline/rows"] == 0  # rows this run wrote

    # an interruption after batch 0 (progress of batches 1-2 lost, a cut line in the rows file)
    progress = path.with_name(path.name + ".progress")
    lines = progress.read_text().splitlines()
    progress.write_text("\n".join(lines[:2]) + "\n")
    with path.open("a") as handle:
        handle.write('{"key": "cut')
    run(train_cfg(FAST_DATA))
    assert path.read_text() == first  # regenerated batches are the same rows, once each

    other = train_cfg([*FAST_DATA, "module.generation.temperature=0.7"])
    with pytest.raises(DataError, match=r"another configuration \(differs in \['module'\]\)"):
        run(other)  # another temperature is another data set: refused, not appended


def test_random_error_baseline_needs_no_generation(train_cfg, tmp_path):
    run(train_cfg([*FAST_DATA, "module.deviation=random", "module.num_samples=2", "module.num_errors=2"]))
    rows = read_rows(tmp_path / "run" / "export" / "undo_train.jsonl")
    assert len(rows) == 32
    tok = build_char_tokenizer()
    for row in rows:
        assert row["deviation"] == "random" and row["sample"] is None
        assert resolve_undo(row["completion_ids"][:-1], row["undo_id"]) == list(
            tok(row["reference"], add_special_tokens=False)["input_ids"]
        )
        assert 2 <= row["num_undos"] <= 6
