"""Page builder of the UltraHorizon demo (arXiv 2509.21766): ``docs/results/ultrahorizon.md`` + ``ultrahorizon.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=ultrahorizon`` (``conf/demo/ultrahorizon.yaml``: env ×
difficulty × agent arm × seed); page: ``python -m zoo.report demo ultrahorizon``. Read from the sweep: the episode
module's ``test/score``, ``test/tool_calls``, ``test/failed_steps``, ``test/committed``, ``test/tokens`` and each
run's ``trajectories.jsonl`` (per-episode windowed action entropy, error tags, steps), and the resolved configs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from _agent_pages import cannot_act, endpoint_section, left_out_paragraph, llm_arm_measured

from zoo.agents.metrics import mean_curve
from zoo.report import (
    Run,
    Sweep,
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
)

PAPER = "ultrahorizon"
ENV_KEY = "env"
DIFFICULTY_KEY = "env.difficulty"
ARM_KEY = "demo/ultrahorizon/arm"
TRAJECTORIES = "trajectories.jsonl"
LLM_ARM = "llm_tiny"
SFT_ARM = "llm_sft"
LLM_ARMS = ("llm_tiny", "llm_sft", "llm_endpoint")


def episodes(run: Run) -> list[dict[str, Any]]:
    """The run's per-episode trajectories (empty when the file is missing)."""
    return run.read_jsonl(TRAJECTORIES) if run.file(TRAJECTORIES).is_file() else []


