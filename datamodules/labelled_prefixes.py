"""Labelled text prefixes for sequence classifiers (the SafeThink safety reward model, probes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zoo.data.sources import Row
from zoo.datamodules.base import RowDataModule
from zoo.encoding import pad_sequences
from zoo.errors import DataError


class LabelledPrefixDataModule(RowDataModule):
    """Rows ``{"text": str, "label": int | str}`` (other fields are kept as metadata).

    ``label`` is a class index in ``[0, len(label_names))`` or one of ``label_names``. Texts longer than
    ``max_length`` tokens keep their *last* ``max_length`` tokens (the latest steps decide safety).

    Batch: ``input_ids``/``attention_mask`` ``[B, T]`` right-padded, ``labels`` ``[B]`` long, ``texts``.

    Args:
        label_names: class names in index order (default ``("unsafe", "safe")``: 1 = safe).
        (other arguments: see :class:`~zoo.datamodules.base.RowDataModule`).
    """

    required_fields = ("text",)

    def __init__(self, *args: Any, label_names: Sequence[str] = ("unsafe", "safe"), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if len(label_names) < 2:
            raise ValueError(f"label_names needs at least two classes, got {list(label_names)}")
        self.label_names = list(label_names)

    def parse_label(self, value: Any, split: str, index: int) -> int:
        """Class index of a row's ``label`` (DataError naming the row otherwise)."""
        if isinstance(value, str) and value in self.label_names:
            return self.label_names.index(value)
        if isinstance(value, (bool, int)) and 0 <= int(value) < len(self.label_names):
            return int(value)
        raise DataError(
            f"{split} row {index}: label {value!r} is not a class index in [0, {len(self.label_names)}) "
            f"nor one of {self.label_names}"
        )

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        if "label" not in row:
            raise DataError(f"{split} row {index}: missing field 'label' (rows need 'text' and 'label')")
        ids = list(self.tokenizer(row["text"], add_special_tokens=True)["input_ids"])
        if not ids:
            raise DataError(f"{split} row {index}: empty text")
        return {
            "input_ids": ids[-self.token_limit :],
            "label": self.parse_label(row["label"], split, index),
            "text": row["text"],
        }

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "input_ids": pad_sequences([it["input_ids"] for it in items], self.tokenizer.pad_token_id, "right"),
            "attention_mask": pad_sequences([[1] * len(it["input_ids"]) for it in items], 0, "right"),
            "labels": torch.tensor([it["label"] for it in items], dtype=torch.long),
            "texts": [it["text"] for it in items],
        }
