"""Page builder of the Cuttlefish demo (arXiv 2602.02780): ``docs/results/cuttlefish.md`` + ``cuttlefish.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=cuttlefish`` (``conf/demo/cuttlefish.yaml``: connector arm x
learning-rate grid point x seed); page: ``python -m zoo.report demo cuttlefish``. Everything on the page is read from
the sweep: the per-row records of the held-out evaluation (``eval_records.jsonl``: answer, completion, correct, kind,
atoms, structure tokens), ``encoder_probe/*`` (callback), the training logs (``train/loss``, ``train/patches/*``: k_g
against size), ``run_info.json`` (wall time) and the resolved configs.

The page opens with the Verdict (:mod:`zoo.verdict`): Cuttlefish's claims (more accurate than a fixed-length query
connector, in distribution and on larger structures; a token count that grows with the structure; the Geometry Grounding
Adapter adds to patching) as differences paired by seed (the arms of a seed share the frozen encoder, the training data
and the held-out questions), followed by the Fair-test section. Each arm's learning rate is chosen per seed on the
*other* seeds' held-out accuracy (:func:`tune`), so no reported number chose its own setting.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from zoo.data.structures import SIZE_BIN_LABELS, normalize_answer
from zoo.report import (
    RATE_KEY,
    GridChoice,
    Run,
    Sweep,
    build_seconds,
    choose_per_seed,
    contrast,
    curve,
    decaying_schedule_caveat,
    group_runs,
    last_change,
    legend,
    lr_order,
    plot_curves,
    provenance,
    pyplot,
    save_figure,
    split_by_length,
    table,
    write_page,
)
from zoo.stats import (
    Stat,
    fmt_stat,
    paired,
    stat,
)
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "cuttlefish"
RECORDS = "eval_records.jsonl"
REGIONS = ("in", "out")
REGION_NAMES = {"in": "in distribution", "out": "extrapolation"}
# the fraction of the logged training curve whose loss change tells whether training plateaued
TAIL = 0.2
# a run is at a plateau when its loss (the held-out loss where it validated during training, else the training loss)
# fell by less than this share over the last TAIL of training
PLATEAU = 0.05
# the held-out (teacher-forced) loss of each validation: the plateau curve of runs that validated during training
HELD_OUT_LOSS = "val/loss"
# accuracy differences below this call for 5 seeds
SMALL_EFFECT = 0.05
ARM_KEY = "demo/cuttlefish/arm"
LR_KEY = "demo.lr"
# the held-out accuracy (every question of the run) a seed's learning rate is chosen on, over the other seeds
SELECTION = "val/exact_match"


def arm_of(run: Run) -> str:
    return run.arm.get(ARM_KEY) or run.group_choice(ARM_KEY) or run.name


def point_of(run: Run) -> str:
    """The run's point of the demo's learning-rate grid (``demo.lr``; ``-`` in a sweep without one)."""
    return str(run.arm.get(LR_KEY) or run.get(LR_KEY) or "-")


@dataclass
class Tuning:
    """Each arm's reported run per seed and how it was chosen.

    Attributes:
        choices: ``{arm: its grid's runs, each seed's chosen point and the run reported for it}``.
        grid: ``{point: learning rate}`` of the grid's runs (their ``module.optimizer.lr``, lowest first).
        tuning_steps: the training steps of the grid's runs.
        retrained: the training steps of the reported runs when they retrain the chosen point for longer than the
            grid's runs (``None``: the reported runs are the grid's own).
        unused: longer runs left out because they do not retrain every reported run (same effort for every arm).
    """

    choices: dict[str, GridChoice[Run]]
    grid: dict[str, float]
    tuning_steps: int | None = None
    retrained: int | None = None
    unused: int = 0

    @property
    def reported(self) -> dict[str, list[Run]]:
        """``{arm: [run per seed]}`` at the chosen grid point (seeds in order)."""
        return {arm: list(c.reported.values()) for arm, c in self.choices.items()}

    @property
    def scores(self) -> dict[str, dict[str, dict[Any, float]]]:
        """``{arm: {point: {seed: held-out accuracy}}}`` of every grid run."""
        return {arm: c.scores for arm, c in self.choices.items()}

    @property
    def chosen(self) -> dict[str, dict[Any, str]]:
        """``{arm: {seed: point}}``."""
        return {arm: c.chosen for arm, c in self.choices.items()}

    @property
    def held_out(self) -> bool:
        """Every choice was made without the seed it is reported for."""
        return all(c.held_out for c in self.choices.values())


def first_reported(arms: dict[str, list[Run]]) -> Run:
    """The first reported run (for the settings every reported run shares)."""
    return next(r for runs in arms.values() for r in runs)


def tune(sweep: Sweep) -> Tuning:
    """Per arm and seed, the grid point with the best mean held-out accuracy (:data:`SELECTION`) on the other seeds,
    over the finished runs (leave one seed out; the seeds vary the structures, so the other seeds' held-out questions
    are other questions); with one point, that point; with one seed, the grid's first point (flagged: not chosen
    without the seed).

    The grid is the runs with the fewest training steps. Runs with more steps retrain a chosen point (same arm, grid
    point and seed) for longer; they are reported in place of the grid's runs only when they retrain *every*
    reported run, at one length (every arm the same effort), and are otherwise left out (counted in ``unused``)."""
    done = [r for r in sweep.runs if r.finished]  # an unfinished run has no held-out evaluation yet
    finished, longer, tuning_steps = split_by_length(done, attrgetter("max_steps"))
    # the grid points that ran (every launch's: a later launch may have added one), lowest learning rate first: the
    # rate each point's runs trained with
    lrs = {point_of(r): float(r.get(RATE_KEY)) for r in finished if r.get(RATE_KEY) is not None}
    grid = dict(sorted(lrs.items(), key=lambda kv: kv[1]))
    choices = {
        arm: choose_per_seed(by_point, lambda r: r.last(SELECTION), order=lr_order(by_point))
        for arm, by_point in group_runs(finished, arm_of=arm_of, point_of=point_of).items()
    }
    # the longest length at which longer runs retrain every arm's every reported run
    complete = [
        set(
            c.retrain_lengths(
                [r for r in longer if arm_of(r) == arm], point_of=point_of, length_of=attrgetter("max_steps")
            )
        )
        for arm, c in choices.items()
    ]
    retrained = max(set.intersection(*complete), default=None) if complete else None
    if retrained is not None:
        choices = {
            arm: c.retrain(
                [r for r in longer if arm_of(r) == arm],
                point_of=point_of,
                length_of=attrgetter("max_steps"),
                length=retrained,
            )
            for arm, c in choices.items()
        }
    unused = sum(r.max_steps != retrained for r in longer)
    return Tuning(choices, grid, tuning_steps, retrained, unused)


def tuning_table(t: Tuning, labels: dict[str, str]) -> str:
    """Per arm: each grid point's learning rate and mean held-out accuracy over every seed, and the points chosen."""
    rows = []
    for arm, by_point in t.scores.items():
        picks = Counter(t.chosen[arm].values())
        rows.append(
            [
                labels.get(arm, arm),
                "; ".join(
                    f"{p} ({t.grid[p]:g}): {stat(v.values()).mean:.3f}"
                    if p in t.grid
                    else f"{p}: {stat(v.values()).mean:.3f}"
                    for p, v in by_point.items()
                ),
                ", ".join(f"{p} x{n}" for p, n in picks.items()),
            ]
        )
    return table(["arm", "grid point (lr): held-out accuracy, mean over seeds", "chosen (seeds)"], rows)


