"""Tools declared once: name, description and JSON schema come from the function's signature and docstring.

Mark a method with :func:`agent_tool` and :meth:`ToolRegistry.from_object` finds it (UltraHorizon marks its tools
with the text ``[agent tool]`` in the docstring; a decorator is the same declaration, checked by Python). The
schema of every parameter comes from its type hint (``str``, ``int``, ``float``, ``bool``, ``list[X]``,
``dict``, ``Literal[...]``, ``X | None``) and its description from the Google-style ``Args:`` section.

:meth:`ToolRegistry.call` never raises for a bad call: an unknown tool, a missing or unexpected argument or a
value of the wrong type comes back as a failed :class:`~zoo.agents.types.ToolResult` whose message names the
problem and the valid choices, so a model can correct itself and the harness records a failed step.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from zoo.agents.types import ToolResult
from zoo.errors import ConfigError

_MARK = "__agent_tool__"
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object"}


def agent_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare ``fn`` (usually a method) as a tool an agent may call."""
    setattr(fn, _MARK, True)
    return fn


def is_agent_tool(fn: Any) -> bool:
    return bool(getattr(fn, _MARK, False))


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {param: description})`` from a Google-style docstring (the text before ``Args:``)."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    head = []
    while lines and lines[0].strip() != "Args:":
        head.append(lines.pop(0))
    params: dict[str, str] = {}
    indent, current = None, None
    for line in lines[1:]:
        if not line.strip():
            continue
        level = len(line) - len(line.lstrip())
        if level == 0:  # the next section (Returns:, ...)
            break
        indent = level if indent is None else indent
        match = re.match(r"(\w+)\s*(?:\([^)]*\))?:\s*(.*)", line.strip())
        if level == indent and match:
            current = match.group(1)
            params[current] = match.group(2)
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(head).strip(), params


def type_schema(hint: Any) -> tuple[dict[str, Any], bool]:
    """JSON schema of a type hint and whether ``None`` is allowed."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}, False
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        schema, _ = type_schema(rest[0]) if len(rest) == 1 else ({"anyOf": [type_schema(a)[0] for a in rest]}, False)
        return schema, len(rest) < len(args)
    if origin is Literal:
        values = list(args)
        kind = _JSON_TYPES.get(type(values[0]), "string")
        return {"type": kind, "enum": values}, False
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        item = type_schema(args[0])[0] if args else {}
        return {"type": "array", "items": item}, False
    if origin is dict or hint is dict:
        return {"type": "object"}, False
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}, False
    raise ConfigError(f"tool parameter type {hint!r} has no JSON schema; use str, int, float, bool, list or dict")


class ArgumentError(ValueError):
    """A tool argument does not match the tool's schema."""


