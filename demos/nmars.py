"""Page builder of the N-MARS demo (ICML 2026 poster 61349): ``docs/results/nmars.md`` + ``nmars.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=nmars`` (``conf/demo/nmars.yaml``: arm x lr grid point x seed);
page: ``python -m zoo.report demo nmars``. Read from the sweep: the last validation of every run as logged by
``callbacks.undo_metrics`` (:class:`zoo.callbacks.UndoMetrics`: ``val/T<t>/exact_match``, ``val/T<t>/undo_rate``,
``val/T<t>/failed_correction_rate``, ``val/deviation_logprob``) and the module (``val/exact_match``, greedy), the
curves the plateau is read from (the SFT arms' per-epoch ``val/loss``, the GRPO arms' ``train/reward``), the
prerequisites each run used (``run_info.json`` artifacts: the base policy's validation curve, the data stage's
``offline/*`` metrics and rows), and the resolved configs.

Each trained arm's grid point is chosen per seed on the *other* seeds' held-out prompts (leave one seed out: the
point with the highest mean resolved exact match at the evaluation temperature there), so no reported number took
part in choosing its own setting.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zoo.encoding import encode_prompt
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    choose_per_seed,
    group_runs,
    legend,
    lr_order,
    provenance,
    pyplot,
    save_figure,
    table,
    val_loss_plateau,
    write_page,
)
from zoo.rl.nmars_attribution import GROUPS, MASKED_SFT_GROUPS, PATHS, Row, deviation_attribution, row_targets
from zoo.stats import Stat, fmt_stat, paired, stat
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "nmars"
ARM_KEY = "demo/nmars/arm"
TUNE_KEY = "demo.tune"
ARMS = ("sft_ref", "sft_plain", "msft", "msft_grpo", "ref_grpo")
UNTRAINED = ("sft_ref",)  # evaluated as built: no setting to choose
GRPO_ARMS = ("msft_grpo", "ref_grpo")
GREEDY = "val/exact_match"
DEVIATION = "val/deviation_logprob"
# a curve (validation loss, training reward) is at a plateau when the mean of its last third differs from the mean of
# its middle third by less than this fraction
PLATEAU = 0.05
# effects below this (exact match, rates) call for 5 seeds
SMALL_EFFECT = 0.05


# -- reading the runs -------------------------------------------------------------------------------------------------
def temperature(run: Run) -> float:
    """The evaluation temperature: the (last) temperature UndoMetrics sampled at."""
    temps = [float(t) for t in run.get("callbacks.undo_metrics.temperatures", []) or []]
    return temps[-1] if temps else math.nan


def metric(t: float, name: str) -> str:
    """``val/T<t>/<name>``, the name UndoMetrics logs under."""
    return f"val/T{t:g}/{name}"


def arm_of(run: Run) -> str:
    return run.arm.get(ARM_KEY) or run.group_choice(ARM_KEY) or run.name


def point_of(run: Run) -> str:
    return str(run.arm.get(TUNE_KEY) or run.get(TUNE_KEY) or "-")


def successful_corrections(run: Run, t: float) -> float:
    """Fraction of generations at temperature ``t`` that used ``<UNDO>`` and whose resolved output is right:
    ``undo_rate * (1 - failed_correction_rate)`` (0 when no generation used ``<UNDO>``)."""
    rate = run.last(metric(t, "undo_rate"))
    if math.isnan(rate):
        return math.nan
    if rate == 0.0:
        return 0.0
    failed = run.last(metric(t, "failed_correction_rate"))
    return math.nan if math.isnan(failed) else rate * (1.0 - failed)


def value(run: Run, name: str, t: float) -> float:
    """A reported quantity of a run: a logged metric name, or ``successful_corrections``."""
    return successful_corrections(run, t) if name == "successful_corrections" else run.last(name)


# -- choosing each arm's grid point (leave one seed out) ---------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """The grid point of one arm for one reported seed, chosen on the other seeds' held-out prompts.

    Attributes:
        point: the chosen point (ties and "no other seed": the first point of the grid).
        scores: ``{point: mean selection metric over the other seeds}`` (empty with a single seed).
    """

    arm: str
    seed: int | None
    point: str
    scores: dict[str, float]


def select(sweep: Sweep, selection_metric: str) -> tuple[dict[str, dict[int | None, Run]], list[Choice]]:
    """Each arm's reported run per seed (its point chosen on the other seeds; ties: the lower learning rate) and the
    choices made."""
    reported: dict[str, dict[int | None, Run]] = {}
    choices: list[Choice] = []
    runs = sorted(sweep.runs, key=lambda r: (r.number, str(r.path)))
    for arm, cells in group_runs(runs, arm_of=arm_of, point_of=point_of).items():
        trained = arm not in UNTRAINED
        choice = choose_per_seed(cells, lambda r: r.last(selection_metric), order=lr_order(cells), tuned=trained)
        reported[arm] = choice.reported
        if trained:
            choices += [
                Choice(arm, seed, point, choice.other_seed_means(seed)) for seed, point in choice.chosen.items()
            ]
    return reported, choices


def grid_order(sweep: Sweep, points: list[str]) -> list[str]:
    """The grid points in the order of the config's ``demo.lrs.sft`` (the selection table's columns), then the
    rest."""
    declared = list((sweep.runs[0].get("demo.lrs.sft", {}) or {}).keys()) if sweep.runs else []
    return [p for p in declared if p in points] + [p for p in points if p not in declared]


def lr_of(sweep: Sweep, arm: str, point: str) -> float:
    family = "grpo" if arm in GRPO_ARMS else "sft"
    return float((sweep.runs[0].get(f"demo.lrs.{family}", {}) or {}).get(point, math.nan))


# -- prerequisites the runs used ---------------------------------------------------------------------------------------
def artifact_path(run: Run, kind: str, name: str | None = None) -> Path | None:
    return next((Path(used.get("path", "")) for used in run.artifacts(kind, name)), None)


def held_out_prompts(run: Run) -> set[str]:
    """The prompts of the data stage's ``val`` rows the run was evaluated on."""
    path = artifact_path(run, "nmars_data", "val")
    rows = path / "export" / "undo_val.jsonl" if path else None
    if rows is None or not rows.is_file():
        return set()
    with rows.open(encoding="utf-8") as f:
        return {json.loads(line)["prompt"] for line in f if line.strip()}


