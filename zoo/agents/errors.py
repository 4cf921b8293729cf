"""Errors of the agent substrate (all :class:`~zoo.errors.ZooError`: ``train.py`` prints them as one line)."""

from __future__ import annotations

from zoo.errors import ZooError


class BackendError(ZooError, RuntimeError):
    """A model backend failed in a way the user can fix (bad response, HTTP error, missing files)."""


class UnreachableEndpointError(BackendError, ConnectionError):
    """An OpenAI-compatible endpoint (or judge) could not be reached after all retries."""


class ReplayMissError(BackendError, KeyError):
    """Replay mode found no recorded reply for a request."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
