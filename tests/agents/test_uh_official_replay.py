"""Replays of the official UltraHorizon environments, pinned as digests of their observation transcripts.

The official code (github.com/StarDewXXX/UltraHorizon, snapshot ac14262, ``envs/grid_env/env.py`` and
``envs/seq_env/env.py``) was driven through :func:`grid_transcript` and :func:`sequence_transcript` below, with the
same action streams and, for Mystery Grid, the same grids and start positions placed into both environments after
construction and after every reset (the official environments draw them from the global ``random``). The official
observations and the zoo's were equal in every call (Mystery Grid: 3 difficulties x 4 streams of 400 calls, 5,094
transcript entries with 1,200 accepted moves per difficulty, the 300-move limit and round ends included; Sequence
Exploration: easy and hard, 60 inputs each) except the wording of refusal messages, which the zoo writes itself (a
refused move is recorded as refused). The digests below are of those transcripts: a change of any rule, observation
field or limit changes one.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from zoo.agents import AlienGeneticsLab, MysteryGrid, SequenceExploration

Call = Callable[..., dict[str, Any]]

#: SHA-256 of the official Mystery Grid transcripts, per difficulty, over streams 0-3.
GRID_DIGESTS = {
    "easy": "e607f62e6d938fc7445361312e83e55fc490ced2483886bf5c9f1a501db634d5",
    "medium": "56f84fef1b42c93b8fbe9436f2aff443dcfe699bf42033460ab7f541d9a2e83c",
    "hard": "020d7083a1d044314eb946f03258220bcea436d6110ef227dbb4cd311263998c",
}
#: SHA-256 of the official Sequence Exploration transcripts (the sequence of every stage of 60 inputs).
SEQUENCE_DIGESTS = {
    "easy": "cfc7e5775281e26b9a9500f469b6bb488096b9cbf25c1c76e0095d5c7d2cf4ce",
    "hard": "ca2b5aceb6adfd0ca29489c093ddd1a0fec2c1bc76ad10aa4fcc0b9421413e58",
}
#: the official final outputs of the first three inputs of stream 0, readable
SEQUENCE_FIRST_OUTPUTS = {
    "easy": ["ACCCDDDDDE", "ABBBCCEEEE", "AAABCCCDEE"],
    "hard": ["DFEDDBEEEEEEEEBDDEFDD", "HJDHKHDCHDDHCDHHEDHEHH", "JEHEJFGEFHHFEGFHEEEFEEE"],
}


def place_round(env: Any, rng: random.Random) -> None:
    """Give ``env`` a grid of letters A-E and a start position drawn from ``rng`` (both environments alike)."""
    env.grid = [[rng.choice("ABCDE") for _ in range(10)] for _ in range(10)]
    env.state.x, env.state.y = rng.randint(0, 9), rng.randint(0, 9)


def grid_transcript(env: Any, call: Call, stream: int, calls: int = 400) -> list[list[Any]]:
    """Drive a Mystery Grid with a seeded stream of moves (some off the grid), state and map reads and resets.

    ``call(name, *args)`` runs one tool of ``env``. A reset's ``initial_position`` is left out of the transcript (it
    names the environment's own drawn grid, replaced right after); the state read that follows records the placed one.
    A refused move is recorded as ``{"success": False}``: the zoo words its refusal messages itself.
    """
    rng = random.Random(stream)
    place_round(env, rng)
    transcript: list[list[Any]] = []

    def move(direction: str) -> dict[str, Any]:
        out = call("move", direction)
        return out if out["success"] else {"success": False}

    for _ in range(calls):
        roll = rng.random()
        if roll < 0.04 or env.state.game_over and roll < 0.5:
            out = {k: v for k, v in call("reset").items() if k != "initial_position"}
            place_round(env, rng)
            transcript.append(["reset", out])
            transcript.append(["get_current_state", call("get_current_state")])
        elif roll < 0.08:
            transcript.append(["get_current_state", call("get_current_state")])
        elif roll < 0.1:
            transcript.append(["get_full_map", call("get_full_map")])
        else:
            direction = rng.choice(["up", "down", "left", "right"])
            transcript.append([direction, move(direction)])
    return transcript


def sequence_pairs(stream: int, count: int) -> list[tuple[str, str]]:
    """Valid (main, vice) inputs: 5 letters of A-E with at least 2 distinct, drawn from a seeded stream."""
    rng = random.Random(stream)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count:
        main, vice = ("".join(rng.choice("ABCDE") for _ in range(5)) for _ in range(2))
        if len(set(main)) >= 2 and len(set(vice)) >= 2:
            pairs.append((main, vice))
    return pairs


def sequence_transcript(call: Call, stream: int = 0, count: int = 60) -> list[list[str]]:
    """The sequence of every stage (input text, rules 1-5) for ``count`` inputs."""
    return [
        [t["sequence"] for t in call("input_sequences", main, vice)["transformations"]]
        for main, vice in sequence_pairs(stream, count)
    ]


def digest(transcript: Any) -> str:
    return hashlib.sha256(json.dumps(transcript, sort_keys=True).encode()).hexdigest()


def tool_caller(env: Any) -> Call:
    return lambda name, *args: getattr(env, name)(*args)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_mystery_grid_replays_the_official_observations(difficulty):
    transcripts = []
    for stream in range(4):
        env = MysteryGrid(seed=0, difficulty=difficulty, required_steps=300)
        transcripts.append(grid_transcript(env, tool_caller(env), stream))
    assert digest(transcripts) == GRID_DIGESTS[difficulty]


@pytest.mark.parametrize("difficulty", ["easy", "hard"])
def test_sequence_exploration_replays_the_official_outputs(difficulty):
    env = SequenceExploration(seed=0, difficulty=difficulty, required_steps=60)
    transcript = sequence_transcript(tool_caller(env))
    assert [stages[-1] for stages in transcript[:3]] == SEQUENCE_FIRST_OUTPUTS[difficulty]
    assert digest(transcript) == SEQUENCE_DIGESTS[difficulty]


def test_run_step_caps_are_the_released_multiples_of_required_steps():
    """``parallel_run.py``: ``max_run_steps = required_steps * 8`` for bio, ``* 4`` for the other two."""
    assert MysteryGrid.max_steps_factor == 4 and SequenceExploration.max_steps_factor == 4
    assert AlienGeneticsLab.max_steps_factor == 8