def prompt_overlap(reported: dict[int | None, Run]) -> float:
    """Share of each seed's held-out prompts that also occur among the other seeds' (the choice's) prompts."""
    prompts = {seed: held_out_prompts(run) for seed, run in reported.items()}
    shares = []
    for seed, own in prompts.items():
        others = set().union(*(p for k, p in prompts.items() if k != seed))
        if own and others:
            shares.append(len(own & others) / len(own))
    return stat(shares).mean


def plateau_curve(arm: str) -> str:
    """The curve an arm's plateau is read from: the GRPO arms' training reward, the SFT arms' validation loss (they
    validate after every epoch; their training loss keeps falling as they memorise the training rows)."""
    return "train/reward" if arm in GRPO_ARMS else "val/loss"


def curve_change(run: Run, name: str) -> float:
    """Relative change of a curve: mean of its last third against the mean of its middle third."""
    ys = [y for _, y in run.series(name) if not math.isnan(y)]
    third = len(ys) // 3
    if third < 1:
        return math.nan
    middle, last = ys[third : 2 * third], ys[len(ys) - third :]
    ref = sum(middle) / len(middle)
    return (sum(last) / len(last) - ref) / abs(ref) if ref else math.nan


# -- why the never-trained error tokens move --------------------------------------------------------------------------
GROUP_NAMES = {
    "clean": "rows without a deviation",
    "before": "targets before the first error",
    "undo": "`<UNDO>` targets",
    "after": "corrections and later targets",
    "error": "the error tokens (plain SFT only)",
    "masked_sft": "masked SFT (sum of the first four)",
}
PATH_NAMES = {
    "body": "body",
    "out_out": "output rows",
    "tied": "tied rows",
    "in_in": "input rows",
}


def undo_rows(path: Path, tokenizer: Any) -> tuple[list[Row], int]:
    """The data stage's rows at ``path`` as :class:`~zoo.rl.nmars_attribution.Row` (prompt encoded as the SFT
    datamodule encodes it) and the id of ``<UNDO>`` in them."""
    with path.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    undo_id = int(records[0]["undo_id"])
    rows = [
        row_targets(encode_prompt(tokenizer, r["prompt"]), r["completion_ids"], r["loss_mask"], undo_id)
        for r in records
    ]
    return rows, undo_id


