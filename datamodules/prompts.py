"""RL prompts: a prompt per row; every other field reaches the reward functions as a column."""

from __future__ import annotations

from typing import Any

from zoo.data.chat import ChatFormat, prompt_conversation
from zoo.data.sources import Row
from zoo.datamodules.base import RowDataModule, collate_columns
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import ConfigError, DataError

#: ``datamodule.chat_format`` of single-turn prompts: ``none`` (raw text after BOS, the synthetic tasks' format) or
#: ``template`` (the tokenizer's chat template, one user message and the generation prompt: instruct models).
PROMPT_FORMATS = ("none", "template")


class PromptDataModule(RowDataModule):
    """Prompts for rollouts.

    Batch: ``prompt_ids``/``prompt_attention_mask`` ``[B, P]`` left-padded, ``prompts`` (list of str) and
    ``columns`` (dict of lists: every other field of the rows, e.g. ``answer``; the ``completion`` only under
    ``completion_column``). ``max_prompt_length`` bounds the prompt; a longer prompt is an error naming the row (no
    silent truncation).

    Args:
        max_prompt_length: longest prompt in tokens.
        chat_format: ``none`` -- the prompt text as is, after the BOS token; ``template`` -- the prompt as one user
            message rendered by the tokenizer's chat template with the generation prompt (what an instruct model
            was trained on); the template's own BOS is not doubled (:func:`zoo.encoding.encode_prompt`). Rewards
            and columns still see the raw ``prompt``. A conversational prompt (TRL's prompt-only format: ``prompt``
            as a list of ``{"role", "content"}`` messages, or ``messages`` without ``prompt``, its last assistant turn
            left out) is always rendered by the chat template (the zoo's turn markers without one), and ``prompts``
            holds its last message's content.
        completion_column: pass each row's reference ``completion`` to the columns under this name (e.g.
            ``reference``, for rewards and offline stages that compare with it); ``None`` keeps it out.
        (other arguments: see :class:`~zoo.datamodules.base.RowDataModule`).
    """

    required_fields = ("prompt",)

    def __init__(
        self,
        *args: Any,
        max_prompt_length: int = 128,
        completion_column: str | None = None,
        chat_format: str = "none",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if chat_format not in PROMPT_FORMATS:
            raise ConfigError(f"datamodule.chat_format={chat_format!r}: use one of {list(PROMPT_FORMATS)}")
        if chat_format == "template" and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                "datamodule.chat_format=template but the tokenizer has no chat_template; use chat_format=none"
            )
        self.max_prompt_length = max_prompt_length
        self.completion_column = completion_column
        self.chat_format = chat_format

    def prompt_text(self, prompt: str) -> str:
        """The text the model sees for a prompt (see ``chat_format``; without a leading BOS when templated)."""
        if self.chat_format == "none":
            return prompt
        return ChatFormat(mode="tokenizer").render([{"role": "user", "content": prompt}], self.tokenizer)

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        conversation = prompt_conversation(row, f"{split} row {index}")
        if conversation is None:
            prompt, text = row["prompt"], self.prompt_text(row["prompt"])
        else:  # TRL's conversational prompt: the chat template renders it whatever chat_format says
            prompt, text = conversation[-1]["content"], ChatFormat().render(conversation, self.tokenizer)
        prompt_ids = encode_prompt(self.tokenizer, text)
        if len(prompt_ids) > self.max_prompt_length:
            raise DataError(
                f"{split} row {index}: prompt has {len(prompt_ids)} tokens > datamodule.max_prompt_length="
                f"{self.max_prompt_length} ({prompt[:40]!r})"
            )
        consumed = ("prompt", "completion") if "prompt" in row else ("completion", "messages")
        columns = {k: v for k, v in row.items() if k not in consumed}
        if self.completion_column is not None:
            if "completion" not in row:
                raise DataError(
                    f"{split} row {index}: datamodule.completion_column={self.completion_column!r} needs the rows' "
                    f"reference 'completion'; this row has {sorted(row)}"
                )
            columns[self.completion_column] = row["completion"]
        return {"prompt_ids": prompt_ids, "prompt": prompt, "columns": columns}

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "prompt_ids": pad_sequences([it["prompt_ids"] for it in items], self.tokenizer.pad_token_id, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(it["prompt_ids"]) for it in items], 0, "left"),
            "prompts": [it["prompt"] for it in items],
            "columns": collate_columns(items),
        }
