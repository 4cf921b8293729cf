"""MemEvolve's outer loop (arXiv 2512.18746, Sec. 4; ``MemEvolve/core/auto_evolver.py`` of the released code).

Per round (:meth:`MemEvolve.run_round`):

1. **run** the base system on the round's ``tasks`` (x) tasks (an inner-loop stream: each task's trajectory is
   ingested before the next task) -- :func:`run_stream`;
2. **diagnose** from the trajectories' statistics -- :func:`diagnose` (the paper's LLM analyst reads the
   trajectories and the memory DB; here: the share of retrieved items about another task family, duplicate items,
   injected characters per item, failures despite relevant memory) [reconstruction];
3. **design** ``candidates`` (m) new systems -- :func:`rule_based_design` mutates the worst module (the honest,
   LLM-free default); optionally :class:`LLMDesigner` asks a backend for provider *code*, which only ever runs in a
   sandboxed subprocess with a timeout (``python -I``, resource limits, no sockets; a missing import is reported,
   never installed);
4. **validate** each candidate on ``smoke_tasks`` tasks (released: 5) with ``smoke_timeout``;
5. **tournament**: the base plus the valid candidates on the same x tasks; the best ``finalists`` (t) go to the
   **finals** on ``reused`` (y) tasks sampled from those plus x new ones (``base_in_finals=True`` also sends the base
   there); the final winner is the next base. Since the base is in the tournament, every finalist -- so the winner --
   scores at least the base's tournament score under the selection order.

What each round changed and what the change contributed: the record names the winner's changed genotype fields
(``change``) and, with ``reference_base=True`` (a zoo addition; it never takes part in selection), also runs the base on
the finals stream (``base_finals``), so the winner and the base are compared on the x new finals tasks, which neither
was selected on. ``design_modules`` restricts which modules the designer may change: ``[top_k]`` is the "tune top_k
only" control, the same loop and the same number of candidate evaluations with only ``top_k`` varied.

Selection (:func:`selection_order`): ``lexicographic`` sorts by (accuracy desc, tokens asc) (the released default);
``pareto`` sorts by non-dominated rank on (accuracy up, tokens down, time down) and, within a rank, by the released
tie-break ``0.6 acc + 0.25 token_norm + 0.15 time_norm`` (min-max normalised, lower cost -> 1). Remaining ties go to
the earlier entrant (the base first), so a fixed seed gives the same winner (``pareto_time=False`` drops wall time,
the one non-deterministic objective).

Every candidate runs in its own, fresh store directory and, with ``isolation="process"``, in a forked child with a
``timeout``: a candidate that raises or hangs is recorded (``ok=False`` with the reason) and the tournament goes
on. Every round's candidates, scores, ranks and winner are written to ``<work_dir>/rounds.jsonl``.

Defaults from ``MemEvolve/config.py``: x=20, t=2, y=5, m=3, seed 42, creativity 0.5 (LLM temperature
``0.3 + 0.9 * creativity``).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.agents.backends.base import Backend
from zoo.agents.envs import ENVIRONMENTS
from zoo.agents.evaluate import derive_seed
from zoo.agents.memory_interface import MemoryProvider, NoMemory, trajectory_data
from zoo.agents.policies.memory import ProcWorldMemoryAgent
from zoo.agents.runner import run_episode
from zoo.agents.sandbox import sandbox_prelude
from zoo.errors import ConfigError
from zoo.memory.system import MANAGERS, RETRIEVERS, STORES, Genotype, ModularMemory

SELECTIONS = ("lexicographic", "pareto")
ISOLATIONS = ("process", "inline")
TIE_BREAK = (0.6, 0.25, 0.15)  # accuracy, token_norm, time_norm (released Pareto tie-break)
STARTUP_GRACE = 60.0  # seconds a sandboxed child may take to start Python and load the zoo (and torch)
LOG_KEYS = ("requests", "items", "hits", "duplicates", "facts", "chars")
DESIGN_MODULES = ("retrieve", "store", "manage", "encode", "top_k")  # what diagnose scores and the designer changes


# -- the inner loop -----------------------------------------------------------------------------------------------
def run_stream(
    memory: MemoryProvider | None,
    env: dict[str, Any],
    episodes: list[int],
    seed: int,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Run tasks ``episodes`` in order with one memory system, ingesting each trajectory before the next task.

    Args:
        memory: the provider (``None``: no memory).
        env: ``{"name": <environment>, **constructor kwargs}`` (``procworld``).
        episodes: task indices; task ``i`` uses seeds ``derive_seed(seed, i, "env" | "agent")``.

    Returns:
        ``success`` (mean score), ``tokens`` (mean injected-memory tokens per task), ``time`` (wall seconds),
        ``memory`` (summed :attr:`ProcWorldMemoryAgent.memory_log`), ``failed_with_hits`` (failed tasks that
        were given memory about their family) and ``episodes`` (per task: family, negative, score, steps, tokens).
    """
    kwargs = {k: v for k, v in env.items() if k != "name"}
    env_cls = ENVIRONMENTS[str(env.get("name", "procworld"))]
    start = time.perf_counter()
    rows, totals = [], dict.fromkeys(LOG_KEYS, 0)
    for index in episodes:
        environment = env_cls(seed=derive_seed(seed, index, "env"), **kwargs)
        agent = ProcWorldMemoryAgent(seed=derive_seed(seed, index, "agent"), memory=memory)
        trajectory = run_episode(environment, agent, max_steps=max_steps, episode=index, seed=seed)
        if memory is not None:
            memory.take_in_memory(trajectory_data(trajectory, task=environment.library()))
        log = agent.memory_log
        for key in LOG_KEYS:
            totals[key] += log[key]
        rows.append(
            {
                "episode": index,
                "family": environment.family.name,
                "negative": environment.value < 0,
                "score": trajectory.score,
                "steps": len(trajectory.steps),
                "tokens": trajectory.usage.total_tokens,
                "hits": log["hits"],
            }
        )
    n = max(len(rows), 1)
    return {
        "success": sum(r["score"] for r in rows) / n,
        "tokens": sum(r["tokens"] for r in rows) / n,
        "time": time.perf_counter() - start,
        "memory": totals,
        "failed_with_hits": sum(r["score"] < 1 and r["hits"] > 0 for r in rows),
        "episodes": rows,
    }