def starting_policy(export: Path, undo_id: int) -> tuple[Any, bool]:
    """The SFT-on-references policy with the ``<UNDO>`` row at the vocabulary mean (as ``+method=nmars_sft`` adds it,
    ``mode: free``) and whether its token rows are tied."""
    model = AutoModelForCausalLM.from_pretrained(export).float()
    rows = model.get_input_embeddings().num_embeddings
    if undo_id >= rows:
        model.resize_token_embeddings(undo_id + 1, mean_resizing=False)
        with torch.no_grad():
            weight = model.get_input_embeddings().weight
            weight[rows:] = weight[:rows].mean(0)
            head = model.get_output_embeddings().weight
            if head is not weight:
                head[rows:] = head[:rows].mean(0)
    return model, model.get_output_embeddings().weight is model.get_input_embeddings().weight


def error_repeats(run: Run) -> tuple[float, float, float]:
    """Of the held-out rows' first error tokens (at reference position ``t``): the share equal to the next reference
    token ``y_{t+1}``, the share found anywhere in ``y_{t+1:}`` -- a token the row trains as a target right after
    the correction -- and that share for a wrong token drawn uniformly from the references' other tokens (chance;
    ``nan`` without the rows)."""
    base, val = artifact_path(run, "base_policy"), artifact_path(run, "nmars_data", "val")
    rows_path = val / "export" / "undo_val.jsonl" if val else None
    if base is None or rows_path is None or not rows_path.is_file():
        return math.nan, math.nan, math.nan
    tokenizer = AutoTokenizer.from_pretrained(base / "export")
    with rows_path.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    references = [list(tokenizer(r["reference"], add_special_tokens=False)["input_ids"]) for r in records]
    alphabet = {token for reference in references for token in reference}
    nxt, later, chance = [], [], []
    for record, reference in zip(records, references):
        if all(record["loss_mask"]):
            continue
        t = record["loss_mask"].index(False)
        error = record["completion_ids"][t]
        rest = reference[t + 1 :]
        nxt.append(float(bool(rest) and rest[0] == error))
        later.append(float(error in rest))
        wrong = sorted(alphabet - set(reference[t : t + 1]))
        if wrong:
            chance.append(sum(w in rest for w in wrong) / len(wrong))
    return stat(nxt).mean, stat(later).mean, stat(chance).mean


def attribution(run: Run) -> dict[str, dict[str, float]] | None:
    """:func:`~zoo.rl.nmars_attribution.deviation_attribution` at the run's SFT-on-references policy on the run's
    training rows, against its held-out rows' error tokens (``None`` when the prerequisites are not on this machine)."""
    base = artifact_path(run, "base_policy")
    train = artifact_path(run, "nmars_data", "train")
    val = artifact_path(run, "nmars_data", "val")
    paths = [
        base / "export" if base else None,
        *(d / "export" / f"undo_{n}.jsonl" if d else None for d, n in ((train, "train"), (val, "val"))),
    ]
    if any(p is None or not p.exists() for p in paths):
        return None
    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    train_rows, undo_id = undo_rows(paths[1], tokenizer)
    val_rows, _ = undo_rows(paths[2], tokenizer)
    model, tied = starting_policy(paths[0], undo_id)
    torch.manual_seed(0)
    return deviation_attribution(model, train_rows, val_rows, tied=tied)


