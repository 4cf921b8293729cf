"""SFT data: prompt + completion, loss on the completion only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from zoo.data.chat import conversation_as_text
from zoo.data.sources import Row
from zoo.datamodules.base import IGNORE_INDEX, ListDataset, RowDataModule, collate_columns, encode_completion
from zoo.encoding import encode_prompt, pad_sequences, tokenizer_fingerprint
from zoo.errors import DataError


class SFTDataModule(RowDataModule):
    """Supervised fine-tuning rows (``prompt``, ``completion``; optional ``answer``, a per-sample weight, and
    pre-tokenized completions with a per-token loss mask).

    Conversational rows, as TRL's SFT trainer takes them, are rendered by the tokenizer's chat template
    (:func:`zoo.data.chat.conversation_as_text`; the zoo's turn markers when the tokenizer has none): ``messages``
    (the last turn, an assistant turn, is the completion, the conversation before it the prompt) or ``prompt`` and
    ``completion`` as lists of ``{"role", "content"}`` messages. The loss covers the completion and its EOS.

    Args:
        weight_column: the row column holding the per-sample loss weight (a finite number ``>= 0``; rows without
            it weigh 1). A column name other than the default that no training row carries is an error (a
            misspelt name would otherwise train unweighted).
        use_loss_mask: apply the rows' ``loss_mask`` to the labels (``False``: train on every completion token of
            the same rows, e.g. N-MARS's plain-SFT baseline; the mask still reaches ``masked_out_labels``).
        (other arguments: see :class:`~zoo.datamodules.base.RowDataModule`).

    Optional row columns:

    - ``completion_ids`` (list of ints, EOS included when wanted) and ``tokenizer`` (the
      :func:`~zoo.encoding.tokenizer_fingerprint` of the tokenizer that made them): the completion's token ids,
      used instead of tokenizing ``completion`` (which stays the readable text); a row whose fingerprint differs
      from this run's tokenizer is an error;
    - ``loss_mask`` (list of bools, one per completion token incl. EOS): False positions carry no loss.

    Batch (documented contract, see ``docs/contracts.md``):

    - ``input_ids``, ``attention_mask``, ``labels``: ``[B, T]`` right-padded; labels are ``-100`` on the
      prompt and padding (and, with ``use_loss_mask``, where ``loss_mask`` is False), so the loss covers the
      completion (and its EOS) only;
    - ``prompt_ids``, ``prompt_attention_mask``: ``[B, P]`` left-padded prompts (for generation);
    - ``prompts``, ``answers``: lists of strings (``answer`` falls back to the completion);
    - ``loss_weight``: ``[B]`` float per-sequence weights (from ``weight_column``; 1 where a row has none);
    - ``columns``: every other field of the rows, as lists (e.g. a label that evaluation callbacks read).
    - ``masked_out_labels``: ``[B, T]`` only when a row has a ``loss_mask``: the token ids at the positions the mask
      excludes, ``-100`` elsewhere (what a mask keeps out of training, e.g. N-MARS's error tokens).
    """

    required_fields = ("prompt", "completion")
    default_weight_column = "loss_weight"
    encoded_fields = ("prompt", "completion", "answer")  # every other field of a row is kept in ``columns``

    def __init__(
        self, *args: Any, weight_column: str = default_weight_column, use_loss_mask: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.weight_column = weight_column
        self.use_loss_mask = bool(use_loss_mask)
        self._fingerprint: str | None = None

    def completion_tokens(self, row: Row, index: int, split: str) -> list[int]:
        """The completion's token ids: the row's ``completion_ids`` (checked) or the tokenized ``completion`` + EOS."""
        ids = row.get("completion_ids")
        if ids is None:
            return encode_completion(self.tokenizer, row["completion"])
        where = f"{split} row {index}"
        if self._fingerprint is None:
            self._fingerprint = tokenizer_fingerprint(self.tokenizer)
        if row.get("tokenizer") != self._fingerprint:
            raise DataError(
                f"{where}: its completion_ids were made with another tokenizer (column 'tokenizer' = "
                f"{row.get('tokenizer')!r}, this run's tokenizer is {self._fingerprint!r}); regenerate the data with "
                "this run's backbone (and its added tokens), or drop completion_ids to tokenize 'completion'"
            )
        size = len(self.tokenizer)
        if (
            not isinstance(ids, list)
            or not ids
            or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < size for t in ids)
        ):
            raise DataError(f"{where}: 'completion_ids' must be a non-empty list of token ids in 0..{size - 1}")
        return list(ids)

    def loss_mask(self, row: Row, index: int, split: str, length: int) -> list[bool] | None:
        """The row's ``loss_mask`` (one bool per completion token), or ``None`` when it has none."""
        mask = row.get("loss_mask")
        if mask is None:
            return None
        if not isinstance(mask, list) or len(mask) != length or any(not isinstance(m, bool) for m in mask):
            raise DataError(
                f"{split} row {index}: 'loss_mask' must be a list of {length} booleans (one per completion token, "
                f"EOS included), got {mask!r:.80}"
            )
        return mask

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
        row = conversation_as_text(row, self.tokenizer, ("completion",), f"{split} row {index}")
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        completion_ids = self.completion_tokens(row, index, split)
        mask = self.loss_mask(row, index, split, len(completion_ids))
        self.check_length(split, index, len(prompt_ids) + len(completion_ids), f"prompt {row['prompt'][:40]!r}")
        keep = mask if mask is not None and self.use_loss_mask else [True] * len(completion_ids)
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "completion_labels": [t if k else IGNORE_INDEX for t, k in zip(completion_ids, keep)],
            "masked_out": None if mask is None else [IGNORE_INDEX if m else t for t, m in zip(completion_ids, mask)],
            "prompt": row["prompt"],
            "answer": str(row.get("answer", row["completion"])),
            "loss_weight": self.sample_weight(row, index, split),
            "columns": {k: v for k, v in row.items() if k not in (*self.encoded_fields, self.weight_column)},
        }

    @staticmethod
    def sequence(item: dict[str, Any]) -> tuple[list[int], list[int]]:
        """The training sequence of an encoded item and its labels: prompt + completion with labels on the completion
        (``completion_labels``: ``-100`` where the row's loss mask excludes a token), or the item's own ``input_ids``
        and ``labels`` when it has them (a subclass that trains other tokens, e.g. every assistant turn of a
        conversation)."""
        if "labels" in item:
            return item["input_ids"], item["labels"]
        prompt, completion = item["prompt_ids"], item["completion_ids"]
        return prompt + completion, [IGNORE_INDEX] * len(prompt) + item.get("completion_labels", completion)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        sequences = [self.sequence(it) for it in items]
        full = [ids for ids, _ in sequences]
        labels = [lab for _, lab in sequences]
        input_ids = pad_sequences(full, pad, "right")
        attention_mask = pad_sequences([[1] * len(f) for f in full], 0, "right")
        extra = {}
        if any(it.get("masked_out") is not None for it in items):
            masked_out = [
                [IGNORE_INDEX] * len(it["prompt_ids"])
                + (it.get("masked_out") or [IGNORE_INDEX] * len(it["completion_ids"]))
                for it in items
            ]
            extra["masked_out_labels"] = pad_sequences(masked_out, IGNORE_INDEX, "right")
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
            **extra,
        }
