"""EvolveLab memory systems and the MemEvolve outer loop (arXiv 2512.18746): a plain library, no Lightning.

* :mod:`zoo.agents.memory_interface` -- the EvolveLab provider interface (``provide_memory`` / ``take_in_memory`` /
  ``initialize``) and its data types;
* :mod:`zoo.memory.distill` -- Encode: raw trajectory, insights, skills;
* :mod:`zoo.memory.system` -- the design space (:class:`Genotype`) and :class:`ModularMemory` with its store;
* :mod:`zoo.memory.memevolve` -- MemEvolve: diagnose, design, validate, tournament, selection.
"""

from zoo.agents.memory_interface import (
    MemoryItem,
    MemoryItemType,
    MemoryProvider,
    MemoryRequest,
    MemoryResponse,
    MemoryStatus,
    NoMemory,
    TrajectoryData,
    trajectory_data,
)
from zoo.memory.system import MODULES, Genotype, MemoryStore, ModularMemory, StoreError, build_memory

__all__ = [
    "MODULES",
    "Genotype",
    "MemoryItem",
    "MemoryItemType",
    "MemoryProvider",
    "MemoryRequest",
    "MemoryResponse",
    "MemoryStatus",
    "MemoryStore",
    "ModularMemory",
    "NoMemory",
    "StoreError",
    "TrajectoryData",
    "build_memory",
    "trajectory_data",
]
