"""Installed as ``zoo.callbacks``; the folder sits at the top level of the repository by design."""

if __name__ != "zoo.callbacks":
    raise ImportError(
        "The 'callbacks' folder of paperzoo is installed as 'zoo.callbacks'. Use 'import zoo.callbacks' "
        "(after 'pip install -e .' in the repository root)."
    )

from zoo.callbacks.af_eval import AlignmentFakingEval
from zoo.callbacks.bucketing import BucketWriter
from zoo.callbacks.decode_stats import DecodeStats
from zoo.callbacks.doremi import DoReMiReweighting
from zoo.callbacks.eval_records import EvalRecords
from zoo.callbacks.forgetting import ForgettingMonitor
from zoo.callbacks.gr3_calibration import GR3AlphaCalibration
from zoo.callbacks.log_generations import LogGenerations
from zoo.callbacks.memory_ingest import MemoryIngestCallback
from zoo.callbacks.multiturn_eval import MultiTurnEvaluation
from zoo.callbacks.nanoquant import NanoQuantExport
from zoo.callbacks.offline_rows import OfflineRowWriter
from zoo.callbacks.preference_pairs import PreferencePairRecords
from zoo.callbacks.progress import LogLineProgress, auto_progress
from zoo.callbacks.quant_report import QuantizationReport
from zoo.callbacks.reasoning_redundancy import ReasoningRedundancy
from zoo.callbacks.run_guard import RunGuard
from zoo.callbacks.safethink import SafeThinkMonitor
from zoo.callbacks.sampler_weights import LogSamplerWeights
from zoo.callbacks.structure_checks import EncoderMotifProbe, RotationInvariance
from zoo.callbacks.training_clock import TrainingClock
from zoo.callbacks.transition_tv import TransitionTV
from zoo.callbacks.undo_metrics import UndoMetrics
from zoo.callbacks.valr_probe import StepStateProbe, VisionFeatureProbe
from zoo.callbacks.watermark import WatermarkCallback
from zoo.callbacks.wet import WETCallback

__all__ = [
    "AlignmentFakingEval",
    "BucketWriter",
    "DecodeStats",
    "DoReMiReweighting",
    "EncoderMotifProbe",
    "EvalRecords",
    "ForgettingMonitor",
    "GR3AlphaCalibration",
    "LogGenerations",
    "LogLineProgress",
    "LogSamplerWeights",
    "MemoryIngestCallback",
    "MultiTurnEvaluation",
    "NanoQuantExport",
    "OfflineRowWriter",
    "PreferencePairRecords",
    "QuantizationReport",
    "ReasoningRedundancy",
    "RotationInvariance",
    "RunGuard",
    "SafeThinkMonitor",
    "StepStateProbe",
    "TrainingClock",
    "TransitionTV",
    "UndoMetrics",
    "VisionFeatureProbe",
    "WETCallback",
    "WatermarkCallback",
    "auto_progress",
]
