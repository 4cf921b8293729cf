"""MemEvolve: Meta-Evolution of Agent Memory Systems (arXiv 2512.18746) -- the outer loop on the zoo's app.

A thin adapter: the datamodule yields round indices (``EpisodeDataModule(episodes=rounds)``), each ``test_step``
runs one round of :class:`zoo.memory.memevolve.MemEvolve` (plain Python), and the end of the test epoch compares the
systems on fresh tasks of the evolution families and on a held-out set of families (transfer): no memory, the
reproduced baselines (``compare``), the initial base and the evolved winner, each from an empty store.

Equation / step -> function map (paper Sec. 3-4; released ``MemEvolve/core/auto_evolver.py``):

* memory genotype Omega = (Encode, Store, Retrieve, Manage) -> :class:`zoo.memory.Genotype`,
  :class:`zoo.memory.ModularMemory`; provide / take-in interface -> :mod:`zoo.agents.memory_interface`;
* inner loop (tasks with a fixed Omega, each trajectory ingested) -> :func:`zoo.memory.memevolve.run_stream`;
* analyze / diagnose -> :func:`zoo.memory.memevolve.diagnose`;
* generate / design -> :func:`zoo.memory.memevolve.rule_based_design`, :class:`zoo.memory.memevolve.LLMDesigner`;
* validate (smoke tasks, timeout), tournament, finals -> :meth:`zoo.memory.memevolve.MemEvolve.run_round`;
* selection, lexicographic or Pareto with the released tie-break -> :func:`zoo.memory.memevolve.selection_order`,
  :func:`zoo.memory.memevolve.pareto_ranks`, :func:`zoo.memory.memevolve.tie_break_scores`.

Logged (``test/``): ``success/<system>`` and ``tokens/<system>`` on the evolution families,
``transfer_success/<system>`` and ``transfer_tokens/<system>`` on the held-out families, ``evolved_success``,
``rounds``. Files in ``work_dir``: ``rounds.jsonl`` (every round's candidates, scores, ranks, winner),
``comparison.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from omegaconf import DictConfig, OmegaConf

from zoo.agents.backends.base import Backend
from zoo.agents.backends.hf_local import backbone_llm
from zoo.agents.memory_interface import NoMemory
from zoo.errors import ConfigError
from zoo.memory.memevolve import Candidate, LLMDesigner, MemEvolve, compare_systems
from zoo.memory.system import Genotype, ModularMemory

log = logging.getLogger("zoo")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def genotype_of(config: Any) -> Genotype | None:
    """A ``memory`` node (config mapping or the provider Hydra built from it) -> its :class:`Genotype`
    (no memory -> ``None``)."""
    if isinstance(config, ModularMemory):
        return config.genotype
    if isinstance(config, NoMemory):
        return None
    config = _plain(config)
    if not isinstance(config, dict):
        raise ConfigError(f"expected a memory config (encode, store, retrieve, manage, ...), got {config!r}")
    if config.get("encode") == "none":
        return None
    return Genotype.from_config(config)


class MemEvolveModule(pl.LightningModule):
    """Run MemEvolve for ``rounds`` rounds (one per test batch), then compare the systems.

    Args:
        base: the starting memory system (a ``memory`` config node, e.g. a released baseline).
        env: the evolution tasks, ``{"name": "procworld", **kwargs}``.
        transfer_env: the held-out tasks (disjoint families) for the transfer comparison (``None``: skipped).
        compare: ``name -> memory config node`` of the reproduced baselines to compare (``encode: none``: no memory).
        work_dir: directory of the rounds' stores and records (new or empty).
        eval_tasks: tasks per system in the final comparison (each on the same stream).
        seed: task seeds and the designer's RNG.
        designer: optional :class:`LLMDesigner` (its code runs sandboxed); ``None``: rule-based only.
        backend: the settings of the designer's model (``${backend}``) when a backbone is composed and
            ``designer`` is unset (the designer added then uses them; ``backend=hf_local`` tunes the in-process
            model); unused otherwise.
        backbone, quantizer: the run's composed backbone and quantizer (``train.py`` passes them when ``backbone``
            is not ``none``): the designer's model, in process (:func:`zoo.agents.backbone_llm`); without a
            ``designer`` node one is added (its defaults, ``backend``'s model settings).
        evolve: the remaining :class:`MemEvolve` options (rounds, candidates, tasks, finalists, reused, ...).
    """

    def __init__(
        self,
        base: Any,
        env: Any,
        work_dir: str,
        transfer_env: Any = None,
        compare: Any = None,
        eval_tasks: int = 30,
        seed: int = 42,
        designer: LLMDesigner | None = None,
        backend: Backend | None = None,
        backbone: Any = None,
        quantizer: Any = None,
        **evolve: Any,
    ) -> None:
        super().__init__()
        if backbone is not None:
            designer = designer or LLMDesigner(backend)
            designer.backend = backbone_llm(designer.backend, backbone, quantizer)
        elif designer is not None:
            designer.backend = backbone_llm(designer.backend, None)
            if designer.backend is None:
                raise ConfigError(
                    "module.designer (the LLM designer) needs a model: compose a backbone (backbone=tiny, or "
                    "backbone=hf backbone.name_or_path=<dir>) or name a backend (backend=openai_compat ...)"
                )
        base_genotype = genotype_of(base)
        if base_genotype is None:
            raise ConfigError("module.base must be a memory system (encode != none): evolution needs a genotype")
        if int(eval_tasks) < 1:
            raise ConfigError(f"module.eval_tasks must be >= 1, got {eval_tasks}")
        self.env = dict(_plain(env))
        self.transfer_env = dict(_plain(transfer_env)) if transfer_env is not None else None
        self.compare = {name: genotype_of(node) for name, node in (_plain(compare) or {}).items()}
        self.eval_tasks = int(eval_tasks)
        self.work_dir = Path(work_dir)
        self.evolver = MemEvolve(
            base=base_genotype,
            work_dir=self.work_dir / "evolution",
            env=self.env,
            seed=seed,
            designer=designer,
            **{k: _plain(v) for k, v in evolve.items()},
        )
        self.comparison: dict[str, Any] = {}

    def configure_optimizers(self) -> None:
        return None

    def test_step(self, batch: list[int], batch_idx: int) -> dict[str, Any]:
        if len(self.evolver.history) >= int(self.evolver.rounds):
            return {}
        record = self.evolver.run_round()
        log.info(
            f"[memevolve] round {record['round']}: diagnosis -> {record['diagnosis']['worst']}; winner "
            f"{record['winner']['system']} ({', '.join(record['finals_order'])})"
        )
        return {"round": record["round"]}

    def on_test_epoch_end(self) -> None:
        current = self.evolver.current
        evolved = current.genotype
        systems: dict[str, Genotype | Candidate | None] = {"no_memory": None, **self.compare}
        systems["initial"] = self.evolver.base
        systems["evolved"] = current  # a genotype, or the code of an LLM-designed winner
        seed = self.evolver.seed
        common = {
            "isolation": self.evolver.isolation,
            "encoder": self.evolver.encoder,
            "timeout": 10 * self.evolver.timeout,
        }
        tasks = list(range(10_000_000, 10_000_000 + self.eval_tasks))
        self.comparison = {
            "evolved": evolved.to_dict() if evolved is not None else {"code": current.code, "name": current.origin},
            "initial": self.evolver.base.to_dict(),
            "in_distribution": compare_systems(systems, self.env, tasks, seed, self.work_dir / "compare", **common),
        }
        if self.transfer_env is not None:
            self.comparison["transfer"] = compare_systems(
                systems, self.transfer_env, tasks, seed, self.work_dir / "transfer", **common
            )
        (self.work_dir / "comparison.json").write_text(json.dumps(self.comparison, indent=2, default=str))
        for part, prefix in (("in_distribution", ""), ("transfer", "transfer_")):
            for name, result in self.comparison.get(part, {}).items():
                self.log(f"test/{prefix}success/{name}", float(result["success"]))
                self.log(f"test/{prefix}tokens/{name}", float(result["tokens"]))
        self.log("test/evolved_success", float(self.comparison["in_distribution"]["evolved"]["success"]))
        self.log("test/rounds", float(len(self.evolver.history)))
