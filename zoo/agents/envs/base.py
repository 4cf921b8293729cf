"""What every exploration environment shares: per-instance RNG, difficulty, the commit protocol and scoring.

An environment is a plain class whose tools are methods marked with :func:`~zoo.agents.tools.agent_tool`. It
owns a ``random.Random(seed)`` (never the global RNG), a ``difficulty``, a ``required_steps`` budget, and the
**commit protocol** of UltraHorizon: ``commit_final_result(content)`` is refused while the environment's commit
rule says so (unless ``free``), is accepted exactly once, and ends the episode.

Scoring has two paths:

* the default **deterministic grader**: ``content`` is a JSON object with the agent's answer (each hidden rule as
  an expression, or plain values; no candidate rule is shown, see :mod:`zoo.agents.envs.answers`); an answer
  that violates the format is refused with a message naming the field and is *not* consumed; the grader awards
  the original point weights, all or nothing per item (``commit_format="choice"`` keeps the older multiple-choice
  variant: ids from a declared library listed in the commit tool);
* the optional **LLM judge** (``judge=`` any :class:`~zoo.agents.backends.Backend`, usually an
  OpenAI-compatible endpoint): ``content`` is free text, sent with the environment's rubric and ground truth.
"""

from __future__ import annotations

import json
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from zoo.agents.backends.base import Backend
from zoo.agents.envs.answers import AnswerError, agrees, compile_expression
from zoo.agents.parsing import loads_lenient
from zoo.agents.tools import ToolRegistry, agent_tool
from zoo.errors import ConfigError

DIFFICULTIES = ("easy", "medium", "hard")
JUDGE_SYSTEM = "You grade descriptions of hidden rules strictly against a rubric and answer with JSON only."


class CommitError(ValueError):
    """A structured commit does not follow the environment's schema (the message names the field)."""


@dataclass
class RubricItem:
    """One scored criterion: all or nothing (``awarded`` is 0 or ``points``) under the deterministic rubric."""

    criterion: str
    points: int
    awarded: int
    comment: str = ""