def attribution_section(rows: dict[str, dict[int | None, Run]], labels: dict[str, str], t: float) -> list[str]:
    """The measured answer to "why does masked SFT raise the error tokens it never trains": per seed, the first-order
    attribution at its starting policy, next to the change each SFT arm produced."""
    results = [a for a in (attribution(r) for r in rows.get("sft_ref", {}).values()) if a is not None]
    lines = ["## Why the never-trained error tokens move (measured)", ""]
    if not results:
        return [*lines, "The prerequisites (base policies, rows) are not on this machine: no attribution.", ""]

    def mean(group: str, key: str) -> float:
        return stat(r[group][key] for r in results).mean

    def num(x: float) -> str:
        return f"{x:+.3g}"

    body = [
        [GROUP_NAMES[g], f"{mean(g, 'share'):.3f}", *(num(mean(g, k)) for k in (*PATHS, "sgd", "adam"))]
        for g in (*GROUPS, "masked_sft")
    ]
    observed = effect(rows, "msft", "sft_ref", DEVIATION, t)
    plain = effect(rows, "sft_plain", "sft_ref", DEVIATION, t)
    push = {g: mean(g, "adam") for g in MASKED_SFT_GROUPS}
    top = max(push, key=lambda g: push[g])
    paths = {k: mean("masked_sft", k) for k in PATHS}
    main = max(paths, key=lambda k: paths[k])
    predicted = mean("masked_sft", "adam")
    repeats = [error_repeats(r) for r in rows.get("sft_ref", {}).values()]
    next_share, later_share, chance_share = (stat(r[i] for r in repeats).mean for i in range(3))
    agree = (predicted > 0) == (observed.mean > 0)
    lines += [
        f"D = mean log-prob of the held-out rows' error tokens given their prefix (`{DEVIATION}`). At each seed's "
        "SFT-on-references policy (the start of both SFT arms, `<UNDO>` row at the vocabulary mean), the change of D "
        "per unit step of one step on the masked-SFT objective, split by the trained targets that cause it (rows) "
        "and the parameters it goes through (columns, adding up to the SGD total exactly: body = every weight but the "
        "token rows; output rows = token rows moved as targets and read as outputs, the path by which a token "
        "trained as a target elsewhere becomes likelier here; tied rows = with tied embeddings, rows moved through "
        "one side and read through the other, the shared-parameter path; input rows); Adam: Adam's first "
        f"step, whose direction the runs follow at first (`zoo/rl/nmars_attribution.py`). Means over {len(results)} "
        "seed(s); share: fraction of the masked-SFT targets.",
        "",
        table(
            ["trained targets", "share", *(PATH_NAMES[k] for k in PATHS), "SGD total", "Adam first step"],
            body,
        ),
        "",
        f"- Measured change of D over the whole run: {labels.get('msft', 'msft')} − {labels.get('sft_ref', 'sft_ref')} "
        f"{fmt_stat(observed)}; {labels.get('sft_plain', 'sft_plain')} − {labels.get('sft_ref', 'sft_ref')} "
        f"{fmt_stat(plain)}. The first-order prediction for masked SFT (Adam) is {num(predicted)}: "
        f"{'the same direction as' if agree else 'the opposite direction to'} the measured change.",
        f"- Largest push on the error tokens among the masked-SFT targets (Adam): {GROUP_NAMES[top]} "
        f"({num(push[top])} of {num(predicted)}). Largest SGD path of masked SFT: {PATH_NAMES[main]} "
        f"({num(paths[main])}; body {num(paths['body'])}, output rows {num(paths['out_out'])}, tied rows "
        f"{num(paths['tied'])}, input rows {num(paths['in_in'])}); the tied rows carry "
        f"{paths['tied'] / mean('masked_sft', 'sgd'):.0%} of the SGD total.",
        f"- Reading of the table: the error tokens rise mostly because of {GROUP_NAMES[top]} (Adam), through "
        f"{PATH_NAMES[main]} first; the shared-parameter path (tied rows) carries "
        f"{paths['tied'] / mean('masked_sft', 'sgd'):.0%} of the SGD total"
        + (", so tying is not the cause" if abs(paths["tied"]) < 0.1 * abs(mean("masked_sft", "sgd")) else "")
        + "; the output-row path (every letter is a target at other positions and in other rows) carries "
        f"{paths['out_out'] / mean('masked_sft', 'sgd'):.0%}.",
        f"- Error tokens as targets later in their own rows: of the held-out rows' first error tokens, "
        f"{next_share:.3f} equal the next reference token and {later_share:.3f} occur later in the reference (a "
        f"wrong letter drawn at random: {chance_share:.3f}); where it does, the row trains that very token as a "
        "target after `<UNDO>` and the correction.",
        "",
    ]
    return lines


# -- the verdict -------------------------------------------------------------------------------------------------------
def by_seed(rows: dict[str, dict[int | None, Run]], arm: str, name: str, t: float) -> dict[int | None, float]:
    return {seed: value(run, name, t) for seed, run in rows.get(arm, {}).items()}


def effect(rows: dict[str, dict[int | None, Run]], a: str, b: str, name: str, t: float) -> Stat:
    """Per-seed differences ``a - b`` (runs of one seed share the base policy, the rows and the prompts)."""
    return paired(by_seed(rows, a, name, t), by_seed(rows, b, name, t))


