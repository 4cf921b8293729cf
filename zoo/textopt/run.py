"""Run a textual optimizer on a chain problem: the step loop's bookkeeping, shared by the Lightning module and
:func:`optimize` (plain Python).

Per step (:meth:`Tracker.step`): minibatch accuracy before the update, the components sent to the optimizer, how many
of them were faulty at that moment (the simulator knows), the faulty count after the update, cumulative call and
token counts per role; once the method's call budget is spent, the remaining steps are skipped. Summary
(:meth:`Tracker.summary`): test accuracy, attribution accuracy (share of optimizer calls spent on a faulty
component), steps to converge (first step after which no component is faulty), steps run, calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zoo.agents.backends.base import Backend
from zoo.errors import ConfigError
from zoo.textopt.calls import PROXY_ROLES
from zoo.textopt.problem import ChainProblem, Example
from zoo.textopt.textgrad import ChainOptimizer, TextGrad
from zoo.textopt.textresnet import TextResNet

OPTIMIZERS = {"textgrad": TextGrad, "textresnet": TextResNet}
TOKEN_PROXY_ROLES = PROXY_ROLES


def make_optimizer(
    name: str, problem: ChainProblem, backend: Backend | None = None, seed: int | None = 0, **options: Any
) -> ChainOptimizer:
    """``textgrad`` or ``textresnet`` on ``problem``; ``backend=None`` uses the problem's own (the simulator's)."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"textual optimizer {name!r}; use one of {sorted(OPTIMIZERS)}")
    backend = backend if backend is not None else problem.default_backend()
    if backend is None:
        raise ConfigError(f"{type(problem).__name__} has no built-in model: choose one with backend=<name>")
    return OPTIMIZERS[name](problem, backend, seed=seed, **options)


def evaluate(method: ChainOptimizer, examples: Sequence[Example]) -> float:
    """Share of ``examples`` the chain answers correctly with its current instructions."""
    hits = sum(method.problem.is_correct(method.output(e), e, method.residual) for e in examples)
    return hits / max(len(examples), 1)


class Tracker:
    """Bookkeeping of an optimization run (see the module docstring)."""

    def __init__(self, method: ChainOptimizer) -> None:
        self.method = method
        self.history: list[dict[str, Any]] = []
        self.converged_at: int | None = None
        if self._faulty() == set():
            self.converged_at = 0

    def _faulty(self) -> set[str] | None:
        return self.method.problem.faulty(self.method.instructions())

    def step(self, examples: Sequence[Example]) -> dict[str, Any]:
        """One optimization step and its row; once the method's call budget is spent the step is skipped (no call,
        ``skipped: true``)."""
        number = len(self.history) + 1
        if not self.method.within_budget():
            faulty = self._faulty()
            row = {"step": number, "skipped": True, "accuracy": None, "updated": [], "updates": 0}
            row.update(hits=None if faulty is None else 0, faulty=None if faulty is None else len(faulty))
            self.history.append({**row, "critiques": 0, **self.method.log.snapshot()})
            return self.history[-1]
        before = self._faulty()
        report = self.method.step(examples)
        after = self._faulty()
        row: dict[str, Any] = {
            "step": number,
            "accuracy": report.accuracy,
            "updated": report.updated,
            "updates": len(report.updated),
            "hits": None if before is None else sum(cid in before for cid in report.updated),
            "faulty_before": None if before is None else len(before),
            "faulty": None if after is None else len(after),
            "critiques": sum(len(v) for v in report.gradients.values()),
            **{k: v for k, v in report.extra.items() if k != "density"},
            **self.method.log.snapshot(),
        }
        if "density" in report.extra:
            row["density"] = report.extra["density"]
        if after is not None:
            if after:
                self.converged_at = None
            elif self.converged_at is None:
                self.converged_at = number
        self.history.append(row)
        return row

    def summary(self, test_accuracy: float | None = None) -> dict[str, Any]:
        updates = sum(r["updates"] for r in self.history)
        hits = [r["hits"] for r in self.history if r["hits"] is not None]
        calls = self.method.log.snapshot()
        return {
            "method": self.method.name,
            "steps": len(self.history),
            "steps_run": sum(not r.get("skipped") for r in self.history),
            "call_budget": self.method.call_budget,
            "test_accuracy": test_accuracy,
            "updates": updates,
            "attribution_accuracy": sum(hits) / updates if hits and updates else None,
            "converged_at": self.converged_at,
            "faulty_final": self.history[-1]["faulty"] if self.history else None,
            "token_proxy_calls": sum(calls[f"calls/{r}"] for r in TOKEN_PROXY_ROLES),
            "token_proxy_tokens": sum(calls[f"tokens/{r}"] for r in TOKEN_PROXY_ROLES),
            "optimizer_parse_failures": self.method.optimizer.parse_failures,
            **calls,
            "instructions": self.method.instructions(),
        }


def optimize(
    problem: ChainProblem,
    method: str = "textresnet",
    steps: int = 10,
    batch_size: int = 4,
    backend: Backend | None = None,
    seed: int = 0,
    **options: Any,
) -> dict[str, Any]:
    """Plain-Python run: ``steps`` minibatches of ``batch_size`` training examples, then the test accuracy.

    Returns the :meth:`Tracker.summary` plus ``history`` (one row per step).
    """
    optimizer = make_optimizer(method, problem, backend, seed, **options)
    tracker = Tracker(optimizer)
    for step in range(steps):
        tracker.step(problem.train_examples(list(range(step * batch_size, (step + 1) * batch_size))))
    return {**tracker.summary(evaluate(optimizer, problem.test_examples())), "history": tracker.history}
