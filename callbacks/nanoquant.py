"""``NanoQuantExport``: write a NanoQuant-quantized backbone (packed bits + JSON of shapes) after evaluation.

NanoQuant (arXiv 2602.06694) is post-training quantization: ``quant=nanoquant`` quantizes the backbone when the
module builds it (``Quantizer.apply`` inside ``configure_model``), the module's validation/test loop evaluates the
quantized model, and this callback exports it at ``on_validation_end`` / ``on_test_end``:

``<dirpath>/nanoquant.safetensors`` + ``nanoquant_config.json`` (:func:`zoo.quant.nanoquant.save_quantized`), the
architecture ``config.json``, the tokenizer and ``nanoquant_report.json`` (measured bpw, ranks, per-block errors,
KL before/after distillation, the evaluation metrics). Reload with
:func:`zoo.quant.nanoquant_quantizer.load_nanoquant_causal_lm` (or ``zoo.quant.nanoquant.load_quantized(dir, base)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only

from zoo.errors import ConfigError
from zoo.quant.nanoquant import NanoQuantLinear, save_quantized
from zoo.quant.nanoquant_quantizer import load_nanoquant_causal_lm

__all__ = ["NanoQuantExport", "load_nanoquant_causal_lm"]

REPORT_FILE = "nanoquant_report.json"


class NanoQuantExport(pl.Callback):
    """Export the module's NanoQuant model after validation/test (rank zero only).

    Args:
        dirpath: export directory (``${paths.output_dir}/nanoquant`` in ``+method=nanoquant``).
        on_validation: export at ``on_validation_end`` (the sanity check is skipped).
        on_test: export at ``on_test_end``.
        log_metrics: log ``quant/bits_per_weight`` (and the distillation KL) with the evaluation metrics.
        probe_rows: how many rows of the first evaluation batch's generations (prompts, completion ids and texts,
            the module's own greedy outputs) go into the report as ``probe``, so that a reload can be checked for
            identical generation (``zoo.generation.generate_text`` with ``probe.max_new_tokens``).
    """

    state_key_name = "NanoQuantExport"

    def __init__(
        self,
        dirpath: str,
        on_validation: bool = True,
        on_test: bool = True,
        log_metrics: bool = True,
        probe_rows: int = 4,
    ) -> None:
        super().__init__()
        if not dirpath:
            raise ConfigError("NanoQuantExport needs dirpath")
        self.dirpath = Path(dirpath)
        self.on_validation = on_validation
        self.on_test = on_test
        self.log_metrics = log_metrics
        if probe_rows < 0:
            raise ConfigError(f"NanoQuantExport: probe_rows={probe_rows} must be >= 0")
        self.probe_rows = int(probe_rows)
        self.probe: dict[str, Any] | None = None
        self.exported: Path | None = None

    @property
    def state_key(self) -> str:
        return f"{self.state_key_name}{{dirpath={str(self.dirpath)!r}}}"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        quantizer = getattr(pl_module, "quantizer", None)
        if quantizer is None or getattr(quantizer, "name", None) != "nanoquant":
            raise ConfigError(
                f"NanoQuantExport needs a module built with quant=nanoquant; {type(pl_module).__name__} has "
                f"quantizer {getattr(quantizer, 'name', None)!r}"
            )
        if not hasattr(pl_module, "model") or not hasattr(pl_module, "tokenizer"):
            raise ConfigError(f"NanoQuantExport needs a zoo module with .model and .tokenizer ({type(pl_module)})")

    def _log(self, pl_module: pl.LightningModule) -> None:
        report = getattr(pl_module.quantizer, "report", None)
        if not self.log_metrics or report is None:
            return
        pl_module.log("quant/bits_per_weight", float(report.bits_per_weight), batch_size=1)
        if report.kl_after_distill is not None:
            pl_module.log("quant/kl_after_distill", float(report.kl_after_distill), batch_size=1)

    def _record_probe(self, pl_module: pl.LightningModule, outputs: Any, batch_idx: int, dataloader_idx: int) -> None:
        if batch_idx != 0 or dataloader_idx != 0 or not self.probe_rows or not isinstance(outputs, dict):
            return
        if "completion_ids" not in outputs or "texts" not in outputs:
            return
        n = self.probe_rows
        sampling = getattr(pl_module, "sampling", None)
        self.probe = {
            "prompts": list(outputs.get("meta", {}).get("prompts", []))[:n],
            "completion_ids": outputs["completion_ids"][:n].tolist(),
            "texts": list(outputs["texts"])[:n],
            "max_new_tokens": getattr(sampling, "max_new_tokens", None),
            "do_sample": getattr(sampling, "do_sample", None),
        }

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.on_validation and not trainer.sanity_checking:
            self._record_probe(pl_module, outputs, batch_idx, dataloader_idx)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.on_test:
            self._record_probe(pl_module, outputs, batch_idx, dataloader_idx)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_validation and not trainer.sanity_checking:
            self._log(pl_module)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_test:
            self._log(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_validation and not trainer.sanity_checking and trainer.state.fn != "fit":
            self.export(trainer, pl_module)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.on_test:
            self.export(trainer, pl_module)

    @rank_zero_only
    def export(self, trainer: pl.Trainer | None, pl_module: pl.LightningModule) -> Path:
        """Write the packed model, architecture config, tokenizer and report to ``dirpath``."""
        model = pl_module.model
        report = getattr(pl_module.quantizer, "report", None)
        if model is None or not any(isinstance(m, NanoQuantLinear) for m in model.modules()):
            raise ConfigError("NanoQuantExport: the module's model has no NanoQuantLinear layers (quant=nanoquant?)")
        out = save_quantized(model, self.dirpath, config=report.config if report is not None else None)
        model.config.save_pretrained(out)
        pl_module.tokenizer.save_pretrained(out)
        metrics = {}
        if trainer is not None:
            metrics = {
                k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1
            }
        summary: dict[str, Any] = {"metrics": metrics, "probe": self.probe}
        if report is not None:
            summary.update(
                {
                    "bits_per_weight": report.bits_per_weight,
                    "ranks": report.ranks,
                    "kl_before_distill": report.kl_before_distill,
                    "kl_after_distill": report.kl_after_distill,
                    "blocks": [
                        {"admm_error": b.admm_error, "final_error": b.final_error, "reverted": b.reverted}
                        for b in report.blocks
                    ],
                    "config": report.config,
                }
            )
        (out / REPORT_FILE).write_text(json.dumps(summary, indent=2, default=str))
        self.exported = out
        return out
