"""``QuantizationReport``: log how many bits per weight the evaluated model stores, whatever quantized it.

Post-training quantizers are compared on *measured* bits per weight, not on their targets. This callback logs, with
the evaluation metrics of every validation/test epoch (outside the sanity check):

* ``quant/bits_per_weight`` -- :func:`zoo.quant.base.measured_bits_per_weight` of ``pl_module.model`` (bitsandbytes
  codes + scales, packed binary factors + scales, or the storage bits of full-precision linears);
* ``quant/kl_before_distill`` / ``quant/kl_after_distill`` -- when the module's quantizer keeps a report with them
  (NanoQuant's model reconstruction);
* ``quant/calibration_real_tokens`` -- real (unpadded) calibration tokens, and ``quant/block_error_ratio`` -- the
  mean over decoder blocks of the block's weighted output error after reconstruction over its ADMM-only error on
  the calibration data (1 = no gain), when the quantizer's report has them (NanoQuant).

It needs only a module with a built ``model`` (and optionally ``quantizer``), so it also works in a plain Lightning
script. With ``+method=nanoquant`` use it instead of the export callback's own logging (``log_metrics: false``), or
the two log the same key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl

from zoo.callbacks.evaluation import EvaluationCallback
from zoo.errors import ConfigError
from zoo.quant.base import measured_bits_per_weight

STAGES = ("validate", "test")


class QuantizationReport(EvaluationCallback):
    """Log the measured bits per weight (and NanoQuant's distillation KL) at the end of validation/test epochs.

    Args:
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
    """

    def __init__(self, stages: Sequence[str] = STAGES, prefix: str = "quant") -> None:
        super().__init__(stages, allowed=STAGES)
        self.prefix = prefix
        self.last: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not hasattr(pl_module, "model"):
            raise ConfigError(f"QuantizationReport needs a module with .model ({type(pl_module).__name__} has none)")

    def measure(self, pl_module: Any) -> dict[str, float]:
        """The values this callback logs for ``pl_module`` (without logging them)."""
        if pl_module.model is None:
            raise ConfigError("QuantizationReport: the module's model is not built")
        values = {"bits_per_weight": float(measured_bits_per_weight(pl_module.model))}
        report = getattr(getattr(pl_module, "quantizer", None), "report", None)
        for name in ("kl_before_distill", "kl_after_distill"):
            value = getattr(report, name, None)
            if value is not None:
                values[name] = float(value)
        config = getattr(report, "config", None) or {}
        if config.get("calibration_tokens") is not None:
            values["calibration_real_tokens"] = float(config["calibration_tokens"])
        blocks = getattr(report, "blocks", None) or []
        ratios = [b.final_error / b.admm_error for b in blocks if b.admm_error and b.admm_error > 0]
        if ratios:
            values["block_error_ratio"] = sum(ratios) / len(ratios)
        return values

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last = self.measure(pl_module)
        for name, value in self.last.items():
            pl_module.log(f"{self.prefix}/{name}", value, batch_size=1)


__all__ = ["QuantizationReport"]
