"""Local Hugging Face datasets in every datamodule that reads the user's data (zoo.data.sources.read_rows): a
``save_to_disk`` directory (Dataset or DatasetDict), parquet/json/csv files, with a column mapping and TRL's
conversational formats rendered by the tokenizer's chat template; a missing column is one message naming the file,
the column and the option. The datasets are small ones written by the tests; nothing is downloaded."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from zoo.backbones import build_char_tokenizer
from zoo.cli.train import run
from zoo.data.sources import JsonlSource, read_rows
from zoo.datamodules import PreferenceDataModule, PromptDataModule, SFTDataModule
from zoo.errors import DataError

datasets = pytest.importorskip("datasets")

# the user's column names (mapped to the zoo's prompt/completion with datamodule.source.columns)
QA = [{"question": f"{i}+{i}=", "response": f"<think></think>{2 * i}", "level": i % 3} for i in range(12)]
MAPPING = {"prompt": "question", "completion": "response"}
# a chat template unlike the zoo's turn markers, written with the characters of the char tokenizer
TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}### assistant: {% endif %}"
)


def write(rows: list[dict], fmt: str, directory: Path) -> Path:
    """``rows`` as a dataset in format ``fmt`` under ``directory``; returns the path a source is given."""
    data = datasets.Dataset.from_list(rows)
    if fmt == "save_to_disk":
        data.save_to_disk(directory / "ds")
        return directory / "ds"
    if fmt == "dataset_dict":  # a validation split the zoo's val reads
        datasets.DatasetDict(train=data, validation=data.select(range(4))).save_to_disk(directory / "dd")
        return directory / "dd"
    if fmt == "jsonl":
        path = directory / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    path = directory / f"rows.{fmt}"
    {"parquet": data.to_parquet, "json": data.to_json, "csv": data.to_csv}[fmt](str(path))
    return path


@pytest.fixture
def tok():
    return build_char_tokenizer()


@pytest.fixture
def chat_tok():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def batches(datamodule, split: str = "val") -> list[dict]:
    datamodule.setup("fit")
    loader = datamodule.val_dataloader() if split == "val" else datamodule.train_dataloader()
    return list(loader)


def same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


@pytest.mark.parametrize("fmt", ["save_to_disk", "parquet", "json", "csv"])
def test_each_format_with_a_column_mapping_gives_the_batches_of_the_jsonl(tok, tmp_path, fmt):
    reference = write(
        [{"prompt": r["question"], "completion": r["response"], "level": r["level"]} for r in QA], "jsonl", tmp_path
    )
    path = write(QA, fmt, tmp_path)
    source = JsonlSource(str(path), str(path), columns=MAPPING, cache_dir=str(tmp_path / "cache"))
    got = SFTDataModule(tok, source, batch_size=4, shuffle=False)
    want = SFTDataModule(tok, JsonlSource(str(reference), str(reference)), batch_size=4, shuffle=False)
    same_batches(batches(got, "train"), batches(want, "train"))
    assert batches(got)[0]["columns"] == {"level": [0, 1, 2, 0]}  # unmapped columns ride along
    if fmt == "csv":  # a CSV has no types: cells of the text fields stay text ("2" is not the number 2)
        numbers = tmp_path / "numbers.csv"
        numbers.write_text("question,response,level\n1+1=,2,7\n")
        rows = read_rows(numbers, ("prompt", "completion"), columns=MAPPING, cache_dir=str(tmp_path / "cache"))
        assert rows == [{"prompt": "1+1=", "completion": "2", "level": 7}]


@pytest.mark.parametrize("fmt", ["save_to_disk", "dataset_dict", "parquet", "json", "csv"])
def test_an_sft_run_reads_each_format(train_cfg, tmp_path, fmt):
    path = write(QA, fmt, tmp_path)
    cfg = train_cfg(
        [
            "+method=sft",
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={path}",
            f"datamodule.source.val_path={path}",
            "datamodule.source.columns.prompt=question",
            "datamodule.source.columns.completion=response",
            "datamodule.batch_size=4",
            "module.generation.max_new_tokens=4",
            "debug=fdr",
        ]
    )
    metrics = run(cfg)
    assert math.isfinite(metrics["train/loss"]) and "val/loss" in metrics
    copies = list((tmp_path / "cache" / "datasets").glob("*"))  # load_dataset's Arrow copy: paths.cache_dir
    assert bool(copies) == (fmt in ("parquet", "json", "csv"))


def test_a_dataset_dict_gives_each_split_its_own_rows(tok, tmp_path):
    data = {
        s: datasets.Dataset.from_list([{"prompt": f"{s} {i}", "completion": "x"} for i in range(3)])
        for s in ("train", "heldout", "test")
    }
    datasets.DatasetDict(data).save_to_disk(tmp_path / "dd")
    path = str(tmp_path / "dd")
    source = JsonlSource(path, path, splits={"val": "heldout"})
    assert [r["prompt"] for r in source.rows("train")] == ["train 0", "train 1", "train 2"]
    assert [r["prompt"] for r in source.rows("val")] == ["heldout 0", "heldout 1", "heldout 2"]
    assert [r["prompt"] for r in source.rows("test")] == ["test 0", "test 1", "test 2"]  # test_path null: its test
    assert [r["prompt"] for r in JsonlSource(path, num_train=2).rows("train")] == ["train 0", "train 1"]
    with pytest.raises(
        DataError,
        match=r"no val split \(looked for \['validation', 'val', 'valid', 'dev'\]; its "
        r"splits are \['train', 'heldout', 'test'\]\); name it with "
        r"datamodule\.source\.splits\.val=<split>",
    ):
        JsonlSource(path, path).rows("val")


def test_a_folder_of_data_files_reads_its_splits_from_the_file_names(tmp_path):
    """A dataset repository as the Hub lays it out (data/<split>-00000-of-00001.parquet), read offline."""
    (tmp_path / "repo" / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        rows = [{"question": f"{split} {i}", "response": "x"} for i in range(2)]
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "repo" / "data" / f"{split}-00000-of-00001.parquet"))
    repo = str(tmp_path / "repo")
    source = JsonlSource(repo, repo, columns=MAPPING, cache_dir=str(tmp_path / "cache"))
    assert [r["prompt"] for r in source.rows("train", ("prompt", "completion"))] == ["train 0", "train 1"]
    assert [r["prompt"] for r in source.rows("val", ("prompt", "completion"))] == ["validation 0", "validation 1"]


def test_a_missing_column_names_the_file_the_column_and_the_option(tok, tmp_path):
    path = write(QA, "parquet", tmp_path)
    with pytest.raises(DataError) as unmapped:
        SFTDataModule(tok, JsonlSource(str(path), str(path))).setup("fit")
    assert str(unmapped.value) == (
        f"{path}: no column 'prompt' (required: ['prompt', 'completion']; its columns are ['question', 'response', "
        "'level']); name the column that holds it with datamodule.source.columns.prompt=<column>"
    )
    with pytest.raises(DataError) as misspelt:
        JsonlSource(str(path), columns={"prompt": "question", "completion": "reponse"}).rows("train", ("prompt",))
    assert str(misspelt.value) == (
        f"{path}: no column 'reponse' (datamodule.source.columns.completion=reponse); its columns are ['question', "
        "'response', 'level']"
    )
    with pytest.raises(DataError, match=r"has both columns 'prompt' and 'question'"):
        read_rows(
            write([{"prompt": "a", "question": "b", "completion": "c"}], "save_to_disk", tmp_path),
            columns={"prompt": "question"},
        )


def test_a_bad_jsonl_row_keeps_its_file_line_message_under_a_mapping(tok, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1=", "response": "2"}\n{"question": "2+2="}\n')
    with pytest.raises(
        DataError,
        match=r"bad\.jsonl:2: missing field 'response' \(required: \['prompt', "
        r"'completion'\]; datamodule\.source\.columns\.completion=response\)",
    ):
        JsonlSource(str(bad), columns=MAPPING).rows("train", ("prompt", "completion"))
    with pytest.raises(
        DataError,
        match=r"bad\.jsonl: no row has the column 'solution' "
        r"\(datamodule\.source\.columns\.answer=solution\)",
    ):
        JsonlSource(str(bad), columns={"answer": "solution"}).rows("train", ("question",))


def test_the_cli_prints_the_missing_column_and_exits_2(zoo_main, tmp_path):
    path = write(QA, "parquet", tmp_path)
    code, _, err = zoo_main(
        [
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={path}",
            f"datamodule.source.val_path={path}",
            f"paths.log_dir={tmp_path / 'logs'}",
            f"paths.cache_dir={tmp_path / 'cache'}",
        ],
        tmp_path,
    )
    assert code == 2
    assert f"{path}: no column 'prompt'" in err and "datamodule.source.columns.prompt=<column>" in err
    assert "Traceback" not in err


def test_a_hub_id_is_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        DataError,
        match=r"org/dataset: data file not found \(a Hugging Face Hub dataset is never "
        r"downloaded at run time: save it once",
    ):
        read_rows("org/dataset", ("prompt",))


def test_a_messages_dataset_is_rendered_by_the_chat_template(chat_tok, tmp_path):
    conversations = [
        [
            {"role": "system", "content": "Add."},
            {"role": "user", "content": f"{i}+{i}="},
            {"role": "assistant", "content": str(2 * i)},
        ]
        for i in range(4)
    ]
    path = write([{"conversation": c} for c in conversations], "json", tmp_path)
    source = JsonlSource(str(path), str(path), columns={"messages": "conversation"}, cache_dir=str(tmp_path / "c"))
    batch = batches(SFTDataModule(chat_tok, source, batch_size=4, shuffle=False))[0]
    for i, conversation in enumerate(conversations):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()]
        rendered = chat_tok.apply_chat_template(conversation, tokenize=False)
        # the whole sequence is the template's text (the newline after the last EOS is where training stops)
        assert chat_tok.decode(ids) == chat_tok.bos_token + rendered.removesuffix("\n")
        trained = ids[batch["labels"][i][: len(ids)] != -100]
        assert chat_tok.decode(trained) == f"{2 * i}{chat_tok.eos_token}"  # the assistant turn and its EOS only
        prompt = batch["prompt_ids"][i][batch["prompt_attention_mask"][i].bool()]
        generation_prompt = chat_tok.apply_chat_template(conversation[:-1], tokenize=False, add_generation_prompt=True)
        assert chat_tok.decode(prompt) == chat_tok.bos_token + generation_prompt
    assert batch["answers"] == ["0", "2", "4", "6"] and batch["columns"] == {}


def test_conversational_prompt_completion_rows_equal_their_rendered_text(chat_tok, tmp_path):
    rows = [
        {
            "prompt": [{"role": "user", "content": f"{i}+1="}],
            "completion": [{"role": "assistant", "content": f"{i + 1}"}],
        }
        for i in range(4)
    ]
    path = write(rows, "parquet", tmp_path)
    text = [{"prompt": f"### user: {i}+1=\n### assistant: ", "completion": f"{i + 1}"} for i in range(4)]
    reference = write(text, "jsonl", tmp_path)
    got = SFTDataModule(
        chat_tok, JsonlSource(str(path), str(path), cache_dir=str(tmp_path / "c")), batch_size=2, shuffle=False
    )
    same_batches(
        batches(got),
        batches(SFTDataModule(chat_tok, JsonlSource(str(reference), str(reference)), batch_size=2, shuffle=False)),
    )


def test_a_preference_dataset_through_dpos_datamodule(train_cfg, chat_tok, tmp_path):
    """+method=dpo datamodule=prefs_jsonl on a save_to_disk DatasetDict of conversational pairs with the user's column
    names: the batches of the text pairs the chat template writes; TRL's implicit prompt gives the same."""
    pairs = [
        {
            "instruction": [{"role": "user", "content": f"{i}+{i}="}],
            "good": [{"role": "assistant", "content": f"{2 * i}"}],
            "bad": [{"role": "assistant", "content": f"{2 * i + 1}"}],
        }
        for i in range(6)
    ]
    data = datasets.Dataset.from_list(pairs)
    datasets.DatasetDict(train=data, validation=data).save_to_disk(tmp_path / "pairs")
    cfg = train_cfg(
        [
            "+method=dpo",
            "datamodule=prefs_jsonl",
            f"datamodule.source.train_path={tmp_path / 'pairs'}",
            f"datamodule.source.val_path={tmp_path / 'pairs'}",
            "datamodule.source.columns={prompt: instruction, chosen: good, rejected: bad}",
            "datamodule.batch_size=3",
        ]
    )
    datamodule = instantiate(cfg.datamodule, tokenizer=chat_tok, _convert_="all")
    assert isinstance(datamodule, PreferenceDataModule)
    text = [
        {"prompt": f"### user: {i}+{i}=\n### assistant: ", "chosen": f"{2 * i}", "rejected": f"{2 * i + 1}"}
        for i in range(6)
    ]
    reference = write(text, "jsonl", tmp_path)
    source = JsonlSource(str(reference), str(reference))
    want = batches(PreferenceDataModule(chat_tok, source, batch_size=3, eval_batch_size=datamodule.eval_batch_size))
    same_batches(batches(datamodule), want)
    implicit = [{"chosen": p["instruction"] + p["good"], "rejected": p["instruction"] + p["bad"]} for p in pairs]
    path = write(implicit, "save_to_disk", tmp_path)
    implicit_source = JsonlSource(str(path), str(path))
    got = PreferenceDataModule(chat_tok, implicit_source, batch_size=3, eval_batch_size=datamodule.eval_batch_size)
    same_batches(batches(got), want)


