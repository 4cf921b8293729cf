"""Multi-turn data: conversations rendered with the feedback environment's chat format.

* :class:`MultiTurnSFTDataModule` -- SFT on the **last assistant turn** of each conversation (everything before it is
  context with label ``-100``), with the per-sample ``loss_weight`` of the rows (DRIFT and its baselines on a rollout
  file; the retry-with-feedback reference policy's data);
* :class:`MultiTurnPromptDataModule` -- prompts for multi-turn episodes (rollout collection, online multi-turn GRPO).

Both render the first user turn with :class:`~zoo.data.feedback.FeedbackEnvironment` (its chat format), so that
``prompt_ids`` are what the policy sees at turn 1, and add ``conversations`` to the batch: the context conversation
of every row (a list of ``{"role", "content"}`` messages), from which multi-turn episodes and evaluations start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data import DataLoader

from zoo.data.chat import Message, check_messages, encode_conversation
from zoo.data.feedback import FeedbackEnvironment
from zoo.data.sources import Row
from zoo.datamodules.base import ListDataset
from zoo.datamodules.prompts import PromptDataModule
from zoo.datamodules.sft import SFTDataModule
from zoo.errors import ConfigError, DataError


def conversation_of(row: Row, environment: FeedbackEnvironment, where: str) -> list[Message]:
    """The conversation of a row: its ``messages``, or the environment's initial messages for ``prompt`` followed by
    ``completion`` as the assistant turn when the row has one."""
    if "messages" in row:
        return check_messages(row["messages"], where)
    if not isinstance(row.get("prompt"), str):
        raise DataError(f"{where}: a row needs 'messages' (a conversation) or a string 'prompt'")
    messages = environment.initial_messages(row["prompt"])
    if "completion" in row:
        if not isinstance(row["completion"], str):
            raise DataError(f"{where}: field 'completion' must be a string")
        messages.append({"role": "assistant", "content": row["completion"]})
    return messages


class MultiTurnSFTDataModule(SFTDataModule):
    """Weighted SFT on the last assistant turn of conversations (or on every assistant turn).

    Rows: ``messages`` ending with an assistant turn (rollout rows, retry-feedback rows), or ``prompt`` +
    ``completion`` (a task's rows: a one-turn conversation); optional ``answer`` and ``loss_weight``
    (``weight_column``). The prompt is the rendered context (``environment.render(messages[:-1])``), the completion
    the last assistant turn plus EOS, so only its tokens carry labels (``train_turns=last``, DRIFT). With
    ``train_turns=all`` the labels cover every assistant turn of the conversation with the EOS that ends it
    (:func:`zoo.data.chat.encode_conversation`; plain multi-turn SFT); system, user and feedback turns never carry
    labels.

    Args:
        environment: the feedback environment (chat format, first-turn message).
        train_turns: ``last`` | ``all``.
        (other arguments: see :class:`~zoo.datamodules.SFTDataModule`).

    Batch: the :class:`~zoo.datamodules.SFTDataModule` batch (``prompt_ids``: the context of the last assistant turn)
    plus ``conversations`` (that context as messages).
    """

    required_fields = ()

    def __init__(self, *args: Any, environment: FeedbackEnvironment, train_turns: str = "last", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if train_turns not in ("last", "all"):
            raise ConfigError(f"datamodule.train_turns must be 'last' or 'all', got {train_turns!r}")
        self.environment = environment
        self.train_turns = train_turns

    def build_dataset(self, split: str, rows: Sequence[Row]) -> ListDataset:
        if split == "train" and len(rows) < self.batch_size:
            raise DataError(
                f"{len(rows)} training rows are fewer than datamodule.batch_size={self.batch_size}: no full batch to "
                "train on (lower the batch size or collect more trajectories)"
            )
        return super().build_dataset(split, rows)

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        where = f"{split} row {index}" + (f" (line {row['_line']})" if "_line" in row else "")
        messages = conversation_of(row, self.environment, where)
        if messages[-1]["role"] != "assistant":
            raise DataError(f"{where}: the conversation must end with the assistant turn that is trained")
        context = messages[:-1]
        if not context:
            raise DataError(f"{where}: the conversation has no context before its assistant turn")
        prompt = self.environment.render(context, self.tokenizer)
        item = super().encode({**row, "prompt": prompt, "completion": messages[-1]["content"]}, index, split)
        item["conversation"] = context
        if self.train_turns == "all":
            chat = self.environment.chat_format
            item["input_ids"], item["labels"] = encode_conversation(self.tokenizer, chat, messages, "all")
        return item

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().collate(items), "conversations": [it["conversation"] for it in items]}


class MultiTurnPromptDataModule(PromptDataModule):
    """Prompts of multi-turn episodes: ``prompt`` (the problem; rendered as the first user turn) or ``messages`` (an
    initial conversation ending with a user turn), and every other field as a column (``answer``, ...).

    Every row gets a ``prompt_id`` column (its own ``prompt_id`` field, else ``<split>-<row index>``), which groups
    the trajectories of a prompt in rollout files.

    Args:
        environment: the feedback environment (chat format, first-turn message).
        predict_split: the split ``predict`` iterates over (rollout collection samples the ``train`` prompts).
        (other arguments: see :class:`~zoo.datamodules.PromptDataModule`).

    Batch: the :class:`~zoo.datamodules.PromptDataModule` batch (``prompts`` are the problems) plus
    ``conversations``.
    """

    def __init__(
        self, *args: Any, environment: FeedbackEnvironment, predict_split: str = "test", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if predict_split not in ("train", "val", "test"):
            raise DataError(f"datamodule.predict_split must be train, val or test, got {predict_split!r}")
        self.environment = environment
        self.predict_split = predict_split

    required_fields = ()

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        where = f"{split} row {index}"
        if "messages" in row:
            messages = check_messages(row["messages"], where)
        elif isinstance(row.get("prompt"), str):
            messages = self.environment.initial_messages(row["prompt"])
        else:
            raise DataError(f"{where}: a row needs a string 'prompt' or 'messages'")
        if messages[-1]["role"] != "user":
            raise DataError(f"{where}: the initial conversation must end with a user message")
        problem = row.get("prompt", messages[-1]["content"])
        item = super().encode({**row, "prompt": self.environment.render(messages, self.tokenizer)}, index, split)
        item["prompt"] = problem
        item["conversation"] = messages
        item["columns"] = {k: v for k, v in item["columns"].items() if k != "messages"}
        item["columns"].setdefault("prompt_id", f"{split}-{index}")
        item["columns"]["prompt_id"] = str(item["columns"]["prompt_id"])
        return item

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().collate(items), "conversations": [it["conversation"] for it in items]}

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader(self.predict_split)


__all__ = ["MultiTurnPromptDataModule", "MultiTurnSFTDataModule", "conversation_of"]
