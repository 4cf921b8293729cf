"""UltraHorizon *Alien Genetics Lab* (arXiv:2509.21766; rules as in the official ``envs/bio_env/env.py``).

A triploid organism (three alleles per gene) with three genes:

* body size: alleles S1, S2, S3 worth 200, 50, 10, **additive**; the phenotype is the sum with +-1% noise, binned
  at 250 / 180 / 100 / 50 (extra_large, large, medium, small, tiny);
* color: **complete dominance** C1 red (intensity 95) > C2 blue (60) > C3 white (20);
* shell: **cyclic dominance** H1 spiky beats H2 smooth, H2 beats H3 ridged, H3 beats H1; hardness =
  ``int(100 * copies of the winner / 3)`` with +-5% noise; H1 + H2 + H3 together are **lethal**.

Meiosis splits the three copies of every gene 1 + 2 (a shuffled assignment per gene), and fertilization draws the
same gamete -- the 1n or the 2n one -- for all genes of a parent. A zygote is viable only if it has exactly three
alleles per gene (so exactly one parent gave its 1n gamete: base viability 1/2) and is not shell-lethal.
``conduct_cross`` keeps fertilizing until ``num_offspring`` viable offspring are born (1..100), reporting lethal
attempts and the viability rate; capacity is 200 organisms. Genotypes are never shown. Stock: line A (S1 S1 S2,
C1 x3, H1 x3), B (S1 S2 S2, C2 x3, H2 x3), C (S3 x3, C3 x3, H3 x3). ``difficulty`` has no effect (as in the
official code). The official constructor re-seeds the *global* RNG with 42, which cancels the runner's seed; here
every instance draws from its own ``random.Random(seed)``.

The structured commit (:data:`COMMIT_FIELDS`) is scored with the official rubric's ten items and weights
(15, 5, 5, 5, 10, 20, 5, 5, 10, 20), all or nothing.

equation -> function: meiosis -> :meth:`AlienGeneticsLab._gametes`; zygote viability -> :meth:`conduct_cross`;
size/color/shell expression -> :func:`size_phenotype`, :func:`color_phenotype`, :func:`shell_phenotype`;
rubric -> :meth:`AlienGeneticsLab.score_commit`.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any, ClassVar

from zoo.agents.envs.answers import AnswerError, agrees, compile_expression
from zoo.agents.envs.base import CommitError, Environment, RubricItem, ScoreReport
from zoo.agents.tools import agent_tool
from zoo.errors import ConfigError

GENES = ("body_size", "color", "shell_shape")
SIZE_VALUES = {"S1": 200, "S2": 50, "S3": 10}
COLORS = {"C1": ("red", 95), "C2": ("blue", 60), "C3": ("white", 20)}
COLOR_HIERARCHY = ("C1", "C2", "C3")
SHELLS = {"H1": "spiky", "H2": "smooth", "H3": "ridged"}
BEATS = {"H1": "H2", "H2": "H3", "H3": "H1"}
CAPACITY = 200
STOCK = (
    ({"body_size": ("S1", "S1", "S2"), "color": ("C1",) * 3, "shell_shape": ("H1",) * 3}, "Initial Organism (Line A)"),
    ({"body_size": ("S1", "S2", "S2"), "color": ("C2",) * 3, "shell_shape": ("H2",) * 3}, "Initial Organism (Line B)"),
    ({"body_size": ("S3",) * 3, "color": ("C3",) * 3, "shell_shape": ("H3",) * 3}, "Initial Organism (Line C)"),
)

#: the structured commit: field -> allowed values (``None``: free value checked by :meth:`parse_commit`)
COMMIT_FIELDS: dict[str, tuple[Any, ...] | None] = {
    "ploidy": (2, 3, 4),
    "gamete_split": ("1+1", "1+2", "2+2", "random"),
    "viability_rule": ("triploid_only", "all"),
    "size_model": ("additive", "dominant"),
    "size_alleles": None,
    "size_values": None,
    "color_order": None,
    "color_dominance": ("complete", "incomplete"),
    "shell_relation": ("cyclic", "linear"),
    "shell_order": None,
    "lethal_set": None,
}
COLOR_NAMES = tuple(name for name, _ in COLORS.values())
SHELL_NAMES = tuple(SHELLS.values())
COMMIT_FORMATS = ("answer", "choice")

#: the default commit: field -> what the agent writes (no candidate answers are listed)
ANSWER_FIELDS: dict[str, str] = {
    "ploidy": "copies of each gene an organism carries (an integer)",
    "gamete_copies": "copies of a gene each kind of gamete receives (a list of integers, e.g. [1, 1])",
    "viable_zygote_copies": "copies per gene of the zygotes that survive (a list of integers)",
    "size_values": "the body-size value of each size allele (a list of numbers, one per allele)",
    "size_rule": "a Python expression giving an organism's size score from values, the list of the size "
    "values of the alleles it carries (one per copy)",
    "color_order": f"the colors {list(COLOR_NAMES)} ordered from most to least dominant",
    "color_intensity": "a Python expression giving an organism's color intensity from counts (color name -> "
    "copies it carries) and intensity (color name -> intensity of a pure line of that color)",
    "shell_beats": f"for each shell of {list(SHELL_NAMES)}, the list of shells it wins over when both are present",
    "lethal_combinations": "every set of shell alleles whose joint presence kills the zygote (a list of lists "
    "of shell names; [] if none)",
}
TRUE_BEATS = {SHELLS[a]: [SHELLS[b]] for a, b in BEATS.items()}


def _size_cases() -> list[dict[str, Any]]:
    rng = random.Random(20250926)
    return [{"values": [rng.randint(1, 300) for _ in range(3)]} for _ in range(200)]


def _color_cases() -> list[dict[str, Any]]:
    intensity = dict(COLORS.values())
    return [
        {"counts": dict(zip(COLOR_NAMES, (a, b, 3 - a - b))), "intensity": intensity}
        for a in range(4)
        for b in range(4 - a)
    ]


def _true_intensity(case: dict[str, Any]) -> int:
    return next(case["intensity"][c] for c in COLOR_NAMES if case["counts"][c])


SIZE_CASES = _size_cases()
COLOR_CASES = _color_cases()


def noisy(rng: random.Random, value: float, level: float) -> float:
    """``value`` times ``1 + U(-level, level)``, clipped at 0 and rounded to 2 decimals (the official noise)."""
    return round(max(0.0, value + value * level * (rng.random() - 0.5) * 2), 2)


def size_phenotype(rng: random.Random, alleles: tuple[str, ...]) -> tuple[str, float]:
    total = noisy(rng, sum(SIZE_VALUES[a] for a in alleles), 0.01)
    for bound, label in ((250, "extra_large"), (180, "large"), (100, "medium"), (50, "small")):
        if total >= bound:
            return label, total
    return "tiny", total


def color_phenotype(alleles: tuple[str, ...]) -> tuple[str, int]:
    for allele in COLOR_HIERARCHY:
        if allele in alleles:
            return COLORS[allele]
    return "colorless", 0


def shell_phenotype(rng: random.Random, alleles: tuple[str, ...]) -> tuple[str, float]:
    kinds = set(alleles)
    if len(kinds) == 3:
        return "deformed", 0
    if len(kinds) == 1:
        allele = alleles[0]
        return SHELLS[allele], noisy(rng, 100, 0.05)
    first, second = sorted(kinds)
    winner = first if BEATS[first] == second else second
    return SHELLS[winner], noisy(rng, int(100 * Counter(alleles)[winner] / 3.0), 0.05)


class AlienGeneticsLab(Environment):
    """Alien Genetics Lab (see the module docstring). ``difficulty`` is accepted and has no effect."""

    name: ClassVar[str] = "ultrahorizon/bio"
    max_steps_factor: ClassVar[int] = 8

    def __init__(
        self,
        seed: int = 0,
        difficulty: str = "hard",
        required_steps: int = 50,
        free: bool = False,
        judge: Any = None,
        commit_format: str = "answer",
    ) -> None:
        super().__init__(seed, difficulty, required_steps, free, judge)
        if commit_format not in COMMIT_FORMATS:
            raise ConfigError(f"{self.name}: commit_format={commit_format!r}; use one of {COMMIT_FORMATS}")
        self.commit_format = commit_format
        self.organisms: dict[int, dict[str, Any]] = {}
        self.next_id = 1
        self.experiments = 0
        self.experiment_log: list[dict[str, Any]] = []
        for genotype, description in STOCK:
            self._create(genotype, description, generation=0, parents=None)

    def _phenotype(self, genotype: dict[str, tuple[str, ...]]) -> dict[str, Any]:
        size, score = size_phenotype(self.rng, genotype["body_size"])
        color, intensity = color_phenotype(genotype["color"])
        shell, hardness = shell_phenotype(self.rng, genotype["shell_shape"])
        return {
            "body_size": size,
            "size_score": score,
            "body_color": color,
            "color_intensity": intensity,
            "shell_shape": shell,
            "shell_hardness": hardness,
        }

    def _create(self, genotype, description: str, generation: int, parents) -> int:
        organism_id = self.next_id
        self.organisms[organism_id] = {
            "id": organism_id,
            "genotype": genotype,
            "phenotype": self._phenotype(genotype),
            "generation": generation,
            "parents": parents,
            "description": description,
            "viable": True,
        }
        self.next_id += 1
        return organism_id

    def _gametes(self, genotype: dict[str, tuple[str, ...]]) -> list[dict[str, tuple[str, ...]]]:
        """Triploid meiosis: per gene one copy goes to gamete 0 (1n) and two to gamete 1 (2n)."""
        gametes: list[dict[str, tuple[str, ...]]] = [{}, {}]
        for gene in GENES:
            assignment = [0, 1, 1]
            self.rng.shuffle(assignment)
            for side in (0, 1):
                gametes[side][gene] = tuple(a for a, s in zip(genotype[gene], assignment) if s == side)
        return gametes

    @property
    def prompt(self) -> str:
        budget = "" if self.free else f" A study takes {self.required_steps} experimental steps in total."
        return (
            "ALIEN ORGANISM GENETICS LAB\n"
            "Task: you are a researcher studying a newly discovered species of alien organism. Every organism has "
            "several traits controlled by hidden genetic factors. Your goal is to discover the rules that govern how "
            "these traits are inherited and expressed.\n"
            "Rules:\n"
            "- You can cross organisms under control to obtain offspring. Every cross uses 1 experimental "
            f"step.{budget}\n"
            "- Every experiment gives offspring whose traits (phenotypes) you can observe.\n"
            "- Some crosses can give offspring that are not viable (lethal combinations).\n"
            "- You can query the organisms of the lab to see their traits, descriptions and lineage.\n"
            "- The number of experiments has a maximum, and a minimum number of steps must be done before you submit "
            "your conclusions.\n"
            "Goals of the exploration:\n"
            "- Find out how traits are inherited from generation to generation.\n"
            "- Identify dominance, interaction or dosage effects in the traits.\n"
            "- Find the lethal combinations that keep offspring from being viable.\n"
            "- Build a model that predicts the traits of offspring from their parents.\n"
            "- Write down observations, form hypotheses, and refine them with repeated experiments.\n"
            "Tools: conduct_cross(parent1_id, parent2_id, num_offspring) crosses two organisms and reports offspring "
            "phenotypes, viability rates and lethality; query_organisms(start_id, end_id) shows the organisms in an "
            "id range with their phenotypes, generation, parents and description; get_lab_status() shows the lab's "
            "resources, the experiments done and those remaining; commit_final_result(content) submits your final "
            "conclusions on the inheritance rules, once, after the minimum number of steps.\n"
            "Notes:\n"
            "- The hidden mechanisms can include complex inheritance, dominance, dosage effects, interactions and "
            "lethal combinations.\n"
            "- The effects are consistent but not disclosed: repeated experiments and careful observation are "
            "needed.\n"
            "- Non-viable offspring belong to the system and carry key information.\n"
            "- Organisms can interact in ways that are not obvious: consider lineage and combinations of traits.\n"
            "- Record your observations carefully. Your final submission must explain the mechanisms you inferred "
            "and predict the outcome of crosses you did not run.\n"
            "Final report: a formal experimental report in three parts. (1) Genetic basis: the organism's "
            "chromosomal make-up (such as the number of chromosome sets) and how gametes form, including any special "
            "segregation rule. (2) Inheritance of each trait: the exact number of alleles and the effect of each, "
            "the dominance relations (dominant, recessive, dosage effects, ...), and any special mechanism (such as "
            "position effects or dosage sensitivity). (3) Lethal combinations and special cases: every lethal or "
            "non-viable combination found and why it is lethal, and any exception or conditional outcome. The report "
            "must be formal, logically consistent and self-contained, so that it alone explains every result."
        )

    def library(self) -> dict[str, Any]:
        return {
            "commit_format": self.commit_format,
            "fields": {k: (list(v) if v else None) for k, v in COMMIT_FIELDS.items()},
            "colors": list(COLOR_NAMES),
            "shells": list(SHELL_NAMES),
        }

    def commit_help(self) -> str:
        if self.judge is not None:
            return "Write a formal report: genetic basis and gametes, inheritance of each trait, lethal combinations."
        if self.commit_format == "answer":
            fields = "; ".join(f"{k}: {v}" for k, v in ANSWER_FIELDS.items())
            return (
                f"Format: a JSON object with the fields {fields}. Each item of the report counts only when it is "
                "exactly right."
            )
        return (
            "Format: a JSON object with the fields ploidy (copies per gene: 2, 3 or 4), gamete_split (how the copies "
            "split into gametes: 1+1, 1+2, 2+2 or random), viability_rule (triploid_only or all), size_model "
            "(additive or dominant), size_alleles (number of size alleles), size_values (value of each size allele), "
            f"color_order (colors from most to least dominant, of {list(COLOR_NAMES)}), color_dominance (complete or "
            f"incomplete), shell_relation (cyclic or linear), shell_order (shells of {list(SHELL_NAMES)} where each "
            "beats the next; for cyclic the last beats the first), lethal_set (shells whose joint presence is lethal; "
            "[] if none)."
        )

    # -- tools ------------------------------------------------------------------------------------------------
    @agent_tool
    def conduct_cross(self, parent1_id: int, parent2_id: int, num_offspring: int = 10) -> dict[str, Any]:
        """Cross two organisms until num_offspring viable offspring are born (one experiment).

        Args:
            parent1_id: id of the first parent.
            parent2_id: id of the second parent.
            num_offspring: viable offspring wanted, 1 to 100.
        """
        if self.committed:
            return {"success": False, "message": "Experiment concluded - no further experiments allowed"}
        if self.experiments >= self.required_steps:
            return {"success": False, "message": f"Maximum experiment limit reached ({self.required_steps}). Commit."}
        if parent1_id not in self.organisms or parent2_id not in self.organisms:
            return {"success": False, "message": "One or both parent organisms not found"}
        if num_offspring <= 0 or num_offspring > 100:
            return {"success": False, "message": "Number of offspring must be between 1 and 100"}
        if len(self.organisms) + num_offspring > CAPACITY:
            return {"success": False, "message": "Laboratory capacity would be exceeded. Remove some organisms first."}
        parent1, parent2 = self.organisms[parent1_id], self.organisms[parent2_id]
        generation = max(parent1["generation"], parent2["generation"]) + 1
        offspring: list[dict[str, Any]] = []
        lethal = attempts = 0
        while len(offspring) < num_offspring:
            attempts += 1
            gametes1, gametes2 = self._gametes(parent1["genotype"]), self._gametes(parent2["genotype"])
            gamete1, gamete2 = self.rng.choice(gametes1), self.rng.choice(gametes2)
            genotype = {gene: tuple(sorted(gamete1[gene] + gamete2[gene])) for gene in GENES}
            viable = all(len(genotype[g]) == 3 for g in GENES) and len(set(genotype["shell_shape"])) < 3
            if not viable:
                lethal += 1
            else:
                child = self._create(
                    genotype,
                    f"Cross {parent1_id} x {parent2_id} offspring #{len(offspring) + 1}",
                    generation,
                    (parent1_id, parent2_id),
                )
                offspring.append({"id": child, "phenotype": self.organisms[child]["phenotype"]})
            if attempts > num_offspring * 100:
                return {
                    "success": False,
                    "message": f"Unable to produce {num_offspring} viable offspring after {attempts} attempts.",
                }
        self.experiments += 1
        result = {
            "success": True,
            "experiment_id": self.experiments,
            "parent1_id": parent1_id,
            "parent2_id": parent2_id,
            "parent1_phenotype": parent1["phenotype"],
            "parent2_phenotype": parent2["phenotype"],
            "requested_offspring": num_offspring,
            "viable_offspring_count": len(offspring),
            "lethal_offspring_count": lethal,
            "total_fertilization_attempts": attempts,
            "viability_rate": round(len(offspring) / attempts, 3),
            "offspring": offspring,
            "remaining_experiments": self.required_steps - self.experiments,
            "total_organisms": len(self.organisms),
        }
        self.experiment_log.append(result)
        return result

    @agent_tool
    def query_organisms(self, start_id: int = 1, end_id: int | None = None) -> dict[str, Any]:
        """Phenotypes, generation, parents and description of the organisms with ids in [start_id, end_id].

        Args:
            start_id: first id.
            end_id: last id (the highest id when omitted).
        """
        if end_id is None:
            end_id = max(self.organisms) if self.organisms else start_id
        if start_id < 1 or end_id < start_id:
            return {"success": False, "message": "Invalid ID range specified"}
        found = [
            {k: self.organisms[i][k] for k in ("id", "phenotype", "generation", "parents", "description", "viable")}
            for i in range(start_id, end_id + 1)
            if i in self.organisms
        ]
        return {
            "success": True,
            "message": f"Found {len(found)} organisms in range {start_id}-{end_id}",
            "query_range": f"{start_id}-{end_id}",
            "organisms_found": len(found),
            "organisms": found,
            "total_lab_organisms": len(self.organisms),
        }

    @agent_tool
    def remove_organisms(self, organism_ids: list[int]) -> dict[str, Any]:
        """Remove organisms from the lab to free capacity.

        Args:
            organism_ids: ids to remove.
        """
        if self.committed:
            return {"success": False, "message": "Experiment concluded - no further modifications allowed"}
        removed = [i for i in organism_ids if self.organisms.pop(i, None) is not None]
        return {
            "success": True,
            "message": f"Removed {len(removed)} organisms from the laboratory",
            "requested_removals": len(organism_ids),
            "actual_removals": len(removed),
            "total_lab_organisms": len(self.organisms),
        }

    @agent_tool
    def get_lab_status(self) -> dict[str, Any]:
        """Experiments done and remaining, organisms in the lab and the capacity."""
        return {
            "success": True,
            "message": "Laboratory status retrieved successfully",
            "current_experiments": self.experiments,
            "remaining_experiments": self.required_steps - self.experiments,
            "can_commit": self.experiments >= self.required_steps,
            "total_organisms": len(self.organisms),
            "max_organisms": CAPACITY,
            "experiment_log_entries": len(self.experiment_log),
            "committed": self.committed,
        }

    # -- commit -----------------------------------------------------------------------------------------------
    def commit_refusal(self) -> str | None:
        if self.experiments < self.required_steps:
            return f"Cannot commit yet: {self.required_steps} experiments are required, {self.experiments} done so far."
        return None

    def parse_commit(self, data: Any) -> dict[str, Any]:
        return self._parse_answer(data) if self.commit_format == "answer" else self._parse_choice(data)

    def score_commit(self, commit: dict[str, Any]) -> ScoreReport:
        checks = self._answer_checks(commit) if self.commit_format == "answer" else self._choice_checks(commit)
        values = sorted(commit["size_values"], reverse=True)
        values_ok = len(values) == 3 and all(
            abs(v - target) <= tol for v, (target, tol) in zip(values, ((200, 20), (50, 10), (10, 5)))
        )
        checks.insert(5, ("Body size: allele values", 20, values_ok))
        return ScoreReport.from_items([RubricItem(name, pts, pts if ok else 0) for name, pts, ok in checks])

    def _parse_answer(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise CommitError("the commit must be a JSON object with the fields " + ", ".join(ANSWER_FIELDS))
        missing = [k for k in ANSWER_FIELDS if k not in data]
        extra = sorted(set(data) - set(ANSWER_FIELDS))
        if missing or extra:
            raise CommitError(f"fields missing {missing}, unexpected fields {extra}")
        parsed = dict(data)
        if isinstance(data["ploidy"], bool) or not isinstance(data["ploidy"], int):
            raise CommitError(f"ploidy must be an integer, got {data['ploidy']!r}")
        for key in ("gamete_copies", "viable_zygote_copies"):
            value = data[key]
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise CommitError(f"{key} must be a list of integers, got {value!r}")
        values = data["size_values"]
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise CommitError(f"size_values must be a list of numbers, got {values!r}")
        order = data["color_order"]
        if not isinstance(order, list) or sorted(map(str, order)) != sorted(COLOR_NAMES):
            raise CommitError(f"color_order must order all of {list(COLOR_NAMES)}, got {order!r}")
        try:
            parsed["size_rule"] = compile_expression(data["size_rule"], ("values",))
            parsed["color_intensity"] = compile_expression(data["color_intensity"], ("counts", "intensity"))
        except AnswerError as err:
            raise CommitError(f"size_rule/color_intensity: {err}") from None
        beats = data["shell_beats"]
        if not isinstance(beats, dict) or any(
            k not in SHELL_NAMES or not isinstance(v, list) or any(x not in SHELL_NAMES for x in v)
            for k, v in beats.items()
        ):
            raise CommitError(f"shell_beats must map shell names {list(SHELL_NAMES)} to lists of them, got {beats!r}")
        lethal = data["lethal_combinations"]
        if not isinstance(lethal, list) or any(
            not isinstance(c, list) or any(x not in SHELL_NAMES for x in c) for c in lethal
        ):
            raise CommitError(f"lethal_combinations must be a list of lists of {list(SHELL_NAMES)}, got {lethal!r}")
        return parsed

    def _answer_checks(self, commit: dict[str, Any]) -> list[tuple[str, int, bool]]:
        beats = {k: sorted(v) for k, v in commit["shell_beats"].items() if v}
        lethal = {frozenset(c) for c in commit["lethal_combinations"]}
        return [
            ("Triploidy", 15, commit["ploidy"] == 3),
            ("Meiosis: 1n and 2n gametes", 5, sorted(commit["gamete_copies"]) == [1, 2]),
            ("Viability: only triploid zygotes", 5, sorted(set(commit["viable_zygote_copies"])) == [3]),
            ("Body size: additive dosage", 5, agrees(commit["size_rule"], lambda c: sum(c["values"]), SIZE_CASES)),
            ("Body size: three alleles", 10, len(commit["size_values"]) == 3),
            ("Color: dominance order", 5, list(commit["color_order"]) == list(COLOR_NAMES)),
            ("Color: complete dominance", 5, agrees(commit["color_intensity"], _true_intensity, COLOR_CASES)),
            ("Shell: cyclic dominance", 10, beats == TRUE_BEATS),
            ("Shell: H1+H2+H3 lethal", 20, lethal == {frozenset(SHELL_NAMES)}),
        ]

    def _parse_choice(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise CommitError("the commit must be a JSON object with the fields " + ", ".join(COMMIT_FIELDS))
        missing = [k for k in COMMIT_FIELDS if k not in data]
        extra = sorted(set(data) - set(COMMIT_FIELDS))
        if missing or extra:
            raise CommitError(f"fields missing {missing}, unexpected fields {extra}")
        for key, allowed in COMMIT_FIELDS.items():
            if allowed is not None and data[key] not in allowed:
                raise CommitError(f"{key}={data[key]!r}; use one of {list(allowed)}")
        if isinstance(data["size_alleles"], bool) or not isinstance(data["size_alleles"], int):
            raise CommitError(f"size_alleles must be an integer, got {data['size_alleles']!r}")
        values = data["size_values"]
        if not isinstance(values, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise CommitError(f"size_values must be a list of numbers, got {values!r}")
        for key, names in (("color_order", COLOR_NAMES), ("shell_order", SHELL_NAMES), ("lethal_set", SHELL_NAMES)):
            value = data[key]
            if not isinstance(value, list) or any(v not in names for v in value) or len(set(value)) != len(value):
                raise CommitError(f"{key} must be a list of distinct names from {list(names)}, got {value!r}")
        for key, names in (("color_order", COLOR_NAMES), ("shell_order", SHELL_NAMES)):
            if sorted(data[key]) != sorted(names):
                raise CommitError(f"{key} must order all of {list(names)}, got {data[key]!r}")
        return dict(data)

    def _choice_checks(self, commit: dict[str, Any]) -> list[tuple[str, int, bool]]:
        cycle = list(SHELL_NAMES)
        order = commit["shell_order"]
        is_rotation = any(order == cycle[i:] + cycle[:i] for i in range(3))
        return [
            ("Triploidy", 15, commit["ploidy"] == 3),
            ("Meiosis: 1n and 2n gametes", 5, commit["gamete_split"] == "1+2"),
            ("Viability: only triploid zygotes", 5, commit["viability_rule"] == "triploid_only"),
            ("Body size: additive dosage", 5, commit["size_model"] == "additive"),
            ("Body size: three alleles", 10, commit["size_alleles"] == 3),
            ("Color: dominance order", 5, commit["color_order"] == list(COLOR_NAMES)),
            ("Color: complete dominance", 5, commit["color_dominance"] == "complete"),
            ("Shell: cyclic dominance", 10, commit["shell_relation"] == "cyclic" and is_rotation),
            ("Shell: H1+H2+H3 lethal", 20, sorted(commit["lethal_set"]) == sorted(SHELL_NAMES)),
        ]

    def ground_truth(self) -> dict[str, str]:
        return {
            "genetic basis": "triploid (three alleles per gene); meiosis splits the copies 1+2 so gametes are 1n or "
            "2n; only triploid zygotes (one 1n and one 2n gamete) are viable",
            "body size": "additive dosage of three alleles worth about 200, 50 and 10",
            "color": "complete dominance red (C1) > blue (C2) > white (C3); intensity set by the dominant allele alone",
            "shell": "cyclic dominance spiky (H1) > smooth (H2) > ridged (H3) > spiky; H1+H2+H3 together is lethal",
        }

    def rubric(self) -> list[tuple[str, int, str]]:
        return [
            ("Triploidy", 15, "identifies three alleles per locus"),
            ("Meiosis: 1n and 2n gametes", 5, "gametes are 1n and 2n by unequal (1+2) segregation"),
            ("Viability: only triploid zygotes", 5, "only triploid zygotes survive; other ploidies die"),
            ("Body size: additive dosage", 5, "size is the sum of allele contributions"),
            ("Body size: three alleles", 10, "three distinct size alleles"),
            ("Body size: allele values", 20, "values about 200 +- 20, 50 +- 10 and 10 +- 5"),
            ("Color: dominance order", 5, "red > blue > white"),
            ("Color: complete dominance", 5, "the dominant allele alone sets the phenotype"),
            ("Shell: cyclic dominance", 10, "spiky > smooth > ridged > spiky"),
            ("Shell: H1+H2+H3 lethal", 20, "all three shell alleles together are lethal"),
        ]
