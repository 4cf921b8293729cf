"""Synthetic visual reasoning data and its datamodule (including bad-input errors naming the sample)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from zoo.backbones.vlm import TinyVLMBackbone
from zoo.data.sources import RowSource
from zoo.data.visual import COLORS, VisualCounting, VisualSource
from zoo.datamodules.visual import VisualReasoningDataModule
from zoo.errors import DataError


class ListSource(RowSource):
    def __init__(self, rows: list[dict]) -> None:
        self._rows = rows

    def rows(self, split, required_fields=()):
        return self._rows


@pytest.fixture(scope="module")
def tokenizer():
    return TinyVLMBackbone().tokenizer


def test_task_is_deterministic_and_answers_are_exact() -> None:
    task = VisualCounting(ops=("sum", "max"))
    a = [task.sample(random.Random(7)) for _ in range(1)] + task.examples(20, seed=3)
    b = [task.sample(random.Random(7)) for _ in range(1)] + task.examples(20, seed=3)
    assert [e.completion for e in a] == [e.completion for e in b]
    assert all(np.array_equal(x.meta["image"], y.meta["image"]) for x, y in zip(a, b))
    for ex in a:
        cells, rows, colour = ex.meta["cells"], ex.meta["query_rows"], ex.meta["query_color"]
        counts = [int((cells[r * 4 : r * 4 + 4, 0] == colour).sum()) for r in rows]
        expected = sum(counts) if ex.meta["op"] == "sum" else rows[int(np.argmax(counts))] + 1
        assert ex.answer == str(expected)
        assert task.verify(ex.completion, ex.answer)
        assert len(ex.meta["steps"]) == ex.meta["num_steps"] == len(rows)


def test_image_pixels_match_cells() -> None:
    ex = VisualCounting(fill_prob=1.0).sample(random.Random(0))
    image, cells = ex.meta["image"], ex.meta["cells"]
    assert image.shape == (32, 32, 3)
    assert image.dtype == np.uint8
    names = ("red", "green", "blue")
    for i, (colour, _) in enumerate(cells.tolist()):
        r, c = divmod(i, 4)
        centre = image[r * 8 + 3, c * 8 + 3]
        assert tuple(centre) == COLORS[names[colour]]


@pytest.mark.parametrize("steps", [1, 3])
def test_difficulty_knob_sets_number_of_steps(steps: int) -> None:
    task = VisualCounting(min_steps=steps, max_steps=steps)
    assert {e.meta["num_steps"] for e in task.examples(10, seed=0)} == {steps}


def test_datamodule_batch(tokenizer) -> None:
    dm = VisualReasoningDataModule(tokenizer, VisualSource(VisualCounting(), 8, 4, 4), batch_size=4)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    assert batch["pixel_values"].shape == (4, 3, 32, 32)
    assert (batch["input_ids"] == image_id).sum(-1).tolist() == [16] * 4
    assert (batch["labels"][batch["input_ids"] == image_id] == -100).all()
    for r, seg in enumerate(batch["segments"]):
        assert len(seg["steps"]) == int(batch["num_steps"][r])
        ids = seg["prompt"] + seg["head"] + [t for s in seg["steps"] for t in s] + seg["tail"]
        n = int(batch["attention_mask"][r].sum())
        assert batch["input_ids"][r, :n].tolist() == ids
    assert float(batch["pixel_values"].min()) >= -1.0
    assert float(batch["pixel_values"].max()) <= 1.0


def _good_row() -> dict:
    return VisualCounting().sample(random.Random(1)).as_row()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(image=np.zeros((16, 16, 3), np.uint8)), "16x16"),
        (lambda r: r.update(image=np.zeros((32, 32, 4), np.uint8)), "[H, W, 3]"),
        (lambda r: r.update(image=np.zeros((32, 32), np.uint8)), "[H, W, 3]"),
        (lambda r: r.pop("image"), "missing image"),
        (lambda r: r.update(prompt="<image><image>" + r["prompt"]), "placeholder"),
        (lambda r: r.update(images=[r["image"], r["image"]]), "placeholder"),
    ],
)
def test_bad_input_names_the_sample(tokenizer, change, message) -> None:
    bad = _good_row()
    change(bad)
    dm = VisualReasoningDataModule(tokenizer, ListSource([_good_row(), bad]), batch_size=2)
    with pytest.raises(DataError) as err:
        dm.setup("fit")
    assert "row 1" in str(err.value)
    assert message in str(err.value)


def test_image_from_npy_path(tokenizer, tmp_path) -> None:
    row = _good_row()
    np.save(tmp_path / "img.npy", row["image"])
    path_row = {**row, "image": str(tmp_path / "img.npy")}
    dm = VisualReasoningDataModule(tokenizer, ListSource([row, path_row]), batch_size=2)
    items = dm.dataset("train").items
    assert torch.equal(items[0]["pixel_values"][0], items[1]["pixel_values"][0])


def test_filler_adds_recap_clauses_between_look_ups_and_keeps_the_question() -> None:
    bare = VisualCounting(min_steps=3, max_steps=3).examples(5, seed=2)
    long = VisualCounting(min_steps=3, max_steps=3, filler=2).examples(5, seed=2)
    for a, b in zip(bare, long):
        assert a.prompt == b.prompt and a.answer == b.answer
        assert np.array_equal(a.meta["image"], b.meta["image"])
        rows = a.meta["query_rows"]
        for i, (short, step) in enumerate(zip(a.meta["steps"], b.meta["steps"])):
            assert step.startswith(short)  # the look-up first, then the recap
            total = short.rsplit(" ", 1)[-1]
            left = " ".join(str(r + 1) for r in rows[i + 1 :]) or "none"
            assert step[len(short) :].count(f" so far {total}, rows left {left}") == 2
        assert "\n" not in "".join(b.meta["steps"])  # the step delimiter stays the only newline
        assert VisualCounting().verify(b.completion, b.answer)
    with pytest.raises(ValueError, match="filler"):
        VisualCounting(filler=-1)
