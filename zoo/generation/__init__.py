"""Decoding: the decoder seam (:mod:`zoo.generation.decoders`), its primitives (:mod:`zoo.generation.sampling`), the
step-wise decoder (:mod:`zoo.generation.stepwise`) and N-MARS's undo-aware decoding with its cores
(:mod:`zoo.generation.undo`). A core: no Lightning, no datamodule import."""

from zoo.generation.decoders import (
    Decoder,
    ForwardHook,
    LogitsProcessor,
    ModuleHook,
    Prefill,
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
from zoo.generation.undo import (
    UndoDecoder,
    UndoResult,
    augment_with_undo,
    resolve_undo,
)

__all__ = [
    "Decoder",
    "ForwardHook",
    "GenerationResult",
    "IncrementalDecoder",
    "LogitsProcessor",
    "ModuleHook",
    "Prefill",
    "SampleDecoder",
    "SamplingParams",
    "StepAction",
    "StepEvent",
    "StepHook",
    "StepwiseDecoder",
    "StepwiseResult",
    "UndoDecoder",
    "UndoResult",
    "augment_with_undo",
    "decode_completion",
    "generate",
    "generate_text",
    "resolve_undo",
    "sample_next",
    "stepwise_generate",
]
