"""UltraHorizon *Mystery Grid* (arXiv:2509.21766; rules as in the official ``envs/grid_env/env.py``).

A 10x10 grid of letters A-E, stored as ``grid[9 - y][x]`` (y points up). Each round starts at a random
``(x, y)`` with 20 energy; a move costs 1 energy and increments the round's ``steps`` and the run's
``total_steps``; the letter's hidden effect is applied *after* the move (energy already lowered, steps already
incremented), then the tile turns into ``X`` (no effect on later visits). A round ends at 30 steps or energy
<= 0; ``reset`` starts a new round on a fresh random grid. Moves are refused once ``total_steps`` reaches
``required_steps``; a commit is refused while ``total_steps < required_steps`` and fewer than 20 resets were
used (unless ``free``). ``reset`` itself is never refused (as in the official code).

Effects are rules of a declared library (:data:`GRID_RULES`), which is also the commit vocabulary: the
structured commit maps each letter to a rule id, and each correct letter earns 20 points.

Where the official code and its judge text disagree -- the HARD/MEDIUM corner bonus: the code adds +3 for the
border band (x or y in {0, 1, 8, 9}) *and* +3 more on the four corners (+6), while the judge's ground truth says
corners give +3 -- ``corner_bonus="code"`` (default) reproduces the code and ``"description"`` the judge text.

equation -> function: effect of a letter -> :data:`GRID_RULES` ``[id].effect(GridContext)``; difficulty
mapping -> :data:`DIFFICULTY_RULES`; move/round/commit rules -> :meth:`MysteryGrid.move`,
:meth:`MysteryGrid.commit_refusal`; rubric (5 x 20 points) -> :meth:`MysteryGrid.score_commit`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from zoo.agents.envs.answers import AnswerError, compile_expression
from zoo.agents.envs.base import RuleMappingEnvironment
from zoo.agents.tools import agent_tool
from zoo.errors import ConfigError

LETTERS = ("A", "B", "C", "D", "E")
SIZE = 10
START_ENERGY = 20
ROUND_STEPS = 30
MAX_RESETS = 20
CORNER_BONUS = ("code", "description")
DIRECTIONS = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}


@dataclass(frozen=True)
class GridContext:
    """What an effect may depend on, at the moment it applies (after the move).

    Attributes:
        x, y: the new position.
        steps: steps of this round, this move included.
        total_steps: moves of the whole run, this move included.
        energy: energy after paying for the move.
        letter_visits: visits to this letter in this round, this visit included.
    """

    x: int
    y: int
    steps: int
    total_steps: int
    energy: int
    letter_visits: int


@dataclass(frozen=True)
class GridRule:
    """A hypothesis about a letter: ``effect(context) -> (score change, energy change)``."""

    id: str
    description: str
    effect: Callable[[GridContext], tuple[int, int]]
    #: the rule as an answer (``{"score": expression, "energy": expression}`` over :data:`ANSWER_VARIABLES`)
    formula: dict[str, str] = field(default_factory=lambda: {"score": "0", "energy": "0"})


_CONTEXT_FIELDS = ("x", "y", "steps", "total_steps", "energy")


def _band(c: GridContext) -> bool:
    return c.x <= 1 or c.x >= 8 or c.y <= 1 or c.y >= 8


def _corner(c: GridContext) -> bool:
    return c.x in (0, 9) and c.y in (0, 9)


def _refill(threshold: int) -> Callable[[GridContext], tuple[int, int]]:
    return lambda c: (-2, 10) if c.energy < threshold else (1, 0)


_FORMULAS: dict[str, tuple[str, str]] = {
    "no_effect": ("0", "0"),
    "score_plus_1": ("1", "0"),
    "score_minus_1": ("-1", "0"),
    "score_plus_2": ("2", "0"),
    "energy_plus_1": ("0", "1"),
    "energy_minus_1": ("0", "-1"),
    "xy_odd_plus_1": ("1 if (x + y) % 2 == 1 else -1", "0"),
    "xy_even_plus_1": ("1 if (x + y) % 2 == 0 else -1", "0"),
    "energy_at_least_15": ("2 if energy >= 15 else -2", "0"),
    "energy_at_least_10": ("2 if energy >= 10 else -2", "0"),
    "round_step_mod_3": ("2 if steps % 3 == 0 else -1", "0"),
    "round_step_mod_2": ("2 if steps % 2 == 0 else -1", "0"),
    "round_step_mod_4": ("2 if steps % 4 == 0 else -1", "0"),
    "total_step_mod_3": ("2 if total_steps % 3 == 0 else -1", "0"),
    "border_plus_3": ("3 if x <= 1 or x >= 8 or y <= 1 or y >= 8 else 0", "0"),
    "border_plus_3_corner_plus_6": (
        "(3 if x <= 1 or x >= 8 or y <= 1 or y >= 8 else 0) + (3 if x in (0, 9) and y in (0, 9) else 0)",
        "0",
    ),
    "outer_edge_plus_3": ("3 if x in (0, 9) or y in (0, 9) else 0", "0"),
    "letter_visits_odd_plus_1": ("1 if visits % 2 == 1 else 0", "0"),
    "letter_visits_even_plus_1": ("1 if visits % 2 == 0 else 0", "0"),
    "low_energy_refill_10": ("-2 if energy < 10 else 1", "10 if energy < 10 else 0"),
    "low_energy_refill_5": ("-2 if energy < 5 else 1", "10 if energy < 5 else 0"),
    "low_energy_refill_15": ("-2 if energy < 15 else 1", "10 if energy < 15 else 0"),
    "x_minus_y": ("x - y", "0"),
    "y_minus_x": ("y - x", "0"),
    "x_plus_y": ("x + y", "0"),
}


def _formula(rule_id: str) -> dict[str, str]:
    score, energy = _FORMULAS[rule_id]
    return {"score": score, "energy": energy}


def _rules() -> dict[str, GridRule]:
    rules = [
        GridRule("no_effect", "nothing happens", lambda c: (0, 0)),
        GridRule("score_plus_1", "+1 score", lambda c: (1, 0)),
        GridRule("score_minus_1", "-1 score", lambda c: (-1, 0)),
        GridRule("score_plus_2", "+2 score", lambda c: (2, 0)),
        GridRule("energy_plus_1", "+1 energy", lambda c: (0, 1)),
        GridRule("energy_minus_1", "-1 energy (on top of the move cost)", lambda c: (0, -1)),
        GridRule("xy_odd_plus_1", "x+y odd: +1 score; x+y even: -1 score", lambda c: (1 if (c.x + c.y) % 2 else -1, 0)),
        GridRule(
            "xy_even_plus_1", "x+y even: +1 score; x+y odd: -1 score", lambda c: (-1 if (c.x + c.y) % 2 else 1, 0)
        ),
        GridRule(
            "energy_at_least_15", "energy >= 15: +2 score; else -2 score", lambda c: (2 if c.energy >= 15 else -2, 0)
        ),
        GridRule(
            "energy_at_least_10", "energy >= 10: +2 score; else -2 score", lambda c: (2 if c.energy >= 10 else -2, 0)
        ),
        GridRule(
            "round_step_mod_3",
            "steps of this round % 3 == 0: +2 score; else -1 score",
            lambda c: (2 if c.steps % 3 == 0 else -1, 0),
        ),
        GridRule(
            "round_step_mod_2",
            "steps of this round % 2 == 0: +2 score; else -1 score",
            lambda c: (2 if c.steps % 2 == 0 else -1, 0),
        ),
        GridRule(
            "round_step_mod_4",
            "steps of this round % 4 == 0: +2 score; else -1 score",
            lambda c: (2 if c.steps % 4 == 0 else -1, 0),
        ),
        GridRule(
            "total_step_mod_3",
            "total steps of the run % 3 == 0: +2 score; else -1 score",
            lambda c: (2 if c.total_steps % 3 == 0 else -1, 0),
        ),
        GridRule(
            "border_plus_3",
            "x or y in {0,1,8,9}: +3 score (corners too, no extra)",
            lambda c: (3 if _band(c) else 0, 0),
        ),
        GridRule(
            "border_plus_3_corner_plus_6",
            "x or y in {0,1,8,9}: +3 score; the four corners get a further +3 (+6 in total)",
            lambda c: (3 * _band(c) + 3 * _corner(c), 0),
        ),
        GridRule(
            "outer_edge_plus_3", "x or y in {0,9}: +3 score", lambda c: (3 if c.x in (0, 9) or c.y in (0, 9) else 0, 0)
        ),
        GridRule(
            "letter_visits_odd_plus_1",
            "visits to this letter in this round (this one included) odd: +1 score; even: 0",
            lambda c: (1 if c.letter_visits % 2 == 1 else 0, 0),
        ),
        GridRule(
            "letter_visits_even_plus_1",
            "visits to this letter in this round (this one included) even: +1 score; odd: 0",
            lambda c: (1 if c.letter_visits % 2 == 0 else 0, 0),
        ),
        GridRule("low_energy_refill_10", "energy < 10: -2 score and +10 energy; else +1 score", _refill(10)),
        GridRule("low_energy_refill_5", "energy < 5: -2 score and +10 energy; else +1 score", _refill(5)),
        GridRule("low_energy_refill_15", "energy < 15: -2 score and +10 energy; else +1 score", _refill(15)),
        GridRule("x_minus_y", "score += x - y", lambda c: (c.x - c.y, 0)),
        GridRule("y_minus_x", "score += y - x", lambda c: (c.y - c.x, 0)),
        GridRule("x_plus_y", "score += x + y", lambda c: (c.x + c.y, 0)),
    ]
    return {r.id: GridRule(r.id, r.description, r.effect, _formula(r.id)) for r in rules}


#: the hypothesis library = the commit vocabulary (ordered: simpler rules first)
GRID_RULES: dict[str, GridRule] = _rules()

#: official mapping (effect_1..10 of the code) per difficulty; ``border`` is resolved by ``corner_bonus``
DIFFICULTY_RULES: dict[str, dict[str, str]] = {
    "easy": {
        "A": "score_plus_1",
        "B": "energy_plus_1",
        "C": "xy_odd_plus_1",
        "D": "score_minus_1",
        "E": "energy_at_least_15",
    },
    "medium": {
        "A": "xy_odd_plus_1",
        "B": "energy_at_least_15",
        "C": "round_step_mod_3",
        "D": "border",
        "E": "letter_visits_odd_plus_1",
    },
    "hard": {
        "A": "round_step_mod_3",
        "B": "border",
        "C": "letter_visits_odd_plus_1",
        "D": "low_energy_refill_10",
        "E": "x_minus_y",
    },
}


@dataclass
class RoundState:
    x: int
    y: int
    energy: int = START_ENERGY
    score: int = 0
    steps: int = 0
    game_over: bool = False
    letter_visits: dict[str, int] = field(default_factory=dict)


ANSWER_VARIABLES = ("x", "y", "steps", "total_steps", "energy", "visits")


def _answer_cases() -> list[dict[str, int]]:
    """Situations an answer is checked on: every position, every round step, every energy level, every visit
    count (each with the other quantities drawn from a fixed seed), plus 600 fully random situations."""
    rng = random.Random(20250926)

    def case(**fixed: int) -> dict[str, int]:
        steps = fixed.get("steps", rng.randint(1, ROUND_STEPS))
        drawn = {
            "x": rng.randint(0, SIZE - 1),
            "y": rng.randint(0, SIZE - 1),
            "steps": steps,
            "total_steps": steps + rng.randint(0, 150),
            "energy": rng.randint(0, 30),
            "visits": rng.randint(1, 8),
        }
        return {**drawn, **fixed}

    cases = [case(x=x, y=y) for x in range(SIZE) for y in range(SIZE)]
    cases += [case(steps=s, total_steps=t) for s in range(1, ROUND_STEPS + 1) for t in (s, s + 31, s + 62)]
    cases += [case(energy=e) for e in range(31) for _ in range(3)]
    cases += [case(visits=v) for v in range(1, 9) for _ in range(4)]
    return cases + [case() for _ in range(600)]


ANSWER_CASES: list[dict[str, int]] = _answer_cases()


class MysteryGrid(RuleMappingEnvironment):
    """Mystery Grid with per-instance RNG.

    Args:
        corner_bonus: the dynamics of the border rule: ``code`` (corners +6, as the official code) or
            ``description`` (+3, as the official judge text).
        graded_corner_bonus: the border rule a commit is graded against (``None``: the one in play).
            ``corner_bonus="code", graded_corner_bonus="description"`` reproduces the released runs, where the
            dynamics give +6 on corners and the judge's ground truth says +3.
        commit_format: ``answer`` (each letter's effect as expressions, graded on :data:`ANSWER_CASES`) or
            ``choice`` (rule ids of :data:`GRID_RULES`, listed in the commit tool).
        (others: see :class:`~zoo.agents.envs.base.Environment`)
    """

    name: ClassVar[str] = "ultrahorizon/grid"
    keys: ClassVar[tuple[str, ...]] = LETTERS
    key_name: ClassVar[str] = "letter"
    rule_library: ClassVar[dict[str, GridRule]] = GRID_RULES
    judge_help: ClassVar[str] = "Describe, for each of A-E, its exact effect and the condition that triggers it."
    answer_variables: ClassVar[tuple[str, ...]] = ANSWER_VARIABLES
    answer_help: ClassVar[str] = (
        "Format: a JSON object with one entry per letter A-E. Each entry is "
        '{"score": <expression>, "energy": <expression>}: the change of score and of energy the letter causes '
        "(not counting the move's own energy cost), written as Python expressions over x, y (the tile stepped on), "
        "steps (moves in this round, this one included), total_steps (moves in the whole game, this one "
        "included), energy (energy after paying for the move) and visits (times this letter was stepped on in "
        "this round, this visit included); a bare expression means the score change with no energy change. "
        'Example: {"A": {"score": "3 if energy > 12 else 0", "energy": "0"}, "B": "x * 2", ...}. Each letter '
        "counts only when its expressions agree with the true effect in every situation."
    )

    def __init__(
        self,
        seed: int = 0,
        difficulty: str = "hard",
        required_steps: int = 50,
        free: bool = False,
        corner_bonus: str = "code",
        graded_corner_bonus: str | None = None,
        judge: Any = None,
        commit_format: str = "answer",
    ) -> None:
        super().__init__(seed, difficulty, required_steps, free, judge, commit_format)
        for option, value in (("corner_bonus", corner_bonus), ("graded_corner_bonus", graded_corner_bonus)):
            if value is not None and value not in CORNER_BONUS:
                raise ConfigError(f"{self.name}: {option}={value!r}; use one of {CORNER_BONUS}")
        self.corner_bonus = corner_bonus
        self.graded_corner_bonus = graded_corner_bonus or corner_bonus
        self.rules = self._resolve(corner_bonus)
        self.total_steps = 0
        self.reset_count = 0
        self._new_round()

    def _resolve(self, corner_bonus: str) -> dict[str, str]:
        border = "border_plus_3_corner_plus_6" if corner_bonus == "code" else "border_plus_3"
        return {k: border if v == "border" else v for k, v in DIFFICULTY_RULES[self.difficulty].items()}

    def _new_round(self) -> None:
        # same draw order as the official code: start x, start y, then the grid row by row
        self.state = RoundState(x=self.rng.randint(0, SIZE - 1), y=self.rng.randint(0, SIZE - 1))
        self.grid = [[self.rng.choice(LETTERS) for _ in range(SIZE)] for _ in range(SIZE)]

    def tile(self, x: int, y: int) -> str:
        """The letter at ``(x, y)`` (y up)."""
        return self.grid[SIZE - 1 - y][x]

    @property
    def prompt(self) -> str:
        budget = (
            ""
            if self.free
            else f" The game requires {self.required_steps} moves in total: you cannot move once that total is "
            "reached, and you cannot commit before it is reached."
        )
        return (
            "GRID EXPLORATION GAME\n"
            "Objective: you are an agent in a 10x10 grid world. Your goal is to discover the hidden effects of the "
            "letters A-E.\n"
            "Rules:\n"
            f"- You start at an initial position with {START_ENERGY} energy.\n"
            "- Every move costs 1 energy.\n"
            f"- A game round has at most {ROUND_STEPS} steps.{budget}\n"
            "- The grid holds the letters A to E, each with its own hidden effect on your score or energy. X marks a "
            "tile you already stepped on; it has no effect.\n"
            "- Each letter's effect stays the same from game to game, but you must find it by exploring.\n"
            "- When you step on a tile, its letter turns into X.\n"
            f"- A round ends when your energy runs out or after {ROUND_STEPS} steps.\n"
            "Important:\n"
            "- The letter effects are hidden but follow consistent rules, found only by experiment. An effect may "
            "depend on your position, your energy, the step count or the visit count.\n"
            "- Every letter A-E works differently. Never conclude an effect from a single try: validate it several "
            "times in different situations so that a coincidence is ruled out. Make full use of the resets to explore "
            "every letter.\n"
            "- Use notes to record plans, ideas and discoveries, and review them often to stay on track. Record each "
            "letter's effect as you find it; you may also record what changed after each move for later analysis.\n"
            "- You may reset and play again many times to learn the patterns. The goal is not a high score but a "
            "clear understanding of the mechanism. Use each round fully, until its steps or energy are spent, rather "
            "than resetting early; and repeat trials until your conclusions are confirmed. You can commit only once, "
            "and the game then ends: commit only when you are sure of every letter's effect.\n"
            "- The 1 energy every move costs is not an effect.\n"
            "Commit requirements:\n"
            "- Give exactly one effect for each of A, B, C, D and E.\n"
            "- State the trigger condition behind each effect; it may depend on the step count, the visit count, the "
            "energy or the grid position. Surface patterns such as 'sometimes +2, sometimes -1' are not enough.\n"
            "- No vague terms ('random', 'uncertain', 'complex') and no several conflicting explanations.\n"
            "- Grading is strict: an effect counts only when its trigger condition and its outcome are both right.\n"
            "Coordinates: positions are shown as (x,y,letter), x the column, y the row, letter the tile's current "
            "letter.\n"
            "Start exploring and discover the hidden mechanics."
        )

    # -- tools ------------------------------------------------------------------------------------------------
    @agent_tool
    def move(self, direction: str) -> dict[str, Any]:
        """Move one tile up, down, left or right.

        Args:
            direction: up, down, left or right.
        """
        state = self.state
        if state.game_over:
            return {"success": False, "message": "This round is over. Use reset to start a new round."}
        if self.total_steps >= self.required_steps:
            return {"success": False, "message": "The required total of moves is reached; no more moves. Commit."}
        if self.committed:
            return {"success": False, "message": "You have already committed; no further moves."}
        if direction.lower() not in DIRECTIONS:
            return {"success": False, "message": "Invalid direction. Use: up, down, left, right"}
        dx, dy = DIRECTIONS[direction.lower()]
        x, y = state.x + dx, state.y + dy
        if not (0 <= x < SIZE and 0 <= y < SIZE) or state.energy <= 0:
            return {"success": False, "message": "Invalid move (off the grid or out of energy)"}
        state.x, state.y = x, y
        state.energy -= 1
        state.steps += 1
        if state.energy <= 0 or state.steps >= ROUND_STEPS:
            state.game_over = True
        self.total_steps += 1
        letter = self.tile(x, y)
        if letter != "X":
            state.letter_visits[letter] = state.letter_visits.get(letter, 0) + 1
            context = GridContext(x, y, state.steps, self.total_steps, state.energy, state.letter_visits[letter])
            d_score, d_energy = GRID_RULES[self.rules[letter]].effect(context)
            state.score += d_score
            state.energy += d_energy
        self.grid[SIZE - 1 - y][x] = "X"
        return {
            "success": True,
            "position": f"({x},{y},{letter})",
            "energy": state.energy,
            "score": state.score,
            "steps": state.steps,
            "game_over": state.game_over,
            "difficulty": self.difficulty,
            "remain_reset_times": MAX_RESETS - self.reset_count,
        }

    @agent_tool
    def get_current_state(self) -> dict[str, Any]:
        """Current position, energy, score and steps, and the tiles at offsets -2/0/+2 around you."""
        state = self.state
        nearby = [
            f"({state.x + dx},{state.y + dy},{self.tile(state.x + dx, state.y + dy)})"
            for dx in (-2, 0, 2)
            for dy in (-2, 0, 2)
            if 0 <= state.x + dx < SIZE and 0 <= state.y + dy < SIZE
        ]
        return {
            "current_position": f"({state.x},{state.y},{self.tile(state.x, state.y)})",
            "energy": state.energy,
            "score": state.score,
            "steps": state.steps,
            "max_steps_in_this_round": ROUND_STEPS,
            "nearby_tiles": nearby,
            "game_over": state.game_over,
            "difficulty": self.difficulty,
        }

    @agent_tool
    def get_full_map(self) -> dict[str, Any]:
        """The whole grid as (x,y,letter) tiles, top row first, and your position."""
        tiles = [f"({x},{SIZE - 1 - row},{self.grid[row][x]})" for row in range(SIZE) for x in range(SIZE)]
        return {"map": tiles, "agent_position": f"({self.state.x},{self.state.y})", "difficulty": self.difficulty}

    @agent_tool
    def reset(self) -> dict[str, Any]:
        """Start a new round on a new random grid (the letters' effects stay the same)."""
        self.reset_count += 1
        self._new_round()
        state = self.state
        return {
            "success": True,
            "message": f"Environment reset. Reset count: {self.reset_count}",
            "initial_position": f"({state.x},{state.y},{self.tile(state.x, state.y)})",
            "energy": state.energy,
            "max_steps_in_this_round": ROUND_STEPS,
            "difficulty": self.difficulty,
        }

    # -- commit -----------------------------------------------------------------------------------------------
    def commit_refusal(self) -> str | None:
        if self.total_steps < self.required_steps and self.reset_count < MAX_RESETS:
            return (
                f"Cannot commit yet: {self.required_steps} moves are required, {self.total_steps} made so far. "
                "Explore more and validate your conclusions first."
            )
        return None

    def truth(self) -> dict[str, str]:
        """The rules a commit is graded against (those in play unless ``graded_corner_bonus`` differs)."""
        return self._resolve(self.graded_corner_bonus)

    def answer_cases(self, key: str) -> list[dict[str, int]]:
        return ANSWER_CASES

    def rule_function(self, rule_id: str) -> Callable[[dict[str, int]], tuple[int, int]]:
        rule = GRID_RULES[rule_id]
        return lambda case: tuple(rule.effect(GridContext(*(case[k] for k in _CONTEXT_FIELDS), case["visits"])))

    def answer_function(self, key: str, value: Any) -> Callable[[dict[str, int]], tuple[int, int]]:
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"score", "energy"})
            if unknown:
                raise AnswerError(f"unexpected fields {unknown}; give score and energy")
            score = compile_expression(value.get("score", "0"), ANSWER_VARIABLES)
            energy = compile_expression(value.get("energy", "0"), ANSWER_VARIABLES)
        else:
            score, energy = compile_expression(value, ANSWER_VARIABLES), compile_expression("0", ANSWER_VARIABLES)
        return lambda case: (score(case), energy(case))

    def key_correct(self, key: str, given: Any, truth: str) -> bool:
        """As the official judge, an answer that also charges the move's 1 energy to the letter is correct."""
        if self.commit_format == "choice" or super().key_correct(key, given, truth):
            return super().key_correct(key, given, truth)

        def with_cost(case: dict[str, int]) -> tuple[int, int]:
            score, energy = given(case)
            return score, energy + 1

        return super().key_correct(key, with_cost, truth)
