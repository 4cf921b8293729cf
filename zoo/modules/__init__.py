"""Family LightningModules: methods are configs over these plus a core."""

from zoo.modules.base import ZooModule
from zoo.modules.causal_lm import CausalLMModule, exact_answer_match

__all__ = ["CausalLMModule", "ZooModule", "exact_answer_match"]
