"""Test-time adaptation cores: ROSA's one-step update toward the optimum reference (:mod:`zoo.adapt.rosa`) and
ROSA2's words + weights turn loop (:mod:`zoo.adapt.rosa2`)."""

from zoo.adapt.rosa import StepResult, candidate_logprobs, kl_to_optimum, optimum_weights, rosa_loss, rosa_step
from zoo.adapt.rosa2 import AdaptationSettings, ConversationRecord, Turn, parameter_shift, route, run_conversation

__all__ = [
    "AdaptationSettings",
    "ConversationRecord",
    "StepResult",
    "Turn",
    "candidate_logprobs",
    "kl_to_optimum",
    "optimum_weights",
    "parameter_shift",
    "rosa_loss",
    "rosa_step",
    "route",
    "run_conversation",
]
