"""Page builder of the MemEvolve demo (arXiv 2512.18746): ``docs/results/memevolve.md`` + ``memevolve.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=memevolve`` (``conf/demo/memevolve.yaml``: selection mode x search x
seed, where search is ``evolve`` (every module, as released) or ``top_k`` (the "tune top_k only" control: the same
loop and candidate budget, only top_k varied)); page: ``python -m zoo.report demo memevolve``. Read from each run
directory: ``evolution/rounds.jsonl`` (every round's diagnosis, candidates, tournament and finals results, Pareto
ranks, winner, the change it made and the base on the finals stream), ``comparison.json`` (no memory, the baselines,
the initial and the evolved system on fresh tasks and on held-out families) and the resolved config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.memory.memevolve import dominates
from zoo.report import (
    Run,
    Sweep,
    legend,
    paired_contrast,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import (
    fmt_stat,
    paired,
    stat,
)
from zoo.verdict import Claim, verdict_section

PAPER = "memevolve"
SELECTION = "module.selection"
SEARCH = "demo/memevolve/search"
SEARCHES = ("evolve", "top_k")
MARGIN = 0.05  # the smallest success difference a claim counts (2 of the 40 comparison tasks)
ROUNDS = "evolution/rounds.jsonl"
COMPARISON = "comparison.json"
FIXED = ("no_memory",)
PARTS = (("in_distribution", "fresh tasks of the evolution families"), ("transfer", "held-out families"))
LAST = ("initial", "evolved")


def rounds(run: Run) -> list[dict[str, Any]]:
    return run.read_jsonl(ROUNDS) if run.file(ROUNDS).is_file() else []


def comparison(run: Run) -> dict[str, Any]:
    return run.read_json(COMPARISON) if run.file(COMPARISON).is_file() else {}


def by_seed(runs: list[Run], part: str, system: str, key: str) -> dict[int, float]:
    out = {}
    for r in runs:
        result = comparison(r).get(part, {}).get(system)
        if result is not None and result.get("ok", True):
            out[r.seed] = float(result[key])
    return out


Arm = tuple[str, str]  # (selection mode, search)


def search_of(run: Run) -> str:
    """``evolve`` or ``top_k`` (the control): the swept group option, else read from the designer's module list."""
    choice = run.arm.get(SEARCH) or run.group_choice(SEARCH)
    if choice:
        return str(choice)
    return "top_k" if list(run.get("module.design_modules") or []) == ["top_k"] else "evolve"


def arm_of(run: Run) -> Arm:
    return (str(run.arm.get(SELECTION, run.get(SELECTION))), search_of(run))


def entry(rec: dict[str, Any], part: str, name: str) -> dict[str, Any]:
    return next(x for x in rec[part] if x["name"] == name)


def contribution(rec: dict[str, Any]) -> dict[str, float] | None:
    """What a round's winner changed relative to the base it replaced, in success (``new``: on the x new finals tasks,
    which neither was selected on; ``tournament``: on the round's x tournament tasks, which picked the winner) and in
    tokens per task on the finals stream; zeros when the base was kept, ``None`` when the round logged no reference."""
    if rec["winner"]["name"] == "base":
        return {"new": 0.0, "tournament": 0.0, "tokens": 0.0}
    reference = rec.get("base_finals")
    if not reference or not reference.get("ok") or "scores" not in reference:
        return None
    win = entry(rec, "finals", rec["winner"]["name"])
    y = len(rec["tasks"]["finals"]) - len(rec["tasks"]["tournament"])
    new_win, new_base = win["scores"][y:], reference["scores"][y:]
    return {
        "new": sum(new_win) / len(new_win) - sum(new_base) / len(new_base),
        "tournament": entry(rec, "tournament", rec["winner"]["name"])["success"]
        - entry(rec, "tournament", "base")["success"],
        "tokens": float(win["tokens"]) - float(reference["tokens"]),
    }


def moved(rec: dict[str, Any]) -> str:
    """The module the round's designer move changed (``top_k``, ``retrieve``, ...; ``kept`` when the base stayed)."""
    origin = str(rec.get("change", {}).get("origin") or "kept")
    return origin.split(":", 1)[1] if origin.startswith("rule:") else origin


