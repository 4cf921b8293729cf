"""Inference-time safety: SafeThink (arXiv 2602.11096) and its safety scorers."""

from zoo.safety.safethink import (
    DEFAULT_PREFIX,
    Intervention,
    SafeThinkHook,
    SafeThinkResult,
    always_prefix_generate,
    safethink_generate,
)
from zoo.safety.scorers import (
    FunctionScorer,
    SafetyScorer,
    ScorerError,
    SequenceClassifierScorer,
    as_scorer,
    load_safety_rm,
    validate_scores,
)

__all__ = [
    "DEFAULT_PREFIX",
    "FunctionScorer",
    "Intervention",
    "SafeThinkHook",
    "SafeThinkResult",
    "SafetyScorer",
    "ScorerError",
    "SequenceClassifierScorer",
    "always_prefix_generate",
    "as_scorer",
    "load_safety_rm",
    "safethink_generate",
    "validate_scores",
]