# -- candidates and their isolated evaluation ---------------------------------------------------------------------
@dataclass
class Candidate:
    """A memory system entering a round: a genotype, or provider source code (from the LLM designer)."""

    name: str
    genotype: Genotype | None = None
    code: str | None = None
    origin: str = "base"

    def describe(self) -> str:
        return self.genotype.describe() if self.genotype is not None else f"generated code ({self.origin})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "origin": self.origin,
            "system": self.describe(),
            "genotype": self.genotype.to_dict() if self.genotype is not None else None,
            "code": self.code,
        }


def _failure(candidate: Candidate, reason: str, seconds: float) -> dict[str, Any]:
    return {"name": candidate.name, "ok": False, "error": reason, "success": 0.0, "tokens": 0.0, "time": seconds}


def _child(conn: Any, fn: Callable[[], dict[str, Any]]) -> None:
    try:
        conn.send({"ok": True, **fn()})
    except BaseException as err:
        conn.send({"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
    finally:
        conn.close()


def run_isolated(fn: Callable[[], dict[str, Any]], timeout: float, isolation: str = "process") -> dict[str, Any]:
    """``fn()`` in a forked child with a wall-clock ``timeout`` (``inline``: in this process, no timeout).

    Returns ``fn``'s dict with ``ok=True``, or ``{"ok": False, "error": ...}`` when it raised or ran out of time.
    """
    if isolation == "inline":
        try:
            return {"ok": True, **fn()}
        except Exception as err:
            return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, fn), daemon=True)
    process.start()
    send.close()
    try:
        if receive.poll(timeout):
            return receive.recv()
        return {"ok": False, "error": f"timed out after {timeout:g} s (stopped)"}
    except EOFError:
        return {"ok": False, "error": f"the candidate's process died (exit code {process.exitcode})"}
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receive.close()