def _coerce(value: Any, schema: dict[str, Any], nullable: bool, where: str) -> Any:
    if value is None:
        if nullable:
            return None
        raise ArgumentError(f"{where} must not be null")
    kind = schema.get("type")
    if kind == "integer":
        if isinstance(value, bool):
            raise ArgumentError(f"{where} must be an integer, got {value!r}")
        integral_float = isinstance(value, float) and value.is_integer()
        if integral_float or (isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value)):
            value = int(value)
        if not isinstance(value, int):
            raise ArgumentError(f"{where} must be an integer, got {value!r}")
    elif kind == "number":
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ArgumentError(f"{where} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ArgumentError(f"{where} must be a number, got {value!r}")
    elif kind == "boolean":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ArgumentError(f"{where} must be true or false, got {value!r}")
    elif kind == "string":
        if not isinstance(value, str):
            raise ArgumentError(f"{where} must be a string, got {value!r}")
    elif kind == "array":
        if not isinstance(value, (list, tuple)):
            raise ArgumentError(f"{where} must be a list, got {value!r}")
        value = [_coerce(v, schema.get("items", {}), False, f"{where}[{i}]") for i, v in enumerate(value)]
    elif kind == "object" and not isinstance(value, dict):
        raise ArgumentError(f"{where} must be an object, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(f"{where} must be one of {schema['enum']}, got {value!r}")
    return value


@dataclass
class Tool:
    """A callable with its declaration.

    Attributes:
        name: the name a model calls.
        description: what the tool does (the docstring before ``Args:``).
        parameters: JSON schema (``{"type": "object", "properties": ..., "required": [...]}``).
        fn: the callable.
        nullable: parameters that accept ``null``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    nullable: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        """Declare ``fn``: its type hints give the schema, its docstring the descriptions."""
        target = getattr(fn, "__func__", fn)
        hints = typing.get_type_hints(target)
        description, docs = parse_docstring(target.__doc__)
        properties: dict[str, Any] = {}
        required: list[str] = []
        nullable = set()
        for param in inspect.signature(fn).parameters.values():
            if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            schema, can_be_null = type_schema(hints.get(param.name, inspect.Parameter.empty))
            if param.name in docs:
                schema = {**schema, "description": docs[param.name]}
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
            else:
                can_be_null = can_be_null or param.default is None
            if can_be_null:
                nullable.add(param.name)
            properties[param.name] = schema
        parameters = {"type": "object", "properties": properties, "required": required}
        return cls(name or target.__name__, description, parameters, fn, frozenset(nullable))

    def spec(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def signature_text(self) -> str:
        """``name(arg: type, ...)`` for error messages and text prompts."""
        props = self.parameters["properties"]
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
        return f"{self.name}({args})"

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments checked against the schema (numbers given as strings are converted)."""
        if not isinstance(arguments, dict):
            raise ArgumentError(f"arguments of {self.name} must be a JSON object, got {arguments!r}")
        props = self.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ArgumentError(f"unexpected argument(s) {unknown}; the tool is {self.signature_text()}")
        missing = [k for k in self.parameters["required"] if k not in arguments]
        if missing:
            raise ArgumentError(f"missing required argument(s) {missing}; the tool is {self.signature_text()}")
        return {
            k: _coerce(v, props[k], k in self.nullable, f"argument '{k}' of {self.name}") for k, v in arguments.items()
        }


def _reports_failure(content: Any) -> bool:
    return isinstance(content, dict) and (content.get("success") is False or "error" in content)


class ToolRegistry:
    """Named tools; :meth:`call` runs one by name and never raises for a bad call."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    @classmethod
    def from_object(cls, obj: Any, exclude: Iterable[str] = ()) -> ToolRegistry:
        """Every method of ``obj`` marked with :func:`agent_tool`, in definition order (the class's own first)."""
        skip = set(exclude)
        names: list[str] = []
        for klass in type(obj).__mro__:
            for name, value in vars(klass).items():
                if is_agent_tool(value) and name not in names and name not in skip:
                    names.append(name)
        return cls(Tool.from_function(getattr(obj, name), name) for name in names)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ConfigError(f"tool '{tool.name}' is declared twice")
        self._tools[tool.name] = tool

    def extend(self, other: ToolRegistry) -> ToolRegistry:
        for tool in other:
            self.add(tool)
        return self

    def __iter__(self):
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        return [tool.spec() for tool in self]

    def call(self, name: str | None, arguments: dict[str, Any] | None = None, call_id: str = "call_0") -> ToolResult:
        """Run tool ``name``; unknown names, bad arguments and exceptions inside the tool become failed results."""
        arguments = {} if arguments is None else arguments
        if name not in self._tools:
            return ToolResult(
                name,
                arguments,
                ok=False,
                error=f"unknown tool {name!r}; available tools: {self.names}",
                call_id=call_id,
            )
        tool = self._tools[name]
        try:
            checked = tool.validate(arguments)
        except ArgumentError as err:
            return ToolResult(name, arguments, ok=False, error=str(err), call_id=call_id)
        try:
            content = tool.fn(**checked)
        except Exception as err:  # the harness records the failure; the episode goes on (as the official harness)
            return ToolResult(
                name, checked, ok=False, error=f"tool {name} raised {type(err).__name__}: {err}", call_id=call_id
            )
        return ToolResult(name, checked, ok=not _reports_failure(content), content=content, call_id=call_id)
