"""A robust tool-call parser: native OpenAI ``tool_calls`` and JSON-in-text fallbacks.

Models that cannot emit native tool calls (small local models, servers without function calling) write them
as text. :func:`parse_tool_calls` recovers calls from

* ``<tool_call>{...}</tool_call>`` / ``<function_call>...`` tags (Hermes/Qwen style; an unterminated tag is read
  to the end of the text),
* fenced code blocks (```json ... ```),
* bare JSON objects or lists anywhere in the text,
* ``name(key=value, ...)`` call syntax for tools named in ``known_tools``,

accepting the shapes ``{"name", "arguments"}`` (also ``parameters``/``args``/``input``), ``{"tool": ...}``,
``{"function": {"name", "arguments"}}``, ``{"tool_calls": [...]}`` and flat ``{"name": "move", "direction":
"up"}``. JSON is repaired leniently (trailing commas, single quotes, Python literals, unclosed brackets of a
truncated reply, arguments given as a JSON string). ``<think>...</think>`` blocks are ignored. What cannot be
recovered is returned as an error message, never raised: the harness records a failed step.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from zoo.agents.types import ToolCall

NAME_KEYS = ("name", "tool", "tool_name", "function")
ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "params")
_TAGS = re.compile(r"<(tool_call|function_call)>(.*?)(?:</\1>|$)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL)


@dataclass
class ParsedCalls:
    """Calls recovered from a reply, in order, and why other candidate calls could not be read."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _snippet(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _close_brackets(text: str) -> str:
    """Append the quotes and brackets a truncated JSON text is missing."""
    stack: list[str] = []
    in_string, escaped, quote = False, False, ""
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                in_string = False
        elif char in "\"'":
            in_string, quote = True, char
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
        elif char in "}]" and stack and stack[-1] == char:
            stack.pop()
    tail = quote if in_string else ""
    return text + tail + "".join(reversed(stack))


def _python_literals(text: str) -> str:
    return re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", text)))


def loads_lenient(text: str) -> Any:
    """``json.loads`` with repairs for the usual model mistakes; raises ``ValueError`` naming the problem."""
    text = text.strip()
    first_error: Exception | None = None
    for candidate in (text, _close_brackets(text)):
        no_trailing = re.sub(r",\s*([}\]])", r"\1", candidate)
        for attempt in (candidate, no_trailing):
            try:
                return json.loads(attempt)
            except json.JSONDecodeError as err:
                first_error = first_error or err
        for attempt in (no_trailing, _python_literals(no_trailing)):
            try:
                value = ast.literal_eval(attempt)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # TypeError: {{...}}
                continue
            if isinstance(value, (dict, list)) and _is_json(value):
                return value
    raise ValueError(f"malformed JSON ({first_error})")


