"""Family LightningModules: methods are configs over these plus a core."""

from zoo.modules.base import ZooBaseModule, ZooModule
from zoo.modules.causal_lm import CausalLMModule, exact_answer_match
from zoo.modules.grpo import GRPOModule
from zoo.modules.sequence_classifier import SequenceClassifierModule
from zoo.modules.structure_lm import StructureLMModule
from zoo.modules.valr import VaLRModule

__all__ = [
    "CausalLMModule",
    "GRPOModule",
    "SequenceClassifierModule",
    "StructureLMModule",
    "VaLRModule",
    "ZooBaseModule",
    "ZooModule",
    "exact_answer_match",
]
