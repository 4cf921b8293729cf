"""Page builder of the ROSA2 demo (arXiv 2603.01375): ``docs/results/rosa2.md`` + ``rosa2.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=rosa2`` (``conf/demo/rosa2.yaml``: arm x hint probability x seed);
page: ``python -m zoo.report demo rosa2``. Read from the sweep: each run's test metrics (``test/acc@k``,
``test/parameter_shift``, ``test/adapt_seconds``, ...), its ``conversations.jsonl`` (every turn of every conversation),
``run_info.json`` (the base policy it used, with its build metrics) and the resolved configs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from zoo.data.ambiguous_ops import OPERATIONS
from zoo.report import (
    Run,
    Sweep,
    artifact_val_loss_curves,
    artifact_values,
    decaying_schedule_caveat,
    last_change,
    legend,
    paired_contrast,
    provenance,
    pyplot,
    save_figure,
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

PAPER = "rosa2"
RECORDS = "conversations.jsonl"
ARMS = ("static", "words", "rosa", "rosa2")
HINT_KEY = "module.conversations.hint_prob"
KINDS = ("clear", "ambiguous", "both")
#: the smallest accuracy difference a claim counts
MARGIN = 0.05
#: a policy's validation loss changing by less than this share over its last epoch is at a plateau
PLATEAU = 0.05
#: effects smaller than this call for 5 seeds
SMALL_EFFECT = 0.1
#: the settings of a ROSA step; weights-only (ROSA) and ROSA2 must share them
STEP_KEYS = ("beta", "lr", "max_update_norm", "unobserved_reward", "temperature", "max_turns")


def conversations(run: Run) -> list[dict[str, Any]]:
    return run.read_jsonl(RECORDS) if run.file(RECORDS).is_file() else []


def hints(sweep: Sweep) -> list[str]:
    return sorted({r.arm.get(HINT_KEY, str(r.get(HINT_KEY))) for r in sweep.runs}, key=float)


def runs_of(sweep: Sweep, arm: str, hint: str) -> list[Run]:
    return [
        r
        for r in sweep.runs
        if r.arm.get("demo/rosa2/arm") == arm and r.arm.get(HINT_KEY, str(r.get(HINT_KEY))) == hint
    ]


def max_turns(sweep: Sweep) -> int:
    return int(sweep.runs[0].get("module.adapt.max_turns", 5))


def turns_to_success(run: Run) -> float:
    """Mean turn of the first right answer over the run's solved conversations (nan when none was solved)."""
    turns = [c["success_turn"] for c in conversations(run) if c["success_turn"] is not None]
    return sum(turns) / len(turns) if turns else math.nan


def solved_share(run: Run, kind: str) -> float:
    """Share of the run's conversations of ``kind`` answered right within the turn budget."""
    rows = [c for c in conversations(run) if c["conversation"]["kind"] == kind]
    return sum(c["success_turn"] is not None for c in rows) / len(rows) if rows else math.nan


def per_seed(runs: list[Run], fn: Any) -> dict[int, float]:
    return {r.seed: float(fn(r)) for r in runs}


def arm_table(sweep: Sweep, hint: str, labels: dict[str, str]) -> str:
    k_max = max_turns(sweep)
    rows = []
    for arm in ARMS:
        runs = runs_of(sweep, arm, hint)
        accuracy = [fmt_stat(stat(r.last(f"test/acc@{k}") for r in runs), ci=False) for k in range(1, k_max + 1)]
        rows.append(
            [
                labels.get(arm, arm),
                *accuracy,
                fmt_stat(stat(turns_to_success(r) for r in runs), digits=2, ci=False),
                fmt_stat(stat(r.last("test/parameter_shift") for r in runs), ci=False),
                fmt_stat(stat(r.last("test/weight_steps") for r in runs), digits=2, ci=False),
                fmt_stat(stat(1000 * r.last("test/adapt_seconds") for r in runs), digits=1, ci=False),
            ]
        )
    header = [
        "arm",
        *[f"acc@{k}" for k in range(1, k_max + 1)],
        "turns to success",
        "‖Δθ‖",
        "ROSA steps",
        "adapt ms",
    ]
    return table(header, rows)


def kind_table(sweep: Sweep, hint: str, labels: dict[str, str]) -> str:
    rows = []
    for arm in ARMS:
        runs = runs_of(sweep, arm, hint)
        rows.append(
            [labels.get(arm, arm), *[fmt_stat(stat(solved_share(r, k) for r in runs), ci=False) for k in KINDS]]
        )
    return table(["arm", *KINDS], rows)


