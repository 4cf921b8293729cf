"""Alien Genetics Lab invariants (research notes, UltraHorizon section 5(e))."""

from __future__ import annotations

import json
import random

import pytest

from zoo.agents import AlienGeneticsLab
from zoo.agents.envs.ultrahorizon.bio import CAPACITY, SIZE_VALUES
from zoo.stats import binom_test

#: a correct report in the default answer format (written as an agent would, not as the environment's code)
ANSWER = {
    "ploidy": 3,
    "gamete_copies": [2, 1],
    "viable_zygote_copies": [3],
    "size_values": [205, 48, 11],
    "size_rule": "values[0] + values[1] + values[2]",
    "color_order": ["red", "blue", "white"],
    "color_intensity": "95 if counts['red'] else (60 if counts['blue'] else 20)",
    "shell_beats": {"spiky": ["smooth"], "smooth": ["ridged"], "ridged": ["spiky"]},
    "lethal_combinations": [["smooth", "spiky", "ridged"]],
}
#: the same in the multiple-choice variant (commit_format="choice")
TRUTH = {
    "ploidy": 3,
    "gamete_split": "1+2",
    "viability_rule": "triploid_only",
    "size_model": "additive",
    "size_alleles": 3,
    "size_values": [205, 48, 11],
    "color_order": ["red", "blue", "white"],
    "color_dominance": "complete",
    "shell_relation": "cyclic",
    "shell_order": ["smooth", "ridged", "spiky"],
    "lethal_set": ["ridged", "smooth", "spiky"],
}


def test_a_x_b_viability_is_one_half_and_never_shell_lethal():
    lab = AlienGeneticsLab(seed=1)
    out = lab.conduct_cross(1, 2, 100)
    viable, attempts = out["viable_offspring_count"], out["total_fertilization_attempts"]
    assert viable == 100 and out["lethal_offspring_count"] == attempts - 100
    assert binom_test(viable, attempts, 0.5) > 1e-3
    assert binom_test(viable, attempts, 0.3125) < 1e-3 and binom_test(viable, attempts, 1.0) < 1e-3
    for child in out["offspring"]:
        genotype = lab.organisms[child["id"]]["genotype"]
        assert all(len(alleles) == 3 for alleles in genotype.values())
        assert set(genotype["shell_shape"]) <= {"H1", "H2"}


def test_a_cross_that_can_make_h1_h2_h3_shows_extra_lethality():
    lab = AlienGeneticsLab(seed=2, required_steps=10)
    lab.conduct_cross(1, 2, 40)
    hybrid = next(i for i, o in lab.organisms.items() if o["genotype"]["shell_shape"] == ("H1", "H1", "H2"))
    out = lab.conduct_cross(hybrid, 3, 100)
    viable, attempts = out["viable_offspring_count"], out["total_fertilization_attempts"]
    assert binom_test(viable, attempts, 0.5) < 1e-3  # below the base viability
    assert binom_test(viable, attempts, 1 / 3) > 1e-3  # 1/2 x (1 - 1/2 x 2/3) under the official rules
    assert all(len(set(lab.organisms[c["id"]]["genotype"]["shell_shape"])) < 3 for c in out["offspring"])


def test_size_is_the_sum_of_allele_values_within_the_noise_band():
    lab = AlienGeneticsLab(seed=3)
    lab.conduct_cross(1, 2, 60)
    for organism in lab.organisms.values():
        total = sum(SIZE_VALUES[a] for a in organism["genotype"]["body_size"])
        assert abs(organism["phenotype"]["size_score"] - total) <= 0.01 * total + 0.01


def test_color_follows_the_hierarchy_and_shell_the_cycle():
    lab = AlienGeneticsLab(seed=4)
    results = {pair: lab.conduct_cross(*pair, 20)["offspring"] for pair in ((1, 2), (1, 3), (2, 3))}
    colors = {pair: {o["phenotype"]["body_color"] for o in kids} for pair, kids in results.items()}
    shells = {pair: {o["phenotype"]["shell_shape"] for o in kids} for pair, kids in results.items()}
    assert colors == {(1, 2): {"red"}, (1, 3): {"red"}, (2, 3): {"blue"}}
    assert shells == {(1, 2): {"spiky"}, (1, 3): {"ridged"}, (2, 3): {"smooth"}}  # H1>H2, H3>H1, H2>H3
    for kids in results.values():
        for kid in kids:
            genotype = lab.organisms[kid["id"]]["genotype"]["shell_shape"]
            winner = {"spiky": "H1", "smooth": "H2", "ridged": "H3"}[kid["phenotype"]["shell_shape"]]
            expected = int(100 * genotype.count(winner) / 3)
            assert abs(kid["phenotype"]["shell_hardness"] - expected) <= 0.05 * expected + 0.01
            assert kid["phenotype"]["color_intensity"] in (95, 60)


