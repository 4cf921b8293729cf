"""TextResNet's additive forward: tagged semantic deltas on an identity highway (plain string functions).

``x_i = x_{i-1} ⊕ δ_i`` with ``⊕`` a tagged append ``<delta id="c3">…</delta>`` [reconstruction: the paper fixes the
mechanism, not the format]; an empty delta appends nothing, so with all deltas empty ``x_L == x_0``, and every state
is a prefix of the next. A retraction delta ``<retract id="c5" target="c3"/>`` withdraws an upstream contribution
without editing it. Used by :class:`zoo.textopt.TextResNet` and by the problems' critics.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_DELTA = re.compile(r'<delta id="([^"]+)">(.*?)</delta>|<retract id="([^"]+)" target="([^"]+)"/>', re.DOTALL)
_RETRACT_REPLY = re.compile(r"^\s*RETRACT\s+(\S+)\s*$")


def cap_delta(text: str, max_chars: int | None) -> str:
    """The delta cut to ``max_chars`` characters (the last one an ellipsis); ``None`` keeps it whole."""
    text = text.strip()
    if max_chars is not None and len(text) > max_chars:
        return text[: max(max_chars - 1, 0)] + "…"
    return text


def append_delta(state: str, component_id: str, delta: str, max_chars: int | None = None) -> str:
    """``x ⊕ δ``: the state with the tagged delta appended; an empty delta leaves the state unchanged.

    Upstream text is never edited, so the state before is a prefix of the state after (the identity highway).
    """
    delta = cap_delta(delta, max_chars).replace("</delta>", "</ delta>")
    if not delta:
        return state
    return f'{state}\n<delta id="{component_id}">{delta}</delta>'


def append_retraction(state: str, component_id: str, target: str) -> str:
    """A retraction delta: ``component_id`` withdraws the contribution of ``target`` (kept in the text, hidden by
    :func:`visible_deltas`), so an additive chain can undo an upstream error without editing upstream text."""
    return f'{state}\n<retract id="{component_id}" target="{target}"/>'


def parse_deltas(state: str) -> list[tuple[str, str]]:
    """``[(component id, delta text), ...]`` in order (retractions excluded)."""
    return [(m.group(1), m.group(2)) for m in _DELTA.finditer(state) if m.group(1) is not None]


def visible_deltas(state: str) -> list[tuple[str, str]]:
    """The deltas not withdrawn by a later retraction, in order."""
    items: list[tuple[str, str]] = []
    for match in _DELTA.finditer(state):
        if match.group(1) is not None:
            items.append((match.group(1), match.group(2)))
        else:
            items = [(cid, text) for cid, text in items if cid != match.group(4)]
    return items


def state_input(state: str) -> str:
    """The text before the first delta (the chain's input ``x_0``)."""
    match = _DELTA.search(state)
    return (state[: match.start()] if match else state).rstrip("\n")


def residual_forward(
    x0: str, components: Sequence[tuple[str, Callable[[str], str]]], max_delta_chars: int | None = None
) -> list[str]:
    """``[x_0, x_1, ..., x_L]`` with ``x_i = x_{i-1} ⊕ C_i(x_{i-1})``; a component reply ``RETRACT <id>`` appends a
    retraction instead of a delta."""
    states = [x0]
    for component_id, component in components:
        reply = component(states[-1])
        retract = _RETRACT_REPLY.match(reply)
        if retract:
            states.append(append_retraction(states[-1], component_id, retract.group(1)))
        else:
            states.append(append_delta(states[-1], component_id, reply, max_delta_chars))
    return states


def replace_forward(x0: str, components: Sequence[Callable[[str], str]]) -> list[str]:
    """``[y_0, ..., y_L]`` with ``y_i = C_i(y_{i-1})``: the replace-style chain of TextGrad (no identity highway)."""
    states = [x0]
    for component in components:
        states.append(component(states[-1]))
    return states


def is_prefix_chain(states: Sequence[str]) -> bool:
    """Whether every state is a prefix of the next (the identity-highway invariant)."""
    return all(b.startswith(a) for a, b in zip(states, states[1:]))
