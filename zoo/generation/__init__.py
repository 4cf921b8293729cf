"""Decoding: the decoder seam (:mod:`zoo.generation.decoders`), its primitives (:mod:`zoo.generation.sampling`), the
step-wise decoder (:mod:`zoo.generation.stepwise`), answer voting and self-consistency (:mod:`zoo.generation.voting`),
DTS tree decoding (:mod:`zoo.generation.dts`) and N-MARS's undo-aware decoding with its cores
(:mod:`zoo.generation.undo`). A core: no Lightning, no datamodule import."""

from zoo.generation.decoders import (
    Decoder,
    ForwardHook,
    GreedyDecoder,
    LogitsProcessor,
    ModuleHook,
    Prefill,
    RowStop,
    SampleDecoder,
    generate,
    generate_text,
)
from zoo.generation.dts import BranchEvent, DTSDecoder, DTSResult, entropy_varentropy
from zoo.generation.prefix import SharedPrefix, distinct_rows
from zoo.generation.sampling import IncrementalDecoder, decode_completion, decode_completions, sample_next
from zoo.generation.stepwise import (
    StepAction,
    StepEvent,
    StepHook,
    StepwiseDecoder,
    StepwiseResult,
    read_traces,
    stepwise_generate,
)
from zoo.generation.undo import (
    UndoDecoder,
    UndoResult,
    augment_with_undo,
    resolve_undo,
)
from zoo.generation.voting import SelfConsistencyDecoder, VotedResult, majority_vote

__all__ = [
    "BranchEvent",
    "DTSDecoder",
    "DTSResult",
    "Decoder",
    "ForwardHook",
    "GreedyDecoder",
    "IncrementalDecoder",
    "LogitsProcessor",
    "ModuleHook",
    "Prefill",
    "RowStop",
    "SampleDecoder",
    "SelfConsistencyDecoder",
    "SharedPrefix",
    "StepAction",
    "StepEvent",
    "StepHook",
    "StepwiseDecoder",
    "StepwiseResult",
    "UndoDecoder",
    "UndoResult",
    "augment_with_undo",
    "VotedResult",
    "decode_completion",
    "decode_completions",
    "distinct_rows",
    "entropy_varentropy",
    "generate",
    "generate_text",
    "majority_vote",
    "resolve_undo",
    "sample_next",
    "read_traces",
    "stepwise_generate",
]
