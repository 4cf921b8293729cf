"""Page builder of the DRIFT demo (arXiv 2605.31455): ``docs/results/drift.md`` + ``drift.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=drift`` (``conf/demo/drift.yaml``: arm x seed); page:
``python -m zoo.report demo drift``. Read from the sweep: the multi-turn evaluation of every validation
(``val/[sampled_]multi@k``, ``val/[sampled_]mean_turns_to_solve`` of :class:`~zoo.callbacks.MultiTurnEvaluation`), the
training clock (``clock/train_seconds``, ``clock/tokens_generated`` of :class:`~zoo.callbacks.TrainingClock`), the
statistics of the reference rollouts the offline arms used (``run_info.json`` -> artifacts ``drift_rollouts``:
``rollouts/seconds``, ``rollouts/tokens``, ``rollouts/turn1_accuracy``, ``rollouts/solved``) and the resolved configs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from zoo.report import (
    Run,
    Sweep,
    contrast,
    fmt,
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
)

PAPER = "drift"
ARMS = ("reference", "uniform_sft", "rft", "drift", "grpo")
OFFLINE = ("uniform_sft", "rft", "drift")
ROLLOUTS = "drift_rollouts"


def rollout_metrics(run: Run) -> dict[str, float]:
    """The build metrics of the reference rollouts an offline run trained on (empty for the other arms)."""
    for used in run.info.get("artifacts", []):
        if used.get("kind") == ROLLOUTS:
            return {k: float(v) for k, v in (used.get("metrics") or {}).items()}
    return {}


def points(run: Run, metric: str) -> list[tuple[float, float, float]]:
    """``(training seconds, tokens generated, metric)`` at every validation of a run; an offline run's collection
    (seconds and tokens of its reference rollouts) is added, since it needs them; pi_ref (no training) is one point at
    zero cost."""
    values = dict(run.series(metric))
    seconds, tokens = dict(run.series("clock/train_seconds")), dict(run.series("clock/tokens_generated"))
    collect = rollout_metrics(run)
    offset_s, offset_t = collect.get("rollouts/seconds", 0.0), collect.get("rollouts/tokens", 0.0)
    if not seconds:  # evaluated only (stage=validate)
        return [(0.0, 0.0, values[s]) for s in sorted(values)[-1:]]
    return [(offset_s + seconds[s], offset_t + tokens.get(s, 0.0), values[s]) for s in sorted(values) if s in seconds]


def cost_to_final(run: Run, metric: str) -> tuple[float, float]:
    """Seconds and tokens (collection included) at the first validation whose ``metric`` reached the run's final
    value."""
    curve = points(run, metric)
    if not curve:
        return math.nan, math.nan
    final = curve[-1][2]
    seconds, tokens, _ = next(p for p in curve if p[2] >= final)
    return seconds, tokens


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}
    key = next(k for k in sweep.swept if k.endswith("arm"))
    by_arm = {a: [r for r in sweep.runs if r.arm.get(key) == a] for a in ARMS}
    by_arm = {a: runs for a, runs in by_arm.items() if runs}
    turns = int(first.get("multiturn.max_turns", 3))
    multi = f"multi@{turns}"
    sampled, greedy = f"val/sampled_{multi}", f"val/{multi}"
    offline = next((runs[0] for a in ("drift", *OFFLINE) for runs in [by_arm.get(a)] if runs), None)
    online = by_arm.get("grpo", [None])[0]

    # the reference rollouts (one per seed, shared by the offline arms)
    reference = {}
    for runs in (by_arm.get(a, []) for a in OFFLINE):
        for r in runs:
            reference.setdefault(r.seed, rollout_metrics(r))
    ref_values = [m for m in reference.values() if m]

    rows = []
    for arm, runs in by_arm.items():
        costs = [cost_to_final(r, sampled) for r in runs]
        rows.append(
            [
                labels.get(arm, arm),
                fmt_stat(stat(r.last("val/sampled_multi@1") for r in runs)),
                fmt_stat(stat(r.last(sampled) for r in runs)),
                fmt_stat(stat(r.last("val/sampled_mean_turns_to_solve") for r in runs), 2, ci=False),
                fmt_stat(stat(r.last("val/multi@1") for r in runs), ci=False),
                fmt_stat(stat(r.last(greedy) for r in runs), ci=False),
                fmt_stat(stat(c[0] for c in costs), 0, ci=False),
                fmt_stat(stat(c[1] for c in costs), 0, ci=False),
            ]
        )

    built = reference_build_minutes(first)
    setup = [
        f"Setup: retry-with-feedback addition (`task=addition`, up to {turns} turns, feedback "
        f'"{first.get("multiturn.incorrect_message")}"), the tiny Llama. Reference policy pi_ref, one for every arm '
        f"and seed (artifact cache): SFT on {first.get('demo.reference.episodes')} episodes of a synthetic policy that "
        "is right with probability 0.4 at each turn and otherwise proposes a wrong candidate it has not proposed "
        f"before, every assistant turn trained, {first.get('demo.reference.epochs')} epochs"
        + (f" (built in {built:.0f} min, not part of any arm's cost)." if not math.isnan(built) else "."),
    ]
    if offline is not None:
        setup.append(
            f"Offline arms: {offline.get('datamodule.source.collect.n_traj')} trajectories for each of "
            f"{offline.get('datamodule.source.collect.num_prompts')} training prompts sampled once from pi_ref "
            f"(temperature 1; one file per seed, shared by the three arms), then {offline.get('trainer.max_epochs')} "
            f"epoch(s) of SFT on the last assistant turns (batch {offline.get('datamodule.batch_size')}, lr "
            f"{offline.get('module.optimizer.lr')}), weighted uniformly, on successes only (RFT), or by DRIFT's "
            f"per-prompt exp(R/beta) (beta {offline.get('datamodule.source.weighting.beta')}, gamma "
            f"{offline.get('datamodule.source.weighting.gamma')})."
        )
    if online is not None:
        setup.append(
            f"Online multi-turn GRPO: {online.get('trainer.max_steps')} rollout steps of "
            f"{online.get('datamodule.batch_size')} prompts x {online.get('module.group_size')} episodes from the "
            f"current policy, reward = the discounted return, lr {online.get('module.optimizer.lr')}."
        )
    setup.append(
        f"Evaluation: the same {first.get('demo.num_val')} "
        f"held-out problems for every arm, {first.get('callbacks.multiturn_sampled.samples')} sampled episodes per "
        "problem (temperature 1) and one greedy episode; multi@k = solved within k turns, mean turns over the solved "
        f"episodes. Cost = training wall-clock (validation excluded) + the collection for the offline arms, up to the "
        f"first validation that reached the run's final sampled {multi}; tokens = tokens generated for training "
        "(collection or online rollouts). Cells: mean ± sd over seeds [95% confidence interval, Student t]."
    )

    text = [
        "# DRIFT demo: offline importance-weighted SFT vs uniform SFT, RFT and online multi-turn GRPO (toy scale)",
        "",
        "Paper: *DRIFT: Decoupled Rollouts and Importance-Weighted Fine-Tuning* (arXiv:2605.31455). Claim: weighted "
        "SFT on offline rollouts of a fixed reference policy (w = exp(R/beta) per prompt) matches multi-turn online "
        "RL at the cost of SFT, while plain offline SFT does not improve. Built through the demo path "
        "(`conf/demo/drift.yaml`, page builder `demos/drift.py`).",
        "",
        provenance(sweep, PAPER),
        "",
        " ".join(setup),
        "",
    ]
    if ref_values:
        text += [
            f"Reference rollouts (temperature 1, {len(ref_values)} seed{'s' if len(ref_values) != 1 else ''}): "
            f"solved at turn 1 {fmt_stat(stat(m['rollouts/turn1_accuracy'] for m in ref_values), ci=False)}, within "
            f"{turns} turns {fmt_stat(stat(m['rollouts/solved'] for m in ref_values), ci=False)}; collection "
            f"{fmt_stat(stat(m.get('rollouts/seconds', math.nan) for m in ref_values), 0, ci=False)} s, "
            f"{fmt_stat(stat(m.get('rollouts/tokens', math.nan) for m in ref_values), 0, ci=False)} tokens.",
            "",
            *reference_remark(by_arm, ref_values),
        ]
    text += [
        "## Final evaluation and cost",
        "",
        table(
            [
                "arm",
                "sampled multi@1",
                f"sampled {multi}",
                "sampled mean turns to solve",
                "greedy multi@1",
                f"greedy {multi}",
                f"seconds to final sampled {multi}",
                "tokens generated",
            ],
            rows,
        ),
        "",
        "## Reading",
        "",
        *reading(by_arm, labels, sampled, greedy, multi),
        "",
        *limits(sweep, by_arm),
        "",
    ]
    png = plot(by_arm, labels, sampled, out / f"{PAPER}.png")
    text += [f"![sampled {multi} against cost]({png.name})", ""]
    return [write_page(out, PAPER, text), png]


def limits(sweep: Sweep, by_arm: dict[str, list[Run]]) -> list[str]:
    """What the toy can and cannot show, with pi_ref's own numbers."""
    ref = by_arm.get("reference", [])
    jobs = ((sweep.multirun.get("hydra") or {}).get("launcher") or {}).get("n_jobs") or 1
    greedy = stat(r.last("val/multi@1") for r in ref)
    sampled = stat(r.last("val/sampled_multi@1") for r in ref)
    return [
        "What this toy can and cannot show: the sampled columns measure the policy's distribution, which the offline "
        "arms are trained to move (temperature 1, as the rollouts); the greedy columns its mode (the released "
        f"evaluation). pi_ref's turn-1 accuracy is {fmt_stat(greedy, ci=False)} greedy and "
        f"{fmt_stat(sampled, ci=False)} sampled. Wall-clock is measured on a shared, loaded CPU with {jobs} run(s) at "
        "a time (see the load above): compare costs within a seed rather than absolute seconds. One small reference "
        f"policy, {len(ref)} seeds, few prompts and few steps per arm: the page shows what each arm did at this scale, "
        "not the "
        "paper's numbers.",
    ]


