"""Page builder of the vocabulary-extension demo (arXiv 2605.04308): ``docs/results/vocab_extend.md`` + plot.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=vocab_extend`` (``conf/demo/vocab_extend.yaml``: arm × n ×
seed); page: ``python -m zoo.report demo vocab_extend``. Read from the sweep: ``transition_tv/*``
(:class:`zoo.callbacks.TransitionTV`), ``forgetting/*`` (:class:`zoo.callbacks.ForgettingMonitor` with
``check_removal``), ``val/loss``, the resolved configs and the base models' build metrics (``run_info.json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoo.data.markov import MarkovChain
from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    contrast,
    legend,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import (
    fmt_stat,
    stat,
    t_critical,
)

PAPER = "vocab_extend"
ARM_KEY = "demo/vocab_extend/arm"
N_KEY = "datamodule.source.num_train"
TV = "transition_tv/new_tv"
FORGETTING = ("forgetting/max_abs_logit_diff", "forgetting/kl_mean")
REMOVAL = ("forgetting/removed_max_abs_param_diff", "forgetting/removed_max_abs_logit_diff")
BASELINES = ("full", "lora")


def dictionary_size(run: Run) -> int:
    return int(run.get("task.dictionary_size"))


def crossing(points: Sequence[tuple[float, float]], eps: float) -> float:
    """The smallest ``n`` at which the TV falls below ``eps``, interpolated linearly in ``(log n, TV)`` between the
    last grid point above ``eps`` and the first one below it; ``nan`` when no grid point is below ``eps``; the
    smallest ``n`` when it already is."""
    points = sorted(points)
    for i, (n, tv) in enumerate(points):
        if tv < eps:
            if i == 0:
                return float(n)
            n0, tv0 = points[i - 1]
            frac = (tv0 - eps) / (tv0 - tv)
            return math.exp(math.log(n0) + frac * (math.log(n) - math.log(n0)))
    return math.nan


def loglog_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float, int]:
    """Least-squares slope of ``log y`` on ``log x`` with its 95% t-interval half-width, the intercept, and the
    number of points (``nan`` where fewer than three points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0 and not math.isnan(y)]
    k = len(pts)
    if k < 3 or len({p[0] for p in pts}) < 2:
        return math.nan, math.nan, math.nan, k
    mx = sum(p[0] for p in pts) / k
    my = sum(p[1] for p in pts) / k
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    intercept = my - slope * mx
    residual = sum((p[1] - intercept - slope * p[0]) ** 2 for p in pts)
    se = math.sqrt(residual / (k - 2) / sxx)
    return slope, t_critical(k - 2) * se, intercept, k


def show_needed(v: float, smallest: int) -> str:
    return "not reached" if math.isnan(v) else f"<= {smallest}" if v <= smallest else f"{v:.0f}"


