"""ThoughtFold's line-removal probe: does verification with the policy tell a dropped essential line from a dropped
redundant one?

ThoughtFold (arXiv:2606.03503) accepts a pruned reasoning when answers sampled after it are correct at a rate of at
least ``threshold``; its pairs then push the pruned lines down. That is only a redundancy signal if verification fails
when an essential line is missing. On held-out prompts of a task whose references label redundant steps, the probe
validates, with the module's own ThoughtFold validation (``module.aux.validate``: same ``repeat``, ``threshold``,
temperature and answer budget as training), the reference reasoning whole, without each essential line and without
each redundant line (:func:`zoo.rl.thoughtfold.line_removals`), at the start of training (the base policy) and at its
end, and logs (``probe/<when>_...``, ``when`` in ``start``, ``end``):

- ``pass_full``, ``pass_drop_essential``, ``pass_drop_redundant``: the share of candidates of each kind that pass;
- ``rows_any_essential_drop_passes``: the share of prompts where at least one essential-line removal passes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.errors import ConfigError
from zoo.rl.thoughtfold import FoldTarget, line_removals, parse_reasoning, split_steps

KINDS = ("full", "essential", "redundant")


class LineRemovalProbe(Callback):
    """Validate reference reasonings with one line removed, at the start and the end of training.

    Args:
        reference_column: the batch column with the reference completion (``datamodule.completion_column``).
        redundant_column: the batch column with the reference's per-step redundancy labels.
        max_rows: probe at most this many held-out prompts (the first ones of the validation split).
    """

    def __init__(
        self, reference_column: str = "reference", redundant_column: str = "step_redundant", max_rows: int = 64
    ) -> None:
        super().__init__()
        if max_rows < 1:
            raise ConfigError(f"LineRemovalProbe max_rows must be >= 1, got {max_rows}")
        self.reference_column = reference_column
        self.redundant_column = redundant_column
        self.max_rows = int(max_rows)
        self.results: dict[str, dict[str, float]] = {}

    def validation(self, pl_module: Any) -> Any:
        aux = getattr(pl_module, "aux", None)
        if not callable(getattr(aux, "validate", None)) or not hasattr(aux, "folder"):
            raise ConfigError(
                "LineRemovalProbe validates with ThoughtFold's verification: use it with module/grpo/aux=thoughtfold"
            )
        return aux

    @torch.no_grad()
    def probe(self, trainer: pl.Trainer, pl_module: Any) -> dict[str, float]:
        """Pass rates of the line-removal candidates on the first ``max_rows`` validation prompts."""
        aux = self.validation(pl_module)
        delimiter = aux.folder.delimiter
        passed: dict[str, list[bool]] = {kind: [] for kind in KINDS}
        rows_any, seen = [], 0
        for batch in trainer.datamodule.val_dataloader():
            columns = batch.get("columns", {})
            missing = [c for c in (self.reference_column, self.redundant_column, "answer") if c not in columns]
            if missing:
                raise ConfigError(
                    f"LineRemovalProbe needs the batch columns {missing}: set datamodule.completion_column="
                    f"{self.reference_column} and use a task whose rows label redundant steps"
                )
            take = min(len(batch["prompts"]), self.max_rows - seen)
            prompt_ids = [
                ids[mask.bool()].tolist()
                for ids, mask in zip(batch["prompt_ids"][:take], batch["prompt_attention_mask"][:take])
            ]
            candidates, kinds, owners, lengths = [], [], [], []
            for row in range(take):
                reference = columns[self.reference_column][row]
                parsed = parse_reasoning(reference)
                if isinstance(parsed, str):
                    raise ConfigError(f"LineRemovalProbe: reference {reference!r} has no reasoning block ({parsed})")
                steps = split_steps(parsed.body, delimiter)
                target = FoldTarget(row, steps, parsed.answer)
                # the answer budget: the reference completion's length (+ its end token)
                lengths.append(len(aux.encode(pl_module, reference)) + 1)
                for kind, kept in line_removals(columns[self.redundant_column][row]):
                    candidates.append((target, [steps[i] for i in kept]))
                    kinds.append(kind)
                    owners.append(row)
            verdicts = aux.validate(pl_module, candidates, prompt_ids, lengths, list(columns["answer"][:take]))
            for kind, verdict in zip(kinds, verdicts):
                passed[kind].append(bool(verdict.passed))
            for row in range(take):
                rows_any.append(
                    any(v.passed for k, o, v in zip(kinds, owners, verdicts) if o == row and k == "essential")
                )
            seen += take
            if seen >= self.max_rows:
                break
        out = {f"pass_{'drop_' if kind != 'full' else ''}{kind}": _mean(passed[kind]) for kind in KINDS}
        out["rows_any_essential_drop_passes"] = _mean(rows_any)
        out["rows"] = float(seen)
        return out

    def record(self, trainer: pl.Trainer, pl_module: Any, when: str) -> None:
        results = self.probe(trainer, pl_module)
        self.results[when] = results
        for logger in trainer.loggers:
            logger.log_metrics({f"probe/{when}_{k}": v for k, v in results.items()}, step=trainer.global_step)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record(trainer, pl_module, "start")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.record(trainer, pl_module, "end")


def _mean(values: list[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


__all__ = ["LineRemovalProbe"]
