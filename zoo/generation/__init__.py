"""Sampling and decoding loops shared by every generating method."""

from zoo.generation.sampling import (
    GenerationResult,
    IncrementalDecoder,
    SamplingParams,
    decode_completion,
    generate,
    generate_text,
    sample_next,
)
from zoo.generation.stepwise import StepAction, StepEvent, StepwiseResult, stepwise_generate

__all__ = [
    "GenerationResult",
    "IncrementalDecoder",
    "SamplingParams",
    "decode_completion",
    "generate",
    "generate_text",
    "sample_next",
    "StepAction",
    "StepEvent",
    "StepwiseResult",
    "stepwise_generate",
]
