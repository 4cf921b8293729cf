"""Conversations as text: the explicit chat format of multi-turn tasks (retry-with-feedback episodes, DRIFT).

A conversation is a list of messages ``{"role": "system" | "user" | "assistant", "content": str}`` (the
Hugging Face chat convention). :class:`ChatFormat` renders it into the text a causal LM continues:

* ``markers`` -- explicit turn markers as plain text, which the zoo's character tokenizer writes one character per
  token::

      [user]37+45=\\n[assistant]<think>7+5=12\\n3+4+1=8</think>81<eos>[user]Incorrect. Please think again.\\n[assistant]

  System and user messages end with ``message_end``; an assistant message ends with the tokenizer's EOS token, which
  is also where generation of a turn stops. :meth:`ChatFormat.jinja` is the same format as a Hugging Face chat
  template (install it as ``tokenizer.chat_template`` and ``apply_chat_template`` renders the same text);
* ``tokenizer`` -- the tokenizer's own chat template (``apply_chat_template``; e.g. an instruct model's);
* ``auto`` (default) -- the tokenizer's template when it has one, else the markers.

Rendered text never starts with the BOS token: :func:`zoo.encoding.encode_prompt` adds it, as for every other
prompt of the zoo (a template that writes BOS itself has it removed, so it is not doubled).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from zoo.errors import ConfigError, DataError

Message = dict[str, str]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
CHAT_MODES: tuple[str, ...] = ("auto", "markers", "tokenizer")


def check_messages(messages: Any, where: str) -> list[Message]:
    """Validate a conversation; returns it as a list of plain ``{"role", "content"}`` dicts.

    Raises:
        DataError: naming ``where`` (e.g. ``file.jsonl:12``) and the message, for anything that is not a non-empty
            list of objects with a known ``role`` and a string ``content``.
    """
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DataError(f"{where}: messages[{i}] must be an object with 'role' and 'content'")
        if message["role"] not in ROLES:
            raise DataError(f"{where}: messages[{i}].role is {message['role']!r}; use one of {list(ROLES)}")
        if not isinstance(message["content"], str):
            raise DataError(f"{where}: messages[{i}].content must be a string, got {type(message['content']).__name__}")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _literal(text: str) -> str:
    """A Jinja string literal of ``text`` (JSON escaping is valid Jinja escaping)."""
    return json.dumps(text)


@dataclass(frozen=True)
class ChatFormat:
    """How a conversation becomes model text (see the module docstring).

    Args:
        mode: ``auto`` | ``markers`` | ``tokenizer``.
        system_prefix, user_prefix, assistant_prefix: the turn markers of the ``markers`` format.
        message_end: written after every system and user message (assistant messages end with EOS).
    """

    mode: str = "auto"
    system_prefix: str = "[system]"
    user_prefix: str = "[user]"
    assistant_prefix: str = "[assistant]"
    message_end: str = "\n"

    def __post_init__(self) -> None:
        if self.mode not in CHAT_MODES:
            raise ConfigError(f"chat_format.mode must be one of {list(CHAT_MODES)}, got {self.mode!r}")
        if not self.assistant_prefix:
            raise ConfigError("chat_format.assistant_prefix must not be empty: it marks where a model turn starts")

    # -- which format ----------------------------------------------------------------------------------------------
    def uses_template(self, tokenizer: PreTrainedTokenizerBase) -> bool:
        """Whether the tokenizer's chat template renders (``tokenizer`` mode, or ``auto`` with a template)."""
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if self.mode == "tokenizer" and not has_template:
            raise ConfigError(
                "chat_format.mode=tokenizer but the tokenizer has no chat_template; use mode=auto or markers"
            )
        return self.mode == "tokenizer" or (self.mode == "auto" and has_template)

    def prefix(self, role: str) -> str:
        return {"system": self.system_prefix, "user": self.user_prefix, "assistant": self.assistant_prefix}[role]

    # -- rendering -------------------------------------------------------------------------------------------------
    def render(
        self, messages: Sequence[Message], tokenizer: PreTrainedTokenizerBase, add_generation_prompt: bool = True
    ) -> str:
        """The text of a conversation (without leading BOS); with ``add_generation_prompt`` it ends where the next
        assistant turn starts."""
        return self.render_with_spans(messages, tokenizer, add_generation_prompt)[0]

    def render_with_spans(
        self, messages: Sequence[Message], tokenizer: PreTrainedTokenizerBase, add_generation_prompt: bool = False
    ) -> tuple[str, list[tuple[int, int]]]:
        """The text and the character span ``[start, end)`` of every assistant turn in it: its content plus the EOS
        token that ends it when the text has one right after the content.

        Raises:
            ConfigError: a chat template that does not write an assistant message verbatim (e.g. one that drops
                earlier reasoning); spans cannot be located then.
        """
        messages = list(messages)
        if not self.uses_template(tokenizer):
            return self._render_markers(messages, tokenizer, add_generation_prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        text = str(text)
        bos = tokenizer.bos_token
        if bos and text.startswith(bos):
            text = text[len(bos) :]
        spans, cursor = [], 0
        eos = tokenizer.eos_token or ""
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = text.find(message["content"], cursor)
            if start < 0:
                raise ConfigError(
                    f"the tokenizer's chat template does not write assistant message {i} verbatim, so its tokens "
                    "cannot be located; use chat_format.mode=markers"
                )
            end = start + len(message["content"])
            if eos and text.startswith(eos, end):
                end += len(eos)
            spans.append((start, end))
            cursor = end
        return text, spans

    def _render_markers(
        self, messages: list[Message], tokenizer: PreTrainedTokenizerBase, add_generation_prompt: bool
    ) -> tuple[str, list[tuple[int, int]]]:
        eos = tokenizer.eos_token or ""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        length = 0
        for message in messages:
            head = self.prefix(message["role"])
            if message["role"] == "assistant":
                start = length + len(head)
                body = head + message["content"] + eos
                spans.append((start, length + len(body)))
            else:
                body = head + message["content"] + self.message_end
            parts.append(body)
            length += len(body)
        if add_generation_prompt:
            parts.append(self.assistant_prefix)
        return "".join(parts), spans

    def jinja(self) -> str:
        """The ``markers`` format as a Hugging Face chat template (``tokenizer.chat_template = fmt.jinja()``)."""
        end = _literal(self.message_end)
        return (
            "{%- for message in messages -%}"
            "{%- if message['role'] == 'assistant' -%}"
            f"{{{{ {_literal(self.assistant_prefix)} }}}}{{{{ message['content'] }}}}{{{{ eos_token }}}}"
            "{%- elif message['role'] == 'user' -%}"
            f"{{{{ {_literal(self.user_prefix)} }}}}{{{{ message['content'] }}}}{{{{ {end} }}}}"
            "{%- else -%}"
            f"{{{{ {_literal(self.system_prefix)} }}}}{{{{ message['content'] }}}}{{{{ {end} }}}}"
            "{%- endif -%}"
            "{%- endfor -%}"
            f"{{%- if add_generation_prompt -%}}{{{{ {_literal(self.assistant_prefix)} }}}}{{%- endif -%}}"
        )

    def describe(self) -> dict[str, Any]:
        """JSON-able description (rollout files record it)."""
        return asdict(self)


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase, chat_format: ChatFormat, messages: Sequence[Message], train: str = "all"
) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation (BOS first when the tokenizer has one) and labels that keep the assistant
    turns (content and the EOS that ends each) and are ``-100`` elsewhere.

    Args:
        train: ``all`` assistant turns, or only the ``last`` one (earlier turns are then context).

    Raises:
        ConfigError: a tokenizer without offset mapping (a slow tokenizer) or an unknown ``train``.
    """
    if train not in ("all", "last"):
        raise ConfigError(f"train must be 'all' or 'last', got {train!r}")
    text, spans = chat_format.render_with_spans(messages, tokenizer, add_generation_prompt=False)
    if train == "last":
        spans = spans[-1:]
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("encoding conversations with per-turn labels needs a fast tokenizer (offset mapping)")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    labels = [-100] * len(ids)
    for i, (start, end) in enumerate(encoded["offset_mapping"]):
        if end > start and any(s <= start and end <= e for s, e in spans):
            labels[i] = ids[i]
    if tokenizer.bos_token_id is not None:
        ids, labels = [tokenizer.bos_token_id, *ids], [-100, *labels]
    return ids, labels


__all__ = ["CHAT_MODES", "ROLES", "ChatFormat", "Message", "check_messages", "encode_conversation"]
