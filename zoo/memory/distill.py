"""Turning a finished trajectory into memory units: raw trajectory, insights, or a skill (sub-procedure).

EvolveLab's encoders call an LLM to write insights and skills; here a *distiller* per environment extracts them
deterministically from the recorded steps (an honest LLM-free stand-in, [reconstruction]). A unit is text (what is
retrieved and injected, so what costs tokens) plus structured ``facts`` a scripted agent can act on, a ``key``
(units with the same key and different content contradict each other: Manage supersedes the older one), and a
``group`` (the task family: the graph store links units of a group).

ProcWorld facts: ``{"type": "step", "index": i, "op": op}``, ``{"type": "unit", "op": op, "unit": u}``,
``{"type": "sign_fix", "op": op, "before": op}``. Other environments fall back to :class:`GenericDistiller`
(failed tool calls as cautionary insights, the successful call sequence as a skill).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from zoo.agents.memory_interface import TrajectoryData

ENCODINGS = ("raw", "insight", "skill")


@dataclass
class Unit:
    """One encoded memory unit before it is stored."""

    text: str
    kind: str
    key: str | None = None
    group: str = ""
    facts: list[dict[str, Any]] = field(default_factory=list)


class Distiller(Protocol):
    """Extracts insights and a skill from one trajectory."""

    def insights(self, data: TrajectoryData) -> list[Unit]: ...

    def skill(self, data: TrajectoryData) -> Unit | None: ...

    def raw(self, data: TrajectoryData) -> Unit: ...


def _call_text(step: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v}" for k, v in sorted((step.get("arguments") or {}).items()) if v not in ("", None))
    obs = step.get("observation")
    message = obs.get("message", json.dumps(obs, sort_keys=True)) if isinstance(obs, dict) else (obs or "")
    return f"{step.get('tool')}({args}) -> {message or step.get('error') or ''}"


class GenericDistiller:
    """Any environment: failed calls become cautionary insights; a successful run's calls become a skill."""

    def raw(self, data: TrajectoryData) -> Unit:
        lines = [data.query, f"result {data.result:.2f}"] + [_call_text(s) for s in data.trajectory if s.get("tool")]
        return Unit("\n".join(lines), "raw", group=str(data.metadata.get("env", "")))

    def insights(self, data: TrajectoryData) -> list[Unit]:
        group = str(data.metadata.get("env", ""))
        seen, out = set(), []
        for step in data.trajectory:
            if step.get("tool") and not step.get("ok"):
                text = f"In {group}: avoid {_call_text(step)}"
                if text not in seen:
                    seen.add(text)
                    out.append(Unit(text, "insight", group=group))
        return out

    def skill(self, data: TrajectoryData) -> Unit | None:
        if data.result < 1.0:
            return None
        group = str(data.metadata.get("env", ""))
        calls = [_call_text(s) for s in data.trajectory if s.get("tool") and s.get("ok")]
        return Unit(f"Skill for {group}: " + " ; ".join(calls), "skill", key=f"{group}/skill", group=group)


_OK = re.compile(r"^(\S+) ok \((\d+)/(\d+)\)$")


def procworld_facts(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The facts a ProcWorld trajectory proves: each completed step's op, the unit it took, the sign fix."""
    facts: list[dict[str, Any]] = []
    sign_fix = None
    for step in steps:
        obs = step.get("observation")
        if step.get("tool") != "use" or not step.get("ok") or not isinstance(obs, dict):
            continue
        message = str(obs.get("message", ""))
        args = step.get("arguments") or {}
        if message.endswith("(sign fixed)"):
            sign_fix = args.get("op")
            continue
        match = _OK.match(message)
        if match is None:
            continue
        index = int(match.group(2)) - 1
        facts.append({"type": "step", "index": index, "op": match.group(1)})
        if index == 1:
            facts.append({"type": "unit", "op": match.group(1), "unit": args.get("unit", "")})
            if sign_fix is not None:
                facts.append({"type": "sign_fix", "op": sign_fix, "before": match.group(1)})
    return facts


def fact_text(family: str, fact: dict[str, Any]) -> str:
    if fact["type"] == "step":
        return f"In the {family} workflow, step {fact['index'] + 1} is {fact['op']}."
    if fact["type"] == "unit":
        return f"In the {family} workflow, {fact['op']} needs unit {fact['unit']}."
    return f"In the {family} workflow, on negative input run {fact['op']} before {fact['before']}."


def fact_key(family: str, fact: dict[str, Any]) -> str:
    return f"{family}/{fact['type']}" + (f"{fact['index']}" if fact["type"] == "step" else "")


class ProcWorldDistiller:
    """ProcWorld: insights are single proven facts; a skill is the whole proven procedure of a solved task."""

    def _family(self, data: TrajectoryData) -> str:
        return str(data.metadata.get("task", {}).get("family", ""))

    def raw(self, data: TrajectoryData) -> Unit:
        lines = [data.query, f"result {data.result:.2f}"] + [_call_text(s) for s in data.trajectory if s.get("tool")]
        family = self._family(data)
        return Unit("\n".join(lines), "raw", group=family, facts=procworld_facts(data.trajectory))

    def insights(self, data: TrajectoryData) -> list[Unit]:
        family = self._family(data)
        if not family:
            return []
        return [
            Unit(fact_text(family, f), "insight", fact_key(family, f), family, [f])
            for f in procworld_facts(data.trajectory)
        ]

    def skill(self, data: TrajectoryData) -> Unit | None:
        family = self._family(data)
        if data.result < 1.0 or not family:
            return None
        facts = procworld_facts(data.trajectory)
        steps = sorted((f for f in facts if f["type"] == "step"), key=lambda f: f["index"])
        unit = next((f["unit"] for f in facts if f["type"] == "unit"), "")
        fix = next((f["op"] for f in facts if f["type"] == "sign_fix"), None)
        parts = []
        for f in steps:
            if f["index"] == 1 and fix is not None:
                parts.append(f"{fix} (only on negative input)")
            parts.append(f"{f['op']}(unit={unit})" if f["index"] == 1 else f["op"])
        text = f"Skill for the {family} workflow: " + " -> ".join(parts)
        return Unit(text, "skill", f"{family}/skill", family, facts)


DISTILLERS: dict[str, Distiller] = {"procworld": ProcWorldDistiller()}


def distiller_for(env: str | None) -> Distiller:
    return DISTILLERS.get(str(env), GenericDistiller())


def encode(kind: str, data: TrajectoryData) -> list[Unit]:
    """The units of one trajectory under an Encode choice (``raw`` | ``insight`` | ``skill``)."""
    distiller = distiller_for(data.metadata.get("env"))
    if kind == "raw":
        return [distiller.raw(data)]
    if kind == "insight":
        return distiller.insights(data)
    skill = distiller.skill(data)
    return [] if skill is None else [skill]