def contrasts(sweep: Sweep, hint: str, labels: dict[str, str]) -> list[str]:
    """ROSA2 against each baseline it should beat, paired by seed (the arms of a seed play the same conversations)."""
    k_max = max_turns(sweep)
    accuracy = f"test/acc@{k_max}"
    comparisons = (
        ("rosa", lambda r: r.last(accuracy), f"accuracy within {k_max} turns"),
        ("words", lambda r: r.last(accuracy), f"accuracy within {k_max} turns"),
        ("rosa", lambda r: r.last("test/parameter_shift"), "the adapters' shift ‖Δθ‖"),
        (
            "words",
            lambda r: solved_share(r, "both"),
            "the solved share of conversations with both an ambiguity and a capability gap",
        ),
        ("rosa", turns_to_success, "the mean turn of the first right answer (solved conversations)"),
    )
    ours = runs_of(sweep, "rosa2", hint)
    lines = [
        paired_contrast(
            labels.get("rosa2", "rosa2"),
            per_seed(ours, fn),
            labels.get(other, other),
            per_seed(runs_of(sweep, other, hint), fn),
            what,
        )
        for other, fn, what in comparisons
    ]
    return [f"- {line}." for line in lines]


def effect(sweep: Sweep, hint: str, other: str, fn: Any) -> Stat:
    """``fn`` of ROSA2 minus ``fn`` of ``other`` at one hint probability, paired by seed (same conversations)."""
    return paired(per_seed(runs_of(sweep, "rosa2", hint), fn), per_seed(runs_of(sweep, other, hint), fn))


def claims(sweep: Sweep, labels: dict[str, str]) -> list[Claim]:
    """The paper's claims as the demo tests them (arXiv 2603.01375, abstract): adapting words and weights together
    beats adapting the words alone and the weights alone (ROSA), and the semantic pre-conditioning reduces the
    parameter shift; one line each per hint probability."""
    k_max = max_turns(sweep)
    accuracy = f"test/acc@{k_max}"
    ours = labels.get("rosa2", "ROSA2")
    found = []
    for hint in hints(sweep):
        for other in ("rosa", "words"):
            found.append(
                Claim(
                    f"words + weights beat {labels.get(other, other)} (h = {hint})",
                    f"accuracy within {k_max} turns, {ours} − {labels.get(other, other)}, paired by seed "
                    f"(margin {MARGIN})",
                    effect(sweep, hint, other, lambda r: r.last(accuracy)),
                    "higher",
                    MARGIN,
                )
            )
        found.append(
            Claim(
                f"clarifying the context first reduces the parameter shift (h = {hint})",
                f"‖Δθ‖ per conversation, {ours} − {labels.get('rosa', 'rosa')}, paired by seed",
                effect(sweep, hint, "rosa", lambda r: r.last("test/parameter_shift")),
                "lower",
            )
        )
    return found


def verdict(found: list[Claim]) -> list[str]:
    return verdict_section(
        found,
        "the paper's benchmarks (MATH, MMLU, SuperGPQA, HumanEval) with LLM policies and users, its +37.8% accuracy "
        "and -40% turns, and its theorem's minimal shift to convergence (here the shift a conversation took). The "
        "words stream is a rule over the four readings, not an LLM's textual gradient, and the ROSA step's settings "
        "are reconstructions (no official code).",
    )


def policy_plateau(sweep: Sweep) -> tuple[list[float], list[float]]:
    """The base policies' last validation loss and its relative change over their last epoch (one per distinct
    policy, read from the artifact's CSV log)."""
    curves = [c for c in artifact_val_loss_curves(sweep.runs, "demo_policy").values() if len(c) >= 2]
    return [c[-1] for c in curves], [last_change(c) for c in curves]