def run_generated(
    code_path: Path, store_dir: Path, env: dict[str, Any], episodes: list[int], seed: int, timeout: float
) -> dict[str, Any]:
    """Run generated provider code (``class Provider(MemoryProvider)``, ``Provider(store_dir)``) on a task stream
    in a sandboxed ``python -I`` subprocess (resource limits, sockets disabled, cwd = its store). ``timeout`` counts
    from when the child has loaded the zoo (its own alarm stops the candidate); the child is killed
    ``STARTUP_GRACE`` seconds later in any case."""
    spec = {
        "code": str(code_path),
        "store_dir": str(store_dir),
        "env": env,
        "episodes": episodes,
        "seed": seed,
        "timeout": timeout,
    }
    with tempfile.TemporaryDirectory(prefix="zoo_memevolve_") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        # the zoo (and torch) load before the limits; the generated code runs after them
        limits = sandbox_prelude(int(timeout + STARTUP_GRACE), 8192)
        program = f"from zoo.memory.worker import main\n{limits}\nmain()\n"
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", program, str(spec_path), str(out_path)],
                cwd=store_dir,
                env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                capture_output=True,
                text=True,
                timeout=timeout + STARTUP_GRACE,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"timed out after {timeout:g} s (+ {STARTUP_GRACE:g} s start-up; killed)"}
        if done.returncode != 0 or not out_path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()
            last = tail[-1] if tail else f"exit code {done.returncode}"
            missing = re.search(r"No module named '([^']+)'", done.stderr or "")
            if missing:
                last = f"the generated code imports {missing.group(1)!r}, which is not installed (never auto-installed)"
            return {"ok": False, "error": last}
        return {"ok": True, **json.loads(out_path.read_text())}


