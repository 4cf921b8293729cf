"""SFT data: prompt + completion, loss on the completion only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from zoo.data.sources import Row
from zoo.datamodules.base import (
    IGNORE_INDEX,
    ListDataset,
    RowDataModule,
    collate_columns,
    encode_completion,
    encode_prompt,
    pad_sequences,
)
from zoo.errors import DataError


class SFTDataModule(RowDataModule):
    """Supervised fine-tuning rows (``prompt``, ``completion``; optional ``answer`` and a per-sample weight).

    Args:
        weight_column: the row column holding the per-sample loss weight (a finite number ``>= 0``; rows without
            it weigh 1). A column name other than the default that no training row carries is an error (a
            misspelt name would otherwise train unweighted).
        (other arguments: see :class:`~zoo.datamodules.base.RowDataModule`).

    Batch (documented contract, see ``docs/contracts.md``):

    - ``input_ids``, ``attention_mask``, ``labels``: ``[B, T]`` right-padded; labels are ``-100`` on the
      prompt and padding, so the loss covers the completion (and its EOS) only;
    - ``prompt_ids``, ``prompt_attention_mask``: ``[B, P]`` left-padded prompts (for generation);
    - ``prompts``, ``answers``: lists of strings (``answer`` falls back to the completion);
    - ``loss_weight``: ``[B]`` float per-sequence weights (from ``weight_column``; 1 where a row has none);
    - ``columns``: every other field of the rows, as lists (e.g. a label that evaluation callbacks read).
    """

    required_fields = ("prompt", "completion")
    default_weight_column = "loss_weight"
    encoded_fields = ("prompt", "completion", "answer")  # every other field of a row is kept in ``columns``

    def __init__(self, *args: Any, weight_column: str = default_weight_column, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.weight_column = weight_column

    def sample_weight(self, row: Row, index: int, split: str) -> float:
        """The row's loss weight (1 when it has no ``weight_column``); a clear error for a bad value."""
        value = row.get(self.weight_column, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise DataError(
                f"{split} row {index}: column '{self.weight_column}' (datamodule.weight_column) must be a finite "
                f"number >= 0, got {value!r}"
            )
        return float(value)

    def build_dataset(self, split: str, rows: Sequence[Row]) -> ListDataset:
        custom_column = split == "train" and self.weight_column != self.default_weight_column
        if custom_column and rows and not any(self.weight_column in row for row in rows):
            raise DataError(
                f"datamodule.weight_column='{self.weight_column}': no training row has this column "
                f"(columns of row 0: {sorted(rows[0])})"
            )
        return super().build_dataset(split, rows)

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        completion_ids = encode_completion(self.tokenizer, row["completion"])
        self.check_length(split, index, len(prompt_ids) + len(completion_ids), f"prompt {row['prompt'][:40]!r}")
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "prompt": row["prompt"],
            "answer": str(row.get("answer", row["completion"])),
            "loss_weight": self.sample_weight(row, index, split),
            "columns": {k: v for k, v in row.items() if k not in (*self.encoded_fields, self.weight_column)},
        }

    @staticmethod
    def sequence(item: dict[str, Any]) -> tuple[list[int], list[int]]:
        """The training sequence of an encoded item and its labels: prompt + completion with labels on the completion,
        or the item's own ``input_ids`` and ``labels`` when it has them (a subclass that trains other tokens, e.g.
        every assistant turn of a conversation)."""
        if "labels" in item:
            return item["input_ids"], item["labels"]
        prompt, completion = item["prompt_ids"], item["completion_ids"]
        return prompt + completion, [IGNORE_INDEX] * len(prompt) + completion

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        sequences = [self.sequence(it) for it in items]
        full = [ids for ids, _ in sequences]
        labels = [lab for _, lab in sequences]
        input_ids = pad_sequences(full, pad, "right")
        attention_mask = pad_sequences([[1] * len(f) for f in full], 0, "right")
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": pad_sequences(labels, IGNORE_INDEX, "right"),
            "prompt_ids": pad_sequences([it["prompt_ids"] for it in items], pad, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(it["prompt_ids"]) for it in items], 0, "left"),
            "prompts": [it["prompt"] for it in items],
            "answers": [it["answer"] for it in items],
            "loss_weight": torch.tensor([it["loss_weight"] for it in items], dtype=torch.float32),
            "columns": collate_columns(items),
        }
