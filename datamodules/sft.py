"""SFT data: prompt + completion, loss on the completion only."""

from __future__ import annotations

from typing import Any

import torch

from zoo.data.sources import Row
from zoo.datamodules.base import IGNORE_INDEX, RowDataModule, encode_completion, encode_prompt, pad_sequences
from zoo.errors import DataError


class SFTDataModule(RowDataModule):
    """Supervised fine-tuning rows (``prompt``, ``completion``; optional ``answer`` and ``loss_weight``).

    Batch (documented contract, see ``docs/contracts.md``):

    - ``input_ids``, ``attention_mask``, ``labels``: ``[B, T]`` right-padded; labels are ``-100`` on the
      prompt and padding, so the loss covers the completion (and its EOS) only;
    - ``prompt_ids``, ``prompt_attention_mask``: ``[B, P]`` left-padded prompts (for generation);
    - ``prompts``, ``answers``: lists of strings (``answer`` falls back to the completion);
    - ``loss_weight``: ``[B]`` per-sequence weights (1 unless the row has ``loss_weight``).
    """

    required_fields = ("prompt", "completion")

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        completion_ids = encode_completion(self.tokenizer, row["completion"])
        if len(prompt_ids) + len(completion_ids) > self.max_length:
            raise DataError(
                f"{split} row {index}: {len(prompt_ids) + len(completion_ids)} tokens exceed "
                f"datamodule.max_length={self.max_length} (prompt {row['prompt'][:40]!r}); raise max_length or "
                "shorten the row"
            )
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "prompt": row["prompt"],
            "answer": str(row.get("answer", row["completion"])),
            "loss_weight": float(row.get("loss_weight", 1.0)),
        }

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        full = [it["prompt_ids"] + it["completion_ids"] for it in items]
        labels = [[IGNORE_INDEX] * len(it["prompt_ids"]) + it["completion_ids"] for it in items]
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
        }