def claims(rows: dict[str, dict[int | None, Run]], labels: dict[str, str], t: float) -> list[Claim]:
    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    sc, em = "successful_corrections", metric(t, "exact_match")
    corrections = f"share of generations at T = {t:g} that emit <UNDO> and end right"
    return [
        Claim(
            "Undo mechanism: masked SFT teaches the model to take back its own errors",
            f"{corrections}, {lab('msft')} − {lab('sft_ref')}, paired by seed",
            effect(rows, "msft", "sft_ref", sc, t),
            "higher",
        ),
        Claim(
            "Undo mechanism after GRPO: the policy corrects itself",
            f"{corrections}, {lab('msft_grpo')} − {lab('ref_grpo')}, paired by seed",
            effect(rows, "msft_grpo", "ref_grpo", sc, t),
            "higher",
        ),
        Claim(
            "Accuracy: masked SFT on self-deviation rows improves on SFT on references",
            f"resolved exact match at T = {t:g}, {lab('msft')} − {lab('sft_ref')}, paired by seed",
            effect(rows, "msft", "sft_ref", em, t),
            "higher",
        ),
        Claim(
            "Accuracy: masking the error tokens beats training on them",
            f"resolved exact match at T = {t:g}, {lab('msft')} − {lab('sft_plain')}, paired by seed",
            effect(rows, "msft", "sft_plain", em, t),
            "higher",
        ),
        Claim(
            "Safety gap: masked SFT leaves error tokens less likely than plain SFT",
            f"mean log-prob of held-out error tokens, {lab('msft')} − {lab('sft_plain')}, paired by seed (nats)",
            effect(rows, "msft", "sft_plain", DEVIATION, t),
            "lower",
        ),
        Claim(
            "Accuracy: masked SFT + GRPO beats the same GRPO from SFT on references",
            f"resolved exact match at T = {t:g}, {lab('msft_grpo')} − {lab('ref_grpo')}, paired by seed",
            effect(rows, "msft_grpo", "ref_grpo", em, t),
            "higher",
        ),
    ]


CANNOT_TEST = (
    "the paper's models (1B-8B) and benchmarks (GSM8K, MATH, MBPP) and its numbers; errors that are hard to detect "
    "(a reversal error is visible in the prompt); more than one round of self-deviation data; the paper's exact "
    "reward and data recipe (no arXiv release: both are reconstructed from the abstract and the authors' "
    "work-in-progress code)."
)


# -- the page ----------------------------------------------------------------------------------------------------------
def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels: dict[str, str] = first.get("demo.labels", {}) or {}
    t = temperature(first)
    em = metric(t, "exact_match")
    rows, choices = select(sweep, em)
    order = [a for a in ARMS if a in rows] + [a for a in rows if a not in ARMS]
    all_claims = claims(rows, labels, t)
    png = plot(order, rows, labels, t, out / f"{PAPER}.png")
    text = [
        "# N-MARS demo: an <UNDO> token learned from the policy's own deviations",
        "",
        "Paper: *N-MARS: Non-Monotonic AutoRegressive Sequence modeling* (ICML 2026 poster 61349; no arXiv release, "
        "the method is reconstructed from the abstract and the authors' work-in-progress repository, see "
        "`docs/methods/nmars_sft.md`). Built through the demo path (`conf/demo/nmars.yaml`, page builder "
        "`demos/nmars.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        *mechanism_summary(all_claims, rows, t),
        *setup_text(sweep, rows, t),
        *fair_test(sweep, rows, choices, all_claims, t),
        "## Grid points chosen (leave one seed out)",
        "",
        "Each trained arm ran every point of its grid; for each seed the page reports the point with the highest "
        f"mean resolved exact match at T = {t:g} on the *other* seeds' held-out prompts (ties and a single seed: the "
        "first point). Mean over the other seeds per point; the chosen point in bold.",
        "",
        selection_table(sweep, choices, labels),
        "",
        "## Resolved exact match on held-out prompts",
        "",
        table(
            ["arm", "greedy", f"T = {t:g}"],
            [[labels.get(a, a), cell(rows, a, GREEDY, t), cell(rows, a, em, t)] for a in order],
        ),
        "",
        "## Use of `<UNDO>` and the safety gap",
        "",
        "Undo rate: fraction of generations with at least one `<UNDO>`. Failed correction: among generations with an "
        "`<UNDO>`, the fraction whose resolved output is still wrong. Successful corrections: fraction of all "
        "generations that used `<UNDO>` and ended right. Deviation log-prob: mean log-probability of the held-out "
        "rows' error tokens given their prefix (the tokens masked SFT never trains; n/a for the GRPO arms, whose "
        "evaluation batches are prompts only).",
        "",
        table(
            [
                "arm",
                f"undo rate T = {t:g}",
                f"failed correction T = {t:g}",
                "successful corrections",
                "deviation log-prob",
            ],
            [
                [
                    labels.get(a, a),
                    cell(rows, a, metric(t, "undo_rate"), t, ci=False),
                    cell(rows, a, metric(t, "failed_correction_rate"), t, ci=False),
                    cell(rows, a, "successful_corrections", t),
                    cell(rows, a, DEVIATION, t),
                ]
                for a in order
            ],
        ),
        "",
        *reading(rows, labels, t),
        *attribution_section(rows, labels, t),
        "Mean wall time per run (seconds, this machine, shared and loaded; includes building the prerequisites the "
        "first run of a seed needed):",
        "",
        table(
            ["arm", "seconds"],
            [
                [labels.get(a, a), f"{stat(float(r.info.get('wall_seconds', 'nan')) for r in runs).mean:.0f}"]
                for a, runs in sweep_arms(sweep, order).items()
            ],
        ),
        "",
        f"![exact match and undo use]({png.name})",
        "",
    ]
    return [write_page(out, PAPER, text, verdict_section(all_claims, CANNOT_TEST)), png]


