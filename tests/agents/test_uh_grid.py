"""Mystery Grid invariants (research notes, UltraHorizon section 5(e)): each fails for a plausible wrong replica."""

from __future__ import annotations

import json
import random

import pytest

from zoo.agents import MysteryGrid
from zoo.agents.envs.ultrahorizon.grid import GRID_RULES, RoundState
from zoo.errors import ConfigError


def grid_with(env: MysteryGrid, tiles: dict[tuple[int, int], str], x: int, y: int, energy: int = 20, steps: int = 0):
    """A controlled round: every tile X except ``tiles``; the agent at ``(x, y)``."""
    env.grid = [["X"] * 10 for _ in range(10)]
    for (tx, ty), letter in tiles.items():
        env.grid[9 - ty][tx] = letter
    env.state = RoundState(x=x, y=y, energy=energy, steps=steps)
    return env


def test_each_move_costs_exactly_one_energy_and_x_has_no_effect():
    env = grid_with(MysteryGrid(seed=0), {}, 5, 5)
    out = env.move("up")
    assert out["success"] and out["position"] == "(5,6,X)"
    assert (out["energy"], out["score"], out["steps"]) == (19, 0, 1)
    assert env.total_steps == 1


def test_a_visited_tile_becomes_x_and_a_revisit_has_no_effect():
    env = grid_with(MysteryGrid(seed=0, difficulty="easy"), {(5, 6): "A"}, 5, 5)  # easy A: +1 score
    assert env.move("up")["score"] == 1
    assert env.tile(5, 6) == "X"
    env.move("down")
    back = env.move("up")
    assert back["position"] == "(5,6,X)" and back["score"] == 1 and back["energy"] == 17


@pytest.mark.parametrize(("corner_bonus", "corner_points"), [("code", 6), ("description", 3)])
def test_hard_b_corner_bonus_follows_the_explicit_switch(corner_bonus, corner_points):
    env = grid_with(MysteryGrid(seed=0, corner_bonus=corner_bonus), {(0, 0): "B", (1, 5): "B", (5, 5): "B"}, 0, 1)
    assert env.move("down")["score"] == corner_points  # corner (0, 0)
    env = grid_with(MysteryGrid(seed=0, corner_bonus=corner_bonus), {(1, 5): "B"}, 2, 5)
    assert env.move("left")["score"] == 3  # border band, not a corner
    env = grid_with(MysteryGrid(seed=0, corner_bonus=corner_bonus), {(5, 5): "B"}, 5, 4)
    assert env.move("up")["score"] == 0  # interior
    with pytest.raises(ConfigError, match="corner_bonus"):
        MysteryGrid(seed=0, corner_bonus="both")


def test_hard_c_first_visit_of_a_letter_gives_plus_one_then_parity():
    env = grid_with(MysteryGrid(seed=0), {(5, 6): "C", (5, 7): "C", (5, 8): "C"}, 5, 5)
    scores = [env.move("up")["score"] for _ in range(3)]
    assert scores == [1, 1, 2]  # visits 1 (odd: +1), 2 (even: 0), 3 (odd: +1)


def test_hard_d_energy_rule_applies_after_the_move_cost():
    env = grid_with(MysteryGrid(seed=0), {(5, 6): "D"}, 5, 5, energy=10)
    out = env.move("up")  # energy 9 after the move: -2 score, +10 energy
    assert (out["score"], out["energy"]) == (-2, 19)
    env = grid_with(MysteryGrid(seed=0), {(5, 6): "D"}, 5, 5, energy=11)
    out = env.move("up")  # energy 10 after the move: +1 score
    assert (out["score"], out["energy"]) == (1, 10)


def test_hard_a_uses_the_round_step_count_after_the_move_and_e_is_x_minus_y():
    env = grid_with(MysteryGrid(seed=0), {(5, 6): "A"}, 5, 5, steps=2)
    assert env.move("up")["score"] == 2  # steps 3
    env = grid_with(MysteryGrid(seed=0), {(5, 6): "A"}, 5, 5, steps=3)
    assert env.move("up")["score"] == -1  # steps 4
    env = grid_with(MysteryGrid(seed=0), {(8, 2): "E"}, 7, 2)
    assert env.move("right")["score"] == 6


