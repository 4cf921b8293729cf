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
"""

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