def evaluate_candidate(
    candidate: Candidate,
    store_dir: Path,
    env: dict[str, Any],
    episodes: list[int],
    seed: int,
    *,
    timeout: float = 120.0,
    isolation: str = "process",
    encoder: str = "hashing",
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Run ``candidate`` on a task stream in its own fresh ``store_dir``; failures come back as ``ok=False``."""
    store_dir = Path(store_dir)
    if store_dir.exists() and any(store_dir.iterdir()):
        raise ConfigError(f"{store_dir} is not empty: each evaluation needs a fresh store directory")
    store_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if candidate.code is not None:
        code_path = store_dir.parent / f"{store_dir.name}_provider.py"
        code_path.write_text(candidate.code)
        result = run_generated(code_path, store_dir, env, episodes, seed, timeout)
    elif candidate.genotype is None:
        result = run_isolated(lambda: run_stream(None, env, episodes, seed, max_steps), timeout, isolation)
    else:
        genotype = candidate.genotype

        def stream() -> dict[str, Any]:
            return run_stream(ModularMemory(genotype, store_dir, encoder), env, episodes, seed, max_steps)

        result = run_isolated(stream, timeout, isolation)
    if not result.get("ok"):
        return _failure(candidate, str(result.get("error")), time.perf_counter() - start)
    return {"name": candidate.name, **result, "store_dir": str(store_dir)}


# -- selection ----------------------------------------------------------------------------------------------------
def _objectives(result: dict[str, Any], use_time: bool) -> tuple[float, float, float]:
    return (float(result["success"]), float(result["tokens"]), float(result["time"]) if use_time else 0.0)


def dominates(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """``a`` dominates ``b``: accuracy not lower, tokens and time not higher, one of them strictly better."""
    no_worse = a[0] >= b[0] and a[1] <= b[1] and a[2] <= b[2]
    return no_worse and (a[0] > b[0] or a[1] < b[1] or a[2] < b[2])


def pareto_ranks(points: list[tuple[float, float, float]]) -> list[int]:
    """Non-dominated sorting: rank 0 is the front; no point of a rank dominates another of the same rank."""
    ranks = [-1] * len(points)
    remaining = set(range(len(points)))
    rank = 0
    while remaining:
        front = {i for i in remaining if not any(dominates(points[j], points[i]) for j in remaining if j != i)}
        for i in front:
            ranks[i] = rank
        remaining -= front
        rank += 1
    return ranks


def tie_break_scores(points: list[tuple[float, float, float]]) -> list[float]:
    """``0.6 acc + 0.25 token_norm + 0.15 time_norm``, costs min-max normalised with lower cost -> 1."""

    def norm(values: list[float]) -> list[float]:
        lo, hi = min(values), max(values)
        return [1.0 if hi <= lo else (hi - v) / (hi - lo) for v in values]

    tokens, times = norm([p[1] for p in points]), norm([p[2] for p in points])
    w_acc, w_tok, w_time = TIE_BREAK
    return [w_acc * p[0] + w_tok * t + w_time * s for p, t, s in zip(points, tokens, times, strict=True)]


def selection_order(results: list[dict[str, Any]], mode: str = "lexicographic", use_time: bool = True) -> list[int]:
    """Indices of the valid ``results`` (``ok``), best first; failed entries are never selected."""
    valid = [i for i, r in enumerate(results) if r.get("ok")]
    if mode == "lexicographic":
        return sorted(valid, key=lambda i: (-float(results[i]["success"]), float(results[i]["tokens"]), i))
    if mode != "pareto":
        raise ConfigError(f"selection={mode!r}; use one of {SELECTIONS}")
    points = [_objectives(results[i], use_time) for i in valid]
    ranks, scores = pareto_ranks(points), tie_break_scores(points)
    order = sorted(range(len(valid)), key=lambda j: (ranks[j], -scores[j], valid[j]))
    return [valid[j] for j in order]


# -- diagnose and design ------------------------------------------------------------------------------------------
def diagnose(result: dict[str, Any]) -> dict[str, Any]:
    """Per-module trouble scores in [0, 1] from a run's trajectory statistics, and the worst module.

    * ``retrieve``: share of retrieved items about another task family (irrelevant recall);
    * ``store``: the same symptom at 0.9 weight (a graph store focuses recall on a family) [interp];
    * ``manage``: share of duplicate items within one answer (no dedup / consolidation);
    * ``encode``: injected characters per item / 400, capped at 1 (verbose units such as raw trajectories);
    * ``top_k``: share of tasks that failed although memory about their family was given (too little recall).
    Ties go to the earlier module in this list.
    """
    memory = result.get("memory", dict.fromkeys(LOG_KEYS, 0))
    items, episodes = memory["items"], max(len(result.get("episodes", [])), 1)
    scores = {
        "retrieve": 1.0 - memory["hits"] / items if items else 0.0,
        "store": 0.9 * (1.0 - memory["hits"] / items) if items else 0.0,
        "manage": memory["duplicates"] / items if items else 0.0,
        "encode": min(1.0, memory["chars"] / items / 400.0) if items else 0.0,
        "top_k": result.get("failed_with_hits", 0) / episodes,
    }
    order = sorted(scores, key=lambda m: -scores[m])
    return {"scores": scores, "worst": order[0], "order": order, "memory": memory}


def mutations(genotype: Genotype, module: str) -> list[Genotype]:
    """Every single-module change of ``genotype`` for ``module`` (the rule-based designer's move set)."""
    g = genotype
    if module == "retrieve":
        out = [g.mutate(retrieve=r) for r in RETRIEVERS if r not in (g.retrieve, "hybrid")]
        return out + [
            g.mutate(retrieve="hybrid", alpha=a) for a in (0.3, 0.5, 0.7) if (g.retrieve, g.alpha) != ("hybrid", a)
        ]
    if module == "store":
        return [g.mutate(store=s) for s in STORES if s != g.store]
    if module == "manage":
        return [g.mutate(manage=m) for m in MANAGERS if m != g.manage]
    if module == "encode":
        return [g.mutate(encode=e) for e in ("insight", "skill", "raw") if e != g.encode]
    if module == "top_k":
        return [g.mutate(top_k=k) for k in sorted({g.top_k + 2, 2 * g.top_k, max(1, g.top_k - 1)}) if k != g.top_k]
    raise ConfigError(f"unknown module {module!r}")


def rule_based_design(
    base: Genotype,
    diagnosis: dict[str, Any],
    count: int,
    rng: random.Random,
    seen: set[str],
    modules: tuple[str, ...] | list[str] = DESIGN_MODULES,
) -> list[tuple[Genotype, str]]:
    """``count`` new genotypes: mutations of the worst module first (in a seeded random order), then of the next
    worst, skipping genotypes already evaluated (``seen``, by :meth:`Genotype.describe`). Only ``modules`` are
    changed; when their move sets run out and ``top_k`` is allowed, the nearest untried ``top_k`` values fill the
    ``count`` (so a ``[top_k]``-only designer keeps the same candidate budget round after round)."""
    out: list[tuple[Genotype, str]] = []
    order = [module for module in diagnosis["order"] if module in modules]
    for module in order:
        options = mutations(base, module)
        rng.shuffle(options)
        for option in options:
            if len(out) >= count:
                return out
            if option.describe() not in seen:
                seen.add(option.describe())
                out.append((option, module))
    if "top_k" in order:
        nearest = sorted(range(1, 4 * base.top_k + count + 2), key=lambda k: (abs(k - base.top_k), k))
        for option in (base.mutate(top_k=k) for k in nearest):
            if len(out) >= count:
                break
            if option.describe() not in seen:
                seen.add(option.describe())
                out.append((option, "top_k"))
    return out


DESIGN_PROMPT = """You design memory systems for a tool-using agent (EvolveLab interface).
Write one Python module defining `class Provider(MemoryProvider)` with `__init__(self, store_dir: str)` and the methods
`initialize() -> bool`, `provide_memory(request: MemoryRequest) -> MemoryResponse` (at most top_k items, best first) and
`take_in_memory(trajectory: TrajectoryData) -> tuple[bool, str]`. Import what you need from `zoo.memory`
(MemoryProvider, MemoryRequest, MemoryResponse, MemoryItem, MemoryStatus, TrajectoryData, Genotype, ModularMemory).
Keep all files in store_dir. Do not propose new frameworks, retraining or multi-agent designs; no hard-coded
task matching.

Current system: {system}
Diagnosis (trouble per module, 0 = fine, 1 = bad): {diagnosis}
Adopt 2-3 improvements for the worst modules. Answer with one ```python code block only."""


class LLMDesigner:
    """Asks a backend for provider code (the paper's generate phase); the code is only ever run sandboxed.

    Args:
        backend: any :class:`~zoo.agents.backends.Backend` (an OpenAI-compatible endpoint, a local model).
        creativity: sampling temperature ``0.3 + 0.9 * creativity`` (released default 0.5).
        max_tokens: reply budget.
    """

    def __init__(self, backend: Backend, creativity: float = 0.5, max_tokens: int = 2048) -> None:
        if not 0.0 <= creativity <= 1.0:
            raise ConfigError(f"designer creativity must be in [0, 1], got {creativity}")
        self.backend = backend
        self.temperature = 0.3 + 0.9 * creativity
        self.max_tokens = max_tokens

    def design(self, base: Genotype, diagnosis: dict[str, Any], count: int, seed: int) -> list[str | None]:
        """Provider sources (``None`` where the reply held no code block)."""
        prompt = DESIGN_PROMPT.format(system=base.describe(), diagnosis=json.dumps(diagnosis["scores"]))
        out: list[str | None] = []
        for i in range(count):
            reply = self.backend.complete(
                [{"role": "user", "content": prompt}],
                None,
                seed=seed + i,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
            ).content
            match = re.search(r"```(?:python)?\s*\n(.*?)```", reply or "", flags=re.DOTALL)
            out.append(match.group(1) if match else None)
        return out


# -- the driver ---------------------------------------------------------------------------------------------------
@dataclass
class MemEvolve:
    """The MemEvolve outer loop over :class:`Genotype` memory systems on a task environment.

    Args:
        base: the starting system.
        work_dir: where every round's stores, candidates and ``rounds.jsonl`` go (must be new or empty).
        env: ``{"name": "procworld", **kwargs}`` of the evolution tasks.
        rounds, candidates (m), tasks (x), finalists (t), reused (y), smoke_tasks: see the module docstring.
        selection: ``lexicographic`` | ``pareto``; pareto_time: wall time as the third Pareto objective.
        seed: the designer's RNG and the task seeds.
        timeout, smoke_timeout: seconds per evaluation (tournament/finals, validation).
        isolation: ``process`` (forked child with timeout) | ``inline`` (no timeout; for debugging).
        encoder: sentence-encoder spec of dense retrieval.
        designer: optional :class:`LLMDesigner`; llm_candidates: its candidates per round (added to the rules').
        max_steps: step cap per task (``None``: the environment's budget).
        base_in_finals: also send the base to the finals (released: only the top-t go) [option].
        reference_base: run the base on the finals stream too when it is not a finalist, outside selection, to
            measure what the round's change contributed on tasks nobody was selected on [zoo addition; logging].
        design_modules: the modules the rule-based designer may change (``[top_k]``: the tune-top_k-only control).
        extra_candidates: ``round -> [Candidate, ...]`` added to a round (tests inject failing systems here).
    """

    base: Genotype
    work_dir: str | Path
    env: dict[str, Any]
    rounds: int = 3
    candidates: int = 3
    tasks: int = 20
    finalists: int = 2
    reused: int = 5
    smoke_tasks: int = 5
    selection: str = "lexicographic"
    pareto_time: bool = True
    seed: int = 42
    timeout: float = 120.0
    smoke_timeout: float = 60.0
    isolation: str = "process"
    encoder: str = "hashing"
    designer: LLMDesigner | None = None
    llm_candidates: int = 1
    max_steps: int | None = None
    base_in_finals: bool = False
    reference_base: bool = True
    design_modules: tuple[str, ...] | list[str] = DESIGN_MODULES
    extra_candidates: dict[int, list[Candidate]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ConfigError(f"module.selection={self.selection!r}; use one of {SELECTIONS}")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"module.isolation={self.isolation!r}; use one of {ISOLATIONS}")
        for name in ("rounds", "tasks", "finalists", "smoke_tasks"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"module.{name} must be >= 1, got {getattr(self, name)}")
        if int(self.candidates) < 0 or not 0 <= int(self.reused) <= int(self.tasks):
            raise ConfigError(f"need candidates >= 0 and 0 <= reused ({self.reused}) <= tasks ({self.tasks})")
        modules = [str(m) for m in self.design_modules]
        if not modules or any(m not in DESIGN_MODULES for m in modules):
            raise ConfigError(
                f"module.design_modules={modules}; use a non-empty subset of {list(DESIGN_MODULES)} "
                "(e.g. [top_k] for the tune-top_k-only control)"
            )
        self.design_modules = tuple(modules)
        self.work_dir = Path(self.work_dir)
        if self.work_dir.exists() and any(self.work_dir.iterdir()):
            raise ConfigError(f"MemEvolve work_dir {self.work_dir} is not empty; give a new directory")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(self.seed)
        self.seen = {self.base.describe()}
        self.history: list[dict[str, Any]] = []
        self.current = Candidate("base", self.base, origin="initial")

    def evaluate(self, candidate: Candidate, phase: str, episodes: list[int], timeout: float) -> dict[str, Any]:
        round_dir = self.work_dir / f"round{len(self.history)}"
        return evaluate_candidate(
            candidate,
            round_dir / phase / candidate.name,
            self.env,
            episodes,
            self.seed,
            timeout=timeout,
            isolation=self.isolation,
            encoder=self.encoder,
            max_steps=self.max_steps,
        )

    def design(self, diagnosis: dict[str, Any], r: int) -> list[Candidate]:
        base = self.current.genotype or self.base
        out = [
            Candidate(f"r{r}c{i}", genotype.mutate(name=f"r{r}c{i}"), origin=f"rule:{module}")
            for i, (genotype, module) in enumerate(
                rule_based_design(base, diagnosis, self.candidates, self.rng, self.seen, self.design_modules)
            )
        ]
        if self.designer is not None:
            for j, code in enumerate(self.designer.design(base, diagnosis, self.llm_candidates, self.seed + r)):
                out.append(Candidate(f"r{r}llm{j}", code=code or "", origin="llm"))
        return out + list(self.extra_candidates.get(r, []))

    def run_round(self) -> dict[str, Any]:
        """One round; returns (and appends to ``rounds.jsonl``) its full record."""
        r = len(self.history)
        offset = 100_000 * (r + 1)
        tournament_tasks = list(range(offset, offset + self.tasks))
        reused = sorted(self.rng.sample(tournament_tasks, int(self.reused)))  # released: random.sample of the batch
        final_tasks = reused + list(range(offset + 50_000, offset + 50_000 + self.tasks))
        smoke = list(range(offset + 90_000, offset + 90_000 + self.smoke_tasks))
        base = self.current
        base_result = self.evaluate(base, "tournament", tournament_tasks, self.timeout)
        diagnosis = diagnose(base_result)
        designed = self.design(diagnosis, r)
        validation = {c.name: self.evaluate(c, "smoke", smoke, self.smoke_timeout) for c in designed}
        entrants = [base] + [c for c in designed if validation[c.name]["ok"]]
        results = [base_result] + [self.evaluate(c, "tournament", tournament_tasks, self.timeout) for c in entrants[1:]]
        order = selection_order(results, self.selection, self.pareto_time)
        chosen = order[: self.finalists]
        finalists = [entrants[i] for i in (sorted(set(chosen) | {0}) if self.base_in_finals else chosen)]
        finals = [self.evaluate(c, "finals", final_tasks, self.timeout) for c in finalists]
        final_order = selection_order(finals, self.selection, self.pareto_time)
        winner = finalists[final_order[0]] if final_order else base
        base_finals = next((x for c, x in zip(finalists, finals, strict=True) if c is base), None)
        if base_finals is None and self.reference_base:
            base_finals = self.evaluate(base, "finals", final_tasks, self.timeout)
        points = [_objectives(x, self.pareto_time) for x in results if x.get("ok")]
        record = {
            "round": r,
            "base": base.to_dict(),
            "diagnosis": diagnosis,
            "candidates": [{**c.to_dict(), "validation": _summary(validation[c.name])} for c in designed],
            "tournament": [_summary(x) | {"system": c.describe()} for c, x in zip(entrants, results, strict=True)],
            "tournament_order": [entrants[i].name for i in order],
            "pareto_ranks": dict(
                zip([entrants[i].name for i, x in enumerate(results) if x.get("ok")], pareto_ranks(points), strict=True)
            ),
            "finals": [_summary(x) | {"system": c.describe()} for c, x in zip(finalists, finals, strict=True)],
            "finals_order": [finalists[i].name for i in final_order],
            "winner": winner.to_dict(),
            "change": _change(base, winner),
            "base_finals": _summary(base_finals) | {"system": base.describe()} if base_finals is not None else None,
            "tasks": {"tournament": tournament_tasks, "finals": final_tasks, "smoke": smoke},
        }
        with (self.work_dir / "rounds.jsonl").open("a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        self.history.append(record)
        if winner is not base:
            self.current = Candidate("base", winner.genotype, winner.code, origin=winner.name)
        return record

    def run(self) -> list[dict[str, Any]]:
        for _ in range(int(self.rounds) - len(self.history)):
            self.run_round()
        return self.history


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The saved part of an evaluation; ``scores`` holds the per-task scores in the order the tasks ran."""
    keys = ("name", "ok", "error", "success", "tokens", "time", "memory", "failed_with_hits", "store_dir")
    out = {k: result.get(k) for k in keys if k in result}
    if "episodes" in result:
        out["scores"] = [float(row["score"]) for row in result["episodes"]]
    return out


def _change(base: Candidate, winner: Candidate) -> dict[str, Any]:
    """What the round's winner changed in the base: the genotype fields that differ (``["code"]`` for generated code,
    ``[]`` when the base is kept) and the designer's move (``winner.origin``, e.g. ``rule:top_k``)."""
    if winner is base:
        return {"origin": "kept", "modules": [], "from": base.describe(), "to": base.describe()}
    if base.genotype is None or winner.genotype is None:
        fields_changed = ["code"]
    else:
        old, new = base.genotype.to_dict(), winner.genotype.to_dict()
        fields_changed = [k for k in old if k != "name" and old[k] != new[k]]
    return {"origin": winner.origin, "modules": fields_changed, "from": base.describe(), "to": winner.describe()}


def compare_systems(
    systems: dict[str, Genotype | Candidate | None],
    env: dict[str, Any],
    episodes: list[int],
    seed: int,
    work_dir: str | Path,
    *,
    timeout: float = 300.0,
    isolation: str = "process",
    encoder: str = "hashing",
) -> dict[str, dict[str, Any]]:
    """Each system (``None``: no memory; a :class:`Candidate` may carry generated code) on the same task stream, from
    an empty store in ``work_dir/<name>``."""
    out = {}
    for name, system in systems.items():
        if isinstance(system, Candidate):
            candidate = Candidate(name, system.genotype, system.code, origin="compare")
        else:
            candidate = Candidate(name, system, origin="compare")
        out[name] = _summary(
            evaluate_candidate(
                candidate,
                Path(work_dir) / name,
                env,
                episodes,
                seed,
                timeout=timeout,
                isolation=isolation,
                encoder=encoder,
            )
        )
    return out


__all__ = [
    "DESIGN_MODULES",
    "Candidate",
    "LLMDesigner",
    "MemEvolve",
    "NoMemory",
    "compare_systems",
    "diagnose",
    "dominates",
    "evaluate_candidate",
    "mutations",
    "pareto_ranks",
    "rule_based_design",
    "run_stream",
    "selection_order",
    "tie_break_scores",
]
