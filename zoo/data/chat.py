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


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def render_prompt_completions(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Sequence[Message],
    completions: Sequence[Sequence[Message]],
    chat_format: ChatFormat | None = None,
) -> tuple[str, list[str]]:
    """A conversational prompt and its completions as text: ``(prompt text, [completion text, ...])``.

    As TRL's ``apply_chat_template`` does for prompt-completion and preference rows (``trl.data_utils``): the prompt
    is rendered with the generation prompt, each completion is the rest of the rendering of prompt + completion, and
    the prompt is cut to the part every rendering shares (a template whose generation prompt differs from how it
    writes an assistant turn, e.g. one that adds a reasoning block, then still gives prompt + completion = the full
    text). The datamodules append EOS to a completion, so the EOS that ends it in the rendering (and whitespace
    after it) is cut. ``chat_format``: default :class:`ChatFormat` ``auto`` (the tokenizer's chat template, the
    turn markers when it has none); the text has no leading BOS (see the module docstring).
    """
    chat = chat_format or ChatFormat()
    prompt_text = chat.render(prompt, tokenizer, add_generation_prompt=True)
    full = [chat.render([*prompt, *completion], tokenizer, add_generation_prompt=False) for completion in completions]
    for text in full:
        prompt_text = _common_prefix(prompt_text, text)
    eos = tokenizer.eos_token or ""
    texts = []
    for text in full:
        completion = text[len(prompt_text) :]
        stripped = completion.rstrip()
        if eos and stripped.endswith(eos):
            completion = stripped[: -len(eos)]
        texts.append(completion)
    return prompt_text, texts


def prompt_conversation(row: dict[str, Any], where: str) -> list[Message] | None:
    """The prompt of a row as a conversation, or ``None`` when its prompt is text: a conversational ``prompt``, or
    ``messages`` without a ``prompt`` (its last assistant turn, the reference completion, left out)."""
    if isinstance(row.get("prompt"), list):
        return check_messages(row["prompt"], f"{where}: field 'prompt'")
    if "prompt" in row or "messages" not in row:
        return None
    messages = check_messages(row["messages"], f"{where}: field 'messages'")
    if messages[-1]["role"] == "assistant":
        messages = messages[:-1]
    if not messages:
        raise DataError(f"{where}: field 'messages' has no prompt before its assistant turn")
    return messages


def conversation_as_text(
    row: dict[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    completion_fields: Sequence[str],
    where: str,
    chat_format: ChatFormat | None = None,
) -> dict[str, Any]:
    """A row of TRL's conversational formats as the zoo's text row (other rows are returned unchanged).

    Conversational rows: ``messages`` (without ``prompt``; its last turn, an assistant turn, is the completion and
    everything before it the prompt), ``prompt`` and the ``completion_fields`` as lists of messages
    (prompt-completion: ``("completion",)``; preference: ``("chosen", "rejected")``), or preference rows whose
    ``chosen`` and ``rejected`` are whole conversations without ``prompt`` (TRL's implicit prompt: the messages they
    share, up to the last turn before an assistant turn). The prompt becomes the text of
    :func:`render_prompt_completions`, each completion field its text; ``messages`` is dropped.

    Raises:
        DataError: naming ``where`` and the field, for a malformed conversation or a row mixing text and
            conversations.
        ConfigError: ``chat_format.mode=tokenizer`` with a tokenizer without a chat template.
    """
    fields = ("prompt", *completion_fields)
    uses_messages = "prompt" not in row and "messages" in row and tuple(completion_fields) == ("completion",)
    if not uses_messages and not any(isinstance(row.get(f), list) for f in fields):
        return row
    out = dict(row)
    if uses_messages:
        messages = check_messages(out.pop("messages"), f"{where}: field 'messages'")
        if messages[-1]["role"] != "assistant" or len(messages) < 2:
            raise DataError(
                f"{where}: field 'messages' must end with the assistant turn that is trained, after a prompt"
            )
        prompt, completions = messages[:-1], [messages[-1:]]
    else:
        for name in fields:
            if name in row and not isinstance(row[name], list):
                raise DataError(
                    f"{where}: field '{name}' is text but {[f for f in fields if isinstance(row.get(f), list)]} "
                    "are conversations; write all of them as text or all as lists of {role, content} messages"
                )
        sides = [check_messages(row[f], f"{where}: field '{f}'") for f in completion_fields]
        if "prompt" in row:
            prompt = check_messages(row["prompt"], f"{where}: field 'prompt'")
        else:  # implicit prompt: the turns every side shares, ending before an assistant turn
            shared = 0
            while all(shared < len(s) - 1 for s in sides) and all(s[shared] == sides[0][shared] for s in sides):
                shared += 1
            while shared and sides[0][shared]["role"] != "assistant":
                shared -= 1
            if not shared:
                raise DataError(
                    f"{where}: no 'prompt', and {list(completion_fields)} share no turns before an assistant turn"
                )
            prompt = sides[0][:shared]
            sides = [s[shared:] for s in sides]
        completions = sides
    prompt_text, texts = render_prompt_completions(tokenizer, prompt, completions, chat_format)
    out["prompt"] = prompt_text
    out.update(zip(completion_fields, texts))
    return out


__all__ = [
    "CHAT_MODES",
    "ROLES",
    "ChatFormat",
    "Message",
    "check_messages",
    "conversation_as_text",
    "encode_conversation",
    "prompt_conversation",
    "render_prompt_completions",
]
