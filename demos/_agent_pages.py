"""Page sections shared by the agent demos' builders (UltraHorizon, Persona2Web): the measured sentences of an LLM
arm (its steps, its replies, its run time) and the section that reruns a demo with a served model. Builders import it
as ``_agent_pages`` (the page loader puts ``demos/`` on the import path)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from zoo.report import Run
from zoo.stats import Stat, stat


def llm_arm_measured(runs: Sequence[Run], episodes: Sequence[dict[str, Any]], score: str) -> str:
    """The measured sentence of an LLM-agent arm of an episode demo (``trajectories.jsonl`` rows in ``episodes``):
    runs, episodes, steps, steps with a parsed tool call, steps that succeeded, commits, tokens per episode, and
    whether every run finished; ``score`` is the formatted score part (e.g. ``"score 0.000 ± 0.000"``)."""
    steps = [s for e in episodes for s in e.get("steps", [])]
    called = sum(s.get("tool") is not None for s in steps)
    ok = sum(bool(s.get("ok")) for s in steps)
    committed = sum(bool(e.get("committed")) for e in episodes)
    finished = (
        "Every run finished: the model's unparseable replies were recorded as failed steps, never a crash."
        if all(r.finished for r in runs)
        else f"{sum(not r.finished for r in runs)} of {len(runs)} runs did not finish."
    )
    return (
        f"Measured over {len(runs)} runs ({len(episodes)} episodes, {len(steps)} steps): {score}; steps with a parsed "
        f"tool call {called} of {len(steps)}, steps that succeeded {ok}; committed {committed} of {len(episodes)} "
        f"episodes; {stat(r.last('test/tokens') for r in runs).mean:.0f} tokens per episode (prompt + completion). "
        + finished
    )


def cannot_act(episodes: Sequence[dict[str, Any]]) -> str | None:
    """Why an LLM-agent arm cannot act (``trajectories.jsonl`` rows of its runs), or ``None`` when it can: an arm none
    of whose replies parsed as a tool call never touched the environment, so its score (0) measures nothing but the
    format; such an arm leaves the score tables and the page says why."""
    steps = [s for e in episodes for s in e.get("steps", [])]
    if any(s.get("tool") is not None for s in steps):
        return None
    return f"none of its {len(steps)} replies ({len(episodes)} episodes) parsed as a tool call"


def left_out_paragraph(left_out: dict[str, str], label: Callable[[str], str]) -> list[str]:
    """The page's sentence naming the arms left out of the score tables (arm -> :func:`cannot_act`'s reason)."""
    if not left_out:
        return []
    reasons = "; ".join(f"{label(arm)}: {why}" for arm, why in left_out.items())
    return [f"Left out of the score tables (they cannot act): {reasons}. Their runs are in the sections below.", ""]


def endpoint_section(paper: str, arm: str, caps: str, note: str = "") -> list[str]:
    """The page section that reruns an episode demo with a served model (``demo/<paper>/arm=<arm>``) and rebuilds its
    page; ``caps`` are the demo's LLM caps for a real model (e.g. ``"demo.llm.max_tokens=1024"``), ``note`` is added
    after the arm's name (e.g. ``", on-demand scheme"``)."""
    return [
        "## Any OpenAI-compatible endpoint",
        "",
        f"The same sweep with a served model as the agent (`pip install 'paperzoo[agents]'`; the arm `{arm}`{note}; "
        "replies can be recorded and replayed with `backend.cache.path=... backend.cache.mode=auto`):",
        "",
        "```bash",
        f"OMP_NUM_THREADS=1 python train.py -m +demo={paper} demo/{paper}/arm={arm} \\",
        "    backend.base_url=http://localhost:8000/v1 backend.model=<served model> \\",
        f"    {caps}",
        f"python -m zoo.report demo {paper}",
        "```",
    ]


def replies_measured(episodes: Sequence[dict[str, Any]], budget: int | None, shown: int = 48) -> str:
    """What an LLM-agent arm's replies were (``trajectories.jsonl`` rows in ``episodes``): how many parsed as a tool
    call, completion tokens per reply against the reply ``budget``, and the most frequent reply start (its first
    ``shown`` characters, written as a code span)."""
    steps = [s for e in episodes for s in e.get("steps", [])]
    if not steps:
        return "No replies were recorded."
    parsed = sum(s.get("tool") is not None for s in steps)
    tokens = [int(s.get("completion_tokens", 0)) for s in steps]
    full = sum(t >= budget for t in tokens) if budget else 0
    starts = Counter(" ".join(str(s.get("text") or "").split())[:shown] for s in steps)
    start, count = starts.most_common(1)[0]
    start = start.replace("`", "'").replace("|", "/")
    return (
        f"Replies: {len(steps)}, of which {parsed} ({100 * parsed / len(steps):.1f}%) parsed as a tool call; "
        f"completion tokens per reply {sum(tokens) / len(tokens):.0f} on average (largest {max(tokens)}"
        + (f"; {full} replies used the whole budget of {budget} tokens" if budget else "")
        + f"); the most frequent reply starts with `{start or '(empty)'}` ({count} of {len(steps)} replies, "
        "whitespace collapsed)."
    )


def run_seconds(runs: Sequence[Run]) -> tuple[Stat, int]:
    """Wall seconds of the runs that built no artifact (model loading and the episodes; a run that trained its model
    through the artifact cache first is left out) and the number of runs left out."""
    plain = [r for r in runs if not any(a.get("built_now") for a in r.artifacts())]
    return stat(r.info.get("wall_seconds") for r in plain), len(runs) - len(plain)