def build(sweep: Sweep, out: Path) -> list[Path]:
    first = sweep.runs[0]
    labels = first.get("demo.labels", {}) or {}

    def lab(name: str | None) -> str:
        return labels.get(name, name) if name else "all"

    def values(key: str) -> list[str]:
        return list(dict.fromkeys(r.arm.get(key) for r in sweep.runs if r.arm.get(key) is not None)) or [None]

    envs, difficulties, swept = values(ENV_KEY), values(DIFFICULTY_KEY), values(ARM_KEY)

    def runs_of(env: str | None, difficulty: str | None, arm: str | None) -> list[Run]:
        return [
            r
            for r in sweep.runs
            if (env is None or r.arm.get(ENV_KEY) == env)
            and (difficulty is None or r.arm.get(DIFFICULTY_KEY) == difficulty)
            and (arm is None or r.arm.get(ARM_KEY) == arm)
        ]

    # an LLM arm none of whose replies parsed as a tool call leaves the score tables (its 0 measures the format only)
    left_out = {
        arm: why
        for arm in swept
        if arm in LLM_ARMS and (why := cannot_act([e for r in runs_of(None, None, arm) for e in episodes(r)]))
    }
    arms = [arm for arm in swept if arm not in left_out]

    def cell(runs: list[Run], metric: str, digits: int = 3, ci: bool = True) -> str:
        return fmt_stat(stat(r.last(metric) for r in runs), digits, ci=ci)

    seeds = sweep.seeds
    sections: list[str] = []
    for env in envs:
        rows = []
        for arm in arms:
            row = [lab(arm)]
            for difficulty in difficulties:
                runs = runs_of(env, difficulty, arm)
                row += [cell(runs, "test/score"), cell(runs, "test/tool_calls", 1, ci=False)]
            rows.append(row)
        header = ["agent"]
        for difficulty in difficulties:
            header += [f"{difficulty}: score", f"{difficulty}: tool calls"]
        sections += [f"### {lab(env)}", "", table(header, rows)]
        sections += [f"- {line}" for line in env_contrasts(env, difficulties, arms, runs_of, lab)]
        if len(difficulties) > 1 and same_across_difficulties(env, difficulties, arms, runs_of):
            sections.append(
                f"- Every agent scored the same on {' and '.join(map(str, difficulties))}, seed by seed: the "
                "difficulty knob does not change this environment (as in the official code)."
            )
        sections.append("")

    sections += left_out_paragraph(left_out, lab)

    detail_rows = []
    for arm in swept:
        runs = runs_of(None, None, arm)
        eps = [e for r in runs for e in episodes(r)]
        steps = sum(len(e.get("steps", [])) for e in eps)
        failed = sum(int(e.get("failed_steps", 0)) for e in eps)
        tags = Counter(t for e in eps for t in e.get("tags", []))
        detail_rows.append(
            [
                lab(arm),
                len(eps),
                f"{sum(bool(e.get('committed')) for e in eps) / max(len(eps), 1):.3f}",
                f"{failed / max(steps, 1):.3f}",
                f"{stat(r.last('test/tokens') for r in runs).mean:.0f}",
                f"{sum(e.get('refreshes', 0) for e in eps) / max(len(eps), 1):.1f}",
                ", ".join(f"{t} {c}" for t, c in tags.most_common()) or "none",
            ]
        )
    entropy_rows = []
    for arm in swept:
        row = [lab(arm)]
        for difficulty in difficulties:
            curves = [e.get("entropy", []) for r in runs_of(None, difficulty, arm) for e in episodes(r)]
            curve = mean_curve([c for c in curves if c])
            row.append(f"{curve[0]:.2f} → {curve[-1]:.2f} ({len(curve)} windows)" if curve else "n/a")
        entropy_rows.append(row)

    png = plot(envs, difficulties, arms, runs_of, lab, out / f"{PAPER}.png")
    window = first.get("module.entropy_window")
    llm_runs = runs_of(None, None, LLM_ARM)
    text = [
        "# UltraHorizon demo: scripted agents and a tiny local LM on the three long-horizon environments",
        "",
        "Paper: *UltraHorizon: Benchmarking Agent Capabilities in Ultra Long-Horizon Scenarios* (arXiv 2509.21766). "
        "Built through the demo path (`conf/demo/ultrahorizon.yaml`, page builder `demos/ultrahorizon.py`). The "
        "environments are rule replicas of the official code; the agents are the zoo's scripted agents, not the "
        "paper's LLMs, so this page checks the environments, the harness and the metrics, not the paper's numbers.",
        "",
        provenance(sweep, PAPER),
        "",
        f"Setup: {len(envs)} environments × {len(difficulties)} difficulties × {len(swept)} agents × "
        f"{len(seeds)} seeds; each run plays {first.get('datamodule.episodes')} episodes (seeds derived from "
        f"(seed, episode)), required steps {first.get('env.required_steps')} per episode before a commit is "
        f"accepted. Score = the deterministic rubric with the official point weights, in [0, 1], mean per run; "
        f"cells are mean ± sd over seeds [95% CI]. CRNR arm: context window {first.get('demo.crnr_window')} "
        f"messages. Windowed action entropy: bits of the (tool, arguments) distribution in windows of {window} "
        "steps.",
        "",
        "## Scores and tool calls",
        "",
        *sections,
        "## Per agent: commits, failed steps, tokens, context refreshes, error tags (all envs and difficulties)",
        "",
        table(
            [
                "agent",
                "episodes",
                "committed",
                "failed steps / steps",
                "tokens per episode",
                "CRNR refreshes per episode",
                "error tags (episodes)",
            ],
            detail_rows,
        ),
        "## The locking curve: windowed action entropy",
        "",
        "Mean over all episodes of the arm (each window averaged over the episodes that reach it), first window → "
        "last window:",
        "",
        table(["agent", *(f"{d} (all environments)" for d in difficulties)], entropy_rows),
        f"![scores and action entropy]({png.name})",
        "",
        "## The tiny local LM through the LLM agent path",
        "",
        *llm_section(llm_runs, first, lab),
        "",
        "## A tiny LM behaviour-cloned from hypothesis elimination (`+method=agent_sft`)",
        "",
        *sft_section(envs, difficulties, runs_of, lab),
        "",
        *endpoint_section(
            PAPER, "llm_endpoint", "demo.llm.max_steps=null demo.llm.max_tokens=1024 demo.llm.episodes=4"
        ),
        "",
        "## Reading",
        "",
        *reading(arms, runs_of, lab),
        "",
    ]
    return [write_page(out, PAPER, text), png]


