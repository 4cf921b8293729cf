"""Family LightningModules: methods are configs over these plus a core."""

from zoo.modules.base import ZooModule
from zoo.modules.causal_lm import CausalLMModule, exact_answer_match
from zoo.modules.grpo import GRPOModule

__all__ = ["CausalLMModule", "GRPOModule", "ZooModule", "exact_answer_match"]