def test_conversational_prompts_for_rollouts(chat_tok, tmp_path):
    rows = [
        {
            "prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i}+1="}],
            "answer": str(i + 1),
        }
        for i in range(4)
    ]
    path = write(rows, "parquet", tmp_path)
    batch = batches(
        PromptDataModule(chat_tok, JsonlSource(str(path), str(path), cache_dir=str(tmp_path / "c")), batch_size=4)
    )[0]
    for i, row in enumerate(rows):
        ids = batch["prompt_ids"][i][batch["prompt_attention_mask"][i].bool()]
        rendered = chat_tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert chat_tok.decode(ids) == chat_tok.bos_token + rendered
    assert batch["prompts"] == ["0+1=", "1+1=", "2+1=", "3+1="]  # rewards see the question
    assert batch["columns"] == {"answer": ["1", "2", "3", "4"]}


def test_a_malformed_conversation_names_the_row_and_the_field(tok, tmp_path):
    path = write([{"messages": [{"role": "robot", "content": "hi"}]}], "save_to_disk", tmp_path)
    with pytest.raises(DataError, match=r"ds \(train split\) row 0: field 'messages': messages\[0\]\.role is 'robot'"):
        JsonlSource(str(path)).rows("train", ("prompt", "completion"))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps({"prompt": "1+1=", "completion": [{"role": "assistant", "content": "2"}]}) + "\n")
    with pytest.raises(DataError, match=r"train row 0: field 'prompt' is text but \['completion'\] are conversations"):
        SFTDataModule(tok, JsonlSource(str(mixed), str(mixed))).setup("fit")