def needed_for(
    eps: float, method_arms: list[str], seeds: list[int], runs_of: Any
) -> tuple[float, dict[str, list[float]], list[list[Any]], tuple[float, float, float, int]]:
    """For one threshold: n needed per arm and seed, the table rows, and the log-log fit over the points reached
    inside the grid (a TV already below ``eps`` at the smallest n is censored: shown as "<= n", left out of the
    fit, like "not reached")."""
    needed: dict[str, list[float]] = {}
    rows, fit_s, fit_n = [], [], []
    for a in method_arms:
        s = dictionary_size(runs_of(a)[0])
        points = {seed: [(int(r.get(N_KEY)), r.last(TV)) for r in runs_of(a) if r.seed == seed] for seed in seeds}
        smallest = min(n for pts in points.values() for n, _ in pts)
        needed[a] = [crossing(points[seed], eps) for seed in seeds]
        inside = [v for v in needed[a] if not math.isnan(v) and v > smallest]
        fit_s += [s] * len(inside)
        fit_n += inside

        rows.append(
            [
                s,
                ", ".join(show_needed(v, smallest) for v in needed[a]),
                fmt_stat(stat(inside), 0, ci=False) if inside else "n/a",
                f"{len(inside)}/{len(needed[a])}",
            ]
        )
    return eps, needed, rows, loglog_fit(fit_s, fit_n), sorted(set(fit_s))


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    eps_values = first.get("demo.tv_eps")
    eps_list = [float(e) for e in (eps_values if isinstance(eps_values, list) else [eps_values])]

    def lab(arm: str) -> str:
        return labels.get(arm, arm)

    arms = list(dict.fromkeys(r.arm.get(ARM_KEY, "all") for r in sweep.runs if r.finished))
    ns = sorted({int(r.get(N_KEY)) for r in sweep.runs})

    def runs_of(arm: str, n: int | None = None) -> list[Run]:
        """The arm's finished runs (at ``n``)."""
        return [
            r
            for r in sweep.runs
            if r.finished and r.arm.get(ARM_KEY, "all") == arm and (n is None or int(r.get(N_KEY)) == n)
        ]

    method_arms = sorted((a for a in arms if a not in BASELINES), key=lambda a: dictionary_size(runs_of(a)[0]))
    seeds = sweep.seeds

    # -- TV vs n, n needed for TV < eps ------------------------------------------------------------------------------
    tv_rows = [[lab(a), *(fmt_stat(stat(r.last(TV) for r in runs_of(a, n)), ci=False) for n in ns)] for a in arms]
    thresholds = [needed_for(eps, method_arms, seeds, runs_of) for eps in eps_list]

    # -- forgetting and reversibility ------------------------------------------------------------------------------
    forget_rows = []
    for a in arms:
        runs = runs_of(a)
        forget_rows.append(
            [
                lab(a),
                len(runs),
                *(f"{max(r.last(m) for r in runs):.3g}" for m in FORGETTING),
                f"{sum(r.last(FORGETTING[0]) == 0.0 and r.last(FORGETTING[1]) == 0.0 for r in runs)}/{len(runs)}",
                *(f"{max(r.last(m) for r in runs):.3g}" for m in REMOVAL),
                f"{sum(all(r.last(m) == 0.0 for m in REMOVAL) for r in runs)}/{len(runs)}",
            ]
        )
    baseline_rows = []
    reference = next((a for a in method_arms if dictionary_size(runs_of(a)[0]) == 4), None)
    for a in [x for x in (reference, *BASELINES) if x in arms]:
        baseline_rows.append(
            [lab(a), *(fmt_stat(stat(r.last(FORGETTING[0]) for r in runs_of(a, n)), 3, ci=False) for n in ns)]
        )

    # -- the base models -------------------------------------------------------------------------------------------
    base_loss = artifact_values(sweep.runs, "demo_policy", "val/loss")
    entropy = [
        MarkovChain(
            int(r.get("task.num_states")),
            int(r.get("task.support")),
            float(r.get("task.concentration")),
            int(r.get("task.chain_seed")),
        ).entropy_rate()
        for r in {int(r.get("task.chain_seed")): r for r in sweep.runs}.values()
    ]
    old_tv = stat(r.last("transition_tv/old_tv") for r in sweep.runs if r.arm.get(ARM_KEY) in method_arms)

    lrs = ", ".join(
        f"{lab(a)}: lr {runs_of(a)[0].get('module.optimizer.lr')}"
        for a in (method_arms[:1] + [b for b in BASELINES if b in arms])
    )
    png = plot(arms, method_arms, ns, runs_of, lab, thresholds, out / f"{PAPER}.png")
    text = [
        "# Vocabulary extension demo: new tokens on a Markov chain, samples needed vs dictionary size, forgetting",
        "",
        "Paper: *Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping* "
        "(arXiv 2605.04308). Built through the demo path (`conf/demo/vocab_extend.yaml`, page builder "
        "`demos/vocab_extend.py`). Toy scale on a shared CPU: this page reports what was measured.",
        "",
        provenance(sweep, PAPER),
        "",
        *setup(first, ns, seeds, base_loss, entropy, old_tv, lrs),
        "",
        f"## TV to the true new rows vs n (mean ± sd over {len(seeds)} seed{'s' if len(seeds) != 1 else ''})",
        "",
        "`transition_tv/new_tv`: mean over the 8 new tokens and "
        f"{first.get('callbacks.transition_tv.contexts_per_token')} held-out contexts each of "
        "TV(p̂(· | context + new token), P'_j), after training on n new-token transitions (n/8 per token).",
        "",
        table(["arm", *(f"n = {n}" for n in ns)], tv_rows),
        "## n needed for TV < ε vs s",
        "",
        "Per seed, the n at which the TV curve falls below ε (linear interpolation in log n between grid points; "
        f"'not reached': still above ε at n = {ns[-1]}; '<= {ns[0]}': already below at the smallest n). The slope is "
        "the least-squares fit of log n on log s over the (s, seed) points inside the grid, with its 95% interval.",
        "",
        *(
            line
            for e, _, rows, (sl, hw, _, kk), ss in thresholds
            for line in (
                f"**ε = {e}**",
                "",
                table(["s", "n needed, per seed", "mean ± sd (inside the grid)", "seeds inside the grid"], rows),
                fit_sentence(sl, hw, kk, ss),
                "",
            )
        ),
        f"![TV vs n and n needed vs s]({png.name})",
        "",
        "## Forgetting and reversibility (old-only held-out contexts)",
        "",
        f"Forgetting: max |Δ logit| and mean KL(p_base ‖ p) on {first.get('callbacks.forgetting.max_contexts')} "
        "held-out old-chain contexts (every position), against the model at fit start. Reversibility: after "
        "`vocab_extension.remove()`, the largest change of any entry of the model's state and of the old-context "
        "logits against copies taken at fit start. Maxima over all n and seeds of the arm.",
        "",
        table(
            [
                "arm",
                "runs",
                "max |Δ logit|",
                "max KL mean",
                "runs with both exactly 0",
                "after remove(): max |Δ param|",
                "after remove(): max |Δ logit|",
                "runs restored exactly",
            ],
            forget_rows,
        ),
        "Max |Δ logit| on old-only contexts by n (mean ± sd over seeds):",
        "",
        table(["arm", *(f"n = {n}" for n in ns)], baseline_rows),
        "## Reading",
        "",
        *reading(arms, method_arms, ns, runs_of, lab, reference, thresholds),
        "",
        "What this toy can and cannot show: the chain is first-order and the model tiny, so 'forgetting' is measured "
        "on held-out old-only contexts of the same chain, and a real LM's state is its whole context. The TV is "
        "measured against the exact mixture P'_j, which a new input row can only approximate through the frozen "
        "network; the frozen model's own TV on the old rows it was trained on (`transition_tv/old_tv`) shows how "
        "close that network gets to rows it has learned. n needed is read from a grid of "
        f"{len(ns)} values of n (interpolated between them), so it is coarse, and a threshold no seed reaches "
        "leaves that s out of the fit.",
        "",
    ]
    return [write_page(out, PAPER, text), png]


