"""Installed as ``zoo.callbacks``; the folder sits at the top level of the repository by design.

The callbacks are imported on first use (``zoo.callbacks.RunGuard``, ``from zoo.callbacks import RunGuard``, a
config's ``_target_: zoo.callbacks.RunGuard``; :mod:`zoo.lazy`), so a run loads only the callbacks it uses.
"""

from zoo.lazy import lazy_exports

if __name__ != "zoo.callbacks":
    raise ImportError(
        "The 'callbacks' folder of paperzoo is installed as 'zoo.callbacks'. Use 'import zoo.callbacks' "
        "(after 'pip install -e .' in the repository root)."
    )

# public name -> the module of this package that defines it
HOME_MODULES = {
    "AlignmentFakingEval": "af_eval",
    "BucketWriter": "bucketing",
    "DecodeStats": "decode_stats",
    "DoReMiReweighting": "doremi",
    "EncoderMotifProbe": "structure_checks",
    "EvalRecords": "eval_records",
    "ForgettingMonitor": "forgetting",
    "GR3AlphaCalibration": "gr3_calibration",
    "LogGenerations": "log_generations",
    "LogLineProgress": "progress",
    "LogSamplerWeights": "sampler_weights",
    "MemoryIngestCallback": "memory_ingest",
    "MultiTurnEvaluation": "multiturn_eval",
    "NanoQuantExport": "nanoquant",
    "OfflineRowWriter": "offline_rows",
    "PreferencePairRecords": "preference_pairs",
    "QuantizationReport": "quant_report",
    "ReasoningRedundancy": "reasoning_redundancy",
    "RotationInvariance": "structure_checks",
    "RunGuard": "run_guard",
    "SafeThinkMonitor": "safethink",
    "StepStateProbe": "valr_probe",
    "TrainingClock": "training_clock",
    "TransitionTV": "transition_tv",
    "UndoMetrics": "undo_metrics",
    "VisionFeatureProbe": "valr_probe",
    "WETCallback": "wet",
    "WatermarkCallback": "watermark",
    "auto_progress": "progress",
}

__all__ = list(HOME_MODULES)
__getattr__, __dir__ = lazy_exports(__name__, globals(), HOME_MODULES)
