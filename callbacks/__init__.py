"""Installed as ``zoo.callbacks``; the folder sits at the top level of the repository by design."""

if __name__ != "zoo.callbacks":
    raise ImportError(
        "The 'callbacks' folder of paperzoo is installed as 'zoo.callbacks'. Use 'import zoo.callbacks' "
        "(after 'pip install -e .' in the repository root)."
    )

from zoo.callbacks.forgetting import ForgettingMonitor
from zoo.callbacks.gr3_calibration import GR3AlphaCalibration
from zoo.callbacks.log_generations import LogGenerations
from zoo.callbacks.nanoquant import NanoQuantExport
from zoo.callbacks.progress import LogLineProgress, auto_progress
from zoo.callbacks.run_guard import RunGuard
from zoo.callbacks.safethink import SafeThinkMonitor
from zoo.callbacks.sampler_weights import LogSamplerWeights

__all__ = [
    "ForgettingMonitor",
    "GR3AlphaCalibration",
    "LogGenerations",
    "LogLineProgress",
    "LogSamplerWeights",
    "NanoQuantExport",
    "RunGuard",
    "SafeThinkMonitor",
    "auto_progress",
]