def setup(
    first: Run, ns: list[int], seeds: list[int], base_loss: list[float], entropy: list[float], old_tv: Any, lrs: str
) -> list[str]:
    """The setup paragraph, filled from the resolved config."""
    return [
        f"Setup: random sparse Markov chain on T = {first.get('task.num_states')} old tokens (each row a Dirichlet "
        f"draw over {first.get('task.support')} successors; chain and dictionaries drawn per seed), one character "
        f"per state. Base model: {first.get('backbone.num_hidden_layers')}-layer Llama, hidden "
        f"{first.get('backbone.hidden_size')}, trained by `+method=sft` on {first.get('demo.model.num_train')} "
        f"chain sequences for {first.get('demo.model.steps')} steps (artifact cache, one per seed): held-out "
        f"loss {fmt_stat(stat(base_loss), ci=False)} nats per completion token (EOS included) vs the chains' "
        f"entropy rates {fmt_stat(stat(entropy), ci=False)}; its TV on old rows (`transition_tv/old_tv`) "
        f"{fmt_stat(old_tv, ci=False)}. m = {first.get('task.num_new_tokens')} new tokens; token j's successor row "
        f"P'_j = Σ_i w_ji P_(D_j,i) over a dictionary of s old states ({first.get('task.dictionary_weights')} "
        f"weights). Each run trains on n ∈ {{{', '.join(map(str, ns))}}} new-token transitions (each row: a chain "
        f"prefix, the new token, its successor and the chain onwards) for {first.get('trainer.max_steps')} steps "
        f"of batch {first.get('datamodule.batch_size')} (AdamW, weight decay "
        f"{first.get('module.optimizer.weight_decay')}): the new rows only "
        f"(`module.mode={first.get('module.mode')}`), or full fine-tuning / LoRA at s = 4 "
        f"({lrs}). {len(seeds)} seed{'s' if len(seeds) != 1 else ''}.",
    ]


def fit_sentence(slope: float, half: float, k: int, ss: Sequence[int]) -> str:
    if math.isnan(slope):
        return f"Too few points inside the grid ({k}) to fit a slope."
    lo, hi = slope - half, slope + half
    if lo <= 1.0 <= hi:
        verdict = (
            "the interval contains both 1 (the paper's linear-in-s claim) and 0 (no dependence on s): not resolved"
            if lo <= 0.0
            else "consistent with the paper's linear-in-s claim (slope 1), and n needed grows with s"
        )
    else:
        verdict = (
            f"the interval excludes 1: n needed grows {'slower' if hi < 1.0 else 'faster'} than linearly in s here"
            + (" (it also contains 0)" if lo <= 0.0 <= hi else "")
        )
    return (
        f"Log-log fit of n needed on s over the {k} (s, seed) points inside the grid (s in "
        f"{{{', '.join(map(str, ss))}}}): slope {slope:.2f}, 95% CI "
        f"[{slope - half:.2f}, {slope + half:.2f}]: {verdict}."
    )