def same_across_difficulties(env: str | None, difficulties: list[Any], arms: list[str], runs_of: Any) -> bool:
    """Whether every arm's per-seed scores are identical at every difficulty."""

    def scores(difficulty: Any, arm: str) -> list[tuple[Any, float]]:
        return sorted((r.seed, r.last("test/score")) for r in runs_of(env, difficulty, arm))

    return all(len({tuple(scores(d, arm)) for d in difficulties}) == 1 for arm in arms)


def env_contrasts(env: str | None, difficulties: list[Any], arms: list[str], runs_of: Any, lab: Any) -> list[str]:
    """Hypothesis elimination against random and early commit, and CRNR against no refresh, per difficulty."""
    pairs = [
        ("hypothesis_elimination", "random"),
        ("hypothesis_elimination", "early_commit"),
        ("he_crnr", "hypothesis_elimination"),
    ]
    lines = []
    for difficulty in difficulties:
        for a, b in pairs:
            if a in arms and b in arms:
                scores_a = [r.last("test/score") for r in runs_of(env, difficulty, a)]
                scores_b = [r.last("test/score") for r in runs_of(env, difficulty, b)]
                lines.append(f"{difficulty}: " + contrast(lab(a), scores_a, lab(b), scores_b, "Score") + ".")
    return lines


def llm_section(runs: list[Run], first: Run, lab: Any) -> list[str]:
    if not runs:
        return ["Not in this sweep."]
    eps = [e for r in runs for e in episodes(r)]
    r0 = runs[0]
    return [
        f"Agent `{r0.get('agent._target_')}` with backend `{r0.get('backend._target_')}` on a tiny Llama trained by "
        f"`+method=sft` on 2-digit addition for {first.get('demo.llm.model_steps')} steps (artifact cache): no chat "
        f"or tool-call training. CPU budget: at most {r0.get('module.max_steps')} steps per episode, "
        f"{r0.get('backend.max_tokens')} new tokens per reply, {r0.get('datamodule.episodes')} episode per run, "
        "greedy decoding. So it cannot reach the required steps before a commit: a score of 0 is expected.",
        "",
        llm_arm_measured(runs, eps, f"score {fmt_stat(stat(r.last('test/score') for r in runs))}"),
    ]


def sft_section(envs: list[Any], difficulties: list[Any], runs_of: Any, lab: Any) -> list[str]:
    """The behaviour-cloned arm: how its model was trained, its harness, and its score per setting next to its teacher
    under the same CRNR window (he_crnr) and the random floor."""
    runs = runs_of(None, None, SFT_ARM)
    if not runs:
        return ["Not in this sweep."]
    r0 = runs[0]
    eps = [e for r in runs for e in episodes(r)]
    rows = []
    for env in envs:
        for difficulty in difficulties:
            row = [f"{lab(env)} ({difficulty})"]
            for arm in (SFT_ARM, "he_crnr", "random"):
                row.append(fmt_stat(stat(r.last("test/score") for r in runs_of(env, difficulty, arm))))
            sft_eps = [e for r in runs_of(env, difficulty, SFT_ARM) for e in episodes(r)]
            steps = [s for e in sft_eps for s in e.get("steps", [])]
            row.append(f"{sum(s.get('tool') is not None for s in steps)} of {len(steps)}")
            rows.append(row)
    why = cannot_act(eps)
    cap, required = r0.get("module.max_steps"), r0.get("env.required_steps")
    return [
        f"Agent `{r0.get('agent._target_')}` with backend `{r0.get('backend._target_')}` on a tiny Llama (character "
        f"tokens, {r0.get('demo.sft.model_steps')} SFT steps) trained by `+method=agent_sft` (artifact cache, one "
        "model per environment and difficulty) on the episodes of hypothesis elimination played through this arm's own "
        f"chat (teacher episodes: {r0.get('demo.sft.train_episodes')}), CRNR window {r0.get('module.crnr_window')} "
        "messages, the Python tool listed, the loss on the replies only (`<tool_call>{...}</tool_call>`). Its context "
        "holds 8192 tokens: the system prompt with its tools (3.9k-6.6k characters) and a window of turns; training "
        "keeps only the requests the evaluation shows the model unchanged (prompt beside a "
        f"{r0.get('backend.max_tokens')}-token reply budget), and at evaluation a longer chat loses its oldest turns "
        "(Alien Genetics Lab's cross results, about 4k characters each, overflow the context after the first). "
        f"Evaluation: greedy, at most {cap} steps per episode ({cap / required:g} × the {required} required steps; "
        "the environment's own cap, 4 × (8 × on bio), costs too much CPU for this model), "
        f"{r0.get('datamodule.episodes')} episode per run. Mystery Grid and Sequence Exploration have one "
        "fixed instance per difficulty (as the official code), so the training worlds are the evaluated worlds: this "
        "measures whether the model reproduces its teacher from the chat, not generalisation to new worlds.",
        "",
        table(["setting", lab(SFT_ARM), lab("he_crnr"), lab("random"), "steps with a parsed tool call"], rows),
        llm_arm_measured(runs, eps, f"score {fmt_stat(stat(r.last('test/score') for r in runs))}"),
        "",
        f"It cannot act: {why}; it is left out of the score tables." if why else "",
    ]