def sweep_arms(sweep: Sweep, order: list[str]) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {a: [] for a in order}
    for run in sweep.runs:
        runs.setdefault(arm_of(run), []).append(run)
    return runs


def cell(rows: dict[str, dict[int | None, Run]], arm: str, name: str, t: float, ci: bool = True) -> str:
    s = stat(value(r, name, t) for r in rows.get(arm, {}).values())
    return "n/a" if s.n == 0 else fmt_stat(s, ci=ci)


def mechanism_summary(all_claims: list[Claim], rows: dict[str, dict[int | None, Run]], t: float) -> list[str]:
    """Whether the undo mechanism was shown, apart from accuracy, in two sentences from the verdict."""
    mechanism = [c for c in all_claims if c.claim.startswith("Undo mechanism")]
    accuracy = [c for c in all_claims if c.claim.startswith("Accuracy")]
    shown = [c for c in mechanism if c.verdict == "shown"]
    undo = {a: stat(r.last(metric(t, "undo_rate")) for r in rows.get(a, {}).values()).mean for a in rows}
    failed = {a: stat(r.last(metric(t, "failed_correction_rate")) for r in rows.get(a, {}).values()) for a in rows}
    return [
        f"**Undo mechanism: {'shown' if shown else 'not shown'}** ({len(shown)} of {len(mechanism)} mechanism claims "
        f"shown; mean undo rate at T = {t:g}: "
        + ", ".join(f"{a} {v:.3f}" for a, v in undo.items() if not math.isnan(v))
        + "; of the generations that used `<UNDO>`, the share still wrong: "
        + (", ".join(f"{a} {s.mean:.3f}" for a, s in failed.items() if s.n) or "none used it")
        + "). **Accuracy, separately:** "
        + "; ".join(f"{c.claim.removeprefix('Accuracy: ')}: {c.verdict} ({c.effect_text()})" for c in accuracy)
        + ".",
        "",
    ]


def setup_text(sweep: Sweep, rows: dict[str, dict[int | None, Run]], t: float) -> list[str]:
    first = sweep.runs[0]
    demo = first.get("demo", {}) or {}
    data = demo.get("data", {}) or {}
    base = demo.get("base", {}) or {}
    n_rows = artifact_values(sweep.runs, "nmars_data", "offline/rows", "train")
    deviating = artifact_values(sweep.runs, "nmars_data", "offline/nonzero_num_undos", "train")
    undos = artifact_values(sweep.runs, "nmars_data", "offline/mean_num_undos", "train")
    seeds = len(sweep.seeds) or 1
    return [
        "## Setup",
        "",
        f"Task `{str(first.get('task._target_', '?')).rsplit('.', 1)[-1]}` (lengths "
        f"{first.get('task.min_length')}-{first.get('task.max_length')} over `{first.get('task.alphabet')}`), tiny "
        f"Llama ({first.get('backbone.hidden_size')} hidden, {first.get('backbone.num_hidden_layers')} layers, tied "
        f"embeddings: {first.get('backbone.tie_word_embeddings')}). SFT on references = the cached base SFT policy "
        f"of each seed ({base.get('num_train')} examples x {base.get('max_epochs')} epochs). Its samples at "
        f"temperature 1.2 on {data.get('num_train')} training prompts, aligned with the references (difflib, autojunk "
        "off) and augmented with one `<UNDO>` per deviating token plus the correction, are the training rows of the "
        f"SFT arms ({demo.get('sft_epochs')} epochs). Both GRPO arms run {demo.get('grpo_steps')} GRPO steps with "
        "undo-aware rollouts and the N-MARS reward (module/grpo/rewards=nmars): masked SFT + GRPO from the "
        "masked-SFT policy (the nmars_sft recipe at its own lr), SFT on references + GRPO (the control) from the base "
        "policy with the `<UNDO>` row added and never trained. Every arm is evaluated at its end (the SFT arms also "
        "after each epoch, for the plateau reading; the reported numbers are the last validation) on the same "
        f"{data.get('num_val')} held-out prompts, greedy and sampled at T = {t:g}, with undo-aware decoding "
        f"(physical sequence kept in context, output = resolved sequence, at most "
        f"{first.get('module.decoder.max_undos')} UNDOs), max {first.get('module.generation.max_new_tokens')} new "
        f"tokens; {seeds} seed{'s' if seeds != 1 else ''}. Cells: mean ± sd over seeds [95% confidence interval, "
        "Student t].",
        "",
        "Training rows (the data stage on the training prompts, one run per seed): "
        + (
            f"{fmt_stat(stat(n_rows), 0, ci=False)} rows, a fraction {fmt_stat(stat(deviating), ci=False)} of the "
            f"samples deviate from the reference, {fmt_stat(stat(undos), 2, ci=False)} `<UNDO>` per row."
            if n_rows
            else "no data-stage metrics recorded."
        ),
        "",
    ]


