"""Page builder of the DTS demo (arXiv 2511.00640): ``docs/results/dts.md`` + ``dts.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=dts`` (``conf/demo/dts.yaml``: setting × arm × grid point × stage
× seed); page: ``python -m zoo.report demo dts``. Every arm has a grid of settings (``demo.grid``), each run on the
validation split (``stage=validate``) and on the test split (``stage=test``): the page picks each arm's setting by its
mean validation accuracy over seeds and reports the test runs of that setting. Read from the sweep: the metrics of
each run (``{val,test}/exact_match`` and ``DecodeStats``' ``{val,test}/decode/*``), the per-problem records
(``eval_records.jsonl``: prompt, completion, correctness, DTS's branch positions and the entropy / varentropy at each
token of the returned completion), ``run_info.json`` (the base policy each run used, with its build metrics and
directory) and the resolved configs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.data.forked import BRANCHES, ForkedTask
from zoo.generation.dts import entropy_varentropy
from zoo.report import (
    Run,
    Sweep,
    decaying_schedule_caveat,
    legend,
    paired_contrast,
    provenance,
    pyplot,
    save_figure,
    table,
    val_loss_plateau,
    write_page,
)
from zoo.stats import Stat, fmt_stat, paired, stat
from zoo.verdict import Claim, seeds_note, verdict_section

PAPER = "dts"
RECORDS = "eval_records.jsonl"
SETTINGS = ("forked", "multisum")
# the swept arms, each with its grid of settings; the page's rows add greedy (sampling's greedy grid point)
ARMS = ("sample", "self_consistency", "shortest_of_n", "dts_greedy", "dts_stable")
ROWS = ("greedy", "sample", "self_consistency", "shortest_of_n", "dts_greedy", "dts_stable")
DTS_ARMS = ("dts_greedy", "dts_stable")
GREEDY = ("sample", "p0")  # (arm, grid point) of greedy decoding
SPLIT = {"validate": "val", "test": "test"}
# (metric without the split prefix, column) of the arm table: the module's accuracy and DecodeStats' per-problem means
COLUMNS = (
    ("exact_match", "accuracy"),
    ("decode/repetition_rate", "repetition rate"),
    ("decode/tokens_per_problem", "tokens / problem (returned)"),
    ("decode/decoded_tokens_per_problem", "tokens / problem (decoded)"),
    ("decode/branch_events", "branch events"),
    ("decode/max_active", "max active"),
)
EVENTS = "branch events / finished traces per problem"
# the fork token of task=forked: completion position 1 (after <think>) with the zoo's character tokenizer
FORK_POSITION = 1
# the smallest accuracy / repetition-rate difference that counts as an effect in the verdict
MARGIN = 0.02
# paired differences smaller than this call for at least 5 seeds (docs: >= 3 seeds, >= 5 where the effect is small)
SMALL_EFFECT = 0.05
# a base policy is at a plateau when its validation loss changed by less than this fraction over its last epoch
PLATEAU = 0.05


# -- reading the sweep ------------------------------------------------------------------------------------------------
def cell(sweep: Sweep, setting: str, arm: str, point: str, stage: str = "test") -> list[Run]:
    """The runs (one per seed) of one arm at one grid point on one split."""
    return sweep.arm(f"{setting}/{arm}/{point}/{stage}")


def points(sweep: Sweep) -> list[str]:
    """The grid points of the sweep, in order."""
    return sorted({str(r.arm.get("demo.point", r.get("demo.point"))) for r in sweep.runs})


def metric(run: Run, name: str) -> float:
    """``name`` (without the split prefix) of the run's own split."""
    return run.last(f"{SPLIT.get(str(run.get('stage')), 'test')}/{name}")


def by_seed(runs: Iterable[Run], fn: Callable[[Run], float]) -> dict[int | None, float]:
    """``{seed: fn(run)}``: the unit of the paired comparisons (arms of a seed share the policy and the problems)."""
    return {r.seed: fn(r) for r in runs}


def records(run: Run) -> list[dict[str, Any]]:
    """The run's per-problem records (empty when it wrote none)."""
    return run.read_jsonl(RECORDS) if run.file(RECORDS).is_file() else []