def records(run: Run) -> list[dict[str, Any]]:
    """The held-out evaluation's per-row records (the last evaluation of the run)."""
    if not run.file(RECORDS).is_file():
        return []
    rows = run.read_jsonl(RECORDS)
    last = max((r["step"] for r in rows), default=0)
    return [r for r in rows if r["step"] == last]


def mean(xs: Any) -> float:
    xs = [float(x) for x in xs]
    return sum(xs) / len(xs) if xs else float("nan")


def train_max_atoms(run: Run) -> int:
    """The largest training structure (``datamodule.source.task.max_atoms``): larger held-out ones extrapolate."""
    return int(run.get("demo.train_max_atoms", run.get("datamodule.source.task.max_atoms", 300)))


def uniform_patches(num_atoms: int, rho: float, k_max: int) -> int:
    """``k_g`` of a uniform gate (eq. P3 on equal logits): ``ceil(rho n)`` clipped to ``[1, min(k_max, n)]``."""
    return max(1, min(math.ceil(rho * num_atoms - 1e-9), k_max, num_atoms))


def summarize(rows: list[dict[str, Any]], limit: int, rho: float | None = None, k_max: int = 0) -> dict[str, Any]:
    """Accuracy overall / by region (in distribution: ``num_atoms <= limit``) / by size bin / by kind and region;
    structure tokens against atoms; ``k / k_uniform`` when the connector has a gate (``rho``)."""
    by_bin, by_kind, answers = defaultdict(list), defaultdict(list), defaultdict(set)
    by_region = defaultdict(list)
    for r in rows:
        region = "in" if r["num_atoms"] <= limit else "out"
        by_bin[r["size_bins"]].append(r["correct"])
        by_region[region].append(r["correct"])
        by_kind[(r["kinds"], region)].append(r["correct"])
        answers[r["kinds"]].add(normalize_answer(r["completion"]))
    tokens = [(r["num_atoms"], r["num_tokens"]) for r in rows]
    ratio = {}
    if rho is not None:
        for region in REGIONS:
            pairs = [(n, k) for n, k in tokens if (n <= limit) == (region == "in")]
            ratio[region] = mean(k / uniform_patches(n, rho, k_max) for n, k in pairs)
    return {
        "limit": limit,
        "acc": mean(r["correct"] for r in rows),
        "region": {g: mean(by_region[g]) for g in REGIONS},
        "region_n": {g: len(by_region[g]) for g in REGIONS},
        "by_bin": {b: mean(by_bin[b]) for b in SIZE_BIN_LABELS},
        "bin_n": {b: len(by_bin[b]) for b in SIZE_BIN_LABELS},
        "by_kind": {k: mean(v) for k, v in by_kind.items()},
        "kinds": sorted({r["kinds"] for r in rows}),
        "tokens": tokens,
        "tokens_by_bin": {
            b: mean(k for (n, k), r in zip(tokens, rows) if r["size_bins"] == b) for b in SIZE_BIN_LABELS
        },
        "one_token": mean(k == 1 for _, k in tokens),
        "k_vs_uniform": ratio,
        "distinct": {k: len(v) for k, v in sorted(answers.items())},
    }


