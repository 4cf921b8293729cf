"""ProcWorld: procedural tool-use tasks whose families share hidden quirks, so memory is the only route to improvement.

The CPU task world of the MemEvolve demo (arXiv 2512.18746; design [reconstruction] of the research notes: the
paper evolves memory on TaskCraft/GAIA with LLM agents). A *world* (``world_seed``) holds ``families`` task
families. Each family has a public op pool (``ops_per_family`` op names) and three hidden things that recur in
every task of the family:

* a **sub-procedure**: ``procedure_length`` ops of the pool that must run in this order;
* a **unit quirk**: the second op of the procedure only accepts one unit (of ``UNITS``);
* a **sign quirk**: on a negative input, one further op of the pool (the *sign fix*) must run before that second op
  ("tool Y fails on negative input").

A task (episode) draws its family from ``family_ids`` and an input value with the environment's seed. Tools:
``use(op, unit)`` runs an op, ``commit_final_result(content)`` ends the episode; the score is 1 when the procedure
was completed before the commit, else 0. An error says *that* a call failed ("cannot run now", "rejects unit",
"fails on negative input") but never what the right op is. Nothing in one task reveals another task's input, so
what an agent knows at the start of a task comes only from what it remembers of earlier tasks of the family.

The world is a pure function of ``world_seed`` (the same families in every episode and run); the episode seed picks
only the family and the input.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.agents.envs.base import Environment, ScoreReport
from zoo.agents.tools import agent_tool
from zoo.errors import ConfigError

UNITS = ("kg", "lb", "oz")
_NAMES = (
    "ledger",
    "parcel",
    "invoice",
    "sensor",
    "payroll",
    "recipe",
    "archive",
    "permit",
    "voucher",
    "manifest",
    "census",
    "tariff",
)
_VERBS = (
    "fetch",
    "parse",
    "convert",
    "validate",
    "stamp",
    "route",
    "hash",
    "merge",
    "audit",
    "index",
    "tag",
    "seal",
    "sort",
    "scale",
    "flip",
    "clamp",
    "encode",
    "sign",
    "queue",
    "trim",
)
_TOPICS = ("records", "shipments", "readings", "entries", "claims", "batches", "forms", "logs")


@dataclass(frozen=True)
class Family:
    """One task family: its public op pool and its hidden procedure, unit and sign fix."""

    name: str
    topic: str
    ops: tuple[str, ...]
    procedure: tuple[str, ...]
    unit: str
    sign_fix: str


def make_world(world_seed: int, families: int, ops_per_family: int = 7, procedure_length: int = 4) -> list[Family]:
    """The families of a world: a pure function of its arguments."""
    if not 1 <= families <= len(_NAMES):
        raise ConfigError(f"env.families must be in [1, {len(_NAMES)}], got {families}")
    if not 2 <= procedure_length <= ops_per_family - 1 or ops_per_family > len(_VERBS):
        raise ConfigError(
            f"need 2 <= env.procedure_length ({procedure_length}) < env.ops_per_family ({ops_per_family}) "
            f"<= {len(_VERBS)}"
        )
    rng = random.Random(f"procworld/{world_seed}")
    names = rng.sample(_NAMES, families)
    out = []
    for name in names:
        verbs = rng.sample(_VERBS, ops_per_family)
        ops = tuple(f"{name}_{v}" for v in verbs)
        out.append(
            Family(
                name=name,
                topic=rng.choice(_TOPICS),
                ops=tuple(sorted(ops)),
                procedure=ops[:procedure_length],
                unit=rng.choice(UNITS),
                sign_fix=ops[procedure_length],
            )
        )
    return out


class ProcWorld(Environment):
    """One ProcWorld task.

    Args:
        seed: the episode seed (picks the family among ``family_ids`` and the input value).
        world_seed: the world (families, procedures, quirks); fixed across episodes and runs.
        families: families in the world.
        family_ids: the families tasks are drawn from (indices; ``None``: all). Held-out transfer uses a
            disjoint set.
        negative_rate: probability that a task's input is negative (the sign quirk applies).
        ops_per_family, procedure_length: sizes of the op pool and of the hidden procedure.
        required_steps: the step budget of a task (the harness caps an episode at ``required_steps``).
    """

    name: ClassVar[str] = "procworld"
    max_steps_factor: ClassVar[int] = 1

    def __init__(
        self,
        seed: int = 0,
        world_seed: int = 0,
        families: int = 6,
        family_ids: list[int] | None = None,
        negative_rate: float = 0.5,
        ops_per_family: int = 7,
        procedure_length: int = 4,
        required_steps: int = 14,
        difficulty: str = "hard",
    ) -> None:
        super().__init__(seed=seed, difficulty=difficulty, required_steps=required_steps, free=True)
        self.world = make_world(world_seed, families, ops_per_family, procedure_length)
        ids = list(range(families)) if family_ids is None else [int(i) for i in family_ids]
        if not ids or any(not 0 <= i < families for i in ids):
            raise ConfigError(f"env.family_ids={family_ids} must be non-empty indices in [0, {families})")
        if not 0.0 <= negative_rate <= 1.0:
            raise ConfigError(f"env.negative_rate must be in [0, 1], got {negative_rate}")
        self.family = self.world[self.rng.choice(ids)]
        magnitude = round(self.rng.uniform(1.0, 99.0), 1)
        self.value = -magnitude if self.rng.random() < negative_rate else magnitude
        self.record = self.rng.randrange(1000, 9999)
        self.progress = 0
        self.sign_fixed = False

    # -- what agents see ----------------------------------------------------------------------------------------
    @property
    def query(self) -> str:
        f = self.family
        return f"{f.name} workflow: process {f.name} {f.topic} record #{self.record} with value {self.value}."

    @property
    def prompt(self) -> str:
        return (
            f"{self.query} Run the {self.family.name} ops in the right order with use(op, unit); each family has a "
            f"fixed hidden procedure. Ops: {', '.join(self.family.ops)}. Units: {', '.join(UNITS)}. Commit when "
            "the record is processed."
        )

    def library(self) -> dict[str, Any]:
        """The public task: family name, op pool, units, the input value and the query text."""
        return {
            "family": self.family.name,
            "ops": list(self.family.ops),
            "units": list(UNITS),
            "value": self.value,
            "query": self.query,
            "procedure_length": len(self.family.procedure),
        }

    def commit_help(self) -> str:
        return 'Format: {"status": "done"}; the score is 1 when the record was fully processed.'

    @property
    def done(self) -> bool:
        return self.progress >= len(self.family.procedure)

    # -- tools ----------------------------------------------------------------------------------------------------
    @agent_tool
    def use(self, op: str, unit: str = "") -> dict[str, Any]:
        """Run one op of the family on the record.

        Args:
            op: the op name (from the task's op pool).
            unit: the unit argument some ops need (kg, lb or oz); empty when not needed.
        """
        f = self.family
        if self.done:
            return {"success": False, "message": "the record is already processed; commit"}
        expected = f.procedure[self.progress]
        if op == expected:
            if self.progress == 1 and self.value < 0 and not self.sign_fixed:
                return {"success": False, "message": f"{op} fails on negative input"}
            if self.progress == 1 and unit != f.unit:
                return {"success": False, "message": f"{op} rejects unit '{unit}'"}
            self.progress += 1
            return {"success": True, "message": f"{op} ok ({self.progress}/{len(f.procedure)})"}
        if op == f.sign_fix and self.value < 0 and not self.sign_fixed and self.progress <= 1:
            self.sign_fixed = True
            return {"success": True, "message": f"{op} ok (sign fixed)"}
        if op not in f.ops:
            return {"success": False, "message": f"unknown op {op!r}; ops: {list(f.ops)}"}
        return {"success": False, "message": f"{op} cannot run now"}

    # -- commit protocol ------------------------------------------------------------------------------------------
    def commit_refusal(self) -> str | None:
        return None

    def parse_commit(self, data: Any) -> Any:
        return data

    def score_commit(self, commit: Any) -> ScoreReport:
        report = ScoreReport(total=100.0 if self.done else 0.0)
        report.raw = {"task": self.library(), "progress": self.progress}
        return report

    def ground_truth(self) -> dict[str, str]:
        f = self.family
        return {
            "procedure": " -> ".join(f.procedure),
            "unit": f"{f.procedure[1]} needs unit {f.unit}",
            "sign_fix": f"on negative input run {f.sign_fix} before {f.procedure[1]}",
        }

    def rubric(self) -> list[tuple[str, int, str]]:
        return [("processed", 100, "the record was processed by the full procedure before the commit")]