def fair_test(
    sweep: Sweep,
    rows: dict[str, dict[int | None, Run]],
    choices: list[Choice],
    all_claims: list[Claim],
    t: float,
) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    em = metric(t, "exact_match")
    base = rows.get("sft_ref", {})
    error = stat(1.0 - r.last(em) for r in base.values())
    greedy_error = stat(1.0 - r.last(GREEDY) for r in base.values())
    deviating = artifact_values(sweep.runs, "nmars_data", "offline/nonzero_num_undos", "train")
    undos = artifact_values(sweep.runs, "nmars_data", "offline/mean_num_undos", "train")
    first = sweep.runs[0]
    sft_grid = first.get("demo.lrs.sft", {}) or {}
    grpo_grid = first.get("demo.lrs.grpo", {}) or {}
    trained = sorted({c.arm for c in choices})
    sizes = sorted({len({point_of(r) for r in sweep.runs if arm_of(r) == a}) for a in trained})
    overlap = prompt_overlap(base)
    base_last, base_change = val_loss_plateau(base.values())
    plateau_parts = [
        f"base policies: validation loss {fmt_stat(base_last, ci=False)}, change over the "
        f"last epoch {percent(base_change.mean)} (**{'met' if abs(base_change.mean) < PLATEAU else 'not met'}**;"
        " by design: a base at its plateau makes almost no errors to undo)"
    ]
    for arm in [a for a in ARMS if a in rows and a not in UNTRAINED]:
        name = plateau_curve(arm)
        change = stat(curve_change(r, name) for r in rows[arm].values())
        met = "met" if not math.isnan(change.mean) and abs(change.mean) < PLATEAU else "not met"
        plateau_parts.append(f"{arm}: {name} last third vs middle third {percent(change.mean)} (**{met}**)")
    seeds = len(sweep.seeds)
    note = seeds_note(all_claims, seeds, SMALL_EFFECT)
    return [
        "## Fair test",
        "",
        "- **The baseline's failure can occur.** The SFT-on-references policy errs at the evaluation temperature: "
        f"resolved error rate at T = {t:g} {fmt_stat(error)} (greedy {fmt_stat(greedy_error, ci=False)}); its samples "
        f"at the data temperature deviate from the reference in {fmt_stat(stat(deviating), ci=False)} of the "
        f"training prompts ({fmt_stat(stat(undos), 2, ci=False)} `<UNDO>` per row). There are errors to take back.",
        "- **The method's signal carries information the baseline lacks.** Masked SFT sees the policy's own errors "
        "followed by `<UNDO>` and the correction; SFT on references never sees an error. The GRPO control gets the "
        "same rollouts, reward (which pays for corrections) and steps, but no demonstration of `<UNDO>`, so masked "
        "SFT + GRPO minus the control is what the demonstrations add.",
        f"- **Same tuning effort for every arm.** Each trained arm has a grid of {'/'.join(map(str, sizes))} "
        f"learning rates (SFT arms: {', '.join(f'{k} {v:g}' for k, v in sft_grid.items())}; GRPO arms: "
        f"{', '.join(f'{k} {v:g}' for k, v in grpo_grid.items())}); SFT on references trains nothing. The masked-SFT "
        "stage under masked SFT + GRPO keeps the recipe's lr, as the control's starting policy keeps the base.",
        "- **Chosen on a split that is not reported.** Leave one seed out: a seed's reported run is the point that "
        "scored best on the other seeds' held-out prompts (drawn with other seeds; other base policies and rows). "
        f"Share of a seed's held-out prompts that also occur among the other seeds' prompts: "
        f"{'n/a' if math.isnan(overlap) else f'{overlap:.3f}'} (short strings over 6 letters repeat).",
        "- **Models trained to a plateau.** " + "; ".join(plateau_parts) + ".",
        f"- **Seeds.** {seeds} seed{'s' if seeds != 1 else ''} (base policy, rows, prompts and sampling noise vary "
        f"together); {note}.",
        "",
    ]


