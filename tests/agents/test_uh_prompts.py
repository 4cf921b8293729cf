"""The environment prompts state every rule the released ENV_PROMPTs state (UltraHorizon ``envs/*/env.py``).

Each fact of an official prompt is listed with a pattern that the zoo's prompt must match (case-insensitive); the
wording is the zoo's own. A prompt that drops a fact, or the sequence prompt's extra hint that rules depend on the
step number (not in the official prompt), fails.
"""

from __future__ import annotations

import re

import pytest

from zoo.agents import AlienGeneticsLab, MysteryGrid, SequenceExploration

GRID_FACTS = {
    "10x10 grid world": r"10x10 grid",
    "goal: the hidden effects of A-E": r"discover the hidden effects of the letters A-E",
    "start with 20 energy": r"20 energy",
    "each move costs 1 energy": r"every move costs 1 energy",
    "at most 30 steps per round": r"at most 30 steps",
    "required total, no move after it, no commit before it": r"requires 50 moves.*cannot move.*cannot commit",
    "each letter has its own effect on score or energy": r"own hidden effect on your score or energy",
    "X: already stepped on, no effect": r"X marks a tile you already stepped on; it has no effect",
    "effects consistent across games": r"stays the same from game to game",
    "a stepped tile turns into X": r"turns into X",
    "round ends when energy runs out or at 30 steps": r"round ends when your energy runs out or after 30 steps",
    "effects may depend on position, energy, step count, visit count": r"position, your energy, the step count or "
    r"the visit count",
    "validate several times in different situations": r"validate it several times in different situations",
    "use the resets": r"make full use of the resets",
    "notes: plans, ideas, discoveries; review often": r"notes to record plans, ideas and discoveries, and review",
    "the goal is not a high score": r"not a high score",
    "use each round fully, avoid early resets": r"use each round fully",
    "commit only once, then the game ends": r"commit only once",
    "the move's energy cost is not an effect": r"energy every move costs is not an effect",
    "one effect per letter": r"exactly one effect for each of A, B, C, D and E",
    "trigger condition required": r"trigger condition",
    "no vague terms, no conflicting explanations": r"no vague terms.*no several conflicting explanations",
    "strict grading": r"grading is strict",
    "coordinates (x,y,letter), x column, y row": r"\(x,y,letter\), x the column, y the row",
}
SEQUENCE_FACTS = {
    "hidden dual-sequence transformation, letters A-E": r"hidden system that transforms pairs of letter sequences",
    "two sequences of exactly 5 characters from A-E": r"TWO sequences of EXACTLY 5 characters.*letters A-E",
    "at least 2 different letters": r"at least 2 different letters",
    "main and vice": r'"main" string and the second the "vice" string',
    "each pair costs 1 step; required total": r"uses 1 step\. A game takes 50 input pairs",
    "a fixed chain of transformations on current result and/or inputs": r"fixed chain of transformations.*current "
    r"result and/or the original inputs",
    "rules consistent across the game": r"stay the same for the whole game",
    "game ends at the step limit or at submission": r"step limit is reached or when you submit",
    "deterministic, test repeatedly": r"deterministic but hidden: test repeatedly",
    "may depend on content, position, history, main/vice relation": r"content of the sequences, on positions, on "
    r"the history, or on how main and vice relate",
    "notes of transformations and hypotheses": r"notes",
    "commit once when confident": r"commit only once",
    "example inputs": r'\("ABCDE", "DECBA"\)',
    "outputs shown rule by rule": r"result after each rule",
    "easy: simplified rules, hard: complex rules": r"easy games use simplified.*hard games use complex",
}
BIO_FACTS = {
    "alien species, traits controlled by hidden genetic factors": r"alien organism.*hidden genetic factors",
    "crosses give offspring": r"cross organisms",
    "each cross is 1 step; required total": r"1 experimental step\. A study takes 50",
    "offspring phenotypes observable": r"phenotypes",
    "non-viable offspring, lethal combinations": r"not viable \(lethal combinations\)",
    "query traits, descriptions, lineage": r"traits, descriptions and lineage",
    "maximum experiments, minimum steps before submitting": r"maximum, and a minimum number of steps",
    "goals: inheritance, dominance/interaction/dosage, lethal, predictive model, notes": r"inherited from generation"
    r".*dominance, interaction or dosage.*lethal combinations.*predicts.*refine them",
    "tools: conduct_cross, query_organisms, get_lab_status, commit_final_result": r"conduct_cross.*query_organisms"
    r".*get_lab_status.*commit_final_result",
    "non-viable offspring are informative": r"Non-viable offspring belong to the system",
    "consider lineage and trait combinations": r"lineage and combinations of traits",
    "explain mechanisms and predict untested crosses": r"predict the outcome of crosses you did not run",
    "report: genetic basis, each trait, lethal combinations": r"Genetic basis.*Inheritance of each trait.*Lethal "
    r"combinations and special cases",
    "formal, consistent, self-contained": r"formal, logically consistent and self-contained",
}


@pytest.mark.parametrize(
    ("env", "facts"),
    [(MysteryGrid, GRID_FACTS), (SequenceExploration, SEQUENCE_FACTS), (AlienGeneticsLab, BIO_FACTS)],
    ids=["grid", "sequence", "bio"],
)
def test_every_official_prompt_fact_is_stated(env, facts):
    prompt = env(seed=0, required_steps=50).prompt
    missing = [fact for fact, pattern in facts.items() if not re.search(pattern, prompt, re.IGNORECASE | re.DOTALL)]
    assert not missing, missing


def test_the_sequence_prompt_does_not_hint_at_the_step_number():
    assert "step number" not in SequenceExploration(seed=0).prompt.lower()


def test_free_runs_drop_only_the_budget():
    for env in (MysteryGrid, SequenceExploration, AlienGeneticsLab):
        free, bound = env(seed=0, free=True).prompt, env(seed=0).prompt
        assert "50" in bound and "50" not in free