def majority(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """Accuracy of answering each kind with its most frequent answer *on these rows* (an upper bound on a prior
    learned from the training answers)."""
    kinds = {r["kinds"] for r in rows}
    prior = {k: Counter(str(r["answer"]).lower() for r in rows if r["kinds"] == k).most_common(1)[0][0] for k in kinds}
    answered = [
        {**r, "completion": prior[r["kinds"]], "correct": str(r["answer"]).lower() == prior[r["kinds"]]} for r in rows
    ]
    return summarize(answered, limit)


def loss_change(run: Run, tail: float = TAIL) -> float:
    """Relative change of the training loss over the last ``tail`` of the logged curve: mean of the last fifth vs
    the fifth before it (near 0: a plateau; negative: still falling)."""
    losses = [v for _, v in run.series("train/loss")]
    m = max(1, int(len(losses) * tail))
    if len(losses) < 2 * m:
        return float("nan")
    before, last = mean(losses[-2 * m : -m]), mean(losses[-m:])
    return (last - before) / before if before else float("nan")


def heldout_change(run: Run) -> float:
    """Relative change of the held-out loss (:data:`HELD_OUT_LOSS`) over the last validation interval
    (:func:`last_change`; the last 20% of training at ``trainer.val_check_interval`` 200 of 1000 steps); ``nan`` for
    a run that validated only at the end."""
    return last_change([v for _, v in run.series(HELD_OUT_LOSS)])


@dataclass(frozen=True)
class Plateau:
    """Each arm's loss change at the end of training (mean over seeds) on one curve.

    Attributes:
        curve: ``"held-out"`` when every reported run validated during training (:func:`heldout_change`, over the
            last validation interval), else ``"training"`` (:func:`loss_change`, over the last :data:`TAIL`: a falling
            training loss may be memorisation).
        changes: ``{arm: change over seeds}``.
    """

    curve: str
    changes: dict[str, Stat]

    @classmethod
    def of(cls, arms: dict[str, list[Run]]) -> Plateau:
        held_out = {n: stat(heldout_change(r) for r in runs) for n, runs in arms.items()}
        if held_out and all(c.n == len(arms[n]) for n, c in held_out.items()):
            return cls("held-out", held_out)
        return cls("training", {n: stat(loss_change(r) for r in runs) for n, runs in arms.items()})

    @property
    def falling(self) -> list[str]:
        """The arms whose loss still falls by more than :data:`PLATEAU`."""
        return [n for n, c in self.changes.items() if c.n and c.mean < -PLATEAU]

    @property
    def missing(self) -> list[str]:
        return [n for n, c in self.changes.items() if not c.n]


def built_prerequisites(run: Run) -> dict[str, float]:
    """``{kind/name: build seconds}`` of the prerequisites this run built (:meth:`~zoo.report.Run.artifacts` with
    ``built_now``; :func:`~zoo.report.build_seconds`, those whose build record is gone left out)."""
    built = {f"{u.get('kind')}/{u.get('name')}": build_seconds(u) for u in run.artifacts() if u.get("built_now")}
    return {key: seconds for key, seconds in built.items() if not math.isnan(seconds)}


def run_seconds(run: Run) -> float:
    """Wall seconds of the run without the prerequisites it built."""
    return float(run.info.get("wall_seconds", "nan")) - sum(built_prerequisites(run).values())


def first_value(run: Run, metric: str) -> float:
    series = run.series(metric)
    return series[0][1] if series else float("nan")


def edge_note(t: Tuning, labels: dict[str, str]) -> str:
    """The arms whose chosen point is the lowest or highest learning rate of a grid of three or more
    (:meth:`GridChoice.on_edge`: the best point may lie beyond the grid); with two points nothing is said."""
    if len(t.grid) < 3:
        return ""
    found = []
    for arm, choice in t.choices.items():
        picks = Counter(choice.on_edge().values())
        if picks:
            found.append(f"{labels.get(arm, arm)} ({', '.join(f'{p} x{n}' for p, n in picks.items())})")
    if not found:
        return "No choice falls on an edge of the grid."
    return "Choices on an edge of the grid (the best point may lie beyond it): " + "; ".join(found) + "."


def build(sweep: Sweep, out: Path) -> list[Path]:
    tuning = tune(sweep)
    arms = tuning.reported
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    limit = train_max_atoms(first)

    def rho_of(run: Run) -> float | None:
        rho = run.get("module.connector.rho")
        return float(rho) if rho is not None else None

    sums = {
        name: [summarize(records(r), limit, rho_of(r), int(r.get("module.connector.k_max", 0) or 0)) for r in runs]
        for name, runs in arms.items()
    }
    ref_rows = records(arms[next(iter(arms))][0])
    maj = majority(ref_rows, limit) if ref_rows else None

    def lab(name: str) -> str:
        return labels.get(name, name)

    def per_seed(name: str, key: str, sub: Any = None) -> list[float]:
        return [s[key][sub] if sub is not None else s[key] for s in sums.get(name, [])]

    def cell(name: str, key: str, sub: Any = None, ci: bool = False) -> str:
        return fmt_stat(stat(per_seed(name, key, sub)), ci=ci)

    ref = sums[next(iter(sums))][0] if sums else None
    bins = [b for b in SIZE_BIN_LABELS if ref and ref["bin_n"][b]]
    kinds = ref["kinds"] if ref else []

    # -- accuracy by region and size bin
    size_rows = [["n", ref["region_n"]["in"], ref["region_n"]["out"], *(ref["bin_n"][b] for b in bins)]] if ref else []
    if maj:
        size_rows.append(
            [
                "majority answer per kind (no structure)",
                *(f"{maj['region'][g]:.3f}" for g in REGIONS),
                *(f"{maj['by_bin'][b]:.3f}" for b in bins),
            ]
        )
    for name in arms:
        size_rows.append(
            [lab(name), *(cell(name, "region", g, ci=True) for g in REGIONS), *(cell(name, "by_bin", b) for b in bins)]
        )

    # -- accuracy by kind and region, with the probe of the pooled encoder features
    kind_header = [f"{k} ({REGION_NAMES[g]})" for k in kinds for g in REGIONS]
    kind_rows = []
    if maj:
        kind_rows.append(
            [
                "majority answer per kind",
                *(f"{maj['by_kind'].get((k, g), math.nan):.3f}" for k in kinds for g in REGIONS),
            ]
        )
    for name in arms:
        kind_rows.append([lab(name), *(cell(name, "by_kind", (k, g)) for k in kinds for g in REGIONS)])
    probe = {
        k: (
            stat(r.last(f"encoder_probe/{k}_accuracy") for r in sweep.runs),
            stat(r.last(f"encoder_probe/{k}_majority") for r in sweep.runs),
        )
        for k in kinds
    }

    # -- patch counts against size (eval records) and during training (logs)
    patch_rows = []
    for name, runs in arms.items():
        gated = bool(sums[name]) and bool(sums[name][0]["k_vs_uniform"])
        toks = [t for s in sums[name] for _, t in s["tokens"]]
        patch_rows.append(
            [
                lab(name),
                *(f"{stat(s['tokens_by_bin'][b] for s in sums[name]).mean:.1f}" for b in bins),
                f"{min(toks, default=0)}-{max(toks, default=0)}",
                cell(name, "one_token"),
                *((cell(name, "k_vs_uniform", g) for g in REGIONS) if gated else ("-", "-")),
                fmt_stat(stat(first_value(r, "train/patches/k_vs_uniform") for r in runs), ci=False) if gated else "-",
                fmt_stat(stat(r.last("train/patches/gate_entropy") for r in runs), ci=False) if gated else "-",
            ]
        )
    train_rows = []
    validated = Plateau.of(arms).curve == "held-out"
    for name, runs in arms.items():
        distinct = Counter()
        for s in sums[name]:
            distinct.update(s["distinct"])
        train_rows.append(
            [
                lab(name),
                fmt_stat(stat(r.last("train/loss") for r in runs), ci=False),
                fmt_stat(stat(loss_change(r) for r in runs), ci=False),
                *([fmt_stat(stat(heldout_change(r) for r in runs), ci=False)] if validated else []),
                ", ".join(f"{k}: {v / max(len(sums[name]), 1):.1f}" for k, v in sorted(distinct.items())),
                f"{stat(run_seconds(r) for r in runs).mean:.0f}",
            ]
        )

    png = plot(sweep, arms, sums, labels, limit, out / f"{PAPER}.png")
    all_claims = claims(arms, sums, labels)
    seeds = len(sweep.seeds) or 1
    steps = tuning.retrained or tuning.tuning_steps or first.get("trainer.max_steps")
    batch = first.get("datamodule.batch_size")
    task = first.get("datamodule.source.task", {}) or {}
    val_task = {**task, **((first.get("datamodule.source.split_task", {}) or {}).get("val") or {})}
    gated_run = next((r for r in sweep.runs if rho_of(r) is not None), None)
    gate_text = (
        f"patching arms: rho={gated_run.get('module.connector.rho')}, k_max={gated_run.get('module.connector.k_max')}, "
        f"beta={gated_run.get('module.connector.beta')}, tau={gated_run.get('module.connector.tau')}; "
        if gated_run
        else ""
    )
    fusion = next(
        (r.get("module.connector.fusion_dim") for r in sweep.runs if r.get("module.connector.fusion_dim")), "n/a"
    )
    text = [
        "# Cuttlefish demo: scaling-aware patching vs fixed-budget connectors",
        "",
        "Paper: *Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning* (arXiv 2602.02780). Built "
        "through the demo path (`conf/demo/cuttlefish.yaml`, page builder `demos/cuttlefish.py`). Toy scale on CPU: "
        "this page reports what was measured, not the paper's numbers.",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: synthetic all-atom structures (5 elements; `zoo.data.structures`) with 0-{task.get('max_rings')} "
        f"six-membered rings and 0-{task.get('max_triads')} inserted N-P-S triads, drawn uniformly whatever the size; "
        f"question kinds {', '.join(kinds)} (counts, and whether a triad is bonded to a ring). Training: "
        f"{first.get('datamodule.source.num_train')} questions on structures of {task.get('min_atoms')}-"
        f"{task.get('max_atoms')} atoms; held out: {first.get('datamodule.source.num_val')} questions on "
        f"{val_task.get('min_atoms')}-{val_task.get('max_atoms')} atoms (*in distribution*: <= {limit} atoms; "
        f"*extrapolation*: more). Frozen pretrained EGNN (width {first.get('module.encoder.hidden')}, artifact "
        f"cache), standardized atom features, tiny Llama trained with the connector "
        f"(`module.stage={first.get('module.stage')}`), {steps} steps of batch {batch}, "
        f"{lr_text(tuning, first)}; {gate_text}fusion width {fusion} "
        f"(query/GGA arms); greedy decoding, exact verifier (first word). {seeds} seed{'s' if seeds != 1 else ''}; "
        "cells: mean ± sd over seeds (region columns: with the 95% interval).",
        "",
        *fair_test(sweep, tuning, sums, labels, maj, all_claims),
        *(
            [
                "## Learning rate chosen per arm (leave one seed out)",
                "",
                "Every arm ran every point of the grid at every seed; a seed's reported run is the point with the "
                f"best mean held-out accuracy (`{SELECTION}`) on the *other* seeds (other structures and questions). "
                "The accuracy columns below are means over every seed, shown for reference." + retrain_text(tuning),
                "",
                tuning_table(tuning, labels),
                edge_note(tuning, labels),
                "",
            ]
            if len(tuning.grid) > 1
            else []
        ),
        "## Accuracy by structure size (held-out)",
        "",
        table(["arm", *(REGION_NAMES[g] for g in REGIONS), *bins], size_rows),
        "## Accuracy by question kind",
        "",
        table(["arm", *kind_header], kind_rows),
        "## Structure tokens against size (k_g) and the gate",
        "",
        table(
            [
                "arm",
                *(f"tokens {b}" for b in bins),
                "tokens min-max",
                "share with 1 token",
                f"k / ceil(rho n) ({REGION_NAMES['in']})",
                f"k / ceil(rho n) ({REGION_NAMES['out']})",
                "k / ceil(rho n) at the first training log",
                "gate entropy H(p)/log n at the end",
            ],
            patch_rows,
        ),
        "k / ceil(rho n) = 1 is what a uniform gate gives (the most tokens eq. P3 allows); near 0: collapsed to a few "
        "patches whatever the size. Training values are batch means of `train/patches/*`.",
        "",
        "## Training",
        "",
        table(
            [
                "arm",
                "final train loss",
                f"loss change over the last {TAIL:.0%} of training",
                *(["held-out loss change over the last validation interval"] if validated else []),
                "distinct answers per kind",
                "run s",
            ],
            train_rows,
        ),
        "run s: wall seconds of a run (training and evaluation; `run_info.json`) on the machine of the header, mean "
        "over seeds, without the prerequisites it built: "
        + (", ".join(f"{k} {v:.0f} s" for r in sweep.runs for k, v in built_prerequisites(r).items()) or "none")
        + ".",
        "",
        f"![accuracy by size, tokens per structure, k_g during training, training loss]({png.name})",
        "",
        "## Reading",
        "",
        *reading(arms, sums, labels, maj, probe, limit),
        "",
    ]
    verdict = verdict_section(all_claims, cannot_test(arms, labels)) if all_claims else None
    return [write_page(out, PAPER, text, verdict), png]


def reading(
    arms: dict[str, list[Run]],
    sums: dict[str, list[dict]],
    labels: dict[str, str],
    maj: dict | None,
    probe: dict,
    limit: int,
) -> list[str]:
    """Sentences filled from the numbers."""

    def lab(name: str) -> str:
        return labels.get(name, name)

    def region(name: str, g: str) -> list[float]:
        return [s["region"][g] for s in sums.get(name, [])]

    notes = [
        "- Linear probe of the frozen encoder's pooled (mean + max over all atoms) features, fitted on half of the "
        "held-out questions of a kind and scored on the other half: "
        + "; ".join(f"{k} {fmt_stat(p, ci=False)} (majority {fmt_stat(m, ci=False)})" for k, (p, m) in probe.items())
        + ". A size-independent summary of the structure holds about this much."
    ]
    if maj:
        notes.append(
            f"- Answering each kind with its most frequent held-out answer gives {maj['region']['in']:.3f} in "
            f"distribution and {maj['region']['out']:.3f} on larger structures."
        )
    for name in arms:
        notes.append(
            f"- {lab(name)}: {stat(region(name, 'in')).mean:.3f} on structures up to {limit} atoms vs "
            f"{stat(region(name, 'out')).mean:.3f} beyond (extrapolation)."
        )
    pairs = [
        ("cuttlefish", "query"),
        ("cuttlefish", "mean_pool"),
        ("patching", "mean_pool"),
        ("cuttlefish", "patching"),
    ]
    for a, b in pairs:
        if a in arms and b in arms:
            for g in REGIONS:
                notes.append(
                    f"- {REGION_NAMES[g].capitalize()}: "
                    + contrast(lab(a), region(a, g), lab(b), region(b, g), "accuracy")
                    + "."
                )
    # the patch-count collapse: is it the straight-through gate gradient?
    if "cuttlefish" in arms and "cuttlefish_paper_grad" in arms:
        for g in REGIONS:
            a = [s["k_vs_uniform"][g] for s in sums["cuttlefish"]]
            b = [s["k_vs_uniform"][g] for s in sums["cuttlefish_paper_grad"]]
            notes.append(
                f"- Patch-count collapse ({REGION_NAMES[g]}): "
                + contrast(lab("cuttlefish"), a, lab("cuttlefish_paper_grad"), b, "k / ceil(rho n)")
                + "."
            )
        for name in ("cuttlefish", "cuttlefish_paper_grad"):
            start = stat(first_value(r, "train/patches/k_vs_uniform") for r in arms[name]).mean
            end = stat(r.last("train/patches/k_vs_uniform") for r in arms[name]).mean
            one = stat(s["one_token"] for s in sums[name]).mean
            notes.append(
                f"- {lab(name)}: k / ceil(rho n) goes from {start:.3f} at the first training log to {end:.3f} at the "
                f"last; {one:.3f} of the held-out structures get a single token."
            )
        for g in REGIONS:
            notes.append(
                f"- Accuracy ({REGION_NAMES[g]}), straight-through gate gradient: "
                + contrast(
                    lab("cuttlefish"),
                    region("cuttlefish", g),
                    lab("cuttlefish_paper_grad"),
                    region("cuttlefish_paper_grad", g),
                    "accuracy",
                )
                + "."
            )
    if "cuttlefish" in arms and "cuttlefish_uniform" in arms:
        for g in REGIONS:
            notes.append(
                f"- Learned vs uniform gate ({REGION_NAMES[g]}): "
                + contrast(
                    lab("cuttlefish"),
                    region("cuttlefish", g),
                    lab("cuttlefish_uniform"),
                    region("cuttlefish_uniform", g),
                    "accuracy",
                )
                + "."
            )
    plateau = Plateau.of(arms)
    span = "its last validation interval" if plateau.curve == "held-out" else f"the last {TAIL:.0%} of training"
    if plateau.falling:
        notes.append(
            f"- {plateau.curve.capitalize()} loss still fell by more than {100 * PLATEAU:.0f}% over {span} for: "
            + ", ".join(lab(n) for n in plateau.falling)
            + " (not at a plateau)."
        )
    else:
        notes.append(f"- No arm's {plateau.curve} loss fell by more than {100 * PLATEAU:.0f}% over {span} (plateau).")
    collapsed = [n for n in arms if all(all(v == 1 for v in s["distinct"].values()) for s in sums[n])]
    if collapsed:
        notes.append(
            f"- {', '.join(lab(n) for n in collapsed)}: one answer per question kind in every seed, an answer prior "
            "rather than a reading of the structure."
        )
    return notes


def plot(
    sweep: Sweep,
    arms: dict[str, list[Run]],
    sums: dict[str, list[dict]],
    labels: dict[str, str],
    limit: int,
    path: Path,
) -> Path:
    """Accuracy by size bin (mean, 95% CI over seeds), structure tokens against atoms, k / ceil(rho n) and the
    training loss over the steps (mean over seeds with its band)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    bins = [b for b in SIZE_BIN_LABELS if any(s["bin_n"][b] for ss in sums.values() for s in ss)]
    for name in arms:
        stats = [stat(s["by_bin"][b] for s in sums[name]) for b in bins]
        lo = [s.mean - s.lo if s.n > 1 else 0 for s in stats]
        hi = [s.hi - s.mean if s.n > 1 else 0 for s in stats]
        axes[0, 0].errorbar(
            bins, [s.mean for s in stats], yerr=[lo, hi], marker="o", capsize=3, label=labels.get(name, name)
        )
        atoms, toks = zip(*[t for s in sums[name] for t in s["tokens"]]) if sums[name] else ((), ())
        axes[0, 1].scatter(atoms, toks, s=6, alpha=0.5, label=labels.get(name, name))
    axes[0, 1].axvline(limit, color="grey", linestyle="--", linewidth=1)
    axes[0, 0].set(xlabel="structure size (atoms)", ylabel="accuracy", title="Held-out accuracy by size")
    axes[0, 1].set(xlabel="atoms", ylabel="structure tokens", title=f"Tokens per structure (dashed: {limit} atoms)")
    gated = {labels.get(n, n): curve(runs, "train/patches/k_vs_uniform") for n, runs in arms.items()}
    plot_curves(axes[1, 0], {k: c for k, c in gated.items() if c.steps})
    axes[1, 0].set(xlabel="step", ylabel="k / ceil(rho n)", title="Patch count vs a uniform gate (training batches)")
    plot_curves(axes[1, 1], {labels.get(n, n): curve(runs, "train/loss") for n, runs in arms.items()}, smooth=4)
    axes[1, 1].set(xlabel="step", ylabel="loss", title="Training loss", yscale="log")
    for ax in (axes[0, 0], axes[1, 0], axes[1, 1]):
        legend(ax, fontsize=7)
    return save_figure(fig, path)


# -- the verdict ---------------------------------------------------------------------------------------------------
def by_seed(arms: dict[str, list[Run]], sums: dict[str, list[dict]], name: str, fn: Any) -> dict[Any, float]:
    """``{seed: fn(summary)}`` of an arm's runs."""
    out = {}
    for run, summary in zip(arms.get(name, []), sums.get(name, [])):
        value = fn(summary)
        if value == value:
            out[run.seed] = value
    return out


def token_growth(summary: dict[str, Any]) -> float:
    """Mean structure tokens on the extrapolation questions minus on the in-distribution ones (one run)."""
    toks, limit = summary["tokens"], summary["limit"]
    return mean(k for n, k in toks if n > limit) - mean(k for n, k in toks if n <= limit)


def claims(arms: dict[str, list[Run]], sums: dict[str, list[dict]], labels: dict[str, str]) -> list[Claim]:
    """Cuttlefish's claims (abstract: fixed-length connectors "compress" structures of any size into the same
    budget; Scaling-Aware Patching lets the token budget "scale with structural complexity" and the Geometry Grounding
    Adapter grounds the tokens in the geometry; Cuttlefish outperforms the baselines, most on large structures) as
    this demo tests them, each paired by seed."""

    def lab(name: str) -> str:
        return labels.get(name, name)

    def acc(name: str, g: str) -> dict[Any, float]:
        return by_seed(arms, sums, name, lambda s: s["region"][g])

    found: list[Claim] = []
    if "cuttlefish" in arms and "query" in arms:
        for g in REGIONS:
            found.append(
                Claim(
                    f"Cuttlefish is more accurate than a fixed-length query connector ({REGION_NAMES[g]})",
                    f"held-out accuracy ({REGION_NAMES[g]}), {lab('cuttlefish')} − {lab('query')}, paired by seed",
                    paired(acc("cuttlefish", g), acc("query", g)),
                    "higher",
                )
            )
    if "cuttlefish" in arms and "mean_pool" in arms:
        found.append(
            Claim(
                "on larger structures than trained on, a token budget that grows with the structure beats a "
                "size-independent summary",
                f"held-out accuracy (extrapolation), {lab('cuttlefish')} − {lab('mean_pool')}, paired by seed",
                paired(acc("cuttlefish", "out"), acc("mean_pool", "out")),
                "higher",
            )
        )
    if "cuttlefish_uniform" in arms and "mean_pool" in arms:
        # the budget alone: the control whose gate cannot collapse gives every structure the most tokens eq. P3 allows
        found.append(
            Claim(
                "on larger structures than trained on, a token budget that grows with the structure beats a "
                "size-independent summary (the budget alone: a gate that cannot collapse)",
                f"held-out accuracy (extrapolation), {lab('cuttlefish_uniform')} − {lab('mean_pool')}, paired by seed",
                paired(acc("cuttlefish_uniform", "out"), acc("mean_pool", "out")),
                "higher",
            )
        )
    if "cuttlefish" in arms:
        found.append(
            Claim(
                "the number of structure tokens grows with the structure (Scaling-Aware Patching)",
                f"{lab('cuttlefish')}: mean structure tokens, extrapolation − in distribution (per seed)",
                stat(by_seed(arms, sums, "cuttlefish", token_growth).values()),
                "higher",
            )
        )
    if "cuttlefish" in arms and "patching" in arms:
        for g in REGIONS:
            found.append(
                Claim(
                    f"the Geometry Grounding Adapter adds to patching alone ({REGION_NAMES[g]})",
                    f"held-out accuracy ({REGION_NAMES[g]}), {lab('cuttlefish')} − {lab('patching')}, paired by seed",
                    paired(acc("cuttlefish", g), acc("patching", g)),
                    "higher",
                )
            )
    return found


def cannot_test(arms: dict[str, list[Run]], labels: dict[str, str]) -> str:
    return (
        "the paper's scale and benchmarks (Llama-3.1-8B and Qwen3-8B; molecules, proteins, DNA and RNA of up to 30k "
        "atoms; GEO-AT, Mol-Instructions, RNA-QA, DNA-Chat; METEOR and the hallucination rate); its three-stage "
        "training (encoder pretraining, alignment with a frozen LLM, LoRA adaptation; here one stage trains the tiny "
        "LLM with the connector, the encoder frozen); the Q-Former baselines it names (the query connector here is a "
        "small cross-attention with 8 learned queries); real chemistry (the structures are synthetic, 5 elements)."
    )


def lr_text(t: Tuning, first: Run) -> str:
    """The learning rate(s) of the setup sentence."""
    if len(t.grid) > 1:
        grid_steps = f" at {t.tuning_steps} steps" if t.retrained else ""
        return (
            "learning rate from the grid "
            + ", ".join(f"{p} {v:g}" for p, v in t.grid.items())
            + f" (every arm the same grid{grid_steps}; chosen per seed on the other seeds)"
        )
    return f"lr {first.get('module.optimizer.lr')}"


def retrain_text(t: Tuning) -> str:
    """The sentence on the reported runs when they retrain the chosen points for longer (and on longer runs left
    out); empty when the reported runs are the grid's own."""
    text = ""
    if t.retrained:
        text += (
            f" The grid's runs train {t.tuning_steps} steps; each arm's chosen point is then retrained at every seed "
            f"for {t.retrained} steps (same data, seed and learning rate), and those runs are the ones reported."
        )
    if t.unused:
        text += f" {t.unused} longer runs are left out: they do not retrain every reported run at one length."
    return text


def fair_test(
    sweep: Sweep,
    tuning: Tuning,
    sums: dict[str, list[dict]],
    labels: dict[str, str],
    maj: dict | None,
    all_claims: list[Claim],
) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    arms = tuning.reported

    def lab(name: str) -> str:
        return labels.get(name, name)

    def acc(name: str, g: str) -> dict[Any, float]:
        return by_seed(arms, sums, name, lambda s: s["region"][g])

    first = sweep.runs[0]
    lines = ["## Fair test", ""]
    fixed = "query" if "query" in arms else ("mean_pool" if "mean_pool" in arms else None)
    if fixed:
        drop = paired(acc(fixed, "in"), acc(fixed, "out"))
        occurs = drop.n > 1 and drop.lo > 0
        above = stat(acc(fixed, "in").values())
        floor = f"; the answer prior (most frequent answer per kind) gives {maj['region']['in']:.3f}" if maj else ""
        lines.append(
            f"- **The baseline's failure can occur.** A fixed budget should lose accuracy on structures larger than "
            f"those it was trained on: {lab(fixed)}, accuracy in distribution − extrapolation, paired by seed, "
            f"{fmt_stat(drop)}: "
            + ("the failure occurs: met." if occurs else "it does not fall measurably here: **not met**.")
            + f" Its accuracy in distribution is {fmt_stat(above, ci=False)}{floor}."
        )
    if "cuttlefish" in arms:
        one = stat(s["one_token"] for s in sums["cuttlefish"])
        growth = stat(by_seed(arms, sums, "cuttlefish", token_growth).values())
        grows = growth.n > 1 and growth.lo > 0 and one.mean < 0.5
        lines.append(
            "- **The method's signal carries information the baseline lacks.** Only if the learned gate gives large "
            f"structures more tokens: {lab('cuttlefish')} gives {fmt_stat(one, ci=False)} of the held-out structures "
            f"a single token, and {fmt_stat(growth)} more tokens on average beyond {train_max_atoms(first)} atoms "
            "than up to it: "
            + (
                "met."
                if grows
                else "**not met** (the gate collapses towards one patch, so its tokens carry no more than a "
                "fixed budget would)."
            )
        )
    knobs = (
        "the patching knobs are the official code's but k_max (the tiny LLM's context) and tau (the paper's formula, "
        "1, for the code's 0.1; `conf/module/structure_lm/connector/cuttlefish.yaml`)"
    )
    grid_steps = tuning.tuning_steps or first.get("trainer.max_steps")
    steps = f"{grid_steps} steps of batch {first.get('datamodule.batch_size')}"
    sizes = {len(by_point) for by_point in tuning.scores.values()}
    if len(tuning.grid) > 1:
        lines.append(
            f"- **Same tuning effort for every arm.** Every arm ran the same {len(tuning.grid)}-point learning-rate "
            f"grid ({', '.join(f'{v:g}' for v in tuning.grid.values())}) for {steps} on the same frozen encoder, "
            "and every arm's point is chosen by the same rule (the table below)"
            + (f", then retrained for {tuning.retrained} steps at every seed" if tuning.retrained else "")
            + "; "
            + knobs
            + (": met." if sizes == {len(tuning.grid)} else ": **not met** (some arm lacks a grid point).")
        )
        lines.append(
            f"- **Chosen on a split that is not reported.** Leave one seed out: a seed's reported run is the grid "
            f"point with the best held-out accuracy on the *other* seeds' {first.get('datamodule.source.num_val')} "
            "questions (the seeds vary the structures), never on the questions it reports; nothing else is chosen "
            "(no threshold, no checkpoint): "
            + ("met." if tuning.held_out else "**not met** (one seed only: its own questions chose its point).")
        )
    else:
        lines.append(
            "- **Same tuning effort for every arm.** None is tuned: every arm trains the same tiny LLM on the same "
            f"frozen encoder for {steps} at lr {first.get('module.optimizer.lr')}; {knobs}: met."
        )
        lines.append(
            f"- **Chosen on a split that is not reported.** The page reports {first.get('datamodule.source.num_val')} "
            "held-out questions per run and chooses nothing on them (no threshold, no checkpoint, no arm): met."
        )
    plateau = Plateau.of(arms)
    falling, missing = plateau.falling, plateau.missing
    if plateau.curve == "held-out":
        every = first_reported(arms).get("trainer.val_check_interval")
        measure = (
            f"Held-out-loss change (`{HELD_OUT_LOSS}`; the reported runs validated every {every} steps) over the last "
            "validation interval, mean over seeds: "
        )
        source = " (a rising held-out loss is past its best, not still learning)"
    else:
        measure = f"Training-loss change over the last {TAIL:.0%} of training (mean over seeds): "
        source = " (validation runs once, at the end, so the curve is the training loss)"
    lines.append(
        "- **Models trained to a plateau.** "
        + measure
        + "; ".join(f"{lab(n)} {100 * c.mean:+.1f}%" for n, c in plateau.changes.items() if c.n)
        + f"{source}; a plateau is no arm falling by more than {100 * PLATEAU:.0f}%: "
        f"**{'met' if not falling and not missing else 'not met'}**"
        + (f" (still falling: {', '.join(lab(n) for n in falling)})" if falling else "")
        + (f" (no curve: {', '.join(lab(n) for n in missing)})" if missing else "")
        + "."
        + decaying_schedule_caveat(
            [r for runs in arms.values() for r in runs],
            None,
            "validation interval" if plateau.curve == "held-out" else f"{TAIL:.0%} of training",
            relative=PLATEAU,
            whose="Every arm's",
        )
    )
    seeds = len(sweep.seeds)
    lines.append(
        f"- **Seeds.** {seeds} seeds ({', '.join(map(str, sweep.seeds))}): each varies the data, the connector and the "
        "LLM (one frozen encoder for the sweep); "
        f"{seeds_note(all_claims, seeds, SMALL_EFFECT)}"
        + ("" if seeds >= 3 else "; fewer than 3 seeds: **not met**")
        + "."
    )
    return [*lines, ""]
