"""Datamodules: completion-only labels, prompt columns, JSONL errors naming file/line/field, resume sampler."""

import json

import pytest

from zoo.backbones import build_char_tokenizer
from zoo.data.samplers import ResumableSampler
from zoo.data.sources import JsonlSource, TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from zoo.errors import ConfigError, DataError


@pytest.fixture
def tok():
    return build_char_tokenizer()


def test_sft_labels_cover_exactly_the_completion_and_eos(tok):
    dm = SFTDataModule(tok, TaskSource(Addition(2), num_train=64, num_val=8), batch_size=4)
    batch = next(iter(dm.val_dataloader()))
    for i in range(4):
        labels = batch["labels"][i]
        ids = batch["input_ids"][i]
        kept = ids[labels != -100].tolist()
        text = tok.decode(kept[:-1])
        assert kept[-1] == tok.eos_token_id
        assert text.startswith("<think>") and text.endswith(batch["answers"][i])
        assert (
            tok.decode(batch["prompt_ids"][i][batch["prompt_attention_mask"][i].bool()].tolist()[1:])
            == batch["prompts"][i]
        )
    assert batch["prompt_attention_mask"][:, -1].all()  # left-padded prompts end with a real token


def test_prompts_columns_reach_the_batch(tok, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "level": i}) for i in range(6)))
    dm = PromptDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)), batch_size=3, shuffle=False)
    batch = next(iter(dm.train_dataloader()))
    assert batch["prompts"] == ["0+1=", "1+1=", "2+1="]
    assert batch["columns"]["answer"] == ["1", "2", "3"]
    assert batch["columns"]["level"] == [0, 1, 2]


def test_jsonl_num_train_keeps_the_first_train_rows_only(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(6)))
    source = JsonlSource(train_path=str(path), val_path=str(path), num_train=4)
    assert [r["prompt"] for r in source.rows("train")] == ["0+1=", "1+1=", "2+1=", "3+1="]
    assert len(source.rows("val")) == 6  # evaluation files are never cut
    assert len(JsonlSource(train_path=str(path), num_train=100).rows("train")) == 6
    with pytest.raises(ConfigError, match="num_train"):
        JsonlSource(train_path=str(path), num_train=0)


def test_sft_columns_carry_the_other_fields_of_the_rows(tok, tmp_path):
    """Evaluation callbacks read row labels from the batch (e.g. SafeThinkMonitor's attack_column)."""
    path = tmp_path / "s.jsonl"
    rows = [{"prompt": f"{i}+1=", "completion": str(i + 1), "trigger": i % 2 == 0, "level": i} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    dm = SFTDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)), batch_size=3)
    batch = next(iter(dm.val_dataloader()))
    assert batch["columns"] == {"trigger": [True, False, True], "level": [0, 1, 2]}


def test_long_prompt_is_an_error_naming_the_row(tok, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x" * 50}) + "\n")
    dm = PromptDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)), max_prompt_length=10)
    with pytest.raises(DataError, match="train row 0: prompt has 51 tokens"):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n', r"bad\.jsonl:2: missing field 'completion'"),
        ('{"prompt": "a", "completion": "b"}\nnot json\n', r"bad\.jsonl:2: not valid JSON"),
        ('{"prompt": 3, "completion": "b"}\n', r"bad\.jsonl:1: field 'prompt' must be a string"),
        ("[1, 2]\n", r"bad\.jsonl:1: expected a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_line_and_field(tok, tmp_path, content, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    dm = SFTDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)))
    with pytest.raises(DataError, match=expected):
        dm.setup("fit")


def test_preferences_batch(tok, tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps({"prompt": "q=", "chosen": "good", "rejected": "bad!"}) + "\n")
    dm = PreferenceDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)), batch_size=1)
    batch = next(iter(dm.val_dataloader()))
    assert (batch["chosen_labels"] != -100).sum() == len("good") + 1
    assert (batch["rejected_labels"] != -100).sum() == len("bad!") + 1


def test_resumable_sampler_skips_exactly_the_consumed_items():
    full = ResumableSampler(20, seed=1)
    full.set_epoch(2)
    order = list(full)
    resumed = ResumableSampler(20, seed=1)
    resumed.resume_at(2, 7)
    resumed.set_epoch(2)
    assert list(resumed) == order[7:]
    assert list(resumed) == order  # the skip applies once
    other_epoch = ResumableSampler(20, seed=1)
    other_epoch.set_epoch(3)
    assert list(other_epoch) != order


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("1<unk>2", "a model sampled its unknown-token id"),  # generated rows: the model wrote the id itself
        ("1é2", "the tokenizer has no token for 'é'"),  # text the tokenizer cannot represent
    ],
)
def test_unknown_tokens_are_explained_by_where_they_come_from(tok, tmp_path, caplog, completion, expected):
    path = tmp_path / "r.jsonl"
    rows = [{"prompt": f"{i}+1=", "completion": completion} for i in range(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    dm = SFTDataModule(tok, JsonlSource(train_path=str(path), val_path=str(path)), batch_size=2)
    with caplog.at_level("WARNING", logger="zoo"):
        dm.setup("fit")
    assert expected in caplog.text
    assert ("clean the data" in caplog.text) == ("é" in completion)
