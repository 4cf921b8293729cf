"""An agent's working context (the conversation it sees) and its notebook (memory that outlives the context).

UltraHorizon's harness gives every agent a note tool (``note_tool(action="write_note" | "check_notes")``) and,
for *context refresh with notes recall* (CRNR), replaces the whole conversation by one user message once it
holds more than ``window`` messages (OpenManus ``Memory.add_message`` with ``WINDOW_SIZE``, default 200). The
system prompt is not part of the context, and the notes are kept by the note tool, not by the context, so
both survive a refresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from zoo.agents.tools import agent_tool
from zoo.agents.types import Message
from zoo.errors import ConfigError

REFRESH_MESSAGE = (
    "The context has been cleared. Read your notes (note_tool with action check_notes) to recover what you "
    "learned so far, and continue the task only after reviewing them."
)


class Context:
    """The messages an agent conditions on (system prompt excluded).

    Args:
        window: ``None`` keeps every message; an integer enables CRNR: when adding a message makes the context
            longer than ``window``, it is replaced by the single :data:`REFRESH_MESSAGE` user message and
            ``on_refresh`` is called.
        on_refresh: called after each refresh (agents use it to drop the working memory derived from context).
    """

    def __init__(self, window: int | None = None, on_refresh: Callable[[], None] | None = None) -> None:
        if window is not None and window < 1:
            raise ConfigError(f"the context window must be >= 1 message, got {window}")
        self.window = window
        self.on_refresh = on_refresh
        self.messages: list[Message] = []
        self.refreshes = 0

    def add(self, message: Message) -> None:
        self.messages.append(message)
        if self.window is not None and len(self.messages) > self.window:
            self.messages = [{"role": "user", "content": REFRESH_MESSAGE}]
            self.refreshes += 1
            if self.on_refresh is not None:
                self.on_refresh()

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def refreshed(self) -> bool:
        """Whether the context is exactly the refresh message (nothing has happened since the last refresh)."""
        return len(self.messages) == 1 and self.messages[0].get("content") == REFRESH_MESSAGE


class NoteBook:
    """The note tool: notes are appended and read back whole; they survive context refreshes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @agent_tool
    def note_tool(self, action: Literal["write_note", "check_notes"], note: str | None = None) -> dict[str, Any]:
        """Write a note or read all notes. Record plans, observations and conclusions; check notes often.

        Args:
            action: write_note to add a note, check_notes to read every note written so far.
            note: the text of the note (required for write_note).
        """
        if action == "write_note":
            if not note:
                return {"success": False, "message": "note is required when action is write_note"}
            self.notes.append(note)
            return {"success": True, "message": f"Note added: {note}"}
        return {"success": True, "notes": list(self.notes)}