def reading(
    arms: list[str],
    method_arms: list[str],
    ns: list[int],
    runs_of: Any,
    lab: Any,
    reference: str | None,
    thresholds: list[tuple[Any, ...]],
) -> list[str]:
    notes = []
    method_runs = [r for a in method_arms for r in runs_of(a)]
    exact = sum(r.last(FORGETTING[0]) == 0.0 and r.last(FORGETTING[1]) == 0.0 for r in method_runs)
    restored = sum(all(r.last(m) == 0.0 for m in REMOVAL) for r in method_runs)
    notes.append(
        f"- New rows only: old-only contexts bit-identical (max |Δ logit| = 0 and KL = 0) in {exact} of "
        f"{len(method_runs)} runs; `remove()` restored the model exactly in {restored} of {len(method_runs)}."
    )
    for a in BASELINES:
        if a in arms:
            runs = runs_of(a)
            moved = sum(r.last(FORGETTING[0]) > 0 for r in runs)
            notes.append(f"- {lab(a)}: old-context logits moved in {moved} of {len(runs)} runs.")
    if "lora" in arms:
        notes.append(
            "- For LoRA, `remove()` drops the new rows only; the adapters stay, which is why the model is not "
            "restored. Dropping the adapters as well would restore the base: LoRA is reversible too, but it "
            "forgets while it is attached (the numbers above)."
        )
    if reference:
        for a in BASELINES:
            if a not in arms:
                continue
            for n in (ns[0], ns[-1]):
                notes.append(
                    f"- n = {n}: "
                    + contrast(
                        lab(a),
                        [r.last(TV) for r in runs_of(a, n)],
                        lab(reference),
                        [r.last(TV) for r in runs_of(reference, n)],
                        "TV to the true new rows",
                    )
                    + "."
                )
    if len(method_arms) >= 2:
        lo, hi = method_arms[0], method_arms[-1]
        notes.append(
            f"- n = {ns[-1]}: "
            + contrast(
                lab(hi),
                [r.last(TV) for r in runs_of(hi, ns[-1])],
                lab(lo),
                [r.last(TV) for r in runs_of(lo, ns[-1])],
                "TV to the true new rows",
            )
            + "."
        )
    for eps, needed, _, (slope, half, _, k), ss in thresholds:
        above = [dictionary_size(runs_of(a)[0]) for a in method_arms if all(math.isnan(v) for v in needed[a])]
        tail = (
            f" s = {', '.join(map(str, above))}: above ε at every n of the grid in every seed (n needed > {ns[-1]}), "
            "left out of the fit."
            if above
            else ""
        )
        notes.append(f"- ε = {eps}: " + fit_sentence(slope, half, k, ss) + tail)
    return notes


def plot(
    arms: list[str],
    method_arms: list[str],
    ns: list[int],
    runs_of: Any,
    lab: Any,
    thresholds: list[tuple[Any, ...]],
    path: Path,
) -> Path:
    """TV vs n per arm (mean, 95% CI over seeds), and n needed for TV < eps vs s on log-log axes with the fit, per
    threshold (points inside the n grid only)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for a in arms:
        stats = [stat(r.last(TV) for r in runs_of(a, n)) for n in ns]
        lo = [s.mean - s.lo if s.n > 1 else 0 for s in stats]
        hi = [s.hi - s.mean if s.n > 1 else 0 for s in stats]
        style = "--" if a in BASELINES else "-"
        axes[0].errorbar(ns, [s.mean for s in stats], yerr=[lo, hi], marker="o", capsize=3, ls=style, label=lab(a))
    for color, (eps, *_rest) in enumerate(thresholds):
        axes[0].axhline(eps, color=f"C{color}", lw=0.8, ls=":")
    axes[0].set(xscale="log", xlabel="n (new-token transitions)", ylabel="TV to true new rows", title="TV vs n")
    legend(axes[0], fontsize=7)
    xs = [dictionary_size(runs_of(a)[0]) for a in method_arms]
    for color, (eps, needed, _, (slope, _half, intercept, _k), ss) in enumerate(thresholds):
        points = [(x, v) for x, a in zip(xs, method_arms) for v in needed[a] if not math.isnan(v) and v > ns[0]]
        if points:
            axes[1].scatter(*zip(*points), color=f"C{color}", alpha=0.7, label=f"TV < {eps}")
        if not math.isnan(slope):
            grid = [min(ss), max(ss)]  # the s values the fit used
            axes[1].plot(
                grid, [math.exp(intercept) * g**slope for g in grid], color=f"C{color}", label=f"fit, slope {slope:.2f}"
            )
    axes[1].set(xscale="log", yscale="log", xlabel="s (dictionary size)", ylabel="n needed", title="n needed vs s")
    axes[1].set_xticks(xs, [str(x) for x in xs])
    legend(axes[1], fontsize=7)
    return save_figure(fig, path)
