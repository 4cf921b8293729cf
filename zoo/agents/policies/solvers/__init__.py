"""Per-environment hypothesis solvers: importing the package registers each in :data:`SOLVERS`
(:mod:`zoo.agents.policies.solvers.base`)."""

from zoo.agents.policies.solvers.base import SOLVERS, HypothesisSet, Solver, register_solver
from zoo.agents.policies.solvers.bio import BioSolver
from zoo.agents.policies.solvers.grid import GridSolver
from zoo.agents.policies.solvers.sequence import SequenceSolver

__all__ = ["SOLVERS", "BioSolver", "GridSolver", "HypothesisSet", "SequenceSolver", "Solver", "register_solver"]
