"""Per-problem decoding statistics of evaluation generations (any decoder): repetition rate, tokens per problem,
decoding work, and the tree statistics of DTS (branch events, active hypotheses).

It reads only the generation protocol's dict (``meta`` holds the decoder's per-row statistics,
:meth:`zoo.protocols.GenerationResult.row_meta`), so it works on every zoo generating module with every
decoder; the DTS keys appear when the decoder is ``module/decoder=dts``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only

from zoo.callbacks.evaluation import STAGES, EvaluationCallback
from zoo.errors import ConfigError

# metric name -> (meta key, how a row's value becomes the metric)
ROW_STATS: dict[str, tuple[str, Any]] = {
    "accuracy": ("correct", float),
    "repetition_rate": ("finished", lambda finished: float(not finished)),
    "tokens_per_problem": ("completion_tokens", float),
    "decoded_tokens_per_problem": ("decoded_tokens", float),
    "branch_events": ("branch_events", float),
    "max_active": ("max_active", float),
    "mean_active": ("mean_active", float),
}


def batch_stats(meta: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """``{metric: (sum over rows, rows)}`` of the statistics a batch's ``meta`` carries.

    ``repetition_rate`` is the share of problems whose returned completion did not end (no EOS and no stop string)
    within the token budget; ``decoded_tokens_per_problem`` falls back to ``completion_tokens`` for one-trace decoders.
    """
    out: dict[str, tuple[float, int]] = {}
    for name, (key, convert) in ROW_STATS.items():
        values = meta.get(key)
        if key == "decoded_tokens" and not values:
            values = meta.get("completion_tokens")
        if isinstance(values, list) and values:
            out[name] = (float(sum(convert(v) for v in values)), len(values))
    return out


class DecodeStats(EvaluationCallback):
    """Log decoding statistics of validation/test generations as ``{split}/decode/<name>`` (epoch means over
    problems) and write those of ``predict`` to ``decode_stats_predict.json`` in the run directory.

    Names: ``accuracy`` (the verifier's verdict, as ``{split}/exact_match``), ``repetition_rate`` (no EOS within
    the budget), ``tokens_per_problem`` (returned completion), ``decoded_tokens_per_problem`` (all traces or
    hypotheses of the problem), and with DTS ``branch_events``, ``max_active``, ``mean_active`` (per problem).

    Args:
        stages: stages to measure, among ``validate``, ``test``, ``predict``.
        filename: JSON file of the predict statistics (in ``trainer.default_root_dir``).

    Under DDP, validation/test means are synchronised across ranks; the predict file holds rank zero's problems.
    """

    def __init__(
        self, stages: tuple[str, ...] | list[str] = STAGES, filename: str = "decode_stats_predict.json"
    ) -> None:
        super().__init__(stages)
        self.filename = filename
        self._predict: dict[str, list[float]] = {}

    @staticmethod
    def _meta(pl_module: pl.LightningModule, outputs: Any) -> dict[str, Any] | None:
        if not isinstance(outputs, dict) or not outputs.get("texts"):
            return None  # no generation in this step (e.g. generate_on_eval=false)
        meta = outputs.get("meta") or {}
        if "finished" not in meta or "completion_tokens" not in meta:
            raise ConfigError(
                f"DecodeStats: the outputs of {type(pl_module).__name__} carry no meta['finished'] / "
                "meta['completion_tokens']; zoo generating modules add them (GenerationResult.row_meta)"
            )
        return meta

    def _log(self, pl_module: pl.LightningModule, outputs: Any, split: str) -> None:
        meta = self._meta(pl_module, outputs)
        if meta is None:
            return
        for name, (total, rows) in batch_stats(meta).items():
            pl_module.log(
                f"{split}/decode/{name}", total / rows, batch_size=rows, on_step=False, on_epoch=True, sync_dist=True
            )

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "predict":
            self._predict.clear()

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if stage != "predict":
            self._log(pl_module, outputs, "val" if stage == "validate" else stage)
            return
        meta = self._meta(pl_module, outputs)
        if meta is None:
            return
        for name, (total, rows) in batch_stats(meta).items():
            sums = self._predict.setdefault(name, [0.0, 0])
            sums[0] += total
            sums[1] += rows

    def predict_stats(self) -> dict[str, float]:
        """Means over the problems predicted so far."""
        return {f"predict/decode/{name}": total / rows for name, (total, rows) in self._predict.items() if rows}

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "predict":
            self._write_predict(trainer)

    @rank_zero_only
    def _write_predict(self, trainer: pl.Trainer) -> None:
        if not self._predict:
            return
        stats = self.predict_stats()
        path = Path(trainer.default_root_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stats, indent=2))
        for logger in trainer.loggers:
            logger.log_metrics(stats, step=trainer.global_step)
