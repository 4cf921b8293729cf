"""Hypothesis solver for Mystery Grid: one hypothesis set per letter over the declared rule library.

After every move the observed change (score difference, energy difference net of the move's cost) is compared
with each remaining rule's prediction in the move's context (position, round steps, total steps, energy after
the cost, this letter's visits in the round). Experiments: the next move goes towards the nearest reachable tile
whose letter's remaining rules predict different outcomes at arrival (breadth-first search over the known map);
when the round is over the solver resets. Context facts that are unknown after a notes recall (letter visits in
the current round, total steps) make every rule that depends on them count as consistent.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, ClassVar

from zoo.agents.envs.ultrahorizon.grid import DIRECTIONS, GRID_RULES, LETTERS, SIZE, GridContext
from zoo.agents.policies.solvers.base import HypothesisSet, Solver, register_solver
from zoo.agents.types import ToolCall, ToolResult

_TILE = re.compile(r"\((-?\d+),(-?\d+)(?:,([A-EX]))?\)")


def parse_tile(text: str) -> tuple[int, int, str | None]:
    x, y, letter = _TILE.fullmatch(text.strip()).groups()
    return int(x), int(y), letter


def outcomes(rule_id: str, ctx: GridContext, visits_known: bool, total_known: bool) -> frozenset[tuple[int, int]]:
    """Outcomes a rule allows in a context whose visit count / total steps may be unknown."""
    rule = GRID_RULES[rule_id].effect
    visit_options = [ctx.letter_visits] if visits_known else [1, 2]
    total_options = [ctx.total_steps] if total_known else [0, 1, 2]
    return frozenset(
        rule(GridContext(ctx.x, ctx.y, ctx.steps, t, ctx.energy, v)) for v in visit_options for t in total_options
    )


@register_solver
class GridSolver(Solver):
    env_name: ClassVar[str] = "ultrahorizon/grid"

    def __init__(self, info, rng, lock_first) -> None:
        super().__init__(info, rng, lock_first)
        self.sets = {letter: HypothesisSet(GRID_RULES, lock_first) for letter in LETTERS}
        self.x = self.y = 0
        self.energy, self.score, self.steps = 20, 0, 0
        self.game_over = False
        self.visits: dict[str, int] | None = {}
        self.total: int | None = 0
        self.grid: dict[tuple[int, int], str] = {}
        self.need_state = True
        self.need_map = True

    # -- notes ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "sets": {k: s.state() for k, s in self.sets.items()},
            "experiments": self.experiments,
            "exhausted": self.exhausted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for letter, s in state["sets"].items():
            self.sets[letter].load(s)
        self.experiments = int(state["experiments"])
        self.exhausted = bool(state["exhausted"])

    def mark_unsynced(self) -> None:
        self.visits = None  # this round's visits are unknown until the next reset
        self.total = None
        self.need_state = self.need_map = True

    # -- decisions --------------------------------------------------------------------------------------------
    def resolved(self) -> bool:
        return all(s.resolved or s.locked for s in self.sets.values())

    def commit_payload(self) -> dict[str, Any]:
        return {letter: s.best for letter, s in self.sets.items()}

    def _arrival_context(self, x: int, y: int, letter: str, distance: int) -> GridContext:
        visits = (self.visits or {}).get(letter, 0) + 1
        total = (self.total or 0) + distance
        return GridContext(x, y, self.steps + distance, total, self.energy - distance, visits)

    def _value(self, x: int, y: int, distance: int) -> int:
        letter = self.grid.get((x, y), "X")
        if letter == "X":
            return 0
        hypotheses = self.sets[letter]
        if self.lock_first:
            return 0 if hypotheses.locked else 1
        if hypotheses.resolved:
            return 0
        ctx = self._arrival_context(x, y, letter, distance)
        predicted = {outcomes(r, ctx, self.visits is not None, self.total is not None) for r in hypotheses.remaining}
        return len(predicted) - 1

    def _neighbors(self, x: int, y: int):
        for direction, (dx, dy) in DIRECTIONS.items():
            if 0 <= x + dx < SIZE and 0 <= y + dy < SIZE:
                yield direction, x + dx, y + dy

    def _choose_direction(self) -> str:
        reach = min(30 - self.steps, self.energy)
        start = (self.x, self.y)
        parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
        frontier = deque([(start, 0)])
        best: tuple[float, int, tuple[int, int]] | None = None
        while frontier:
            (x, y), distance = frontier.popleft()
            if distance and distance <= reach:
                value = self._value(x, y, distance)
                if value > 0 and (best is None or (value / distance, -distance) > best[:2]):
                    best = (value / distance, -distance, (x, y))
            if distance >= reach:
                continue
            for direction, nx, ny in self._neighbors(x, y):
                if (nx, ny) not in parent:
                    parent[(nx, ny)] = ((x, y), direction)
                    frontier.append(((nx, ny), distance + 1))
        if best is None:
            options = [d for d, nx, ny in self._neighbors(self.x, self.y)]
            fresh = [d for d, nx, ny in self._neighbors(self.x, self.y) if self.grid.get((nx, ny), "X") != "X"]
            return self.rng.choice(fresh or options)
        node = best[2]
        while parent[node][0] != start:
            node = parent[node][0]
        return parent[node][1]

    def next_call(self) -> ToolCall:
        if self.need_state:
            return ToolCall("get_current_state", {})
        if self.need_map:
            return ToolCall("get_full_map", {})
        if self.game_over:
            return ToolCall("reset", {})
        return ToolCall("move", {"direction": self._choose_direction()})

    # -- observations -----------------------------------------------------------------------------------------
    def observe(self, result: ToolResult) -> None:
        content = result.content if isinstance(result.content, dict) else {}
        handler = getattr(self, f"_on_{result.name}", None)
        if handler is not None:
            handler(result.ok, content)

    def _on_move(self, ok: bool, content: dict[str, Any]) -> None:
        if not ok:
            message = str(content.get("message", "")).lower()
            if "round is over" in message:
                self.game_over = True
            elif "required total" in message:
                self.exhausted = True
            return
        x, y, letter = parse_tile(content["position"])
        energy_before = self.energy
        score_change = content["score"] - self.score
        energy_change = content["energy"] - (energy_before - 1)
        self.experiments += 1
        self.total = None if self.total is None else self.total + 1
        if letter != "X":
            if self.visits is not None:
                self.visits[letter] = self.visits.get(letter, 0) + 1
            visits = (self.visits or {}).get(letter, 1)
            ctx = GridContext(x, y, content["steps"], self.total or 0, energy_before - 1, visits)
            observed = (score_change, energy_change)
            known = (self.visits is not None, self.total is not None)
            self.sets[letter].update(lambda r: observed in outcomes(r, ctx, *known))
        self.grid[(x, y)] = "X"
        self.x, self.y = x, y
        self.energy, self.score, self.steps = content["energy"], content["score"], content["steps"]
        self.game_over = bool(content["game_over"])

    def _on_reset(self, ok: bool, content: dict[str, Any]) -> None:
        if ok:
            self.x, self.y, _ = parse_tile(content["initial_position"])
            self.energy, self.score, self.steps = content["energy"], 0, 0
            self.game_over = False
            self.visits = {}
            self.need_map = True

    def _on_get_full_map(self, ok: bool, content: dict[str, Any]) -> None:
        self.grid = {}
        for tile in content.get("map", []):
            x, y, letter = parse_tile(tile)
            self.grid[(x, y)] = letter
        self.x, self.y, _ = parse_tile(content["agent_position"])
        self.need_map = False

    def _on_get_current_state(self, ok: bool, content: dict[str, Any]) -> None:
        self.x, self.y, _ = parse_tile(content["current_position"])
        self.energy, self.score, self.steps = content["energy"], content["score"], content["steps"]
        self.game_over = bool(content["game_over"])
        self.need_state = False
