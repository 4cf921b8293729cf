"""Preference pairs: ``prompt``, ``chosen``, ``rejected``."""

from __future__ import annotations

from typing import Any

from zoo.data.chat import conversation_as_text
from zoo.data.sources import Row
from zoo.datamodules.base import IGNORE_INDEX, RowDataModule, encode_completion
from zoo.encoding import encode_prompt, pad_sequences


class PreferenceDataModule(RowDataModule):
    """Pairwise preference rows.

    Batch: ``chosen_input_ids``/``chosen_attention_mask``/``chosen_labels`` and the same for ``rejected``
    (``[B, T]`` right-padded, labels ``-100`` on the prompt and padding), plus ``prompts``. Consumed by
    :class:`zoo.modules.PreferenceModule` (``+method=dpo``); rows from JSONL or a local Hugging Face dataset
    (``datamodule=prefs_jsonl``) or a synthetic task (``datamodule=prefs``,
    :class:`zoo.data.sources.TaskPreferenceSource`).

    Conversational rows, as TRL's DPO trainer takes them, are rendered by the tokenizer's chat template
    (:func:`zoo.data.chat.conversation_as_text`): ``prompt``, ``chosen`` and ``rejected`` as lists of
    ``{"role", "content"}`` messages, or ``chosen``/``rejected`` as whole conversations without ``prompt`` (the
    shared turns are the prompt).
    """

    required_fields = ("prompt", "chosen", "rejected")

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        row = conversation_as_text(row, self.tokenizer, ("chosen", "rejected"), f"{split} row {index}")
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        item: dict[str, Any] = {"prompt": row["prompt"]}
        for side in ("chosen", "rejected"):
            ids = encode_completion(self.tokenizer, row[side])
            self.check_length(split, index, len(prompt_ids) + len(ids), f"prompt + {side}")
            item[side] = (prompt_ids + ids, [IGNORE_INDEX] * len(prompt_ids) + ids)
        return item

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = {"prompts": [it["prompt"] for it in items]}
        for side in ("chosen", "rejected"):
            seqs = [it[side][0] for it in items]
            batch[f"{side}_input_ids"] = pad_sequences(seqs, self.tokenizer.pad_token_id, "right")
            batch[f"{side}_attention_mask"] = pad_sequences([[1] * len(s) for s in seqs], 0, "right")
            batch[f"{side}_labels"] = pad_sequences([it[side][1] for it in items], IGNORE_INDEX, "right")
        return batch
