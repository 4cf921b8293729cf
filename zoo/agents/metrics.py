"""Episode metrics: windowed action entropy (the locking curve), heuristic error tags, and the summary of a set.

*Windowed action entropy*: the Shannon entropy (bits) of the actions -- tool name plus arguments -- in
consecutive windows of ``window`` steps. UltraHorizon reports falling output-token entropy as the trace of
in-context locking; actions are what every agent (scripted or LLM) produces, so the zoo measures them.

*Error tags* are heuristics over a trajectory, named after the two causes the paper identifies (in-context locking
and capability gaps): ``no_commit`` (never committed), ``invalid_commit`` (a commit rejected for its format),
``premature_commit_attempt`` (a commit refused by the commit rule), ``repeated_failure`` (the same failing call
three times in a row: a loop), ``tool_misuse`` (more than 20% failed steps), ``entropy_collapse`` (the last
window's action entropy below half the first window's, over at least three windows), plus the tags the
environment's grade carries (``ScoreReport.tags``, e.g. Persona2Web's ``retrieval_failure``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from zoo.stats import mean_ci95


def action_key(step: Any) -> str:
    if step.tool is None:
        return "<no call>"
    return f"{step.tool} {json.dumps(step.arguments, sort_keys=True)}"


def entropy_bits(items: Sequence[str]) -> float:
    counts = Counter(items)
    total = len(items)
    return -sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0


def windowed_entropy(steps: Sequence[Any], window: int = 10) -> list[float]:
    """Entropy of the actions in each full window of ``window`` consecutive steps."""
    keys = [action_key(s) for s in steps]
    return [entropy_bits(keys[i : i + window]) for i in range(0, len(keys) - window + 1, window)]


def error_tags(trajectory: Any) -> list[str]:
    steps = trajectory.steps
    tags = []
    if not trajectory.committed:
        tags.append("no_commit")
    commits = [s for s in steps if s.tool == "commit_final_result" and not s.ok]
    messages = [
        str((s.observation or {}).get("message", "")) if isinstance(s.observation, dict) else "" for s in commits
    ]
    if any(m.startswith("Commit rejected") for m in messages):
        tags.append("invalid_commit")
    if any(m.startswith("Cannot commit") for m in messages):
        tags.append("premature_commit_attempt")
    run = 1
    for previous, step in zip(steps, steps[1:]):
        run = run + 1 if (not step.ok and not previous.ok and action_key(step) == action_key(previous)) else 1
        if run >= 3:
            tags.append("repeated_failure")
            break
    if steps and trajectory.failed_steps / len(steps) > 0.2:
        tags.append("tool_misuse")
    entropy = trajectory.entropy
    if len(entropy) >= 3 and entropy[0] > 0 and entropy[-1] < 0.5 * entropy[0]:
        tags.append("entropy_collapse")
    tags += [t for t in (trajectory.report or {}).get("tags", []) if t not in tags]  # the environment's own tags
    return tags


def mean_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """Point-wise mean of curves of different lengths (each point over the curves that reach it)."""
    length = max((len(c) for c in curves), default=0)
    out = []
    for i in range(length):
        points = [c[i] for c in curves if len(c) > i]
        out.append(sum(points) / len(points))
    return out


def summarize(trajectories: Sequence[Any]) -> dict[str, Any]:
    """Aggregate numbers of a set of episodes (deterministic: no timings)."""
    scores = [t.score for t in trajectories]
    score, ci = mean_ci95(scores)
    n = len(trajectories)
    items: dict[str, list[float]] = {}
    for t in trajectories:
        for item in (t.report or {}).get("items", []):
            items.setdefault(item["criterion"], []).append(item["awarded"] / item["points"] if item["points"] else 0.0)
    tags = Counter(tag for t in trajectories for tag in t.tags)
    return {
        "score": score,
        "score_ci95": ci,
        "scores": scores,
        "tool_calls": sum(t.tool_calls for t in trajectories) / n if n else math.nan,
        "failed_steps": sum(t.failed_steps for t in trajectories) / n if n else math.nan,
        "tokens": sum(t.usage.total_tokens for t in trajectories) / n if n else math.nan,
        "committed": sum(t.committed for t in trajectories) / n if n else math.nan,
        "failed_episodes": sum(bool(getattr(t, "error", None)) for t in trajectories),
        "refreshes": sum(t.refreshes for t in trajectories) / n if n else math.nan,
        "items": {k: sum(v) / len(v) for k, v in items.items()},
        "error_tags": dict(sorted(tags.items())),
        "entropy_curve": mean_curve([t.entropy for t in trajectories]),
    }
