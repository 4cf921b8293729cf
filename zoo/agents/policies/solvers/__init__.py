"""Per-environment hypothesis solvers (importing them registers them in ``zoo.agents.policies.hypotheses.SOLVERS``)."""

from zoo.agents.policies.solvers.bio import BioSolver
from zoo.agents.policies.solvers.grid import GridSolver
from zoo.agents.policies.solvers.sequence import SequenceSolver

__all__ = ["BioSolver", "GridSolver", "SequenceSolver"]