def test_a_round_ends_at_30_steps_or_without_energy():
    env = grid_with(MysteryGrid(seed=0, required_steps=100), {}, 0, 0, energy=100, steps=29)
    out = env.move("up")
    assert out["steps"] == 30 and out["game_over"]
    refused = env.move("up")
    assert not refused["success"] and "reset" in refused["message"]
    env = grid_with(MysteryGrid(seed=0), {}, 0, 0, energy=1)
    assert env.move("up")["game_over"]
    assert env.reset()["energy"] == 20 and not env.state.game_over


def test_moves_off_the_grid_are_refused_and_cost_nothing():
    env = grid_with(MysteryGrid(seed=0), {}, 0, 0)
    out = env.move("left")
    assert not out["success"] and env.state.energy == 20 and env.total_steps == 0
    assert not env.move("north")["success"]


def test_commit_is_refused_until_the_required_steps_or_20_resets():
    env = MysteryGrid(seed=0, required_steps=3)
    commit = json.dumps(dict.fromkeys("ABCDE", "0"))
    refused = env.commit_final_result(commit)
    assert not refused["success"] and "3 moves are required" in refused["message"] and not env.committed
    grid_with(env, {}, 5, 5)
    for direction in ("up", "up", "up"):
        assert env.move(direction)["success"]
    assert not env.move("up")["success"]  # no moves after the required total
    assert env.commit_final_result(commit)["success"] and env.committed
    resets = MysteryGrid(seed=0, required_steps=50)
    for _ in range(20):
        resets.reset()
    assert resets.commit_final_result(commit)["success"]
    assert MysteryGrid(seed=0, required_steps=50, free=True).commit_final_result(commit)["success"]


def test_full_map_uses_y_up_coordinates():
    env = MysteryGrid(seed=3)
    tiles = env.get_full_map()["map"]
    assert tiles[0].startswith("(0,9,") and tiles[-1].startswith("(9,0,")
    for tile in tiles:
        x, y, letter = tile.strip("()").split(",")
        assert env.tile(int(x), int(y)) == letter == env.grid[9 - int(y)][int(x)]
    state = env.get_current_state()
    assert state["current_position"] == f"({env.state.x},{env.state.y},{env.tile(env.state.x, env.state.y)})"
    assert all(abs(int(t.strip("()").split(",")[0]) - env.state.x) in (0, 2) for t in state["nearby_tiles"])


def test_per_instance_rng_leaves_the_global_rng_alone():
    random.seed(123)
    before = random.getstate()
    a, b = MysteryGrid(seed=7), MysteryGrid(seed=7)
    a.reset()
    assert random.getstate() == before
    assert b.grid != a.grid  # a moved on to a fresh grid
    b.reset()
    assert (a.grid, a.state.x, a.state.y) == (b.grid, b.state.x, b.state.y)
    assert MysteryGrid(seed=8).grid != MysteryGrid(seed=7).grid


def test_difficulty_maps_letters_to_the_official_effects():
    easy = grid_with(MysteryGrid(seed=0, difficulty="easy"), {(5, 6): "B", (5, 7): "C", (5, 8): "D", (5, 9): "E"}, 5, 5)
    steps = [easy.move("up") for _ in range(4)]
    assert (steps[0]["energy"], steps[0]["score"]) == (20, 0)  # B: +1 energy cancels the cost
    assert steps[1]["score"] == -1  # C at (5, 7): x + y even -> -1
    assert steps[2]["score"] == -2  # D: -1
    assert (steps[3]["energy"], steps[3]["score"]) == (17, 0)  # E: energy 17 >= 15 -> +2
    odd = grid_with(MysteryGrid(seed=0, difficulty="easy"), {(4, 5): "C"}, 5, 5)
    assert odd.move("left")["score"] == 1  # C at (4, 5): x + y odd -> +1
    assert MysteryGrid(seed=0, difficulty="medium").rules["D"] == "border_plus_3_corner_plus_6"
    with pytest.raises(ConfigError, match="difficulty"):
        MysteryGrid(seed=0, difficulty="insane")


TRUTH_IDS = {
    "A": "round_step_mod_3",
    "B": "border_plus_3_corner_plus_6",
    "C": "letter_visits_odd_plus_1",
    "D": "low_energy_refill_10",
    "E": "x_minus_y",
}
#: the HARD rules as an agent would write them (not the library's wording)
HARD_ANSWER = {
    "A": "-1 + 3 * (steps % 3 == 0)",
    "B": {"score": "3 * (min(x, y) < 2 or max(x, y) > 7) + 3 * (x % 9 == 0 and y % 9 == 0)", "energy": "0"},
    "C": "visits % 2",
    "D": {"score": "1 if energy >= 10 else -2", "energy": "10 * (energy <= 9)"},
    "E": {"score": "x - y"},
}


