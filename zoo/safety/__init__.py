"""Inference-time safety: SafeThink (arXiv 2602.11096) and its safety scorers."""

from zoo.safety.safethink import (
    DEFAULT_HOOK_LOOKAHEAD,
    DEFAULT_PREFIX,
    Intervention,
    SafeThinkHook,
    SafeThinkResult,
    always_prefix_generate,
    safethink_decoder,
    safethink_generate,
)
from zoo.safety.scorers import (
    FunctionScorer,
    IncrementalScoringSession,
    SafetyScorer,
    ScorerError,
    SequenceClassifierScorer,
    as_scorer,
    is_causal_classifier,
    load_safety_rm,
    scoring_session,
    validate_scores,
)

__all__ = [
    "DEFAULT_HOOK_LOOKAHEAD",
    "DEFAULT_PREFIX",
    "FunctionScorer",
    "IncrementalScoringSession",
    "Intervention",
    "SafeThinkHook",
    "SafeThinkResult",
    "SafetyScorer",
    "ScorerError",
    "SequenceClassifierScorer",
    "always_prefix_generate",
    "as_scorer",
    "is_causal_classifier",
    "load_safety_rm",
    "safethink_decoder",
    "safethink_generate",
    "scoring_session",
    "validate_scores",
]
