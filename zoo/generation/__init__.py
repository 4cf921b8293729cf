"""Decoding: the decoder seam (:mod:`zoo.generation.decoders`), its primitives (:mod:`zoo.generation.sampling`) and
the step-wise decoder (:mod:`zoo.generation.stepwise`). A core: no Lightning, no datamodule import."""

from zoo.generation.decoders import (
    Decoder,
    ForwardHook,
    LogitsProcessor,
    ModuleHook,
    Prefill,
    RowStop,
    SampleDecoder,
    generate,
    generate_text,
)
from zoo.generation.sampling import (
    GenerationResult,
    IncrementalDecoder,
    SamplingParams,
    decode_completion,
    sample_next,
)
from zoo.generation.stepwise import (
    StepAction,
    StepEvent,
    StepHook,
    StepwiseDecoder,
    StepwiseResult,
    stepwise_generate,
)

__all__ = [
    "Decoder",
    "ForwardHook",
    "GenerationResult",
    "IncrementalDecoder",
    "LogitsProcessor",
    "ModuleHook",
    "Prefill",
    "RowStop",
    "SampleDecoder",
    "SamplingParams",
    "StepAction",
    "StepEvent",
    "StepHook",
    "StepwiseDecoder",
    "StepwiseResult",
    "decode_completion",
    "generate",
    "generate_text",
    "sample_next",
    "stepwise_generate",
]