def _is_json(value: Any) -> bool:
    """Whether a Python literal is a JSON value (objects with string keys, arrays, strings, numbers, booleans, null):
    ``ast.literal_eval`` also reads sets, tuples and bytes, which a tool call cannot carry."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    return value is None or isinstance(value, (str, bool, int, float))


def _json_spans(text: str) -> list[str]:
    """Top-level ``{...}``/``[{...}]`` spans of ``text`` (an unclosed one runs to the end)."""
    spans: list[str] = []
    stack: list[str] = []
    start = -1
    in_string, escaped = False, False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif stack and char == '"':
            in_string = True
        elif char == "{" or (char == "[" and (stack or text[i + 1 : i + 20].lstrip().startswith("{"))):
            if not stack:
                start = i
            stack.append("}" if char == "{" else "]")
        elif stack and char == stack[-1]:
            stack.pop()
            if not stack:
                spans.append(text[start : i + 1])
    if stack:
        spans.append(text[start:])
    return spans


def _call_syntax(text: str, known_tools: Iterable[str]) -> list[tuple[str, str]]:
    """``name(...)`` expressions for known tool names, as ``(name, source)``."""
    found = []
    for name in known_tools:
        for match in re.finditer(rf"(?<![\w.]){re.escape(name)}\s*\(", text):
            depth = 0
            for j in range(match.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    found.append((match.start(), name, text[match.start() : j + 1]))
                    break
    return [(name, source) for _, name, source in sorted(found)]


def _from_call_syntax(name: str, source: str, tool_params: dict[str, list[str]]) -> dict[str, Any]:
    node = ast.parse(source, mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {source}")
    arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    positional = tool_params.get(name, [])
    if len(node.args) > len(positional):
        raise ValueError(f"{name} got {len(node.args)} positional arguments")
    for param, value in zip(positional, node.args):
        arguments[param] = ast.literal_eval(value)
    return arguments


def _normalize(obj: Any, strict: bool) -> tuple[list[tuple[str, Any]], list[str]]:
    """``[(name, arguments)]`` from one decoded candidate; ``strict``: a nameless object is an error."""
    if isinstance(obj, list):
        calls, errors = [], []
        for item in obj:
            c, e = _normalize(item, strict)
            calls += c
            errors += e
        return calls, errors
    if not isinstance(obj, dict):
        return [], ([f"a tool call must be a JSON object, got {_snippet(json.dumps(obj))}"] if strict else [])
    if isinstance(obj.get("tool_calls"), list):
        return _normalize(obj["tool_calls"], True)
    function = obj.get("function")
    if isinstance(function, dict):
        return _normalize(function, True)
    name = next((obj[k] for k in NAME_KEYS if isinstance(obj.get(k), str) and obj[k].strip()), None)
    if name is None:
        missing = f"a tool call needs a 'name' (one of {list(NAME_KEYS)}): {_snippet(json.dumps(obj))}"
        return [], ([missing] if strict else [])
    arg_key = next((k for k in ARGUMENT_KEYS if k in obj), None)
    if arg_key is None:
        arguments: Any = {k: v for k, v in obj.items() if k not in NAME_KEYS and k not in ("id", "type")}
    else:
        arguments = obj[arg_key]
    return [(name.strip(), arguments)], []


def _finish(pairs: list[tuple[str, Any]], errors: list[str], id_prefix: str, ids: list[str] | None = None):
    calls = []
    for i, (name, arguments) in enumerate(pairs):
        if isinstance(arguments, str):
            if not arguments.strip():
                arguments = {}
            else:
                try:
                    arguments = loads_lenient(arguments)
                except ValueError as err:
                    errors.append(f"arguments of {name} are not valid JSON: {err}: {_snippet(arguments)}")
                    continue
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            errors.append(f"arguments of {name} must be a JSON object, got {_snippet(json.dumps(arguments))}")
            continue
        call_id = ids[i] if ids and i < len(ids) and ids[i] else f"{id_prefix}{i}"
        calls.append(ToolCall(name=name, arguments=arguments, id=call_id))
    return ParsedCalls(calls, errors)


def parse_tool_calls(
    text: str, known_tools: Iterable[str] = (), tool_params: dict[str, list[str]] | None = None
) -> ParsedCalls:
    """Tool calls written in a model's text reply (see the module docstring for the accepted forms).

    Args:
        text: the reply.
        known_tools: tool names recognised in ``name(...)`` call syntax.
        tool_params: positional parameter order per tool, for ``name("up")``.
    """
    text = _THINK.sub("", text or "")
    pairs: list[tuple[str, Any]] = []
    errors: list[str] = []
    marked = [m.group(2) for m in _TAGS.finditer(text)]
    marked += [m.group(2) for m in _FENCE.finditer(_TAGS.sub("", text)) if m.group(1).lower() != "python"]
    candidates = [(c, True) for c in marked if c.strip()]
    if not candidates:
        candidates = [(c, False) for c in _json_spans(text)]
    for candidate, strict in candidates:
        try:
            obj = loads_lenient(candidate)
        except ValueError as err:
            if strict or re.search(r"[\"']name[\"']|[\"']tool[\"']", candidate):
                errors.append(f"could not read tool call: {err}: {_snippet(candidate)}")
            continue
        found, problems = _normalize(obj, strict)
        pairs += found
        errors += problems
    if not pairs and known_tools:
        for name, source in _call_syntax(text, known_tools):
            try:
                pairs.append((name, _from_call_syntax(name, source, tool_params or {})))
            except (ValueError, SyntaxError) as err:
                errors.append(f"could not read call {_snippet(source)}: {err}")
    if pairs:
        errors = [e for e in errors if not e.startswith("a tool call needs")]
    return _finish(pairs, errors, "text_call_")


def parse_native_tool_calls(raw_calls: list[dict[str, Any]]) -> ParsedCalls:
    """OpenAI ``message.tool_calls`` entries; malformed ``arguments`` strings are repaired or reported."""
    pairs, errors, ids = [], [], []
    for raw in raw_calls or []:
        function = raw.get("function") if isinstance(raw, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name.strip():
            errors.append(f"native tool call without a function name: {_snippet(json.dumps(raw, default=str))}")
            continue
        pairs.append((name.strip(), function.get("arguments")))
        ids.append(str(raw.get("id") or ""))
    return _finish(pairs, errors, "call_", ids)
