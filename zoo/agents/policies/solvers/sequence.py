"""Hypothesis solver for Sequence Exploration: one hypothesis set per stage over the declared rule library.

Every input shows all five intermediate strings, so each stage is checked on its own: a rule survives when it
maps the previous stage's shown output (empty for rule_1), the inputs, the step number and the previous input
to the stage's shown output. Experiments: among random valid input pairs, the one whose predicted outputs differ
most across the remaining rules of every stage (predicting from the best hypothesis of the stage before).
"""

from __future__ import annotations

from typing import Any, ClassVar

from zoo.agents.envs.ultrahorizon.sequence import ALPHABET, SEQ_RULES, STAGES, SeqContext, validate_sequence
from zoo.agents.policies.solvers.base import HypothesisSet, Solver, register_solver
from zoo.agents.types import ToolCall, ToolResult

CANDIDATE_PAIRS = 24


def possible_outputs(rule_id: str, ctx: SeqContext, previous_known: bool) -> set[str]:
    """Outputs a rule allows; with the previous input unknown, any rule that reads it allows anything."""
    rule = SEQ_RULES[rule_id].apply
    if previous_known:
        return {rule(ctx)}
    probes = [SeqContext(ctx.current, ctx.main, ctx.vice, ctx.n, lm, lv) for lm, lv in (("", ""), ("ABCDE", "EDCBA"))]
    outs = {rule(p) for p in probes}
    return outs if len(outs) == 1 else {"*"}


def random_sequence(rng) -> str:
    while True:
        candidate = "".join(rng.choice(ALPHABET) for _ in range(5))
        if validate_sequence(candidate) is None:
            return candidate


@register_solver
class SequenceSolver(Solver):
    env_name: ClassVar[str] = "ultrahorizon/sequence"

    def __init__(self, info, rng, lock_first) -> None:
        super().__init__(info, rng, lock_first)
        self.sets = {stage: HypothesisSet(SEQ_RULES, lock_first) for stage in STAGES}
        self.n = 0
        self.last: tuple[str, str] | None = ("", "")

    def state_dict(self) -> dict[str, Any]:
        return {
            "sets": {k: s.state() for k, s in self.sets.items()},
            "experiments": self.experiments,
            "exhausted": self.exhausted,
            "n": self.n,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for stage, s in state["sets"].items():
            self.sets[stage].load(s)
        self.experiments = int(state["experiments"])
        self.exhausted = bool(state["exhausted"])
        self.n = int(state["n"])

    def mark_unsynced(self) -> None:
        self.last = None  # the previous input is unknown until the next one

    def resolved(self) -> bool:
        return all(s.resolved or s.locked for s in self.sets.values())

    def commit_payload(self) -> dict[str, Any]:
        return {stage: s.best for stage, s in self.sets.items()}

    def _spread(self, main: str, vice: str) -> int:
        """How many hypotheses this input would tell apart (distinct predicted outputs per stage, summed)."""
        n = self.n + 1
        last_main, last_vice = self.last or ("", "")
        current, total = "", 0
        for stage in STAGES:
            ctx = SeqContext(current, main, vice, n, last_main, last_vice)
            remaining = self.sets[stage].remaining
            total += len({SEQ_RULES[r].apply(ctx) for r in remaining}) - 1
            current = SEQ_RULES[remaining[0]].apply(ctx)
        return total

    def next_call(self) -> ToolCall:
        pairs = [(random_sequence(self.rng), random_sequence(self.rng)) for _ in range(CANDIDATE_PAIRS)]
        if not self.lock_first and not self.resolved():
            pairs.sort(key=lambda p: -self._spread(*p))
        main, vice = pairs[0]
        return ToolCall("input_sequences", {"main_sequence": main, "vice_sequence": vice})

    def observe(self, result: ToolResult) -> None:
        if result.name != "input_sequences":
            return
        content = result.content if isinstance(result.content, dict) else {}
        if not result.ok:
            if "maximum steps" in str(content.get("error", "")).lower():
                self.exhausted = True
            return
        steps = content["transformations"]
        main, vice = steps[0]["main"], steps[0]["vice"]
        self.n = int(content["step_number"])
        self.experiments = self.n  # one step per input: the step number re-syncs the count after a recall
        last_main, last_vice = self.last or ("", "")
        current = ""
        for stage, shown in zip(STAGES, steps[1:]):
            ctx = SeqContext(current, main, vice, self.n, last_main, last_vice)
            output = shown["sequence"]
            known = self.last is not None
            self.sets[stage].update(
                lambda r, ctx=ctx, output=output, known=known: bool({output, "*"} & possible_outputs(r, ctx, known))
            )
            current = output
        self.last = (main, vice)