def change_text(rec: dict[str, Any]) -> str:
    """``top_k 3 → 5, alpha 0.5 → 0.3`` from the logged change (``kept the base`` when nothing changed)."""
    fields = rec.get("change", {}).get("modules") or []
    if not fields:
        return "kept the base"
    old, new = rec["base"].get("genotype") or {}, rec["winner"].get("genotype") or {}
    return ", ".join(f"{f} {_value(old.get(f))} → {_value(new.get(f))}" for f in fields)


def _value(value: Any) -> str:
    return (
        "+".join(map(str, value))
        if isinstance(value, list)
        else f"{value:g}"
        if isinstance(value, float)
        else str(value)
    )


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}

    def lab(name: str) -> str:
        return labels.get(name, name)

    found = list(dict.fromkeys(arm_of(r) for r in sweep.runs))
    selections = list(dict.fromkeys(a[0] for a in found))
    arms = [(sel, search) for sel in selections for search in SEARCHES if (sel, search) in found]
    runs_of = {arm: [r for r in sweep.runs if arm_of(r) == arm] for arm in arms}

    def arm_label(arm: Arm) -> str:
        return f"{lab(arm[1])}, {lab(arm[0])}"

    def final(arm: Arm) -> str:
        """The name of an arm's final system: the evolved one, or the control's tuned top_k."""
        return lab("evolved") if arm[1] == "evolve" else lab("tuned")

    systems = list(comparison(first).get("in_distribution", {}))
    baselines = [s for s in systems if s not in FIXED + LAST]
    env, transfer = first.get("module.env", {}), first.get("module.transfer_env", {}) or {}
    designed = {arm: stat(sum(len(rec["candidates"]) for rec in rounds(r)) for r in runs_of[arm]) for arm in arms}

    # -- per round ------------------------------------------------------------------------------------------------
    round_sections: list[str] = []
    for arm in arms:
        rows = []
        n_rounds = max((len(rounds(r)) for r in runs_of[arm]), default=0)
        for k in range(n_rounds):
            recs = [rounds(r)[k] for r in runs_of[arm] if len(rounds(r)) > k]
            base = [entry(rec, "tournament", "base") for rec in recs]
            winners = [entry(rec, "finals", rec["finals_order"][0]) for rec in recs if rec["finals_order"]]
            valid = [sum(x["ok"] for x in rec["tournament"]) - 1 for rec in recs]
            rows.append(
                [
                    k,
                    fmt_stat(stat(b["success"] for b in base), ci=False),
                    fmt_stat(stat(b["tokens"] for b in base), 1, ci=False),
                    fmt_stat(stat(max(x["success"] for x in rec["tournament"] if x["ok"]) for rec in recs), ci=False),
                    fmt_stat(stat(w["success"] for w in winners), ci=False),
                    fmt_stat(stat(w["tokens"] for w in winners), 1, ci=False),
                    fmt_stat(stat(_wall(rec) for rec in recs), 1, ci=False),
                    f"{sum(valid)}/{sum(len(rec['candidates']) for rec in recs)}",
                    ", ".join(sorted({rec["diagnosis"]["worst"] for rec in recs})),
                    sum(rec["winner"]["name"] != "base" for rec in recs),
                ]
            )
        round_sections += [
            f"### {arm_label(arm)}",
            "",
            table(
                [
                    "round",
                    "base success (tournament)",
                    "base tokens/task",
                    "best entrant success (tournament)",
                    "winner success (finals)",
                    "winner tokens/task (finals)",
                    "wall s (tournament + finals)",
                    "valid candidates",
                    "diagnosed worst module",
                    "seeds where a candidate won",
                ],
                rows,
            ),
            "",
        ]
        path = [
            f"- seed {r.seed}: "
            + " → ".join([rounds(r)[0]["base"]["system"], *(rec["winner"]["system"] for rec in rounds(r))])
            for r in runs_of[arm]
            if rounds(r)
        ]
        round_sections += ["Evolution path per seed (initial → winner of each round):", "", *path, ""]

    # -- what each round changed and what it contributed ---------------------------------------------------------
    change_rows, module_rows = [], []
    for arm in arms:
        by_module: dict[str, list[dict[str, float]]] = {}
        for r in runs_of[arm]:
            for rec in rounds(r):
                c = contribution(rec)
                change_rows.append(
                    [
                        arm_label(arm),
                        r.seed,
                        rec["round"],
                        change_text(rec),
                        "n/a" if c is None else f"{c['tournament']:+.3f}",
                        "n/a" if c is None else f"{c['new']:+.3f}",
                        "n/a" if c is None else f"{c['tokens']:+.1f}",
                    ]
                )
                if c is not None and moved(rec) != "kept":
                    by_module.setdefault(moved(rec), []).append(c)
        total_rounds = sum(len(rounds(r)) for r in runs_of[arm])
        for module, cs in sorted(by_module.items()):
            module_rows.append(
                [
                    arm_label(arm),
                    module,
                    f"{len(cs)} of {total_rounds}",
                    f"{stat(c['tournament'] for c in cs).mean:+.3f}",
                    f"{stat(c['new'] for c in cs).mean:+.3f}",
                    f"{sum(c['new'] for c in cs) / max(len(runs_of[arm]), 1):+.3f}",
                ]
            )

    # -- Pareto fronts ------------------------------------------------------------------------------------------------
    front_rows = []
    for arm in arms:
        if arm[1] != "evolve":
            continue
        for r in runs_of[arm]:
            for rec in rounds(r):
                ranks = rec.get("pareto_ranks", {})
                front = [x for x in rec["tournament"] if x["ok"] and ranks.get(x["name"]) == 0]
                dominated = any(
                    dominates(_point(a), _point(b)) for a in front for b in front if a is not b
                )  # recomputed from the saved numbers; must be False
                front_rows.append(
                    [
                        lab(arm[0]),
                        r.seed,
                        rec["round"],
                        "; ".join(f"{x['system']} ({x['success']:.2f}, {x['tokens']:.0f} tok)" for x in front),
                        "yes" if dominated else "no",
                    ]
                )

    # -- comparison ---------------------------------------------------------------------------------------------------
    def cell(arm_runs: list[Run], part: str, system: str, key: str, digits: int = 3) -> str:
        values = list(by_seed(arm_runs, part, system, key).values())
        return fmt_stat(stat(values), digits) if values else "n/a"

    ref = runs_of[arms[0]]
    compare_rows = []
    for system in [*FIXED, *baselines, "initial"]:
        compare_rows.append(
            [
                lab(system),
                cell(ref, "in_distribution", system, "success"),
                cell(ref, "in_distribution", system, "tokens", 1),
                cell(ref, "transfer", system, "success"),
                cell(ref, "transfer", system, "tokens", 1),
            ]
        )
    for arm in arms:
        compare_rows.append(
            [
                f"{final(arm)}: {arm_label(arm)}",
                cell(runs_of[arm], "in_distribution", "evolved", "success"),
                cell(runs_of[arm], "in_distribution", "evolved", "tokens", 1),
                cell(runs_of[arm], "transfer", "evolved", "success"),
                cell(runs_of[arm], "transfer", "evolved", "tokens", 1),
            ]
        )

    best = best_baseline(ref, baselines)
    contrasts = []
    for arm in arms:
        arm_runs = runs_of[arm]
        control = runs_of.get((arm[0], "top_k")) if arm[1] == "evolve" else None
        for part, where in PARTS:
            evolved = by_seed(arm_runs, part, "evolved", "success")
            for other in ("initial", "no_memory", best):
                if other is None:
                    continue
                contrasts.append(
                    f"- {arm_label(arm)}, {where}: "
                    + paired_contrast(
                        final(arm), evolved, lab(other), by_seed(arm_runs, part, other, "success"), "Success"
                    )
                    + "."
                )
            tokens = by_seed(arm_runs, part, "evolved", "tokens")
            if control:
                for key, what, digits in (("success", "Success", 3), ("tokens", "Tokens per task", 1)):
                    contrasts.append(
                        f"- {lab(arm[0])}, {where}: "
                        + paired_contrast(
                            lab("evolved"),
                            by_seed(arm_runs, part, "evolved", key),
                            lab("tuned"),
                            by_seed(control, part, "evolved", key),
                            what,
                            digits,
                        )
                        + "."
                    )
            if best is not None:
                contrasts.append(
                    f"- {arm_label(arm)}, {where}: "
                    + paired_contrast(
                        final(arm), tokens, lab(best), by_seed(arm_runs, part, best, "tokens"), "Tokens per task", 1
                    )
                    + "."
                )

    evolved_rows = [
        [arm_label(arm), r.seed, _evolved(r).get("name", ""), _describe(_evolved(r))]
        for arm in arms
        for r in runs_of[arm]
    ]
    png = plot(arms, runs_of, out / f"{PAPER}.png")
    text = [
        "# MemEvolve demo: evolving a memory architecture on ProcWorld with a scripted agent",
        "",
        "Paper: *MemEvolve: Meta-Evolution of Agent Memory Systems* (arXiv 2512.18746), with the EvolveLab design "
        "space. Built through the demo path (`conf/demo/memevolve.yaml`, page builder `demos/memevolve.py`). The "
        "agent is the zoo's scripted ProcWorld memory agent and the designer is the rule-based mutation of the "
        "diagnosed worst module, not the paper's LLM agent and LLM designer: this page tests the outer loop "
        "(diagnose, design, validate, tournament, selection) and the design space, not the paper's numbers.",
        "",
        provenance(sweep, PAPER),
        "",
        "## Setup",
        "",
        f"- World: ProcWorld with {env.get('families')} task families; evolution on families "
        f"{env.get('family_ids')}, transfer on held-out families {transfer.get('family_ids')}. Each family hides a "
        f"{env.get('procedure_length')}-op procedure (from a pool of {env.get('ops_per_family')} ops), a unit quirk "
        f"and a sign quirk that recur in every task of the family; {env.get('required_steps')} steps per task. "
        "Errors never name the right op, so what the agent knows at the start of a task comes only from memory.",
        f"- Loop: {first.get('module.rounds')} rounds; per round the base runs x = {first.get('module.tasks')} "
        f"tasks, m = {first.get('module.candidates')} candidates are designed and validated on "
        f"{first.get('module.smoke_tasks')} smoke tasks, the base and the valid candidates play the same x tasks "
        f"(tournament), the top t = {first.get('module.finalists')} play y = {first.get('module.reused')} of them "
        f"plus x new ones (finals); the winner is the next base. Initial base: "
        f"{_describe(comparison(first).get('initial'))} (Agent-KB, the release's `default_provider`).",
        "- Two searches with the same candidate budget (candidates designed per run, mean over runs: "
        + ", ".join(
            f"{lab(search)} {stat(designed[a].mean for a in arms if a[1] == search).mean:.1f}"
            for search in dict.fromkeys(a[1] for a in arms)
        )
        + f"). {lab('evolve')} lets the designer change every module the diagnosis scores (as released); "
        f"{lab('top_k')} is the control: the same rounds, tournaments, finals and selection, with the designer "
        "allowed to change top_k alone (its moves k+2, 2k, k−1, then the nearest untried values).",
        "- What a change contributed: the base also plays the finals stream (outside selection), so the winner and "
        "the base it replaces are compared on the x new finals tasks, which neither was selected on. The tournament "
        "difference is shown too; it is biased upward (the winner was picked on those tasks).",
        f"- Comparison: every system starts from an empty store and plays the same stream of "
        f"{first.get('module.eval_tasks')} fresh tasks (evolution families) and of the held-out families; "
        f"{len(sweep.seeds)} seeds ({', '.join(map(str, sweep.seeds))}); cells are mean ± sd over seeds [95% CI].",
        "- Success = share of tasks whose procedure was completed. Tokens = injected memory, 4 characters per "
        "token, per task (the token proxy: the scripted agent spends no other tokens). Wall time = seconds of the "
        "evaluations on this shared, loaded 2-core machine.",
        "",
        "## What each round changed and what it contributed",
        "",
        "Per run and round: the change the winner made to the base (`kept the base` when the base won), the "
        "success difference winner − base on the round's tournament tasks (selected on) and on the x new finals "
        "tasks (not selected on), and the token difference on the finals stream.",
        "",
        table(
            [
                "search, selection",
                "seed",
                "round",
                "change adopted",
                "Δ success (tournament)",
                "Δ success (new finals tasks)",
                "Δ tokens/task (finals)",
            ],
            change_rows,
        ),
        "",
        "Adopted changes by the module the designer changed (means over adoptions; the last column sums a run's "
        "adoptions of that module and averages over seeds):",
        "",
        table(
            [
                "search, selection",
                "module changed",
                "adopted (rounds)",
                "mean Δ success (tournament)",
                "mean Δ success (new finals tasks)",
                "sum of Δ per run (new finals tasks)",
            ],
            module_rows,
        ),
        "",
        "## Per round: success, tokens and wall time",
        "",
        *round_sections,
        "## Pareto front of every round (tournament entrants; accuracy up, tokens down, time down)",
        "",
        f"Rank-0 entrants per round with (success, tokens per task), {lab('evolve')} runs (the control's entrants "
        "differ only in top_k); the last column re-checks from the saved numbers that no front member dominates "
        "another (with wall time as the third objective, as released).",
        "",
        table(["selection", "seed", "round", "front", "dominated pair inside"], front_rows),
        "",
        f"![per-round success and tokens, Pareto fronts]({png.name})",
        "",
        "## No memory vs the reproduced baselines vs the evolved system vs tuning top_k only",
        "",
        table(
            [
                "system",
                "success (evolution families)",
                "tokens/task",
                "success (held-out families)",
                "tokens/task (held-out)",
            ],
            compare_rows,
        ),
        "",
        "Baselines and the initial base are the same runs in every arm (same seeds, same tasks); the table shows "
        f"them from the {arm_label(arms[0])} runs. Paired by seed (same task stream):",
        "",
        *contrasts,
        "",
        "Final systems:",
        "",
        table(
            ["search, selection", "seed", "id", "genotype (encode/store/retrieve/manage/top_k/phases)"], evolved_rows
        ),
        "",
        "## Reading",
        "",
        *reading(arms, runs_of, baselines, lab, arm_label),
        "",
    ]
    return [write_page(out, PAPER, text, verdict(arms, runs_of, baselines, lab)), png]