def reference_build_minutes(run: Run) -> float:
    """Build time of the reference policy a run started from (its artifact's ``build_seconds``), in minutes."""
    for used in run.info.get("artifacts", []):
        meta = Path(used.get("path", "")) / "artifact.json"
        if used.get("kind") == "demo_policy" and meta.is_file():
            return float(json.loads(meta.read_text()).get("build_seconds", math.nan)) / 60
    return math.nan


def groups_with_a_success(run: Run) -> float:
    """Fraction of the prompts of an offline run's rollout file with at least one successful trajectory."""
    for used in run.info.get("artifacts", []):
        path = Path(used.get("path", "")) / "rollouts.jsonl"
        if used.get("kind") == ROLLOUTS and path.is_file():
            solved: dict[str, bool] = {}
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if "prompt_id" in row:
                    solved[row["prompt_id"]] = solved.get(row["prompt_id"], False) or row.get("t_star") is not None
            return sum(solved.values()) / len(solved) if solved else math.nan
    return math.nan


def reference_remark(by_arm: dict[str, list[Run]], ref_values: list[dict[str, float]]) -> list[str]:
    """How the collected reference compares with the intended one (~40% at turn 1), and what that leaves to learn."""
    turn1 = stat(m["rollouts/turn1_accuracy"] for m in ref_values)
    if not ref_values or turn1.mean >= 0.25:
        return []
    groups = stat(groups_with_a_success(r) for r in by_arm.get("drift", []))
    parts = [
        f"The intended reference solves about 40% at turn 1; this one solves {turn1.mean:.3f} of its sampled "
        "rollouts at turn 1, so every arm learns from few successes"
    ]
    if not math.isnan(groups.mean):
        parts.append(
            f"{groups.mean:.2f} of the prompts have a successful trajectory (RFT's rows; DRIFT's weights are uniform "
            "within the other groups)"
        )
    return ["; ".join(parts) + ".", ""]