def test_offspring_count_capacity_and_removal():
    lab = AlienGeneticsLab(seed=5)
    assert lab.conduct_cross(1, 1, 37)["viable_offspring_count"] == 37
    assert not lab.conduct_cross(1, 2, 0)["success"] and not lab.conduct_cross(1, 2, 101)["success"]
    assert not lab.conduct_cross(1, 999, 5)["success"]
    lab.conduct_cross(2, 2, 100)
    assert len(lab.organisms) == 140
    full = lab.conduct_cross(1, 2, CAPACITY - 140 + 1)
    assert not full["success"] and "capacity" in full["message"].lower() and len(lab.organisms) == 140
    removed = lab.remove_organisms([4, 5, 6, 9999])
    assert removed["actual_removals"] == 3 and len(lab.organisms) == 137
    assert lab.experiments == 2  # refused crosses cost nothing
    query = lab.query_organisms(1, 3)
    assert [o["id"] for o in query["organisms"]] == [1, 2, 3]
    assert all("genotype" not in o for o in query["organisms"])


def test_commit_rule_schema_and_rubric_weights():
    lab = AlienGeneticsLab(seed=6, required_steps=1)
    assert not lab.commit_final_result(json.dumps(ANSWER))["success"]
    lab.conduct_cross(1, 2, 5)
    bad = lab.commit_final_result(json.dumps({**ANSWER, "color_order": ["red", "blue"]}))
    assert not bad["success"] and "color_order" in bad["message"] and not lab.committed
    bad = lab.commit_final_result(json.dumps({**ANSWER, "ploidy": "three"}))
    assert not bad["success"] and "ploidy" in bad["message"]
    bad = lab.commit_final_result(json.dumps({**ANSWER, "size_rule": "open('x')"}))
    assert not bad["success"] and "size_rule" in bad["message"]
    assert lab.commit_final_result(json.dumps(ANSWER))["success"] and lab.report.total == 100
    weights = [i.points for i in lab.report.items]
    assert weights == [15, 5, 5, 5, 10, 20, 5, 5, 10, 20]
    wrong = {
        **ANSWER,
        "size_values": [230, 50, 10],  # 230 is outside 200 +- 20
        "shell_beats": {"spiky": ["smooth", "ridged"], "smooth": ["ridged"]},  # linear, not cyclic
        "size_rule": "max(values)",  # not additive
        "color_intensity": "sum(intensity[c] * counts[c] for c in counts) / 3",  # blending, not complete dominance
    }
    partial = AlienGeneticsLab(seed=6, free=True)
    partial.commit_final_result(json.dumps(wrong))
    assert partial.report.total == 100 - 20 - 10 - 5 - 5


def test_choice_variant_and_no_answer_options_in_the_default_commit():
    description = AlienGeneticsLab(seed=0).tools()["commit_final_result"].description
    assert not any(hint in description for hint in ("triploid_only", "1+2", "cyclic", "additive", "complete"))
    lab = AlienGeneticsLab(seed=6, free=True, commit_format="choice")
    lab.commit_final_result(json.dumps({**TRUTH, "size_values": [230, 50, 10], "shell_relation": "linear"}))
    assert lab.report.total == 100 - 20 - 10


def test_lab_status_carries_the_official_fields():
    lab = AlienGeneticsLab(seed=0)
    lab.conduct_cross(1, 2, 3)
    status = lab.get_lab_status()
    assert status["message"] == "Laboratory status retrieved successfully" and status["experiment_log_entries"] == 1


def test_per_instance_rng_and_difficulty_has_no_effect():
    random.seed(5)
    state = random.getstate()
    a = AlienGeneticsLab(seed=9, difficulty="easy").conduct_cross(1, 2, 10)
    b = AlienGeneticsLab(seed=9, difficulty="hard").conduct_cross(1, 2, 10)
    assert random.getstate() == state
    assert a == b
    assert AlienGeneticsLab(seed=10).conduct_cross(1, 2, 10) != a


@pytest.mark.parametrize("field", ["lethal_set", "shell_order"])
def test_commit_names_must_be_known(field):
    lab = AlienGeneticsLab(seed=0, free=True, commit_format="choice")
    out = lab.commit_final_result(json.dumps({**TRUTH, field: ["spiky", "spiky", "smooth"]}))
    assert not out["success"] and field in out["message"]