def best_baseline(runs: list[Run], baselines: list[str]) -> str | None:
    """The reproduced baseline with the highest mean success on the evolution families."""
    return max(
        baselines, key=lambda s: stat(by_seed(runs, "in_distribution", s, "success").values()).mean, default=None
    )


def _wall(rec: dict[str, Any]) -> float:
    return sum(x["time"] for x in rec["tournament"] + rec["finals"])


def _evolved(run: Run) -> dict[str, Any]:
    return comparison(run).get("evolved") or {}


def _point(x: dict[str, Any]) -> tuple[float, float, float]:
    return (float(x["success"]), float(x["tokens"]), float(x["time"]))


def _describe(genotype: dict[str, Any] | None) -> str:
    if not genotype:
        return "n/a"
    if "code" in genotype:
        return f"generated code ({genotype.get('name')})"
    from zoo.memory.system import Genotype

    return Genotype.from_config(genotype).describe()


def _main_selection(arms: list[Arm]) -> str:
    """The selection the verdict reads: the released default (lexicographic) when it ran."""
    selections = [a[0] for a in arms]
    return "lexicographic" if "lexicographic" in selections else selections[0]


def verdict(arms: list[Arm], runs_of: dict[Arm, list[Run]], baselines: list[str], lab: Any) -> list[str]:
    """The paper's claims as this demo tests them (arXiv 2512.18746: evolving the memory architecture beats its
    starting system and the hand-designed baselines, and transfers to unseen tasks), plus the control the reading
    needs: does evolution find more than a top_k setting with the same candidate budget? Paired by seed."""
    selection = _main_selection(arms)
    evolve = runs_of.get((selection, "evolve"), [])
    control = runs_of.get((selection, "top_k"), [])
    best = best_baseline(evolve, baselines)

    def effect(runs_a: list[Run], runs_b: list[Run], part: str, system_b: str) -> Any:
        return paired(by_seed(runs_a, part, "evolved", "success"), by_seed(runs_b, part, system_b, "success"))

    where = {"in_distribution": "fresh tasks of the evolution families", "transfer": "held-out families"}
    claims = []
    for part in ("in_distribution", "transfer"):
        claims.append(
            Claim(
                "the evolved memory beats its starting memory (Agent-KB)"
                + (" on unseen task families" if part == "transfer" else ""),
                f"success on {where[part]}, evolved − initial, paired by seed (margin {MARGIN})",
                effect(evolve, evolve, part, "initial"),
                "higher",
                margin=MARGIN,
            )
        )
    if control:
        for part in ("in_distribution", "transfer"):
            claims.append(
                Claim(
                    "evolution finds more than a top_k setting (same candidate budget)",
                    f"success on {where[part]}, evolved − tuned top_k only, paired by seed (margin {MARGIN})",
                    paired(by_seed(evolve, part, "evolved", "success"), by_seed(control, part, "evolved", "success")),
                    "higher",
                    margin=MARGIN,
                )
            )
    if best is not None:
        claims.append(
            Claim(
                "the evolved memory beats the best reproduced baseline",
                f"success on {where['in_distribution']}, evolved − {lab(best)} (the baseline with the highest mean), "
                "paired by seed",
                effect(evolve, evolve, "in_distribution", best),
                "higher",
            )
        )
    return verdict_section(
        claims,
        f"the paper's setting: LLM agents, the LLM analyst and designer writing new provider code, real token costs "
        f"and the paper's benchmarks (TaskCraft, GAIA, WebWalkerQA, xBench). Here a scripted agent on ProcWorld and a "
        f"rule-based designer over a fixed grid of modules; {lab(selection)}, the released default.",
    )