def _mean(xs: Iterable[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


@dataclass(frozen=True)
class Choice:
    """An arm's setting picked on the validation split: the grid point with the highest mean validation accuracy
    over seeds (ties: the first point of the grid), and every point's validation accuracy."""

    arm: str
    point: str
    validation: dict[str, Stat]


def select(sweep: Sweep, setting: str, arm: str) -> Choice:
    scores = {
        p: stat(metric(r, "exact_match") for r in cell(sweep, setting, arm, p, "validate")) for p in points(sweep)
    }
    ranked = [p for p in scores if not math.isnan(scores[p].mean)]
    best = max(ranked, key=lambda p: (scores[p].mean, -ranked.index(p))) if ranked else points(sweep)[0]
    return Choice(arm, best, scores)


def reported(sweep: Sweep, setting: str) -> tuple[dict[str, list[Run]], dict[str, Choice]]:
    """The test runs of each page row (``greedy``: sampling's greedy point, untuned; the arms: their chosen point)
    and the choices."""
    choices = {arm: select(sweep, setting, arm) for arm in ARMS}
    rows = {"greedy": cell(sweep, setting, *GREEDY)}
    rows.update({arm: cell(sweep, setting, arm, c.point) for arm, c in choices.items()})
    return rows, choices


def knob(sweep: Sweep, arm: str, point: str) -> str:
    """The setting of a grid point in words (``T 0.6``, ``greedy``, ``tau_H 2.5, tau_V 0.05``)."""
    grid = (sweep.runs[0].get("demo.grid", {}) or {}) if sweep.runs else {}
    if arm == "sample":
        value = (grid.get("sample") or {}).get(point) or {}
        return f"T {value.get('temperature')}" if value.get("do_sample") else "greedy"
    if arm in DTS_ARMS:
        value = (grid.get("dts") or {}).get(point) or {}
        return f"tau_H {value.get('tau_H')}, tau_V {value.get('tau_V')}"
    return f"T {(grid.get('temperature') or {}).get(point)}"


def label(labels: dict[str, str], row: str, choice: Choice | None = None, sweep: Sweep | None = None) -> str:
    name = labels.get(row, row)
    return f"{name} [{knob(sweep, row, choice.point)}]" if choice is not None and sweep is not None else name


# -- what the records say ----------------------------------------------------------------------------------------------
def branch_shares(run: Run) -> dict[str, float]:
    """Share of problems whose returned completion took each branch of the forked task (``other``: none)."""
    rows = records(run)
    counts = Counter(ForkedTask.branch_of(r["completion"]) or "other" for r in rows)
    return {b: counts[b] / len(rows) if rows else math.nan for b in (*BRANCHES, "other")}


def branching(run: Run) -> dict[str, Any]:
    """Where a DTS run branched: the share of its branch events at the fork position, the positions they happened
    at, mean ``H`` / ``V`` of the returned completions at the fork, and the largest ``V`` at any other position of a
    returned completion and at any position (medians over problems)."""
    rows = records(run)
    steps = [s for r in rows for s in r.get("branch_steps", [])]
    at_fork = [r for r in rows if len(r.get("varentropies", [])) > FORK_POSITION]
    others = sorted(
        max((v for i, v in enumerate(r["varentropies"]) if i != FORK_POSITION), default=0.0)
        for r in rows
        if r.get("varentropies")
    )
    anywhere = sorted(max(r["varentropies"]) for r in rows if r.get("varentropies"))
    return {
        "at_fork": sum(s == FORK_POSITION for s in steps) / len(steps) if steps else math.nan,
        "steps": Counter(steps),
        "finished": _mean(r.get("num_finished", 0) for r in rows),
        "fork_h": _mean(r["entropies"][FORK_POSITION] for r in at_fork),
        "fork_v": _mean(r["varentropies"][FORK_POSITION] for r in at_fork),
        "other_v": others[len(others) // 2] if others else math.nan,
        "max_v": anywhere[len(anywhere) // 2] if anywhere else math.nan,
    }


def common_positions(counts: Counter, top: int = 4) -> str:
    """The most frequent branch positions with their share of all branch events (``"1 (62%), 5 (10%)"``)."""
    total = sum(counts.values())
    return ", ".join(f"{pos} ({100 * n / total:.0f}%)" for pos, n in counts.most_common(top)) if total else "none"


def length_accuracy(runs: Iterable[Run]) -> dict[str, float]:
    """The paper's premise (shorter traces are more often correct) in the returned completions of ``runs``: the
    accuracy of the finished completions at most as long as their run's median finished length and of the longer
    ones (pooled over runs), and the share of finished completions."""
    short, long, finished, total = [], [], 0, 0
    for run in runs:
        rows = records(run)
        total += len(rows)
        done = [r for r in rows if r.get("finished")]
        finished += len(done)
        if not done:
            continue
        lengths = sorted(int(r["completion_tokens"]) for r in done)
        median = lengths[(len(lengths) - 1) // 2]
        for r in done:
            (short if int(r["completion_tokens"]) <= median else long).append(float(bool(r["correct"])))
    return {"short": _mean(short), "long": _mean(long), "finished": finished / total if total else math.nan}


def overlap(sweep: Sweep, setting: str) -> float:
    """Share of test prompts that also occur among the validation prompts of the same seed (the selection split)."""
    shared = total = 0
    for seed in sweep.seeds:
        val = {
            r["prompt"] for run in cell(sweep, setting, *GREEDY, "validate") if run.seed == seed for r in records(run)
        }
        test = [r["prompt"] for run in cell(sweep, setting, *GREEDY, "test") if run.seed == seed for r in records(run)]
        shared += sum(p in val for p in test)
        total += len(test)
    return shared / total if total else math.nan


# -- tables and sentences ---------------------------------------------------------------------------------------------
def selection_table(sweep: Sweep, choices: dict[str, Choice], labels: dict[str, str]) -> str:
    grid = points(sweep)
    rows = []
    for arm, choice in choices.items():
        cells = []
        for p in grid:
            text = f"{knob(sweep, arm, p)}: {fmt_stat(choice.validation[p], ci=False)}"
            cells.append(f"**{text}**" if p == choice.point else text)
        rows.append([labels.get(arm, arm), *cells])
    return table(["arm", *grid], rows)


def arm_table(rows: dict[str, list[Run]], choices: dict[str, Choice], sweep: Sweep, labels: dict[str, str]) -> str:
    lines = []
    for row, runs in rows.items():
        cells = [fmt_stat(stat(metric(r, m) for r in runs), ci=(m == "exact_match")) for m, _ in COLUMNS]
        lines.append([label(labels, row, choices.get(row), sweep), *cells])
    return table(["arm [setting chosen on validation]", *(c for _, c in COLUMNS)], lines)


def branch_table(rows: dict[str, list[Run]], labels: dict[str, str], fork: bool) -> str:
    """Where each DTS arm branched; with ``fork``, the share at the fork position and ``H`` / ``V`` there."""
    lines = []
    for arm in DTS_ARMS:
        found = [branching(r) for r in rows[arm]]
        pooled = sum((b["steps"] for b in found), Counter())
        events = fmt_stat(stat(metric(r, "decode/branch_events") for r in rows[arm]), ci=False)
        events += " / " + fmt_stat(stat(b["finished"] for b in found), digits=1, ci=False)
        if fork:
            at_fork = [fmt_stat(stat(b[k] for b in found), ci=False) for k in ("at_fork", "fork_h", "fork_v")]
            lines.append([labels.get(arm, arm), events, at_fork[0], common_positions(pooled), *at_fork[1:]])
        else:
            lines.append([labels.get(arm, arm), events, common_positions(pooled)])
        lines[-1].append(fmt_stat(stat(b["other_v" if fork else "max_v"] for b in found), ci=False))
    where = "most frequent branch positions (share of events, all seeds)"
    if fork:
        at = f"position {FORK_POSITION}"
        header = ["arm", EVENTS, f"share at {at}", where, f"H at {at}", f"V at {at}"]
        return table([*header, "largest V at another position (median problem)"], lines)
    anywhere = "largest V in the returned completion (median problem)"
    return table(["arm", EVENTS, where, anywhere], lines)


def shares_table(rows: dict[str, list[Run]], choices: dict[str, Choice], sweep: Sweep, labels: dict[str, str]) -> str:
    lines = []
    for row, runs in rows.items():
        shares = [branch_shares(r) for r in runs]
        cells = [fmt_stat(stat(s[b] for s in shares), ci=False) for b in (*BRANCHES, "other")]
        lines.append([label(labels, row, choices.get(row), sweep), *cells])
    return table(["arm", *BRANCHES, "other"], lines)


def paired_values(rows: dict[str, list[Run]], row: str, name: str) -> dict[int | None, float]:
    return by_seed(rows[row], lambda r: metric(r, name))


def contrasts(rows: dict[str, list[Run]], labels: dict[str, str]) -> list[str]:
    """The comparisons of the paper's claim, each a sentence from the numbers, paired by seed."""
    pairs = [
        ("dts_greedy", "sample", "exact_match", "accuracy"),
        ("dts_stable", "sample", "exact_match", "accuracy"),
        ("dts_greedy", "greedy", "exact_match", "accuracy"),
        ("dts_stable", "self_consistency", "exact_match", "accuracy"),
        ("dts_greedy", "shortest_of_n", "exact_match", "accuracy"),
        ("dts_greedy", "sample", "decode/repetition_rate", "repetition rate"),
        ("dts_stable", "self_consistency", "decode/repetition_rate", "repetition rate"),
        ("dts_greedy", "shortest_of_n", "decode/decoded_tokens_per_problem", "decoded tokens"),
    ]
    return [
        "- "
        + paired_contrast(
            labels.get(a, a), paired_values(rows, a, m), labels.get(b, b), paired_values(rows, b, m), what
        )
        for a, b, m, what in pairs
    ]


def mean_of(rows: dict[str, list[Run]], row: str, name: str) -> float:
    return stat(metric(r, name) for r in rows[row]).mean


def forked_reading(rows: dict[str, list[Run]], labels: dict[str, str]) -> list[str]:
    """Sentences on task=forked filled from the records: which continuation each arm returns, and how many of DTS's
    branch events lie beyond the longest short (correct) continuation, i.e. inside the loop or the wrong one."""
    short_len = max(
        (
            int(r["completion_tokens"])
            for runs in rows.values()
            for run in runs
            for r in records(run)
            if ForkedTask.branch_of(r["completion"]) == "short" and r.get("correct")
        ),
        default=0,
    )
    shares = {row: [branch_shares(r) for r in runs] for row, runs in rows.items()}

    def share(row: str, branch: str) -> str:
        return fmt_stat(stat(s[branch] for s in shares[row]), ci=False)

    lines = [
        f"- Greedy decoding takes the most likely continuation, the loop, on {share('greedy', 'loop')} of problems "
        f"(repetition rate {mean_of(rows, 'greedy', 'decode/repetition_rate'):.3f}); sampling returns the loop on "
        f"{share('sample', 'loop')} and the short correct line on {share('sample', 'short')}.",
        f"- Self-consistency votes over the answers of finished samples: the wrong continuation finishes more often "
        f"than the short one, and it returns the wrong answer on {share('self_consistency', 'wrong')} of problems "
        f"(the short line on {share('self_consistency', 'short')}).",
        "- Shortest-of-N returns the short line when one of its N samples takes it "
        f"({share('shortest_of_n', 'short')}); "
        f"otherwise the wrong one ({share('shortest_of_n', 'wrong')}) or, when no sample finishes, a loop "
        f"({share('shortest_of_n', 'loop')}).",
    ]
    for arm in DTS_ARMS:
        steps = [s for r in rows[arm] for row in records(r) for s in row.get("branch_steps", [])]
        beyond = sum(s >= short_len for s in steps) / len(steps) if steps else math.nan
        lines.append(
            f"- {labels.get(arm, arm)} returned the short correct continuation on {share(arm, 'short')} of problems "
            f"and the wrong one on {share(arm, 'wrong')}; {100 * beyond:.0f}% of its branch events (all seeds) are at "
            f"positions >= {short_len}, the length of the longest short continuation, i.e. inside the loop or the "
            "wrong continuation."
        )
    lines.append(
        "- DTS-Stable votes over finished traces, not over probability mass: a continuation whose tokens the policy "
        "hesitates over branches more and can finish with several traces, while a continuation without hesitation "
        "finishes as one trace; DTS-Greedy only needs the short one to finish first."
    )
    return lines


def arm_sentences(
    rows: dict[str, list[Run]], choices: dict[str, Choice], sweep: Sweep, labels: dict[str, str]
) -> list[str]:
    """One sentence per arm: its test accuracy against tuned sampling (paired by seed), returned and decoded length."""
    base = paired_values(rows, "sample", "exact_match")
    lines = []
    for row in ROWS:
        name = label(labels, row, choices.get(row), sweep)
        acc = paired_values(rows, row, "exact_match")
        text = f"- {name}: accuracy {fmt_stat(stat(acc.values()), ci=False)}"
        if row != "sample":
            text += "; " + paired_contrast(name, acc, labels.get("sample", "sampling"), base, "accuracy")
        text += (
            f"; returned {mean_of(rows, row, 'decode/tokens_per_problem'):.1f} tokens per problem, decoded "
            f"{mean_of(rows, row, 'decode/decoded_tokens_per_problem'):.1f}."
        )
        lines.append(text)
    return lines


def multisum_reading(rows: dict[str, list[Run]], labels: dict[str, str]) -> list[str]:
    """Why DTS-Greedy fares as it does without a planted fork, from the records: how many traces finish in its
    stopping step (they vote), how far its tree grows against its cap, and what that costs against shortest-of-N."""
    found = [branching(r) for r in rows["dts_greedy"]]
    finished = _mean(b["finished"] for b in found)
    dts = mean_of(rows, "dts_greedy", "decode/decoded_tokens_per_problem")
    son = mean_of(rows, "shortest_of_n", "decode/decoded_tokens_per_problem")
    active = mean_of(rows, "dts_greedy", "decode/max_active")
    cap = next((r.get("module.decoder.max_active") for r in rows["dts_greedy"]), None)
    vote = (
        "(the completions of one problem have nearly the same length, so length does not single one out) and their "
        "answers vote"
        if finished >= 1.5
        else "(one trace: nothing to vote over)"
    )
    if cap is not None and active >= 0.9 * float(cap):
        grows = f"reaches {active:.1f} active hypotheses (the cap, {cap})"
    else:
        grows = f"reaches {active:.1f} active hypotheses (cap {cap}): the policy is rarely uncertain enough to branch"
    cost = (
        "on this task the two are not compute-matched, and shortest-of-N is the cheaper of them"
        if dts > son
        else "DTS-Greedy is the cheaper of the two here"
    )
    return [
        f"- {labels.get('dts_greedy', 'dts_greedy')} stops at the first step in which a trace finishes; here "
        f"{finished:.1f} traces per problem finish in that step {vote}. Its tree branches "
        f"{mean_of(rows, 'dts_greedy', 'decode/branch_events'):.1f} times per problem and {grows}, so it decodes "
        f"{dts:.0f} tokens per problem, {dts / son:.1f}x shortest-of-N's {son:.0f}: {cost}.",
    ]


def premise_sentence(rows: dict[str, list[Run]], sweep: Sweep, setting: str) -> str:
    """The length-accuracy relation the first-finished rule relies on, in sampling's returned completions at the
    highest temperature of its grid (the most diverse lengths)."""
    point = points(sweep)[-1]
    found = length_accuracy(cell(sweep, setting, "sample", point))
    verb = "are more often correct than" if found["short"] > found["long"] else "are not more often correct than"
    return (
        "- The premise of returning the first finished trace, in sampling's completions at "
        f"{knob(sweep, 'sample', point)} "
        f"(test, all seeds): finished completions no longer than their run's median {verb} the longer ones "
        f"(accuracy {found['short']:.3f} vs {found['long']:.3f}; {found['finished']:.3f} of completions finished)."
    )


# -- the verdict ---------------------------------------------------------------------------------------------------
def claims(reports: dict[str, dict[str, list[Run]]], labels: dict[str, str]) -> list[Claim]:
    """The paper's claims (abstract: DTS "significantly enhances accuracy" and "reduces repetitive generation";
    structured exploration instead of "redundant sampling"; early termination that prefers short trajectories) as
    this demo tests them, each a paired difference over seeds."""

    def effect(setting: str, a: str, b: str, name: str) -> Stat:
        rows = reports[setting]
        return paired(paired_values(rows, a, name), paired_values(rows, b, name))

    def lab(row: str) -> str:
        return labels.get(row, row)

    found = []
    for setting in SETTINGS:
        if setting not in reports:
            continue
        where = f"task={setting}"
        found += [
            Claim(
                f"DTS-Greedy is more accurate than sampling ({where})",
                f"test accuracy, {lab('dts_greedy')} − {lab('sample')} (both tuned), paired by seed",
                effect(setting, "dts_greedy", "sample", "exact_match"),
                "higher",
                MARGIN,
            ),
            Claim(
                f"DTS-Stable is more accurate than sampling ({where})",
                f"test accuracy, {lab('dts_stable')} − {lab('sample')} (both tuned), paired by seed",
                effect(setting, "dts_stable", "sample", "exact_match"),
                "higher",
                MARGIN,
            ),
            Claim(
                f"tree exploration beats redundant sampling: DTS-Stable vs self-consistency ({where})",
                f"test accuracy, {lab('dts_stable')} − {lab('self_consistency')} (both tuned, 8 traces)",
                effect(setting, "dts_stable", "self_consistency", "exact_match"),
                "higher",
                MARGIN,
            ),
            Claim(
                f"DTS-Greedy beats shortest-of-N, the same first-finished rule without branching ({where})",
                f"test accuracy, {lab('dts_greedy')} − {lab('shortest_of_n')} (both tuned; decoded tokens per "
                f"problem {mean_of(reports[setting], 'dts_greedy', 'decode/decoded_tokens_per_problem'):.0f} vs "
                f"{mean_of(reports[setting], 'shortest_of_n', 'decode/decoded_tokens_per_problem'):.0f})",
                effect(setting, "dts_greedy", "shortest_of_n", "exact_match"),
                "higher",
                MARGIN,
            ),
        ]
    if "forked" in reports:
        found += [
            Claim(
                f"DTS reduces repetitive generation: {name} (task=forked)",
                f"repetition rate (no EOS within the budget), {lab(arm)} − {lab('sample')}",
                effect("forked", arm, "sample", "decode/repetition_rate"),
                "lower",
                MARGIN,
            )
            for arm, name in (("dts_greedy", "DTS-Greedy"), ("dts_stable", "DTS-Stable"))
        ]
    return found


def verdict(reports: dict[str, dict[str, list[Run]]], labels: dict[str, str]) -> list[str]:
    return verdict_section(
        claims(reports, labels),
        "the paper's benchmarks (AIME, GPQA-Diamond, LiveBench) with 0.6B-7B reasoning models, where no fork is "
        "planted and correct traces are not built to be the shortest; its +14% accuracy and -8% repetition averages; "
        "that DTS lets a model beat one 10x its size (one model size here); task=multisum has no repetition failure, "
        "so its repetition rates cannot show a reduction.",
    )


def fair_test(
    sweep: Sweep,
    reports: dict[str, dict[str, list[Run]]],
    all_claims: list[Claim],
    labels: dict[str, str],
) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    forked = reports.get("forked")
    lines = ["## Fair test", ""]
    if forked:
        greedy_rep = mean_of(forked, "greedy", "decode/repetition_rate")
        sc_wrong = stat(branch_shares(r)["wrong"] for r in forked["self_consistency"]).mean
        lines.append(
            "- **The baselines' failures can occur.** On task=forked the short correct line is a minority of the "
            "training data, the loop (which cannot end within the budget) is the most likely continuation and the "
            f"wrong one finishes more often than the short one: greedy loops on {greedy_rep:.3f} of problems, and "
            f"self-consistency returns the wrong answer on {sc_wrong:.3f}. Taking the mode and voting both fail; only "
            "a rule that returns the first finished trace can pick the short line."
        )
        fork = [branching(r) for r in forked["dts_greedy"]]
        son = mean_of(forked, "shortest_of_n", "decode/decoded_tokens_per_problem")
        dts = mean_of(forked, "dts_greedy", "decode/decoded_tokens_per_problem")
        lines.append(
            "- **The method's signal carries information the baseline lacks.** DTS branches where the policy's "
            f"next-token distribution is a decision (share of DTS-Greedy's branch events at the fork: "
            f"{_mean(b['at_fork'] for b in fork):.3f}; V there {_mean(b['fork_v'] for b in fork):.3f}, the largest V "
            f"elsewhere in a returned completion {_mean(b['other_v'] for b in fork):.3f}). Shortest-of-N applies the "
            "same first-finished rule to independent samples without that signal; at a similar decoding cost "
            f"(decoded tokens per problem: shortest-of-N {son:.1f}, DTS-Greedy {dts:.1f}) their difference is the "
            "value of branching at the fork."
        )
    val_n = sweep.runs[0].get("datamodule.source.num_val")
    test_n = sweep.runs[0].get("datamodule.source.num_test")
    overlaps = ", ".join(f"task={s} {overlap(sweep, s):.3f}" for s in reports)
    lines += [
        f"- **Same tuning effort for every arm.** Each of the five arms has a grid of {len(points(sweep))} settings "
        "(sampling: greedy and three temperatures; self-consistency and shortest-of-N: four temperatures; DTS-Greedy "
        "and DTS-Stable: tau_H x tau_V); each arm keeps the setting with the highest mean validation accuracy over "
        "seeds (tables above; ties: the first setting of the grid). Greedy is reported as sampling's untuned greedy "
        "setting.",
        f"- **Chosen on a split that is not reported.** The choice reads the validation split ({val_n} problems per "
        f"seed, drawn with the seed + 1); the tables report the test split ({test_n} problems, seed + 2). Share of "
        f"test prompts that also occur among the validation prompts: {overlaps}.",
    ]
    plateau_text = []
    for setting, rows in reports.items():
        loss, change = val_loss_plateau(r for runs in rows.values() for r in runs)
        met = "met" if abs(change.mean) < PLATEAU else "not met"
        plateau_text.append(
            f"task={setting}: final validation loss {fmt_stat(loss, ci=False)}, change over the last epoch "
            f"{100 * change.mean:+.1f}% (mean over the {loss.n} policies; a plateau by the loss, a change of less "
            f"than {100 * PLATEAU:.0f}%: **{met}**)"
        )
    if forked:
        grid = points(sweep)
        hot = [branch_shares(r) for r in cell(sweep, "forked", "sample", grid[-1])]
        trained = tuple(float(sweep.runs[0].get(f"task.p_{b}", math.nan)) for b in BRANCHES)
        sampled = ", ".join(f"{b} {_mean(s[b] for s in hot):.3f} ({p:g})" for b, p in zip(BRANCHES, trained))
        plateau_text.append(
            f"sampling at {knob(sweep, 'sample', grid[-1])} returns the forked branches with the training shares "
            f"(returned share (training share): {sampled})"
        )
    lines.append(
        "- **Models trained to a plateau.** The base policies (one per seed and task, the same for every arm): "
        + "; ".join(plateau_text)
        + "."
        + decaying_schedule_caveat(sweep.runs, "base_policy", "epoch", relative=PLATEAU)
    )
    seeds = len(sweep.seeds)
    note = seeds_note(all_claims, seeds, SMALL_EFFECT)
    lines += [f"- **Seeds.** {seeds} seeds (base policy, data draws and sampling noise vary together); {note}.", ""]
    return lines


# -- the page ------------------------------------------------------------------------------------------------------
def varentropy_profile(runs: list[Run]) -> tuple[list[float], list[float]]:
    """Mean ``H`` and ``V`` by completion position over the returned completions of ``runs``."""
    by_h: dict[int, list[float]] = {}
    by_v: dict[int, list[float]] = {}
    for run in runs:
        for r in records(run):
            for i, (h, v) in enumerate(zip(r.get("entropies", []), r.get("varentropies", []))):
                by_h.setdefault(i, []).append(h)
                by_v.setdefault(i, []).append(v)
    n = max(by_v, default=-1) + 1
    return [_mean(by_h.get(i, [])) for i in range(n)], [_mean(by_v.get(i, [])) for i in range(n)]


def plot(
    reports: dict[str, dict[str, list[Run]]],
    choices: dict[str, dict[str, Choice]],
    sweep: Sweep,
    labels: dict[str, str],
    out: Path,
) -> Path:
    plt = pyplot()
    settings = list(reports)
    fig, axes = plt.subplots(1, 1 + len(settings), figsize=(6 + 5 * len(settings), 4.2))
    width = 0.8 / len(ROWS)
    for i, row in enumerate(ROWS):
        accs = [stat(metric(r, "exact_match") for r in reports[s][row]) for s in settings]
        xs = [j + (i - (len(ROWS) - 1) / 2) * width for j in range(len(settings))]
        err = [0.0 if math.isnan(a.hi) else a.hi - a.mean for a in accs]
        axes[0].bar(xs, [a.mean for a in accs], width, yerr=err, label=labels.get(row, row))
    axes[0].set_xticks(range(len(settings)), [f"task={s}" for s in settings])
    axes[0].set_ylabel("test accuracy (setting chosen on validation;\nmean over seeds, 95% CI)")
    legend(axes[0], fontsize=7)
    for ax, setting in zip(axes[1:], settings):
        h, v = varentropy_profile(reports[setting]["dts_greedy"])
        tau_v = knob(sweep, "dts_greedy", choices[setting]["dts_greedy"].point)
        ax.plot(range(len(v)), v, marker=".", label="varentropy V")
        ax.plot(range(len(h)), h, marker=".", alpha=0.6, label="entropy H")
        grid = (sweep.runs[0].get("demo.grid", {}) or {}).get("dts") or {}
        tau = (grid.get(choices[setting]["dts_greedy"].point) or {}).get("tau_V")
        if tau is not None:
            ax.axhline(float(tau), color="k", ls="--", lw=0.8, label=f"tau_V = {tau:g}")
        ax.set_xlabel(f"position in the returned completion (DTS-Greedy, {tau_v})")
        ax.set_title(f"task={setting}: mean H, V at T_ent by position", fontsize=9)
        legend(ax, fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


def setup_text(sweep: Sweep) -> list[str]:
    first = sweep.runs[0]
    forked = next((r for r in sweep.runs if r.name.startswith("forked/")), first)
    dts = next((r.get("module.decoder", {}) for r in sweep.runs if "/dts_greedy/" in r.name), {}) or {}
    recipe = first.get("base_policy", {}) or {}
    backbone = first.get("backbone", {}) or {}
    traces = first.get("demo.num_traces")
    seeds = len(sweep.seeds) or 1
    shares = tuple(float(forked.get(f"task.p_{b}", math.nan)) for b in BRANCHES)
    t_ent = float(dts.get("entropy_temperature") or math.nan)
    fork_h, fork_v = (float(x) for x in entropy_varentropy(torch.tensor(shares).log(), t_ent))
    knobs = ", ".join(
        f"{name} {dts.get(key)}"
        for name, key in (
            ("k", "branch_top_k"),
            ("max_active", "max_active"),
            ("T", "temperature"),
            ("T_ent", "entropy_temperature"),
            ("rule", "branch_rule"),
            ("vote over", "vote_over"),
        )
    )
    return [
        "## Setup",
        "",
        f"One base SFT policy per seed and task (`+method=sft` through the artifact cache: a "
        f"{backbone.get('num_hidden_layers')}-layer Llama, hidden {backbone.get('hidden_size')}, "
        f"{recipe.get('num_train')} rows x {recipe.get('max_epochs')} epochs) is decoded by every arm on the same "
        f"problems ({seeds} seeds), every trace with the same budget of "
        f"{first.get('module.generation.max_new_tokens')} new tokens: sampling (one trace; its greedy setting is "
        f"also reported as greedy), self-consistency ({traces} samples, majority vote of the verifier's answers), "
        f"shortest-of-N ({first.get('demo.shortest_of_n')} samples racing in lockstep, the first to finish is "
        f"returned: the compute-matched baseline of DTS-Greedy), DTS-Greedy (the first finished trace of the tree) "
        f"and DTS-Stable (majority vote of the finished traces once {traces} have finished). DTS knobs besides "
        f"tau_H / tau_V: {knobs}.",
        "",
        f"- **task=forked** plants one fork right after `<think>`: a short correct line (training share "
        f"{shares[0]:g}), a loop of {forked.get('task.loop_lines')} repeated lines that cannot end within the budget "
        f"({shares[1]:g}), a medium wrong continuation ({shares[2]:g}). Everything else is a copy of the question's "
        f"word. At the training shares the fork has H {fork_h:.2f} and V {fork_v:.2f} at T_ent {t_ent:g}, well below "
        "the official tau_V 1.5 (set for the long-tailed next-token distributions of reasoning LLMs), hence the "
        "grid's smaller tau_V.",
        "- **task=multisum** (running sums of 3-5 digits) has no planted fork: the uncertain tokens are wherever the "
        "small policy still errs on a sum (at its plateau, rarely: decoding has little to fix there).",
        "",
        "Metrics (per problem, mean over the problems of a run; mean ± sd over seeds, with the 95% CI of the mean for "
        "accuracy): **accuracy** = the task verifier on the returned completion; **repetition rate** = share of "
        "problems whose returned completion has no EOS within the budget; **tokens (returned)** = length of the "
        "returned completion; **tokens (decoded)** = tokens generated by all samples / hypotheses of the problem "
        "(the decoding work); **branch events** = branches of the DTS tree; **max active** = most hypotheses alive at "
        "once. Comparisons are paired by seed (the arms of a seed share the policy and the problems).",
        "",
    ]


def build(sweep: Sweep, out: Path) -> list[Path]:
    labels = sweep.runs[0].get("demo.labels", {}) or {}
    present = [s for s in SETTINGS if any(r.name.startswith(f"{s}/") for r in sweep.runs)]
    reports: dict[str, dict[str, list[Run]]] = {}
    choices: dict[str, dict[str, Choice]] = {}
    for setting in present:
        reports[setting], choices[setting] = reported(sweep, setting)
    png = plot(reports, choices, sweep, labels, out / f"{PAPER}.png")
    all_claims = claims(reports, labels)
    text = [
        "# DTS demo: decoding tree sketching vs sampling, self-consistency and shortest-of-N",
        "",
        provenance(sweep, PAPER),
        "",
        *setup_text(sweep),
        *fair_test(sweep, reports, all_claims, labels),
    ]
    for setting in present:
        rows, chosen = reports[setting], choices[setting]
        text += [
            f"## {labels.get(setting, setting)}",
            "",
            "Selection on the validation split (accuracy, mean ± sd over seeds; the chosen setting in bold):",
            "",
            selection_table(sweep, chosen, labels),
            "",
            "Test split, each arm at its chosen setting:",
            "",
            arm_table(rows, chosen, sweep, labels),
            "",
            *contrasts(rows, labels),
            "",
        ]
        if setting == "forked":
            text += [
                "Which continuation the returned completion took (share of problems, from its first reasoning word):",
                "",
                shares_table(rows, chosen, sweep, labels),
                "",
                *forked_reading(rows, labels),
                "",
            ]
        else:
            text += [
                "Every arm on this task (test accuracy against tuned sampling, paired by seed):",
                "",
                *arm_sentences(rows, chosen, sweep, labels),
                *multisum_reading(rows, labels),
                premise_sentence(rows, sweep, setting),
                "",
            ]
        fork = setting == "forked"
        where = f"; position {FORK_POSITION}, right after `<think>`, is the planted fork" if fork else ""
        text += [
            f"Where DTS branched (positions count from 0 = the first generated token{where}; H and V at T_ent of the "
            "returned completions):",
            "",
            branch_table(rows, labels, fork),
            "",
        ]
    text += [
        f"![test accuracy by arm; mean H and V by position]({png.name})",
        "",
        "## What this toy can and cannot show",
        "",
        "- Every trace has the same budget; the decoding work differs (tokens decoded): self-consistency decodes "
        "every sample to its end, shortest-of-N and DTS-Greedy stop when the first trace finishes, DTS-Stable when "
        "the first B have.",
        "- It can show whether branching at a decision token and returning the first finished trace leaves behind "
        "the long non-terminating continuation and the longer wrong one when the correct line is not the mode, "
        "whether that needs the branching signal (against shortest-of-N), and at which positions DTS branches. It "
        "cannot show the paper's gains on reasoning benchmarks with billion-parameter models, where correct traces "
        "are not planted to be the shortest.",
        "",
    ]
    return [write_page(out, PAPER, text, verdict(reports, labels)), png]
