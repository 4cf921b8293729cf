"""Text variables and their gradients (the TextGrad abstraction, with gradients kept in insertion order).

A :class:`Variable` holds a text value, a role description (what the text is for, read by every prompt that
mentions it), whether it is optimized, the variables it was computed from, and its *textual gradients*: critiques
appended in the order they arrive. TextGrad keeps them in a Python ``set`` joined with newlines, so the gradient
text (and every prompt built from it) changes between runs; here they are a list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Variable:
    """A text value in a computation graph.

    Args:
        value: the text.
        role_description: what the text is (e.g. "instruction of component c3").
        requires_grad: whether backward computes a gradient for it (optimized parameters, intermediate outputs).
        predecessors: the variables it was computed from, in argument order.
        name: a short identifier (a component id for parameters).
    """

    value: str
    role_description: str
    requires_grad: bool = False
    predecessors: list[Variable] = field(default_factory=list)
    name: str | None = None
    gradients: list[str] = field(default_factory=list)
    backward_fn: Callable[[], None] | None = field(default=None, repr=False)

    def add_gradient(self, critique: str) -> None:
        """Append one critique (empty ones are ignored)."""
        if critique.strip():
            self.gradients.append(critique.strip())

    def gradient_text(self) -> str:
        """The gradients joined by newlines, in insertion order."""
        return "\n".join(self.gradients)

    def zero_grad(self) -> None:
        self.gradients.clear()

    def backward(self) -> None:
        """Run every ``backward_fn`` from this variable to the leaves, each node after all nodes that consume it.

        The order is a reverse topological order of a depth-first post-order over ``predecessors`` (deterministic:
        argument order), so a node's output holds all of its downstream gradients when the node's backward runs.
        """
        order: list[Variable] = []
        seen: set[int] = set()

        def visit(node: Variable) -> None:
            if id(node) in seen:
                return
            seen.add(id(node))
            for parent in node.predecessors:
                visit(parent)
            order.append(node)

        visit(self)
        for node in reversed(order):
            if node.backward_fn is not None:
                node.backward_fn()
