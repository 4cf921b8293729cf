"""RL prompts: a prompt per row; every other field reaches the reward functions as a column."""

from __future__ import annotations

from typing import Any

from zoo.data.sources import Row
from zoo.datamodules.base import RowDataModule, collate_columns
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import DataError


class PromptDataModule(RowDataModule):
    """Prompts for rollouts.

    Batch: ``prompt_ids``/``prompt_attention_mask`` ``[B, P]`` left-padded, ``prompts`` (list of str) and
    ``columns`` (dict of lists: every other field of the rows, e.g. ``answer``; the ``completion`` only under
    ``completion_column``). ``max_prompt_length`` bounds the prompt; a longer prompt is an error naming the row (no
    silent truncation).

    Args:
        max_prompt_length: longest prompt in tokens.
        completion_column: pass each row's reference ``completion`` to the columns under this name (e.g.
            ``reference``, for rewards and offline stages that compare with it); ``None`` keeps it out.
        (other arguments: see :class:`~zoo.datamodules.base.RowDataModule`).
    """

    required_fields = ("prompt",)

    def __init__(
        self, *args: Any, max_prompt_length: int = 128, completion_column: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_prompt_length = max_prompt_length
        self.completion_column = completion_column

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        if len(prompt_ids) > self.max_prompt_length:
            raise DataError(
                f"{split} row {index}: prompt has {len(prompt_ids)} tokens > datamodule.max_prompt_length="
                f"{self.max_prompt_length} ({row['prompt'][:40]!r})"
            )
        columns = {k: v for k, v in row.items() if k not in ("prompt", "completion")}
        if self.completion_column is not None:
            if "completion" not in row:
                raise DataError(
                    f"{split} row {index}: datamodule.completion_column={self.completion_column!r} needs the rows' "
                    f"reference 'completion'; this row has {sorted(row)}"
                )
            columns[self.completion_column] = row["completion"]
        return {"prompt_ids": prompt_ids, "prompt": row["prompt"], "columns": columns}

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "prompt_ids": pad_sequences([it["prompt_ids"] for it in items], self.tokenizer.pad_token_id, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(it["prompt_ids"]) for it in items], 0, "left"),
            "prompts": [it["prompt"] for it in items],
            "columns": collate_columns(items),
        }