def fair_test(sweep: Sweep, labels: dict[str, str], found: list[Claim]) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    lab = labels.get
    lines = ["## Fair test", ""]
    parts_words, parts_rosa = [], []
    for hint in hints(sweep):
        share = {
            (arm, kind): stat(solved_share(r, kind) for r in runs_of(sweep, arm, hint)).mean
            for arm in ("words", "rosa")
            for kind in KINDS
        }
        parts_words.append(f"h = {hint}: {share['words', 'both']:.3f} vs {share['words', 'ambiguous']:.3f}")
        parts_rosa.append(f"h = {hint}: {share['rosa', 'ambiguous']:.3f} vs {share['rosa', 'clear']:.3f}")
    lines.append(
        "- **The baselines' failures can occur.** Words cannot train an operation: "
        f"{lab('words', 'words')} solves fewer *both* conversations (read wrong and under-trained) than *ambiguous* "
        f"ones (read wrong, well trained) ({'; '.join(parts_words)}). Weight steps fix a wrong reading slowly "
        "(they only push down judged answers under it): "
        f"{lab('rosa', 'rosa')} solves fewer *ambiguous* conversations than *clear* ones "
        f"({'; '.join(parts_rosa)})."
    )
    steps = "; ".join(
        f"h = {hint}: {lab('rosa2', 'rosa2')} "
        f"{stat(r.last('test/weight_steps') for r in runs_of(sweep, 'rosa2', hint)).mean:.2f}, "
        f"{lab('rosa', 'rosa')} {stat(r.last('test/weight_steps') for r in runs_of(sweep, 'rosa', hint)).mean:.2f}"
        for hint in hints(sweep)
    )
    lines.append(
        "- **The method's signal carries information the baselines lack.** ROSA2 routes each wrong answer by the "
        "decomposition (is the answer the operation as read? a hint when there is one): a wrong reading goes to the "
        "words, an answer wrong under the right reading to the weights, whose step then runs on the revised context. "
        f"ROSA steps per conversation ({steps}); the decomposition's errors are counted under the reading."
    )
    first = {arm: runs_of(sweep, arm, hints(sweep)[0])[0] for arm in ("rosa", "rosa2")}
    adapt = {arm: run.get("module.adapt", {}) or {} for arm, run in first.items()}
    differ = [k for k in STEP_KEYS if adapt["rosa"].get(k) != adapt["rosa2"].get(k)]
    if first["rosa"].get("backbone.lora") != first["rosa2"].get("backbone.lora"):
        differ.append("the LoRA adapters")
    same = ", ".join(f"{k} {adapt['rosa2'].get(k)}" for k in STEP_KEYS)
    lines.append(
        "- **Same tuning effort for every arm.** No arm is tuned: "
        + (
            f"weights only (ROSA) and ROSA2 take the same ROSA step ({same}) and the same LoRA adapters"
            if not differ
            else f"**the ROSA step differs between ROSA and ROSA2 in {', '.join(differ)}**"
        )
        + "; words only and ROSA2 use the same words rule; every arm of a seed plays the same conversations with the "
        "same policy. The step's values are reconstructions fixed before any run."
    )
    lines.append(
        "- **Chosen on a split that is not reported.** Nothing is chosen from runs (no setting is fitted), so no "
        "reported conversation informed a setting; the policy's validation rows are its own SFT split."
    )
    last, change = policy_plateau(sweep)
    if change:
        met = "met" if all(abs(c) < PLATEAU for c in change) else "not met"
        lines.append(
            f"- **Models trained to a plateau.** The base policy (one for every seed and arm; {len(change)} found): "
            f"final validation loss {fmt_stat(stat(last), ci=False)}, change over its last epoch "
            f"{100 * stat(change).mean:+.1f}% (a plateau by the loss: a change of less than {100 * PLATEAU:.0f}%: "
            f"**{met}**). The capability gap is built into its data (sub and mul rarer), not left by stopping early."
            + decaying_schedule_caveat(sweep.runs, "demo_policy", "epoch", relative=PLATEAU, whose="Its")
        )
    else:
        lines.append("- **Models trained to a plateau.** **Not measured**: the runs name no policy with a loss log.")
    seeds = len(sweep.seeds)
    lines.append(
        f"- **Seeds.** {seeds} seeds (each draws other conversations; one policy); "
        f"{seeds_note(found, seeds, SMALL_EFFECT)}."
    )
    return [*lines, ""]


def misrouted(conversation: dict[str, Any]) -> bool:
    """Whether a turn of the conversation was sent to the weights while the reading was not the user's intent (the
    prompt differs from the one naming the user's operation, whose symbol sits between the operands)."""
    info = conversation["conversation"]
    for turn in conversation["turns"]:
        read_as = turn["prompt"][len(str(info["a"])) : -len(str(info["b"])) - 1]
        if turn["capability"] and read_as != OPERATIONS[info["intent"]][0]:
            return True
    return False