def reading(arms: list[str], runs_of: Any, lab: Any) -> list[str]:
    notes = []
    for arm in arms:
        notes.append(
            f"- {lab(arm)}: mean score {stat(r.last('test/score') for r in runs_of(None, None, arm)).mean:.3f}"
        )
    if "hypothesis_elimination" in arms and "random" in arms:
        notes.append(
            "- Over all environments and difficulties (per-run means): "
            + contrast(
                lab("hypothesis_elimination"),
                [r.last("test/score") for r in runs_of(None, None, "hypothesis_elimination")],
                lab("random"),
                [r.last("test/score") for r in runs_of(None, None, "random")],
                "Score",
            )
            + "."
        )
    if "hypothesis_elimination" in arms:
        he = stat(r.last("test/score") for r in runs_of(None, None, "hypothesis_elimination")).mean
        notes.append(
            f"- The scripted hypothesis-elimination agent (it sees only observations and searches a declared rule "
            f"library that contains the true rules) scores {he:.3f} on average: how far disciplined elimination gets "
            "from the tool outputs within the budget, not how an LLM explores. Early commit is the scripted form of "
            "in-context locking (it stops exploring after its first consistent hypothesis)."
        )
    return notes


def plot(envs: list[Any], difficulties: list[Any], arms: list[str], runs_of: Any, lab: Any, path: Path) -> Path:
    """Top row: score per agent (mean, 95% CI over seeds) per env and difficulty; bottom row: the mean windowed
    action entropy over the episode (hard difficulty, or the last one swept)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, len(envs), figsize=(4.8 * len(envs), 7), squeeze=False)
    width = 0.8 / max(len(arms), 1)
    difficulty = "hard" if "hard" in difficulties else difficulties[-1]
    for col, env in enumerate(envs):
        ax = axes[0][col]
        for i, arm in enumerate(arms):
            stats = [stat(r.last("test/score") for r in runs_of(env, d, arm)) for d in difficulties]
            xs = [j + i * width for j in range(len(difficulties))]
            err = [[s.mean - s.lo if s.n > 1 else 0 for s in stats], [s.hi - s.mean if s.n > 1 else 0 for s in stats]]
            ax.bar(xs, [s.mean for s in stats], width, yerr=err, capsize=2, label=lab(arm))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(difficulties))], [str(d) for d in difficulties])
        ax.set(ylim=(0, 1.4), ylabel="score", title=lab(env))
        ax = axes[1][col]
        for arm in arms:
            curves = [e.get("entropy", []) for r in runs_of(env, difficulty, arm) for e in episodes(r)]
            curve = mean_curve([c for c in curves if c])
            if curve:
                ax.plot(range(1, len(curve) + 1), curve, marker="o", ms=3, label=lab(arm))
        ax.set(xlabel="window", ylabel="action entropy (bits)", title=f"{lab(env)} ({difficulty})")
    legend(axes[0][0], fontsize=6, ncol=2, loc="upper left")
    legend(axes[1][0], fontsize=7)
    return save_figure(fig, path)
