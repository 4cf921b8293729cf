"""Tool declaration (schema from type hints and docstring), the registry, and the tool-call parser on broken output."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from zoo.agents import MysteryGrid, ToolRegistry, agent_tool, parse_native_tool_calls, parse_tool_calls
from zoo.agents.parsing import loads_lenient
from zoo.agents.tools import Tool


class Lab:
    """A toy tool holder: two declared tools and one plain method."""

    @agent_tool
    def cross(self, parent1_id: int, parent2_id: int, num_offspring: int = 10) -> dict[str, Any]:
        """Cross two organisms.

        Args:
            parent1_id: first parent.
            parent2_id: second parent.
            num_offspring: how many
                viable offspring to produce.

        Returns:
            the offspring.
        """
        return {"success": True, "n": num_offspring, "parents": [parent1_id, parent2_id]}

    @agent_tool
    def tag(self, ids: list[int], mode: Literal["add", "drop"], note: str | None = None) -> dict[str, Any]:
        """Tag organisms."""
        return {"ids": ids, "mode": mode, "note": note}

    def helper(self) -> int:
        return 1

    @agent_tool
    def broken(self) -> dict[str, Any]:
        """Always raises."""
        raise RuntimeError("boom")


def test_schema_comes_from_type_hints_and_docstring():
    tool = Tool.from_function(Lab().cross)
    assert tool.name == "cross"
    assert tool.description == "Cross two organisms."
    props = tool.parameters["properties"]
    assert props["parent1_id"] == {"type": "integer", "description": "first parent."}
    assert props["num_offspring"]["description"] == "how many viable offspring to produce."
    assert tool.parameters["required"] == ["parent1_id", "parent2_id"]
    tag = Tool.from_function(Lab().tag).parameters
    assert tag["properties"]["ids"] == {"type": "array", "items": {"type": "integer"}}
    assert tag["properties"]["mode"] == {"type": "string", "enum": ["add", "drop"]}
    assert tag["required"] == ["ids", "mode"]
    assert Tool.from_function(Lab().cross).spec()["function"]["name"] == "cross"


def test_registry_holds_exactly_the_declared_tools():
    registry = ToolRegistry.from_object(Lab())
    assert registry.names == ["cross", "tag", "broken"]
    assert "helper" not in registry


def test_registry_of_an_environment_is_its_declared_tools():
    registry = MysteryGrid(seed=0).tools()
    assert registry.names == ["move", "get_current_state", "get_full_map", "reset", "commit_final_result"]
    commit = registry["commit_final_result"]
    # the answer format is part of the declaration; no candidate rule is (the default commit is not multiple choice)
    assert "Format:" in commit.description and "visits" in commit.description
    assert "round_step_mod_3" not in commit.description


def test_calls_are_validated_and_bad_calls_become_failed_results():
    registry = ToolRegistry.from_object(Lab())
    ok = registry.call("cross", {"parent1_id": "1", "parent2_id": 2.0})
    assert ok.ok and ok.content["parents"] == [1, 2] and ok.content["n"] == 10
    unknown = registry.call("fly", {})
    assert not unknown.ok and "unknown tool 'fly'" in unknown.error and "cross" in unknown.error
    missing = registry.call("cross", {"parent1_id": 1})
    assert not missing.ok and "parent2_id" in missing.error
    extra = registry.call("cross", {"parent1_id": 1, "parent2_id": 2, "colour": "red"})
    assert not extra.ok and "colour" in extra.error
    wrong_type = registry.call("cross", {"parent1_id": "one", "parent2_id": 2})
    assert not wrong_type.ok and "integer" in wrong_type.error
    enum = registry.call("tag", {"ids": [1], "mode": "keep"})
    assert not enum.ok and "add" in enum.error
    nullable = registry.call("tag", {"ids": [1], "mode": "add", "note": None})
    assert nullable.ok
    raised = registry.call("broken", {})
    assert not raised.ok and "RuntimeError" in raised.error and "boom" in raised.error


KNOWN = ["move", "conduct_cross", "note_tool"]
PARAMS = {"move": ["direction"], "conduct_cross": ["parent1_id", "parent2_id", "num_offspring"]}


@pytest.mark.parametrize(
    ("text", "name", "arguments"),
    [
        ('<tool_call>{"name": "move", "arguments": {"direction": "up"}}</tool_call>', "move", {"direction": "up"}),
        (
            'Plan: go.\n```json\n{"name": "move", "arguments": "{\\"direction\\": \\"left\\"}"}\n```',
            "move",
            {"direction": "left"},
        ),
        ("{'name': 'move', 'arguments': {'direction': 'down'},}", "move", {"direction": "down"}),
        (  # truncated reply: unclosed braces are closed
            '{"name": "conduct_cross", "arguments": {"parent1_id": 1, "parent2_id": 2, "num_offspring": 10',
            "conduct_cross",
            {"parent1_id": 1, "parent2_id": 2, "num_offspring": 10},
        ),
        ('<think>{"name": "reset"}</think> {"tool": "move", "args": {"direction": "up"}}', "move", {"direction": "up"}),
        (
            '{"function": {"name": "move", "arguments": "{\\"direction\\": \\"right\\"}"}}',
            "move",
            {"direction": "right"},
        ),
        ('{"name": "move", "direction": "up"}', "move", {"direction": "up"}),
        (
            '{"name": "note_tool", "arguments": {"action": "write_note", "note": "B {+3}"}}',
            "note_tool",
            {"action": "write_note", "note": "B {+3}"},
        ),
        ('{"name": "x", "arguments": {"flag": true, "value": null}}', "x", {"flag": True, "value": None}),
        ('<tool_call>{"name": "move", "arguments": {"direction": "up"}}', "move", {"direction": "up"}),
        ('I call move(direction="up") now', "move", {"direction": "up"}),
        ('move("down")', "move", {"direction": "down"}),
    ],
)
def test_parser_recovers_calls_from_imperfect_text(text, name, arguments):
    parsed = parse_tool_calls(text, known_tools=KNOWN, tool_params=PARAMS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [(name, arguments)]
    assert parsed.errors == []


def test_parser_keeps_several_calls_in_order():
    text = '[{"name": "move", "arguments": {"direction": "up"}}, {"name": "move", "arguments": {"direction": "left"}}]'
    parsed = parse_tool_calls(text)
    assert [c.arguments["direction"] for c in parsed.calls] == ["up", "left"]
    assert len({c.id for c in parsed.calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "move", "arguments": {"direction": </tool_call>',  # value missing
        '<tool_call>{"arguments": {"direction": "up"}}</tool_call>',  # no name
        '<tool_call>{"name": "move", "arguments": "direction=up"}</tool_call>',  # arguments not JSON
        '<tool_call>{"name": "move", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '```json\n{"name": "move", "arguments": {"direction": "up" "x": 1}}\n```',  # missing comma
    ],
)
def test_parser_reports_what_it_cannot_read(text):
    parsed = parse_tool_calls(text)
    assert parsed.calls == []
    assert parsed.errors and all(isinstance(e, str) and e for e in parsed.errors)


def test_plain_text_is_neither_a_call_nor_an_error():
    parsed = parse_tool_calls("I think A gives +1 score. {not json but braces}")
    assert parsed.calls == [] and parsed.errors == []


def test_native_tool_calls_with_broken_arguments():
    parsed = parse_native_tool_calls(
        [
            {"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"direction": "up"'}},
            {"id": "c2", "type": "function", "function": {"arguments": "{}"}},
            {"id": "c3", "type": "function", "function": {"name": "reset", "arguments": ""}},
            {"id": "c4", "type": "function", "function": {"name": "move", "arguments": "up please"}},
        ]
    )
    assert [(c.id, c.name, c.arguments) for c in parsed.calls] == [
        ("c1", "move", {"direction": "up"}),
        ("c3", "reset", {}),
    ]
    assert len(parsed.errors) == 2


def test_lenient_json_raises_a_value_error_naming_the_problem():
    with pytest.raises(ValueError, match="malformed JSON"):
        loads_lenient("{'a': }")


def test_a_reply_that_python_reads_as_a_set_of_dicts_is_a_parse_error_not_a_crash():
    """A tiny model's reply seen in an UltraHorizon run: ``{{...}}`` is a Python set holding a dict, which
    ``ast.literal_eval`` rejects with ``TypeError``; the episode must record a malformed call and go on."""
    with pytest.raises(ValueError, match="malformed JSON"):
        loads_lenient('{{"name": "move"}}')
    parsed = parse_tool_calls('<tool_call>{{"name": "move", "arguments": {}}}</tool_call>', known_tools=["move"])
    assert not parsed.calls and len(parsed.errors) == 1


@pytest.mark.parametrize(
    "reply",
    [
        '{"name": {"parent1_cross", "parent2"}}',  # the behaviour-cloned Alien Genetics Lab model's reply, 2026-12-07
        '{"name": "move", "arguments": {"direction": ("up", "down")}}',
        '{"name": "move", "arguments": {1: \'up\'}}',
        '{"name": "move", "arguments": {"direction": b"up"}}',
    ],
)
def test_a_reply_that_python_reads_as_a_set_tuple_or_bytes_is_a_parse_error_not_a_crash(reply):
    """``ast.literal_eval`` (the lenient fallback) reads sets, tuples, bytes and non-string keys, which no JSON tool
    call carries: before, a set reached ``json.dumps`` in the error message and ended the run with a TypeError."""
    with pytest.raises(ValueError, match="malformed JSON"):
        loads_lenient(reply)
    parsed = parse_tool_calls(f"<tool_call>{reply}</tool_call>", known_tools=["move"])
    assert not parsed.calls and len(parsed.errors) == 1 and parsed.errors[0].startswith("could not read tool call")