@dataclass
class ScoreReport:
    """The grade of a commit: rubric items, total points out of 100, where it came from, and the environment's own
    error tags (added to the trajectory's tags by the harness)."""

    items: list[RubricItem] = field(default_factory=list)
    source: str = "rubric"
    total: float = 0.0
    raw: Any = None
    tags: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Total as a fraction in ``[0, 1]``."""
        return max(0.0, min(1.0, self.total / 100.0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "total": self.total,
            "score": self.score,
            "items": [asdict(i) for i in self.items],
            "raw": self.raw,
            "tags": list(self.tags),
        }

    @classmethod
    def from_items(cls, items: list[RubricItem]) -> ScoreReport:
        return cls(items=items, source="rubric", total=float(sum(i.awarded for i in items)))


def judge_commit(judge: Backend, prompt: str) -> ScoreReport:
    """Send a rubric prompt to an LLM judge (temperature 0, seed 0) and read its JSON grade.

    The judge must answer ``{"final_score": int, "score_breakdown": [{"criterion", "max_score", "awarded_score",
    "comment"}, ...]}``; reasoning in ``<think>`` tags and code fences are stripped. An unreadable answer scores 0
    and keeps the raw text in :attr:`ScoreReport.raw`.
    """
    messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}]
    reply = judge.complete(messages, None, seed=0, temperature=0.0).content
    text = re.sub(r"<think>.*?</think>", "", reply, flags=re.DOTALL).strip()
    text = re.sub(r"^```[A-Za-z]*\s*|\s*```$", "", text).strip()
    try:
        data = loads_lenient(text)
        items = [
            RubricItem(str(b["criterion"]), int(b["max_score"]), int(b["awarded_score"]), str(b.get("comment", "")))
            for b in data.get("score_breakdown", [])
        ]
        total = float(data["final_score"]) if "final_score" in data else float(sum(i.awarded for i in items))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ScoreReport(source="llm_judge", total=0.0, raw={"unreadable": reply})
    return ScoreReport(items=items, source="llm_judge", total=max(0.0, min(100.0, total)), raw=data)


def judge_prompt(task: str, ground_truth: dict[str, str], rubric: list[tuple[str, int, str]], content: str) -> str:
    """The judge prompt: the task, the ground truth, the rubric (criterion, points, condition) and the commit."""
    lines = [
        f"You are grading an agent's final report for the exploration task '{task}'.",
        "Ground truth (hidden from the agent):",
        json.dumps(ground_truth, indent=2),
        "Rubric: award each criterion its full points only when the report states the correct mechanism with its "
        "trigger condition; otherwise award 0 (no partial credit). Equivalent wording is fine; vague words "
        "('random', 'complex', 'varies'), surface patterns without the condition, several conflicting "
        "explanations, or a wrong cause earn 0.",
    ]
    lines += [f"- {criterion} ({points} points): {condition}" for criterion, points, condition in rubric]
    lines += [
        "Agent report:",
        content,
        'Answer with JSON only: {"final_score": <sum>, "score_breakdown": [{"criterion": <name>, "max_score": '
        '<points>, "awarded_score": <0 or points>, "comment": <why>}, ...]} listing every criterion above.',
    ]
    return "\n".join(lines)


class Environment(ABC):
    """Base of the exploration environments.

    Args:
        seed: seed of the environment's own ``random.Random``.
        difficulty: ``easy`` | ``medium`` | ``hard`` (an environment may map some levels to the same rules).
        required_steps: the experiment budget (and the minimum before a commit is accepted).
        free: accept a commit at any time (UltraHorizon's ``--free``).
        judge: grade free-text commits with this LLM backend instead of the structured rubric.
    """

    name: ClassVar[str] = ""
    #: the run is capped at ``required_steps * max_steps_factor`` agent steps (UltraHorizon: 4, 8 for bio)
    max_steps_factor: ClassVar[int] = 4
    #: tools defined on the class that this configuration does not expose
    hidden_tools: tuple[str, ...] = ()

    def __init__(
        self,
        seed: int = 0,
        difficulty: str = "hard",
        required_steps: int = 50,
        free: bool = False,
        judge: Backend | None = None,
    ) -> None:
        if difficulty not in DIFFICULTIES:
            raise ConfigError(f"{self.name}: difficulty={difficulty!r}; use one of {DIFFICULTIES}")
        if int(required_steps) < 1:
            raise ConfigError(f"{self.name}: required_steps must be >= 1, got {required_steps}")
        self.seed = seed
        self.rng = random.Random(seed)
        self.difficulty = difficulty
        self.required_steps = int(required_steps)
        self.free = bool(free)
        self.judge = judge
        self.committed = False
        self.report: ScoreReport | None = None
        self.commit_content: str | None = None

    # -- what agents see --------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def prompt(self) -> str:
        """The task description (the agent's system prompt)."""

    @abstractmethod
    def commit_help(self) -> str:
        """How to write ``content`` for :meth:`commit_final_result` (the structured schema, or free text)."""

    def library(self) -> dict[str, Any]:
        """The public commit vocabulary (hypothesis ids and their descriptions) agents may draw on."""
        return {}

    @property
    def max_agent_steps(self) -> int:
        return self.required_steps * self.max_steps_factor

    def tools(self) -> ToolRegistry:
        """The environment's tools (commit included), with the commit schema in the commit tool's description."""
        registry = ToolRegistry.from_object(self, exclude=self.hidden_tools)
        commit = registry["commit_final_result"]
        commit.description = f"{commit.description}\n\n{self.commit_help()}"
        return registry

    # -- the commit protocol ---------------------------------------------------------------------------------
    @abstractmethod
    def commit_refusal(self) -> str | None:
        """Why a commit is refused now under the commit rule (``None``: accepted)."""

    @abstractmethod
    def parse_commit(self, data: Any) -> Any:
        """Check a decoded structured commit; raise :class:`CommitError` naming the offending field."""

    @abstractmethod
    def score_commit(self, commit: Any) -> ScoreReport:
        """The deterministic rubric."""

    @abstractmethod
    def ground_truth(self) -> dict[str, str]:
        """The hidden rules in words (for the judge and for reports)."""

    @abstractmethod
    def rubric(self) -> list[tuple[str, int, str]]:
        """``(criterion, points, what earns them)`` of the judge rubric (points sum to 100)."""

    @agent_tool
    def commit_final_result(self, content: str) -> dict[str, Any]:
        """Submit your final conclusions for evaluation. You can commit only once; the episode then ends.

        Args:
            content: your conclusions (see the required format below).
        """
        if self.committed:
            return {"success": False, "message": "A final result was already committed; only one commit is allowed."}
        refusal = None if self.free else self.commit_refusal()
        if refusal:
            return {"success": False, "message": refusal}
        if self.judge is not None:
            report = judge_commit(self.judge, judge_prompt(self.name, self.ground_truth(), self.rubric(), content))
        else:
            try:
                data = loads_lenient(content) if isinstance(content, str) else content
                commit = self.parse_commit(data)
            except (ValueError, CommitError) as err:
                return {
                    "success": False,
                    "message": f"Commit rejected (not counted, fix it and commit again): {err}. {self.commit_help()}",
                }
            report = self.score_commit(commit)
        self.committed = True
        self.report = report
        self.commit_content = content
        return {"success": True, "message": "Final result committed; the episode is over.", "points": report.total}


COMMIT_FORMATS = ("answer", "choice")


class RuleMappingEnvironment(Environment):
    """An environment whose hidden rules are one rule per unknown (a letter, a stage).

    Two commit formats (``commit_format``):

    * ``answer`` (default): the agent writes each unknown's rule as an expression over the quantities the prompt
      names (:attr:`answer_variables`); :mod:`zoo.agents.envs.answers` grades it against the true rule on
      :meth:`answer_cases`. The commit tool shows no candidate rule.
    * ``choice``: the agent picks one id per unknown from the declared :attr:`rule_library`, whose descriptions
      (the true rules among them) are listed in the commit tool -- a multiple-choice variant kept for comparison.

    Each key is worth 20 points unless :meth:`score_key` says otherwise. The library also serves the scripted
    agents as their hypothesis space (:meth:`library`, with each rule's expression in ``formulas``).
    """

    keys: ClassVar[tuple[str, ...]] = ()
    key_name: ClassVar[str] = "key"
    rule_library: ClassVar[Mapping[str, Any]] = {}
    judge_help: ClassVar[str] = ""
    answer_help: ClassVar[str] = ""
    answer_variables: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        seed: int = 0,
        difficulty: str = "hard",
        required_steps: int = 50,
        free: bool = False,
        judge: Backend | None = None,
        commit_format: str = "answer",
    ) -> None:
        super().__init__(seed, difficulty, required_steps, free, judge)
        if commit_format not in COMMIT_FORMATS:
            raise ConfigError(f"{self.name}: commit_format={commit_format!r}; use one of {COMMIT_FORMATS}")
        self.commit_format = commit_format

    @abstractmethod
    def truth(self) -> dict[str, str]:
        """The true rule id of every key."""

    @abstractmethod
    def answer_cases(self, key: str) -> list[dict[str, Any]]:
        """The fixed situations (variable -> value) on which an answer for ``key`` is compared with the truth."""

    @abstractmethod
    def rule_function(self, rule_id: str) -> Any:
        """``f(case) -> outcome`` of a library rule, in the form an answer expression must produce."""

    def answer_function(self, key: str, value: Any) -> Any:
        """``f(case) -> outcome`` of the agent's answer for ``key`` (default: one expression)."""
        return compile_expression(value, self.answer_variables)

    def library(self) -> dict[str, Any]:
        return {
            "keys": list(self.keys),
            "commit_format": self.commit_format,
            "rules": {k: r.description for k, r in self.rule_library.items()},
            "formulas": {k: r.formula for k, r in self.rule_library.items()},
        }

    def commit_help(self) -> str:
        if self.judge is not None:
            return self.judge_help
        if self.commit_format == "answer":
            return self.answer_help
        example = ", ".join(f'"{k}": <rule id>' for k in self.keys)
        rules = "; ".join(f"{k}: {r.description}" for k, r in self.rule_library.items())
        return f"Format: a JSON object giving one rule id per {self.key_name}, {{{example}}}. Rule ids: {rules}."

    def parse_commit(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise CommitError(f"the commit must be a JSON object with one entry per {self.key_name} {list(self.keys)}")
        missing = [k for k in self.keys if k not in data]
        extra = sorted(set(data) - set(self.keys))
        if missing or extra:
            raise CommitError(f"missing {missing}, unexpected keys {extra}; give exactly {list(self.keys)}")
        if self.commit_format == "answer":
            parsed = {}
            for key in self.keys:
                try:
                    parsed[key] = self.answer_function(key, data[key])
                except AnswerError as err:
                    raise CommitError(f"{key}: {err}") from None
            return parsed
        for key in self.keys:
            if data[key] not in self.rule_library:
                raise CommitError(f"{key}: unknown rule id {data[key]!r}; valid ids: {list(self.rule_library)}")
        return {k: data[k] for k in self.keys}

    def key_correct(self, key: str, given: Any, truth: str) -> bool:
        """Whether a parsed commit entry states the true rule (same id, or an expression that agrees everywhere)."""
        if self.commit_format == "choice":
            return given == truth
        return agrees(given, self.rule_function(truth), self.answer_cases(key))

    def score_key(self, key: str, given: Any, truth: str) -> list[RubricItem]:
        """The rubric items of one key (default: 20 points, all or nothing)."""
        ok = self.key_correct(key, given, truth)
        return [RubricItem(key, 20, 20 if ok else 0, given if isinstance(given, str) else "expression")]

    def score_commit(self, commit: dict[str, Any]) -> ScoreReport:
        truth = self.truth()
        return ScoreReport.from_items([item for k in self.keys for item in self.score_key(k, commit[k], truth[k])])

    def ground_truth(self) -> dict[str, str]:
        return {k: self.rule_library[rule].description for k, rule in self.truth().items()}

    def rubric(self) -> list[tuple[str, int, str]]:
        return [(k, 20, f"the mechanism of {k} and the condition that triggers it") for k in self.keys]