def misrouting(sweep: Sweep) -> list[str]:
    """Per hint probability: how many of ROSA2's unsolved conversations had a turn routed to the weights under a
    wrong reading (the decomposition's error), read from conversations.jsonl."""
    lines = []
    for hint in hints(sweep):
        failed = [c for r in runs_of(sweep, "rosa2", hint) for c in conversations(r) if c["success_turn"] is None]
        wrong = sum(misrouted(c) for c in failed)
        lines.append(
            f"- h = {hint}: {len(failed)} of ROSA2's conversations (all seeds) were not solved; {wrong} of them had "
            "a wrong answer routed to the weights while the reading was not the user's intent."
        )
    return [
        "Decomposition errors (a wrong answer under a wrong reading of an under-trained operation is not the "
        "operation as read, so without a hint the rule sends it to the weights and the reading is not revised):",
        "",
        *lines,
        "",
    ]


def reading(sweep: Sweep, labels: dict[str, str]) -> list[str]:
    """The paper's claims next to what was measured, per hint probability (templated from the numbers)."""
    k_max = max_turns(sweep)
    accuracy = f"test/acc@{k_max}"

    def mean(arm: str, hint: str, fn: Any) -> float:
        return stat(fn(r) for r in runs_of(sweep, arm, hint)).mean

    def paired(hint: str, other: str, fn: Any) -> Any:
        ours, theirs = per_seed(runs_of(sweep, "rosa2", hint), fn), per_seed(runs_of(sweep, other, hint), fn)
        return stat(ours[k] - theirs[k] for k in ours if k in theirs)

    def verdict(d: Any, margin: float = 0.0) -> str:
        """The sentence of a paired difference, with the margin the Verdict uses."""
        if d.n < 2 or math.isnan(d.lo):
            return "not measurable (fewer than two seeds)"
        if d.lo > margin:
            return "higher (shown)"
        if d.hi < -margin:
            return "lower (shown)"
        if d.lo > 0 or d.hi < 0:
            return (
                f"{'higher' if d.lo > 0 else 'lower'}, but the interval reaches inside the {margin} margin the "
                "Verdict uses (not shown)"
            )
        return "not shown (the interval contains 0)"

    lines = []
    for hint in hints(sweep):
        acc = {a: mean(a, hint, lambda r: r.last(accuracy)) for a in ARMS}
        shift = {a: mean(a, hint, lambda r: r.last("test/parameter_shift")) for a in ("rosa", "rosa2")}
        ambiguous = {a: mean(a, hint, lambda r: solved_share(r, "ambiguous")) for a in ("words", "rosa2")}
        lines.append(
            f"- h = {hint}: accuracy within {k_max} turns {acc['rosa2']:.3f} with ROSA2 against "
            f"{acc['rosa']:.3f} (ROSA), {acc['words']:.3f} (words only), {acc['static']:.3f} (static); against ROSA "
            f"{verdict(paired(hint, 'rosa', lambda r: r.last(accuracy)), MARGIN)}, against words only "
            f"{verdict(paired(hint, 'words', lambda r: r.last(accuracy)), MARGIN)}. "
            f"‖Δθ‖ {shift['rosa2']:.3f} with ROSA2 against {shift['rosa']:.3f} with ROSA: "
            f"{verdict(paired(hint, 'rosa', lambda r: r.last('test/parameter_shift')))}. Ambiguous-only "
            f"conversations solved: {ambiguous['rosa2']:.3f} with ROSA2, {ambiguous['words']:.3f} with words only."
        )
    return [
        "## Reading: the paper's claims next to the measurements",
        "",
        "Claims: ROSA2 needs fewer turns / reaches higher accuracy than static, prompt-only (words only) and "
        "weights-only (ROSA) adaptation; co-adaptation reduces the parameter shift ‖Δθ‖. Measured (paired by seed):",
        "",
        *lines,
        "",
        *misrouting(sweep),
        "The shift ‖Δθ‖ here is the shift a conversation actually took (fewer ROSA steps when the words fix the "
        "reading), not the minimal shift to convergence of the paper's theorem.",
        "",
    ]


def plot(sweep: Sweep, labels: dict[str, str], path: Path) -> Path:
    plt = pyplot()
    levels = hints(sweep)
    k_max = max_turns(sweep)
    fig, axes = plt.subplots(1, len(levels), figsize=(4.2 * len(levels), 3.4), squeeze=False, sharey=True)
    for ax, hint in zip(axes[0], levels, strict=True):
        for arm in ARMS:
            runs = runs_of(sweep, arm, hint)
            stats = [stat(r.last(f"test/acc@{k}") for r in runs) for k in range(1, k_max + 1)]
            ks = list(range(1, k_max + 1))
            ax.plot(ks, [s.mean for s in stats], marker="o", label=labels.get(arm, arm))
            ax.fill_between(ks, [s.lo for s in stats], [s.hi for s in stats], alpha=0.15)
        ax.set_title(f"hint probability h = {hint}")
        ax.set_xlabel("turn k")
        ax.set_xticks(range(1, k_max + 1))
    axes[0][0].set_ylabel("solved within k turns")
    legend(axes[0][-1], fontsize=8, loc="lower right")
    return save_figure(fig, path)