def percent(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:+.1f}%"


def selection_table(sweep: Sweep, choices: list[Choice], labels: dict[str, str]) -> str:
    points = grid_order(sweep, sorted({point_of(r) for r in sweep.runs if arm_of(r) not in UNTRAINED}))
    body = []
    for c in choices:
        row = [labels.get(c.arm, c.arm), str(c.seed)]
        for p in points:
            score = c.scores.get(p, math.nan)
            text = "n/a" if math.isnan(score) else f"{score:.3f}"
            row.append(f"**{text}**" if p == c.point else text)
        row.append(f"{c.point} ({lr_of(sweep, c.arm, c.point):g})")
        body.append(row)
    return table(["arm", "reported seed", *(f"{p} (other seeds)" for p in points), "chosen (lr)"], body)


def reading(rows: dict[str, dict[int | None, Run]], labels: dict[str, str], t: float) -> list[str]:
    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    def diff(a: str, b: str, name: str) -> str:
        s = effect(rows, a, b, name, t)
        per = by_seed(rows, a, name, t)
        ref = by_seed(rows, b, name, t)
        values = ", ".join(f"{per[k] - ref[k]:+.3f}" for k in per if k in ref)
        return f"per seed {values}; mean {fmt_stat(s)}" if s.n else "no paired seeds"

    return [
        "## Reading",
        "",
        f"- Deviation log-prob, {lab('msft')} − {lab('sft_ref')} (what masked SFT did to the error tokens it never "
        f"trains): {diff('msft', 'sft_ref', DEVIATION)}.",
        f"- Deviation log-prob, {lab('sft_plain')} − {lab('sft_ref')} (the same rows with the error tokens trained): "
        f"{diff('sft_plain', 'sft_ref', DEVIATION)}.",
        f"- Resolved exact match at T = {t:g}, {lab('ref_grpo')} − {lab('sft_ref')} (what GRPO alone does): "
        f"{diff('ref_grpo', 'sft_ref', metric(t, 'exact_match'))}.",
        f"- Resolved exact match at T = {t:g}, {lab('msft_grpo')} − {lab('msft')} (what GRPO adds after masked "
        f"SFT): {diff('msft_grpo', 'msft', metric(t, 'exact_match'))}.",
        "",
    ]


def plot(
    order: list[str], rows: dict[str, dict[int | None, Run]], labels: dict[str, str], t: float, path: Path
) -> Path:
    """Bars per arm, mean ± sd over seeds: resolved exact match (greedy, T), undo rate and successful corrections."""
    plt = pyplot()
    fig, (ax_em, ax_undo) = plt.subplots(1, 2, figsize=(12, 4))
    panels = (
        (ax_em, [("greedy", GREEDY), (f"T = {t:g}", metric(t, "exact_match"))], "resolved exact match"),
        (
            ax_undo,
            [(f"undo rate T = {t:g}", metric(t, "undo_rate")), ("successful corrections", "successful_corrections")],
            "use of <UNDO>",
        ),
    )
    for ax, series, title in panels:
        width = 0.8 / len(series)
        for j, (label, name) in enumerate(series):
            stats = [stat(value(r, name, t) for r in rows.get(a, {}).values()) for a in order]
            means = [0.0 if s.n == 0 or math.isnan(s.mean) else s.mean for s in stats]
            sds = [0.0 if s.n < 2 or math.isnan(s.sd) else s.sd for s in stats]
            ax.bar([i + j * width for i in range(len(order))], means, width, yerr=sds, label=label, capsize=2)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(order))])
        ax.set_xticklabels([labels.get(a, a) for a in order], rotation=15, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        legend(ax, fontsize=8)
    ax_em.set_ylim(0, 1)
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["Choice", "build", "claims", "select", "successful_corrections"]
