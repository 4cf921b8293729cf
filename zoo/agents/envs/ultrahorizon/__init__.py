"""UltraHorizon (arXiv:2509.21766) environments: Mystery Grid, Sequence Exploration, Alien Genetics Lab."""

from zoo.agents.envs.ultrahorizon.bio import AlienGeneticsLab
from zoo.agents.envs.ultrahorizon.grid import GRID_RULES, MysteryGrid
from zoo.agents.envs.ultrahorizon.sequence import SEQ_RULES, SequenceExploration

__all__ = ["GRID_RULES", "SEQ_RULES", "AlienGeneticsLab", "MysteryGrid", "SequenceExploration"]
