"""TextResNet: additive semantic deltas, semantic gradient decomposition, causal routing, density-aware scheduling.

Paper: "TextResNet: Decoupling and Routing Optimization Signals in Compound AI Systems through Deep Residual Tuning"
(arXiv 2602.08306, ICML 2026). No public code: the delta format, the projector prompt, the density rule and the step
budget are constructor arguments, marked [reconstruction] where the paper fixes only the mechanism.

Equation -> function map (the paper's four mechanisms):

* additive forward ``x_i = x_{i-1} ⊕ δ_i``, ``δ_i = C_i(x_{i-1}; p_i)`` -> :mod:`zoo.textopt.deltas`:
  :func:`residual_forward`, :func:`append_delta` (⊕ = tagged append ``<delta id="c3">…</delta>`` [reconstruction]);
  the replace-style chain it replaces -> :func:`replace_forward`; optional retraction delta ->
  :func:`append_retraction`, :func:`visible_deltas`
* semantic gradient decomposition ``g -> {g^(i)} ∪ g^global``  -> :class:`LLMProjector` (an LLM prompt returning
  ``{component: [critiques], "global": [...]}``, parsed by :func:`parse_projection`) or :class:`RuleProjector`
* causal routing ``g^(i) -> p_i``                                 -> :meth:`TextResNet.step` (no hop-by-hop calls)
* density-aware scheduling ``ρ_i <- λ ρ_i + (1-λ) s_i``, update ``topk(ρ)`` -> :class:`DensityScheduler`
  (``s_i`` = share of this step's routed critiques that went to ``i`` [reconstruction])
* one optimization step                                           -> :class:`TextResNet` ``.step(examples)``
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.agents.backends.base import Backend
from zoo.errors import ConfigError
from zoo.textopt.calls import CallLog, call
from zoo.textopt.deltas import residual_forward, visible_deltas
from zoo.textopt.problem import ChainProblem, Example, StepReport
from zoo.textopt.textgrad import ChainOptimizer

GLOBAL = "global"
RESIDUAL_NOTE = (
    "The text you receive keeps every earlier contribution unchanged. Reply with only your own contribution; "
    "it is appended after the earlier ones."
)
RETRACTION_NOTE = "To withdraw an earlier contribution instead, reply with exactly: RETRACT <component id>."


# --------------------------------------------------------------------------------------------- projection
@dataclass
class Projection:
    """Critiques split by component: ``components[id]`` (insertion order) and ``global_items`` (the residual).

    ``failed`` is set when the projector's reply could not be parsed (everything went to the residual);
    ``invented`` lists component ids the projector named that do not exist (their critiques went to the residual).
    """

    components: dict[str, list[str]] = field(default_factory=dict)
    global_items: list[str] = field(default_factory=list)
    failed: bool = False
    invented: list[str] = field(default_factory=list)

    def items(self) -> list[str]:
        return [c for cs in self.components.values() for c in cs] + list(self.global_items)


def _as_items(value: Any) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [v if isinstance(v, str) else json.dumps(v) for v in values if v is not None and str(v).strip()]


def _json_object(reply: str) -> dict[str, Any] | None:
    """The reply as a JSON object: the whole text, else the span from the first ``{`` to the last ``}`` (code fences,
    prose around it)."""
    for text in (reply.strip(), reply[reply.find("{") : reply.rfind("}") + 1] if "{" in reply else ""):
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, ValueError):
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_projection(reply: str, component_ids: Sequence[str], feedback: Sequence[str]) -> Projection:
    """Parse a projector reply ``{"c1": [...], ..., "global": [...]}``.

    Falls back to the outermost ``{...}`` of the reply; when that fails too the projection is ``failed`` and the
    whole ``feedback`` goes to the residual (counted, never raised). Critiques under an id not in ``component_ids``
    go to the residual and the id is listed in ``invented``.
    """
    data = _json_object(reply)
    if data is None:
        return Projection(global_items=list(feedback), failed=True)
    known = set(component_ids)
    projection = Projection(components={cid: [] for cid in component_ids})
    for key, value in data.items():
        items = _as_items(value)
        if key in known:
            projection.components[key].extend(items)
        else:
            projection.global_items.extend(items)
            if key != GLOBAL:
                projection.invented.append(str(key))
    return projection


def route_by_pattern(items: Sequence[str], component_ids: Sequence[str], pattern: re.Pattern[str]) -> Projection:
    """Each item to the component its ``pattern`` group ``id`` names, else to the residual: lossless and disjoint."""
    known = set(component_ids)
    projection = Projection(components={cid: [] for cid in component_ids})
    for item in items:
        match = pattern.match(item)
        target = match.group("id") if match else None
        if target in known:
            projection.components[target].append(item)
        else:
            projection.global_items.append(item)
            if target is not None:
                projection.invented.append(target)
    return projection


class RuleProjector:
    """A rule projector: a critique item whose text names a component (regex group ``id``) goes to it.

    Args:
        pattern: regular expression with a named group ``id`` matched at the start of each critique item
            (the simulator's critic writes ``span c3: ...``).
    """

    def __init__(self, pattern: str = r"^span (?P<id>[^:\s]+):") -> None:
        try:
            self.pattern = re.compile(pattern)
        except re.error as err:
            raise ConfigError(f"RuleProjector pattern {pattern!r}: {err}") from None
        if "id" not in self.pattern.groupindex:
            raise ConfigError(f"RuleProjector pattern {pattern!r} needs a named group (?P<id>...)")
        self.failures = 0

    def project(self, feedback: Sequence[str], deltas: Sequence[tuple[str, str]], component_ids: Sequence[str]):
        return route_by_pattern(feedback, component_ids, self.pattern)


PROJECTOR_SYSTEM = (
    "You are the semantic projector of a textual optimization system. The output below is made of tagged "
    "contributions, one per component. Split the feedback into critiques of individual components: assign each "
    'feedback item to the component whose contribution it concerns, or to "global" when it concerns none. Reply '
    'with one JSON object only: {"<component id>": ["critique", ...], ..., "global": ["critique", ...]}.'
)


class LLMProjector:
    """The semantic projector as an LLM prompt returning JSON (one call per critiqued example).

    Args:
        backend: the model.
        log: call counter (role ``projector``).
        system: the projector's system prompt [reconstruction].
    """

    def __init__(self, backend: Backend, log: CallLog, system: str = PROJECTOR_SYSTEM, seed: int | None = None):
        self.backend = backend
        self.log = log
        self.system = system
        self.seed = seed
        self.failures = 0
        self.invented = 0

    def project(
        self, feedback: Sequence[str], deltas: Sequence[tuple[str, str]], component_ids: Sequence[str]
    ) -> Projection:
        contributions = "\n".join(f'<delta id="{cid}">{text}</delta>' for cid, text in deltas)
        user = (
            f"Components: {', '.join(component_ids)}\nContributions:\n{contributions}\n"
            "Feedback:\n<FEEDBACK>\n" + "\n".join(feedback) + "\n</FEEDBACK>"
        )
        projection = parse_projection(
            call(self.backend, self.log, "projector", self.system, user, self.seed), component_ids, feedback
        )
        self.failures += projection.failed
        self.invented += len(projection.invented)
        return projection


# --------------------------------------------------------------------------------------------- scheduling
class DensityScheduler:
    """Running signal density per component and top-k selection within the update budget.

    ``observe(signal)``: ``ρ_i <- decay · ρ_i + (1 - decay) · s_i`` (``s_i >= 0``; ρ stays non-negative and decays
    geometrically without signal). ``select(eligible)``: the ``budget`` eligible components of highest ρ; ties go
    to the component earlier in the chain (deterministic).

    Args:
        component_ids: the components in chain order.
        budget: updates per step (k).
        decay: EMA factor λ in [0, 1).
    """

    def __init__(self, component_ids: Sequence[str], budget: int = 2, decay: float = 0.5) -> None:
        if budget < 1:
            raise ConfigError(f"TextResNet budget={budget}: updates per step must be >= 1")
        if not 0.0 <= decay < 1.0:
            raise ConfigError(f"TextResNet decay={decay}: the density EMA factor must be in [0, 1)")
        self.order = {cid: i for i, cid in enumerate(component_ids)}
        self.budget = budget
        self.decay = decay
        self.density = dict.fromkeys(component_ids, 0.0)

    def observe(self, signal: Mapping[str, float]) -> None:
        for cid in self.density:
            value = float(signal.get(cid, 0.0))
            if value < 0:
                raise ValueError(f"density signal of {cid} is negative ({value})")
            self.density[cid] = self.decay * self.density[cid] + (1.0 - self.decay) * value

    def select(self, eligible: Sequence[str]) -> list[str]:
        ranked = sorted(eligible, key=lambda cid: (-self.density[cid], self.order[cid]))
        return ranked[: self.budget]


# --------------------------------------------------------------------------------------------- the optimizer
class TextResNet(ChainOptimizer):
    """TextResNet on a chain problem.

    Forward: each component sees the whole state and appends one tagged delta (:func:`residual_forward`). Backward:
    the problem's critic, then one projector call per critiqued example that splits the critique by component;
    each part is appended to its component's gradient (insertion order); the residual (global) part updates
    nothing. Step: the densities observe this step's routed shares; the top-``budget`` components by density among
    those holding a critique are rewritten (TGD prompt). A component with no routed critique is never touched.

    Args:
        problem: a :class:`~zoo.textopt.problem.ChainProblem`.
        backend: the model of every call.
        budget: components rewritten per step (k).
        decay: density EMA factor.
        projector: ``llm`` (the JSON prompt through ``backend``) or ``rule`` (:class:`RuleProjector`).
        rule_pattern: the rule projector's pattern.
        max_delta_chars: cap on each delta (``None``: no cap) — bounds the state at
            ``len(x_0) + L · (max_delta_chars + tag)``.
        retraction: tell components they may retract an earlier contribution.
        seed: forwarded to every call.
        constraints: TGD constraints.
        call_budget: cap on backward + projector + optimizer calls (:class:`~zoo.textopt.textgrad.ChainOptimizer`).
    """

    name = "textresnet"
    residual = True

    def __init__(
        self,
        problem: ChainProblem,
        backend: Backend,
        budget: int = 2,
        decay: float = 0.5,
        projector: str = "llm",
        rule_pattern: str = r"^span (?P<id>[^:\s]+):",
        max_delta_chars: int | None = 400,
        retraction: bool = False,
        seed: int | None = 0,
        constraints: Sequence[str] = (),
        call_budget: int | None = None,
    ) -> None:
        if projector not in ("llm", "rule"):
            raise ConfigError(f"TextResNet projector={projector!r}; use llm or rule")
        if max_delta_chars is not None and max_delta_chars < 1:
            raise ConfigError(f"TextResNet max_delta_chars={max_delta_chars}: use null or a positive cap")
        super().__init__(problem, backend, seed, constraints, call_budget)
        self.projector = (
            LLMProjector(backend, self.log, seed=seed) if projector == "llm" else RuleProjector(rule_pattern)
        )
        self.scheduler = DensityScheduler(self.ids, budget, decay)
        self.max_delta_chars = max_delta_chars
        self.retraction = retraction

    def system_prompt(self, cid: str) -> str:
        note = f"{RESIDUAL_NOTE} {RETRACTION_NOTE}" if self.retraction else RESIDUAL_NOTE
        return f"{self.parameters[cid].value}\n\n{note}"

    def component(self, cid: str) -> Callable[[str], str]:
        return lambda state: call(self.backend, self.log, "forward", self.system_prompt(cid), state, self.seed)

    def output(self, example: Example) -> str:
        return residual_forward(example.input, [(c, self.component(c)) for c in self.ids], self.max_delta_chars)[-1]

    def step(self, examples: Sequence[Example]) -> StepReport:
        self.optimizer.zero_grad()
        correct, routed = 0, Counter()
        failures, invented = 0, 0
        for example in examples:
            state = self.output(example)
            correct += self.problem.is_correct(state, example, residual=True)
            critique = self.problem.critique(state, example, residual=True, backend=self.backend, log=self.log)
            if not critique:
                continue
            projection = self.projector.project(critique, visible_deltas(state), self.ids)
            failures += projection.failed
            invented += len(projection.invented)
            for cid, items in projection.components.items():
                for item in items:
                    self.parameters[cid].add_gradient(item)
                    routed[cid] += 1
        total = sum(routed.values())
        self.scheduler.observe({cid: routed[cid] / total for cid in routed} if total else {})
        selected = self.scheduler.select([cid for cid in self.ids if self.parameters[cid].gradients])
        gradients = {cid: list(p.gradients) for cid, p in self.parameters.items()}
        for cid in selected:
            self.optimizer.update(self.parameters[cid])
        extra = {"projector_failures": failures, "invented_ids": invented, "density": dict(self.scheduler.density)}
        return StepReport(correct / max(len(examples), 1), selected, gradients, extra)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "density": dict(self.scheduler.density)}

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.scheduler.density.update(state.get("density", {}))
