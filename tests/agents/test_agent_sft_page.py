"""The agent demos' pages: an LLM arm none of whose replies parsed as a tool call cannot act; it leaves the score
tables and the page says why (demos/_agent_pages.py, used by demos/ultrahorizon.py)."""

from __future__ import annotations

import sys

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "demos"))

from _agent_pages import cannot_act


def test_an_arm_without_a_parsed_tool_call_cannot_act():
    failed = {"tool": None, "ok": False, "error": "the reply called no tool"}
    episodes = [{"steps": [failed, failed]}, {"steps": [failed]}]
    assert cannot_act(episodes) == "none of its 3 replies (2 episodes) parsed as a tool call"
    episodes[1]["steps"].append({"tool": "move", "ok": False, "error": "unknown direction"})
    assert cannot_act(episodes) is None  # one executed call (even a failed one) touched the environment