def reading(by_arm: dict[str, list[Run]], labels: dict[str, str], sampled: str, greedy: str, multi: str) -> list[str]:
    """Templated contrasts (Welch 95% intervals; "not shown" when the interval contains 0)."""

    def last(arm: str, metric: str) -> list[float]:
        return [r.last(metric) for r in by_arm.get(arm, [])]

    def compare(arm: str, other: str, metric: str, what: str) -> None:
        if arm in by_arm and other in by_arm:
            lines.append(
                "- "
                + contrast(labels.get(arm, arm), last(arm, metric), labels.get(other, other), last(other, metric), what)
                + "."
            )

    lines: list[str] = []
    for other in ("reference", "uniform_sft", "rft", "grpo"):
        compare("drift", other, sampled, f"Sampled {multi}")
    compare("uniform_sft", "reference", sampled, f"Sampled {multi}")
    # where the weighting acts: how early an episode is solved (sampled turn-1 accuracy)
    for other in ("reference", "uniform_sft", "rft", "grpo"):
        compare("drift", other, "val/sampled_multi@1", "Sampled multi@1")
    if "drift" in by_arm and "grpo" in by_arm:
        drift = {r.seed: cost_to_final(r, sampled) for r in by_arm["drift"]}
        grpo = {r.seed: cost_to_final(r, sampled) for r in by_arm["grpo"]}
        common = sorted(set(drift) & set(grpo))
        seconds = [grpo[s][0] / drift[s][0] for s in common if drift[s][0] > 0]
        tokens = [grpo[s][1] / drift[s][1] for s in common if drift[s][1] > 0]
        if seconds:
            lines.append(
                f"- Cost to each arm's own final sampled {multi}, GRPO / DRIFT within a seed: wall-clock "
                f"{fmt_stat(stat(seconds), 2, ci=False)}, tokens generated {fmt_stat(stat(tokens), 2, ci=False)} "
                f"(per seed: {', '.join(fmt(v, 3) for v in seconds)}); the two arms end at different {multi}, see the "
                "table."
            )
    return lines


def plot(by_arm: dict[str, list[Run]], labels: dict[str, str], metric: str, path: Path) -> Path:
    """Sampled multi@K at every validation against the cost so far (seconds, collection included), one line per
    run."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (arm, runs) in enumerate(by_arm.items()):
        for j, run in enumerate(runs):
            curve = points(run, metric)
            xs, ys = [p[0] for p in curve], [p[2] for p in curve]
            ax.plot(
                xs, ys, marker="o", ms=3, color=colors[i % len(colors)], label=labels.get(arm, arm) if j == 0 else None
            )
    ax.set_xlabel("seconds (training + collection)")
    ax.set_ylabel(metric)
    legend(ax, fontsize=7)
    return save_figure(fig, path)