def test_the_default_commit_shows_no_candidate_rule():
    env = MysteryGrid(seed=0)
    description = env.tools()["commit_final_result"].description
    for rule in GRID_RULES.values():
        assert rule.description not in description and rule.id not in description
    choice = MysteryGrid(seed=0, commit_format="choice").tools()["commit_final_result"].description
    assert all(rule.id in choice for rule in GRID_RULES.values())  # the multiple-choice variant, kept by name


def test_answers_are_graded_by_agreement_with_the_true_rule():
    env = MysteryGrid(seed=0, free=True)
    for bad, field in (
        ("not json at all {", "malformed"),
        (json.dumps({"A": "0"}), "missing"),
        (json.dumps({**dict.fromkeys("ABCDE", "0"), "F": "1"}), "unexpected"),
        (json.dumps({**dict.fromkeys("ABCD", "0"), "E": "teleport"}), "E: unknown name 'teleport'"),
        (json.dumps({**dict.fromkeys("ABCD", "0"), "E": "__import__('os')"}), "E: unknown name"),
        (json.dumps({**dict.fromkeys("ABCD", "0"), "E": "x.__class__"}), "E: attribute"),
        (json.dumps({**dict.fromkeys("ABCD", "0"), "E": "2 ** 99"}), "E: Pow"),
    ):
        out = env.commit_final_result(bad)
        assert not out["success"] and field in out["message"] and not env.committed
    assert env.commit_final_result(json.dumps(HARD_ANSWER))["success"] and env.report.total == 100
    # a wrong trigger (energy threshold 9 instead of 10), a surface pattern (C always +1) and a missed corner bonus
    wrong = {
        **HARD_ANSWER,
        "B": "3 * (min(x, y) < 2 or max(x, y) > 7)",
        "C": "1",
        "D": {"score": "1 if energy >= 9 else -2", "energy": "10 * (energy < 9)"},
    }
    graded = MysteryGrid(seed=0, free=True)
    graded.commit_final_result(json.dumps(wrong))
    assert [i.awarded for i in graded.report.items] == [20, 0, 0, 0, 20]
    # as the official judge: also charging the move's own energy to the letter is accepted
    with_cost = {k: {"score": v, "energy": "-1"} for k, v in HARD_ANSWER.items() if isinstance(v, str)}
    counted = MysteryGrid(seed=0, free=True)
    counted.commit_final_result(json.dumps({**HARD_ANSWER, **with_cost}))
    assert counted.report.total == 100
    again = env.commit_final_result(json.dumps(HARD_ANSWER))
    assert not again["success"] and "only one commit" in again["message"] and env.report.total == 100


def test_choice_variant_keeps_the_rule_id_schema():
    env = MysteryGrid(seed=0, free=True, commit_format="choice")
    out = env.commit_final_result(json.dumps({**dict.fromkeys("ABCD", "no_effect"), "E": "teleport"}))
    assert not out["success"] and "E: unknown rule id" in out["message"]
    assert env.commit_final_result(json.dumps({**TRUTH_IDS, "B": "border_plus_3"}))["success"]
    assert [i.awarded for i in env.report.items] == [20, 0, 20, 20, 20]
    with pytest.raises(ConfigError, match="commit_format"):
        MysteryGrid(seed=0, commit_format="essay")


def test_corner_bonus_dynamics_and_the_graded_truth_are_separate_switches():
    # the released runs: +6 corner dynamics, graded against the judge text's +3
    released = grid_with(MysteryGrid(seed=0, free=True, graded_corner_bonus="description"), {(0, 0): "B"}, 0, 1)
    assert released.move("down")["score"] == 6
    border_3 = {**HARD_ANSWER, "B": "3 * (min(x, y) < 2 or max(x, y) > 7)"}
    assert released.commit_final_result(json.dumps(border_3))["success"] and released.report.total == 100
    consistent = MysteryGrid(seed=0, free=True)
    consistent.commit_final_result(json.dumps(border_3))
    assert consistent.report.total == 80
    assert MysteryGrid(seed=0, corner_bonus="description").truth()["B"] == "border_plus_3"
    with pytest.raises(ConfigError, match="graded_corner_bonus"):
        MysteryGrid(seed=0, graded_corner_bonus="both")