def build(sweep: Sweep, out: Path) -> list[Path]:
    labels = sweep.runs[0].get("demo.labels", {}) or {}
    first = sweep.runs[0]
    png = plot(sweep, labels, out / f"{PAPER}.png")
    found = claims(sweep, labels)
    policy = artifact_values(sweep.runs, "demo_policy", "val/exact_match")
    per_run = int(first.get("datamodule.episodes", 0))
    adapt = first.get("module.adapt", {}) or {}
    lora = first.get("backbone.lora", {}) or {}
    weights = ", ".join(f"{k} {v:g}" for k, v in (first.get("task.intent_weights", {}) or {}).items())
    text = [
        "# ROSA2 demo: words + weights test-time adaptation on AmbiguousOps",
        "",
        provenance(sweep, PAPER),
        "",
        "**The paper's claim** (arXiv:2603.01375, abstract): decomposing in-conversation feedback into intent "
        "ambiguity (fixed in words) and capability gap (fixed in weights) reaches right answers in fewer turns than "
        "static, prompt-only and weights-only (ROSA) adaptation, and co-adaptation reduces the parameter shift ‖Δθ‖ "
        "needed.",
        "",
        "## Setup",
        "",
        "- Policy: one 2-layer Llama (hidden 64) trained by `+method=sft task=ambiguous_ops` through the artifact "
        f"cache (greedy validation exact match at the end of its SFT: {fmt_stat(stat(policy), ci=False)}, "
        f"{len(policy)} policy); intents' relative frequency in its data: {weights}, the others 1 (the rarer ones "
        "are the capability gap).",
        f"- Conversations: {per_run} per run, users' intents uniform over add, sub, mul, max; the instruction is read "
        "as add until the words stream revises it. Kinds: *clear* (add: read right, well trained), *ambiguous* (max: "
        "read wrong, well trained), *both* (sub, mul: read wrong and under-trained). "
        f"Seeds {sweep.seeds} draw different conversations (same policy).",
        f"- ROSA step [reconstruction]: β {adapt.get('beta')}, lr {adapt.get('lr')}, update capped at L2 norm "
        f"{adapt.get('max_update_norm')}, unjudged answers' reward {adapt.get('unobserved_reward')}; LoRA r "
        f"{lora.get('r')}, α {lora.get('alpha')} on {', '.join(lora.get('target_modules', []))}. Greedy answers "
        f"(temperature {adapt.get('temperature')}), at most {adapt.get('max_turns')} turns.",
        "- acc@k: share of conversations answered right within k turns (mean ± sd over seeds); turns to success: mean "
        "turn of the first right answer among solved conversations; ‖Δθ‖: L2 distance of the adapters from their "
        "initial values at the end of a conversation (mean over conversations); adapt ms: wall time of the words and "
        "weights updates per conversation (shared, loaded machine).",
        "",
        *fair_test(sweep, labels, found),
    ]
    for hint in hints(sweep):
        text += [
            f"## Hint probability h = {hint}",
            "",
            arm_table(sweep, hint, labels),
            "",
            "Solved within the turn budget, by kind of conversation:",
            "",
            kind_table(sweep, hint, labels),
            "",
            *contrasts(sweep, hint, labels),
            "",
        ]
    text += [
        *reading(sweep, labels),
        f"![solved within k turns, per arm and hint probability]({png.name})",
        "",
        "## What this toy can and cannot show",
        "",
        "- It shows the mechanism on a world built to hold both error kinds: a wrong reading is cheap to fix in words "
        "and slow to fix by weight steps (which only push down judged answers under the wrong reading), and words "
        "cannot train an under-trained operation. Whether ROSA2's routing helps depends on the decomposition being "
        "right; without hints (h = 0) the rule can only use whether the answer is the operation as read.",
        "- It does not reproduce the paper's benchmarks (MATH, MMLU, SuperGPQA, HumanEval) nor its numbers; the step "
        "size, β and the decomposition rule are reconstructions, and the words stream is a rule rather than an LLM.",
        "- ‖Δθ‖ counts only the conversations' own steps; an arm that never steps (static, words only) has 0.",
    ]
    return [write_page(out, PAPER, text, verdict(found)), png]
