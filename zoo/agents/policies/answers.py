"""How the scripted agents write a commit: their conclusions (rule ids, inheritance modes) in the environment's
commit format.

The scripted solvers reason over a hypothesis library (:meth:`~zoo.agents.envs.base.Environment.library`). Under
the default ``answer`` format an environment shows no candidate rule and grades expressions and plain values
(:mod:`zoo.agents.envs.answers`), so a solver states each conclusion the way any agent would: the expression of
the rule it settled on (``library["formulas"]``), and for the genetics lab the numbers, lists and expressions its
inheritance model implies. Under ``choice`` the payload goes out as it is.
"""

from __future__ import annotations

from typing import Any

from zoo.agents.policies.base import EpisodeInfo

#: copies per gamete under each segregation hypothesis of the genetics solver
GAMETE_COPIES = {"1+1": [1, 1], "1+2": [1, 2], "2+2": [2, 2], "random": [0, 1, 2, 3]}


def answer_payload(info: EpisodeInfo, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` (the solver's conclusions) in the commit format of the episode's environment."""
    library = info.library
    if library.get("commit_format", "choice") == "choice":
        return payload
    if "formulas" in library:
        return {key: library["formulas"][rule] for key, rule in payload.items()}
    return genetics_answer(payload)


def genetics_answer(fields: dict[str, Any]) -> dict[str, Any]:
    """The genetics lab's answer fields from the solver's model (ploidy, split, viability, size, color, shell)."""
    ploidy = int(fields["ploidy"])
    copies = GAMETE_COPIES[fields["gamete_split"]]
    every = sorted({a + b for a in copies for b in copies})
    viable = [ploidy] if fields["viability_rule"] == "triploid_only" else every
    order = list(fields["color_order"])
    if fields["color_dominance"] == "complete":
        intensity = f"intensity[[c for c in {order!r} if counts[c]][0]]"
    else:
        intensity = f"sum(intensity[c] * counts[c] for c in counts) / {ploidy}"
    a, b, c = fields["shell_order"]
    beats = {a: [b], b: [c], c: [a]} if fields["shell_relation"] == "cyclic" else {a: [b, c], b: [c], c: []}
    lethal = sorted(fields["lethal_set"])
    return {
        "ploidy": ploidy,
        "gamete_copies": copies,
        "viable_zygote_copies": viable,
        "size_values": list(fields["size_values"]),
        "size_rule": "sum(values)" if fields["size_model"] == "additive" else "max(values)",
        "color_order": order,
        "color_intensity": intensity,
        "shell_beats": beats,
        "lethal_combinations": [lethal] if lethal else [],
    }