def reading(
    arms: list[Arm], runs_of: dict[Arm, list[Run]], baselines: list[str], lab: Any, arm_label: Any
) -> list[str]:
    """The reading, sentence by sentence from the numbers (``not shown`` where the seeds do not resolve it)."""
    notes = []
    for arm in arms:
        runs = runs_of[arm]
        for part, where in (("in_distribution", "evolution families"), ("transfer", "held-out families")):
            ev = stat(by_seed(runs, part, "evolved", "success").values()).mean
            ini = stat(by_seed(runs, part, "initial", "success").values()).mean
            none = stat(by_seed(runs, part, "no_memory", "success").values()).mean
            ranked = sorted(baselines, key=lambda s: -stat(by_seed(runs, part, s, "success").values()).mean)
            better = [s for s in ranked if stat(by_seed(runs, part, s, "success").values()).mean > ev]
            notes.append(
                f"- {arm_label(arm)}, {where}: final system {ev:.3f} vs initial {ini:.3f} vs no memory {none:.3f}; "
                + (
                    f"baselines with a higher mean success: {', '.join(lab(s) for s in better)}."
                    if better
                    else "no baseline has a higher mean success."
                )
            )
    for arm in arms:
        if arm[1] != "evolve":
            continue
        recs = [rec for r in runs_of[arm] for rec in rounds(r)]
        adopted = [rec for rec in recs if moved(rec) != "kept"]
        contributions = [(moved(rec), contribution(rec)) for rec in adopted]
        top_k = [c["new"] for m, c in contributions if c is not None and m == "top_k"]
        other = [c["new"] for m, c in contributions if c is not None and m != "top_k"]
        ties = sum(abs(c["tournament"]) < 1e-9 for m, c in contributions if c is not None and m != "top_k")
        n = max(len(runs_of[arm]), 1)
        notes.append(
            f"- Where the gain came from ({arm_label(arm)}): {len(adopted)} of {len(recs)} rounds adopted a change; "
            f"{len(top_k)} changed top_k and added {sum(top_k) / n:+.3f} success per run on new finals tasks, the "
            f"other {len(other)} ({', '.join(sorted({m for m, _ in contributions if m != 'top_k'})) or 'none'}) "
            f"added {sum(other) / n:+.3f} per run (sums over a run's rounds, mean over seeds; the table above has "
            f"each round); {ties} of those {len(other)} tied the base's tournament success and won on the selection's "
            "cost terms (tokens, and time under Pareto selection)."
        )
        control = runs_of.get((arm[0], "top_k"))
        if control:
            for part, where in PARTS:
                evolved = by_seed(runs_of[arm], part, "evolved", "success")
                tuned = by_seed(control, part, "evolved", "success")
                gain = paired(evolved, tuned)
                if gain.n >= 2 and gain.lo > MARGIN:
                    conclusion = f"evolution found more than a top_k setting here (above the {MARGIN} margin)"
                elif gain.n >= 2 and gain.lo > 0:
                    conclusion = (
                        f"evolution did better than the control here, but the interval reaches below the {MARGIN} "
                        "margin the verdict uses"
                    )
                elif gain.n >= 2 and gain.hi < 0:
                    conclusion = "tuning top_k alone, with the same candidate budget, did better here"
                else:
                    conclusion = (
                        "the evolved system is not shown to be more than a tuned top_k here, so any gain over the "
                        "initial base is not evidence of an evolved architecture"
                    )
                notes.append(
                    f"- {lab(arm[0])}, {where}: "
                    + paired_contrast(lab("evolved"), evolved, lab("tuned"), tuned, "Success")
                    + f": {conclusion}."
                )
    notes += [
        "- Pareto selection counts measured wall time as an objective (as released), so on a shared machine its "
        "winners can differ between two sweeps of the same code; lexicographic selection is deterministic (the same "
        "seed gives the same evolution). The Pareto tie-break weighs tokens and time at 0.4 in total, so it may "
        "carry forward a cheaper system with lower success (see the evolution paths above).",
        "- What this can show: on a world where memory is the only route to improvement, whether the outer loop "
        "finds, from trajectory statistics alone, module changes that raise success over its starting system, "
        "whether those changes are more than a top_k setting (the control with the same candidate budget), and "
        "whether the final architecture (not its memories: every comparison starts from an empty store) carries over "
        "to families it never saw. The sentences above say where the seeds resolve it and where they do not.",
        "- What it cannot show: anything about LLM agents or the LLM designer (the paper's setting), the size of the "
        "paper's gains, or costs in real tokens. The design space here is the 3 x 3 x 4 x 4 grid with top_k, alpha, "
        "phases, tau and the consolidation period; the paper's designer writes new provider code. Dense retrieval "
        "uses the hashing encoder (character n-grams), which understates semantic retrieval; the ProcWorld queries "
        "name the family, which favours lexical retrieval.",
    ]
    return notes


