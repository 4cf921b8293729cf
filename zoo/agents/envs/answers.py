"""Free-form answers graded deterministically: the agent writes each hidden rule as an expression.

UltraHorizon's released graders send the agent's free-text report and the ground truth to an LLM judge, which
awards a rule's points only when the report names the right effect *and* its trigger condition (the judge prompts
of ``envs/*/env.py``). Offline, the zoo asks for the same statement in a form a program can check: each rule is a
Python expression over the quantities the environment's prompt already names (position, energy, step number,
visit counts, the input strings, ...). The grader evaluates it on a fixed, seeded set of situations and awards
the rubric item, all or nothing, when it agrees with the true rule on every one of them -- the "trigger condition
must be identified" rule of the official judge, made exact. No candidate rule is shown to the agent.

Expressions are parsed with :mod:`ast` and only a small, side-effect-free subset is accepted: literals, names of
the given variables, arithmetic/comparison/boolean operators, conditional expressions, subscripts and slices,
comprehensions, calls of a few pure builtins (:data:`FUNCTIONS`) and of a few string methods
(:data:`STRING_METHODS`). No attribute other than those methods, no power operator, and integer constants are
bounded, so an answer cannot run away with time or memory.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "all": all,
    "any": any,
    "chr": chr,
    "dict": dict,
    "enumerate": enumerate,
    "int": int,
    "len": len,
    "list": list,
    "max": max,
    "min": min,
    "ord": ord,
    "range": range,
    "reversed": reversed,
    "round": round,
    "set": set,
    "sorted": sorted,
    "str": str,
    "sum": sum,
    "tuple": tuple,
    "zip": zip,
}
STRING_METHODS = frozenset({"join", "replace", "count", "index", "find", "upper", "lower", "get", "startswith"})
MAX_LENGTH = 2000
MAX_CONSTANT = 1000

_NODES = (
    ast.Expression,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Store,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.Call,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.Starred,
    ast.List,
    ast.Set,
    ast.Dict,
    ast.ListComp,
    ast.SetComp,
    ast.GeneratorExp,
    ast.DictComp,
    ast.comprehension,
    ast.keyword,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)


class AnswerError(ValueError):
    """An answer expression that cannot be accepted (the message says what to change)."""


def compile_expression(text: Any, variables: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    """Check ``text`` and return ``f(values) -> result`` evaluating it with ``values`` bound to ``variables``.

    Raises:
        AnswerError: not a string, too long, not an expression, or outside the accepted subset.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = repr(text)
    if not isinstance(text, str) or not text.strip():
        raise AnswerError(f"expected an expression string over {list(variables)}, got {text!r}")
    if len(text) > MAX_LENGTH:
        raise AnswerError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise AnswerError(f"not a Python expression ({err.msg}): {text!r}") from None
    bound = set(variables)
    for node in ast.walk(tree):
        if not isinstance(node, _NODES) or isinstance(node, ast.Pow):
            raise AnswerError(f"{type(node).__name__} is not allowed in an answer expression: {text!r}")
        if isinstance(node, ast.comprehension):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        if isinstance(node, ast.Attribute) and (node.attr not in STRING_METHODS or node.attr.startswith("_")):
            raise AnswerError(f"attribute .{node.attr} is not allowed (methods: {sorted(STRING_METHODS)})")
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and abs(node.value) > MAX_CONSTANT:
            raise AnswerError(f"constant {node.value} is larger than {MAX_CONSTANT}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in bound and node.id not in FUNCTIONS:
            raise AnswerError(f"unknown name {node.id!r}; use the variables {list(variables)}")
    code = compile(tree, "<answer>", "eval")

    def evaluate(values: Mapping[str, Any]) -> Any:
        scope = {"__builtins__": {}, **FUNCTIONS, **{k: values[k] for k in variables}}
        return eval(code, scope)

    return evaluate


def agrees(answer: Callable[[Mapping[str, Any]], Any], truth: Callable[[Mapping[str, Any]], Any], cases) -> bool:
    """Whether ``answer`` equals ``truth`` on every case (an answer that raises on a case disagrees)."""
    for case in cases:
        try:
            if answer(case) != truth(case):
                return False
        except Exception:
            return False
    return True
