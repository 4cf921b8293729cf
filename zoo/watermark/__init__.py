"""Sentence-level semantic watermarks: X-Guard (reconstruction), SemStamp and k-SemStamp on shared cores.

Start at :mod:`zoo.watermark.xguard` (the method, its equation map and the reconstruction choices).

* encoders -- :mod:`zoo.text.encoders`; partitions -- :mod:`zoo.watermark.partition`,
  :mod:`zoo.watermark.xguard`; fitting partitions on a domain corpus and schemes from settings (API and
  ``python -m zoo.watermark.fitting``) -- :mod:`zoo.watermark.fitting`; green sets -- :mod:`zoo.watermark.green`;
  rejection sampling -- :mod:`zoo.watermark.sampler`; watermarked generation with any causal LM (the decoder
  seam, ``module/decoder=semantic_watermark``) -- :mod:`zoo.watermark.decoder`; sentence boundaries --
  :mod:`zoo.watermark.sentences`; detection (API and ``python -m zoo.watermark.detect``) --
  :mod:`zoo.watermark.detect`; attacks -- :mod:`zoo.watermark.attacks`, paraphrase by a second generator --
  :mod:`zoo.watermark.paraphrase`. The Lightning adapter is :class:`zoo.callbacks.WatermarkCallback`.

The names below are imported on first use (PEP 562), so that ``python -m zoo.watermark.detect`` and ``python -m
zoo.watermark.fitting`` do not find their own module already imported by this package (runpy's RuntimeWarning).
``zoo.watermark.detect`` stays the detection function, as it always was, also after the submodule of the same name is
imported (the import system would set the package's attribute to the submodule).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# registers the 'balanced' partition kind that load_partitioner reads (imports neither detect nor fitting)
from zoo.watermark import xguard as _xguard  # noqa: F401

if TYPE_CHECKING:
    from zoo.text.encoders import (
        HashingEncoder,
        SentenceEncoder,
        SentenceTransformerEncoder,
        load_encoder,
        minilm_encoder,
        minilm_path,
    )
    from zoo.watermark.attacks import (
        Attack,
        ClauseReorder,
        Paraphrase,
        SentenceAttack,
        SentenceMerge,
        SentenceSplit,
        SynonymSubstitution,
    )
    from zoo.watermark.decoder import SemanticWatermarkDecoder, WatermarkGenerationResult
    from zoo.watermark.detect import DEFAULT_Z_THRESHOLD, DetectionResult, build_scheme, detect, z_score
    from zoo.watermark.fitting import PartitionSpec, SchemeSpec, domain_corpus, fit_partition
    from zoo.watermark.green import GreenList, green_regions, green_seed
    from zoo.watermark.paraphrase import ModelParaphraser, model_paraphrase
    from zoo.watermark.partition import KMeansPartitioner, LSHPartitioner, Partitioner, load_partitioner
    from zoo.watermark.sampler import RejectionSampler, RowState, SentenceSample, WatermarkedText, WatermarkScheme
    from zoo.watermark.sentences import first_sentence, first_sentence_end, sentence_ended, split_sentences
    from zoo.watermark.xguard import BalancedPartitioner, Whitener, equal_mass_offsets

# name -> the module that defines it
_HOMES = {
    "Attack": "zoo.watermark.attacks",
    "BalancedPartitioner": "zoo.watermark.xguard",
    "ClauseReorder": "zoo.watermark.attacks",
    "DEFAULT_Z_THRESHOLD": "zoo.watermark.detect",
    "DetectionResult": "zoo.watermark.detect",
    "GreenList": "zoo.watermark.green",
    "HashingEncoder": "zoo.text.encoders",
    "KMeansPartitioner": "zoo.watermark.partition",
    "LSHPartitioner": "zoo.watermark.partition",
    "ModelParaphraser": "zoo.watermark.paraphrase",
    "Paraphrase": "zoo.watermark.attacks",
    "PartitionSpec": "zoo.watermark.fitting",
    "Partitioner": "zoo.watermark.partition",
    "RejectionSampler": "zoo.watermark.sampler",
    "RowState": "zoo.watermark.sampler",
    "SchemeSpec": "zoo.watermark.fitting",
    "SemanticWatermarkDecoder": "zoo.watermark.decoder",
    "SentenceAttack": "zoo.watermark.attacks",
    "SentenceEncoder": "zoo.text.encoders",
    "SentenceMerge": "zoo.watermark.attacks",
    "SentenceSample": "zoo.watermark.sampler",
    "SentenceSplit": "zoo.watermark.attacks",
    "SentenceTransformerEncoder": "zoo.text.encoders",
    "SynonymSubstitution": "zoo.watermark.attacks",
    "WatermarkGenerationResult": "zoo.watermark.decoder",
    "WatermarkScheme": "zoo.watermark.sampler",
    "WatermarkedText": "zoo.watermark.sampler",
    "Whitener": "zoo.watermark.xguard",
    "build_scheme": "zoo.watermark.detect",
    "detect": "zoo.watermark.detect",
    "domain_corpus": "zoo.watermark.fitting",
    "equal_mass_offsets": "zoo.watermark.xguard",
    "first_sentence": "zoo.watermark.sentences",
    "first_sentence_end": "zoo.watermark.sentences",
    "fit_partition": "zoo.watermark.fitting",
    "green_regions": "zoo.watermark.green",
    "green_seed": "zoo.watermark.green",
    "load_encoder": "zoo.text.encoders",
    "load_partitioner": "zoo.watermark.partition",
    "minilm_encoder": "zoo.text.encoders",
    "minilm_path": "zoo.text.encoders",
    "model_paraphrase": "zoo.watermark.paraphrase",
    "sentence_ended": "zoo.watermark.sentences",
    "split_sentences": "zoo.watermark.sentences",
    "z_score": "zoo.watermark.detect",
}

__all__ = [
    "DEFAULT_Z_THRESHOLD",
    "Attack",
    "BalancedPartitioner",
    "ClauseReorder",
    "DetectionResult",
    "GreenList",
    "HashingEncoder",
    "KMeansPartitioner",
    "LSHPartitioner",
    "ModelParaphraser",
    "Paraphrase",
    "PartitionSpec",
    "Partitioner",
    "RejectionSampler",
    "RowState",
    "SchemeSpec",
    "SemanticWatermarkDecoder",
    "SentenceAttack",
    "SentenceEncoder",
    "SentenceMerge",
    "SentenceSample",
    "SentenceSplit",
    "SentenceTransformerEncoder",
    "SynonymSubstitution",
    "WatermarkGenerationResult",
    "WatermarkScheme",
    "WatermarkedText",
    "Whitener",
    "build_scheme",
    "detect",
    "domain_corpus",
    "equal_mass_offsets",
    "fit_partition",
    "first_sentence",
    "first_sentence_end",
    "green_regions",
    "green_seed",
    "load_encoder",
    "load_partitioner",
    "minilm_encoder",
    "minilm_path",
    "model_paraphrase",
    "sentence_ended",
    "split_sentences",
    "z_score",
]


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (and keep it on the package)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "detect" and isinstance(value, types.ModuleType):  # the submodule, just imported: keep the function
            value = value.detect
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
