"""Hypothesis solver for the Alien Genetics Lab: hypothesis sets per question, crosses chosen per open question.

Questions and the evidence that decides them (phenotypes only; genotypes are never shown):

* genetics ``(ploidy, gamete split, viability rule)``: each candidate predicts the viability of a cross that
  cannot be shell-lethal (both parents at full shell hardness, i.e. one shell allele kind each); candidates
  rejected by an exact two-sided binomial test (alpha = 1e-3) on the pooled counts are removed;
* shell relation: the 8 tournaments on the three shells (6 linear orders, 2 cycles); a cross of two full-hardness
  parents with different shells shows the winner of that pair;
* lethal set: none, one of the three pairs, or all three. A viable offspring of a pair cross clears that pair;
  crossing a two-shell offspring with the third shell tests "all three" (one-sided binomial tests against the
  base viability and against the viability that lethality would leave, ``2/3`` of it under a 1+2 split);
* color order and dominance: 6 orders x {complete, incomplete}; a cross of two colors whose offspring all show
  one color ranks it above the other; offspring intensity equal to the parent's of that color means complete;
* body size: observed sizes are clustered (2% tolerance); the allele values are the smallest set of
  ``cluster / ploidy`` candidates whose ``ploidy``-sums explain every cluster (additive model); the dominant
  model needs one allele per cluster, so the additive model is kept when it needs fewer alleles (parsimony).

Experiments, in order of need: query the stock, cross each pair of stock lines, self-cross each line, cross a
two-shell offspring with the third line, repeat pair crosses until the genetics test separates the candidates;
offspring are removed when the lab would overflow.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

from zoo.agents.envs.ultrahorizon.bio import CAPACITY, COLOR_NAMES, SHELL_NAMES
from zoo.agents.policies.solvers.base import HypothesisSet, Solver, register_solver
from zoo.agents.types import ToolCall, ToolResult
from zoo.stats import binom_cdf, binom_sf, binom_test

ALPHA = 1e-3
FULL_HARDNESS = 90.0
OFFSPRING = 20
#: (ploidy, gamete split, viability rule) -> predicted viability of a cross without lethal combinations
GENETICS: dict[tuple[int, str, str], float] = {
    (2, "1+1", "all"): 1.0,
    (3, "1+2", "all"): 1.0,
    (3, "1+2", "triploid_only"): 0.5,
    (3, "random", "triploid_only"): 0.3125,  # each copy joins either gamete: P(1n+2n or 2n+1n or 0n+3n or 3n+0n)
    (4, "2+2", "all"): 1.0,
}
#: tournaments: (a, b, c, relation); linear a > b > c, cyclic a > b > c > a
TOURNAMENTS = [[*p, "linear"] for p in itertools.permutations(sorted(SHELL_NAMES))] + [
    ["spiky", "smooth", "ridged", "cyclic"],
    ["spiky", "ridged", "smooth", "cyclic"],
]
LETHAL_SETS = [[], *[sorted(p) for p in itertools.combinations(sorted(SHELL_NAMES), 2)], sorted(SHELL_NAMES)]
COLOR_MODELS = [[list(p), d] for d in ("complete", "incomplete") for p in itertools.permutations(sorted(COLOR_NAMES))]


def beats(tournament: list[str], winner: str, loser: str) -> bool:
    a, b, c, relation = tournament
    order = [a, b, c]
    i, j = order.index(winner), order.index(loser)
    return i < j if relation == "linear" else (j - i) % 3 == 1


def clusters(values: list[float], tolerance: float = 0.02) -> list[float]:
    """Centers of 1-D clusters: a value joins the running cluster when within ``tolerance`` of its mean."""
    centers: list[list[float]] = []
    for v in sorted(values):
        if centers and v <= (sum(centers[-1]) / len(centers[-1])) * (1 + 2 * tolerance) + 1:
            centers[-1].append(v)
        else:
            centers.append([v])
    return [sum(c) / len(c) for c in centers]


def explains(values: tuple[float, ...], centers: list[float], ploidy: int) -> bool:
    sums = [sum(combo) for combo in itertools.combinations_with_replacement(values, ploidy)]
    return all(any(abs(s - c) <= 0.02 * c + 1 for s in sums) for c in centers)


def additive_values(centers: list[float], ploidy: int, max_alleles: int = 4) -> list[float] | None:
    """The smallest set of allele values whose ``ploidy``-sums explain every cluster (least error on ties)."""
    candidates = sorted({round(c / ploidy, 1) for c in centers})
    for size in range(1, min(max_alleles, len(candidates)) + 1):
        fits = [v for v in itertools.combinations(candidates, size) if explains(v, centers, ploidy)]
        if fits:
            return sorted(fits[0], reverse=True)
    return None


@register_solver
class BioSolver(Solver):
    env_name: ClassVar[str] = "ultrahorizon/bio"

    def __init__(self, info, rng, lock_first) -> None:
        super().__init__(info, rng, lock_first)
        self.genetics = HypothesisSet([list(g) for g in GENETICS], lock_first)
        self.shell = HypothesisSet(TOURNAMENTS, lock_first)
        self.lethal = HypothesisSet(LETHAL_SETS, lock_first)
        self.color = HypothesisSet(COLOR_MODELS, lock_first)
        self.size: dict[str, Any] | None = None
        self.sizes: list[float] = []
        self.pure = [0, 0]  # viable, attempts of crosses that cannot be shell-lethal
        self.mixed = [0, 0]  # viable, attempts of two-shell x third-shell crosses
        self.crossed: list[list[int]] = []
        self.organisms: dict[int, dict[str, Any]] = {}
        self.stock: list[int] = []
        self.shell_alleles: dict[int, list[str]] = {}
        self.need_query = True

    # -- notes ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        sets = {"genetics": self.genetics, "shell": self.shell, "lethal": self.lethal, "color": self.color}
        return {
            "sets": {k: s.state() for k, s in sets.items()},
            "size": self.size,
            "sizes": self.sizes,
            "pure": self.pure,
            "mixed": self.mixed,
            "crossed": self.crossed,
            "shell_alleles": {str(k): v for k, v in self.shell_alleles.items()},
            "experiments": self.experiments,
            "exhausted": self.exhausted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, s in state["sets"].items():
            getattr(self, key).load(s)
        self.size, self.sizes = state["size"], list(state["sizes"])
        self.pure, self.mixed = list(state["pure"]), list(state["mixed"])
        self.crossed = [list(c) for c in state["crossed"]]
        self.shell_alleles = {int(k): list(v) for k, v in state["shell_alleles"].items()}
        self.experiments, self.exhausted = int(state["experiments"]), bool(state["exhausted"])

    def mark_unsynced(self) -> None:
        self.need_query = True  # the lab's organisms are re-read

    # -- beliefs ----------------------------------------------------------------------------------------------
    def _ploidy(self) -> int:
        return int(self.genetics.best[0])

    def _base_viability(self) -> float:
        return GENETICS[tuple(self.genetics.best)]

    def _size_settled(self, size: dict[str, Any]) -> bool:
        centers = clusters(self.sizes)
        homozygous = [any(abs(self._ploidy() * v - c) <= 0.02 * c + 1 for c in centers) for v in size["values"]]
        return size["model"] == "additive" and all(homozygous)

    def resolved(self) -> bool:
        sets = (self.genetics, self.shell, self.lethal, self.color)
        return all(s.resolved or s.locked for s in sets) and (self.size is not None and self._size_settled(self.size))

    def commit_payload(self) -> dict[str, Any]:
        ploidy, split, viability = self.genetics.best
        a, b, c, relation = self.shell.best
        order, dominance = self.color.best
        size = self.size or {"model": "dominant", "values": []}
        return {
            "ploidy": ploidy,
            "gamete_split": split,
            "viability_rule": viability,
            "size_model": size["model"],
            "size_alleles": len(size["values"]),
            "size_values": [round(v, 1) for v in size["values"]],
            "color_order": order,
            "color_dominance": dominance,
            "shell_relation": relation,
            "shell_order": [a, b, c],
            "lethal_set": self.lethal.best,
        }

    # -- experiments ------------------------------------------------------------------------------------------
    def _lab_ids(self) -> list[int]:
        return sorted(self.organisms)

    def _full(self, organism_id: int) -> bool:
        return self.organisms[organism_id]["phenotype"]["shell_hardness"] >= FULL_HARDNESS

    def _shell(self, organism_id: int) -> str:
        return self.organisms[organism_id]["phenotype"]["shell_shape"]

    def _plan(self) -> tuple[int, int]:
        stock = [i for i in self.stock if i in self.organisms]
        pairs = list(itertools.combinations(stock, 2))
        done = {tuple(sorted(c)) for c in self.crossed}
        if self.lock_first:
            return pairs[0] if pairs else (stock[0], stock[0])
        for pair in pairs:
            if pair not in done:
                return pair
        for line in stock:
            if (line, line) not in done:
                return line, line
        if not self.lethal.resolved:
            for child in self._lab_ids():
                kinds = self.shell_alleles.get(child)
                if child in stock or self._full(child) or kinds is None or len(kinds) != 2:
                    continue
                third = [s for s in stock if self._full(s) and self._shell(s) not in kinds]
                if third:
                    return child, third[0]
        return pairs[self.experiments % len(pairs)] if pairs else (stock[0], stock[0])

    def next_call(self) -> ToolCall:
        if self.need_query:
            return ToolCall("query_organisms", {"start_id": 1})
        parent1, parent2 = self._plan()
        if len(self.organisms) + OFFSPRING > CAPACITY:
            keep = {*self.stock, parent1, parent2}
            keep |= {i for i in self._lab_ids() if not self._full(i)}
            removable = [i for i in self._lab_ids() if i not in keep]
            if len(self.organisms) - len(removable) + OFFSPRING > CAPACITY:  # drop two-shell offspring too
                removable = [i for i in self._lab_ids() if i not in {*self.stock, parent1, parent2}]
            return ToolCall("remove_organisms", {"organism_ids": removable})
        return ToolCall("conduct_cross", {"parent1_id": parent1, "parent2_id": parent2, "num_offspring": OFFSPRING})

    # -- observations -----------------------------------------------------------------------------------------
    def observe(self, result: ToolResult) -> None:
        content = result.content if isinstance(result.content, dict) else {}
        if result.name == "query_organisms" and result.ok:
            self.organisms = {o["id"]: o for o in content["organisms"]}
            self.stock = [o["id"] for o in content["organisms"] if o["generation"] == 0]
            self.need_query = False
            self.sizes += [o["phenotype"]["size_score"] for o in content["organisms"] if o["generation"] == 0]
            self._update_size()
        elif result.name == "remove_organisms" and result.ok:
            for organism_id in result.arguments.get("organism_ids", []):
                self.organisms.pop(organism_id, None)
        elif result.name == "conduct_cross":
            if result.ok:
                self._on_cross(content)
            elif "maximum experiment limit" in str(content.get("message", "")).lower():
                self.exhausted = True

    def _alleles(self, organism_id: int, phenotype: dict[str, Any]) -> set[str] | None:
        """Shell allele kinds of an organism: one kind at full hardness, else what its lineage brought."""
        if phenotype["shell_hardness"] >= FULL_HARDNESS:
            return {phenotype["shell_shape"]}
        known = self.shell_alleles.get(organism_id)
        return set(known) if known is not None else None

    def _on_cross(self, content: dict[str, Any]) -> None:
        self.experiments = int(content["experiment_id"])
        p1, p2 = content["parent1_id"], content["parent2_id"]
        self.crossed.append(sorted([p1, p2]))
        parents = [content["parent1_phenotype"], content["parent2_phenotype"]]
        offspring = [o["phenotype"] for o in content["offspring"]]
        kinds = [self._alleles(p1, parents[0]), self._alleles(p2, parents[1])]
        union = kinds[0] | kinds[1] if None not in kinds else None
        for child in content["offspring"]:
            self.organisms[child["id"]] = {"id": child["id"], "phenotype": child["phenotype"], "parents": [p1, p2]}
            if union is not None:
                self.shell_alleles[child["id"]] = sorted(union)
        viable, attempts = content["viable_offspring_count"], content["total_fertilization_attempts"]
        if union is not None and len(union) <= 2:  # no shell-lethal zygote is possible
            self.pure[0] += viable
            self.pure[1] += attempts
            k, n = self.pure
            self.genetics.update(lambda g: binom_test(k, n, GENETICS[tuple(g)]) >= ALPHA)
        if union is not None and len(union) == 2 and all(len(k) == 1 for k in kinds):
            shown = {o["shell_shape"] for o in offspring}
            if len(shown) == 1:
                winner = shown.pop()
                loser = next(s for s in union if s != winner)
                self.shell.update(lambda t: beats(t, winner, loser))
            if viable:
                self.lethal.update(lambda s: sorted(s) != sorted(union))
        elif union is not None and len(union) == 3:
            self._lethal_test(viable, attempts)
        self._color_evidence(parents, offspring)
        self.sizes += [o["size_score"] for o in offspring]
        self._update_size()

    def _lethal_test(self, viable: int, attempts: int) -> None:
        self.mixed[0] += viable
        self.mixed[1] += attempts
        k, n = self.mixed
        base = self._base_viability()
        lower_than_base = binom_cdf(k, n, base) < ALPHA
        higher_than_lethal = binom_sf(k, n, base * 2 / 3) < ALPHA
        everything = sorted(SHELL_NAMES)
        if lower_than_base:
            self.lethal.update(lambda s: sorted(s) == everything)
        elif higher_than_lethal:
            self.lethal.update(lambda s: sorted(s) != everything)

    def _color_evidence(self, parents: list[dict[str, Any]], offspring: list[dict[str, Any]]) -> None:
        colors = {p["body_color"]: p["color_intensity"] for p in parents}
        shown = {o["body_color"] for o in offspring}
        if len(colors) != 2 or len(shown) != 1:
            return
        winner = shown.pop()
        loser = next(c for c in colors if c != winner)
        same_intensity = all(o["color_intensity"] == colors[winner] for o in offspring)

        def consistent(model: list[Any]) -> bool:
            order, dominance = model
            ranked = order.index(winner) < order.index(loser)
            return ranked and ((dominance == "complete") == same_intensity)

        self.color.update(consistent)

    def _update_size(self) -> None:
        if self.size is not None and self.lock_first:
            return
        centers = clusters(self.sizes)
        values = additive_values(centers, self._ploidy())
        if values is not None and len(values) < len(centers):
            self.size = {"model": "additive", "values": values}
        else:
            self.size = {"model": "dominant", "values": sorted(centers, reverse=True)}