def plot(arms: list[Arm], runs_of: dict[Arm, list[Run]], path: Path) -> Path:
    """Left: tournament success of the system carried into each round (mean over seeds), one colour per selection
    mode, solid for evolution and dashed for the tune-top_k-only control; right: every tournament entrant of the
    first seed of the first arm as (tokens, success), one colour per round, front members ringed."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))

    def arm_label(arm: Arm) -> str:
        return f"{arm[1]}, {arm[0]}"

    ax = axes[0]
    colours = {sel: f"C{i}" for i, sel in enumerate(dict.fromkeys(a[0] for a in arms))}
    for arm in arms:
        recs = [rounds(r) for r in runs_of[arm]]
        n = max((len(x) for x in recs), default=0)
        base = [stat(rr[k]["tournament"][0]["success"] for rr in recs if len(rr) > k) for k in range(n)]
        control = arm[1] != "evolve"
        ax.plot(
            range(n),
            [s.mean for s in base],
            marker="s" if control else "o",
            ls="--" if control else "-",
            color=colours[arm[0]],
            label=arm_label(arm),
        )
    ax.set(xlabel="round", ylabel="success on the round's tournament tasks", ylim=(0, 1))
    ax.xaxis.get_major_locator().set_params(integer=True)
    legend(ax, fontsize=6, loc="lower right")
    ax = axes[1]
    run0 = runs_of[arms[0]][0]
    cmap = plt.get_cmap("viridis")
    recs = rounds(run0)
    for rec in recs:
        colour = cmap(rec["round"] / max(len(recs) - 1, 1))
        ranks = rec.get("pareto_ranks", {})
        for x in rec["tournament"]:
            if not x["ok"]:
                continue
            front = ranks.get(x["name"]) == 0
            size, edge = (60, "k") if front else (25, "none")
            ax.scatter(x["tokens"], x["success"], color=colour, s=size, edgecolors=edge)
        ax.scatter([], [], color=colour, label=f"round {rec['round']}")
    ax.set(
        xlabel="tokens per task (injected memory)",
        ylabel="success (tournament)",
        title=f"entrants, {arm_label(arms[0])}, seed {run0.seed} (ringed: front)",
    )
    legend(ax, fontsize=7)
    return save_figure(fig, path)
