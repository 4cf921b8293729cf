"""Checks of a structure-grounded LM (Cuttlefish, arXiv 2602.02780) during validation/test.

* :class:`RotationInvariance` -- re-decodes every evaluated batch after a random rotation (orthogonal matrix, det
  ``±1``) and translation of each structure's coordinates and logs the accuracy of the rotated copies and the
  fraction of answers that stay the same (an E(3)-invariant pipeline gives the same answers up to float round-off).
* :class:`EncoderMotifProbe` -- how much of a yes/no answer the frozen structure encoder exposes at all, without
  connector or LLM: a linear probe (:class:`zoo.interp.probes.LinearProbe`) on mean + max pooled atom embeddings of
  the evaluated structures, fitted on one half of each question kind and scored on the other half, next to the
  majority rate of that half.

Both need a module with the structure batch protocol of :class:`zoo.modules.structure_lm.StructureLMModule`
(``batch["structures"]``, ``generate_output(batch)``, ``structure_encoder``) and work in a plain Lightning script.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from zoo.callbacks.evaluation import EvaluationCallback
from zoo.errors import ConfigError
from zoo.interp.probes import LinearProbe

STAGES = ("validate", "test")


def random_rigid_motion(num: int, generator: torch.Generator, shift: float = 10.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` random orthogonal matrices ``[num, 3, 3]`` (QR of a Gaussian, sign-fixed; det ``±1``, so reflections
    are included) and translations ``[num, 3]`` (Gaussian, scale ``shift`` Å)."""
    q, r = torch.linalg.qr(torch.randn(num, 3, 3, generator=generator, dtype=torch.float64))
    rot = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return rot, torch.randn(num, 3, generator=generator, dtype=torch.float64) * shift


def moved(structures: Any, generator: torch.Generator) -> Any:
    """A copy of a structure batch with each structure rotated and translated (``pos' = pos R^T + t``)."""
    rot, shift = random_rigid_motion(structures.num_graphs, generator)
    graph = structures.batch.cpu()
    pos = structures.pos.detach().cpu().double()
    new = torch.einsum("aj,aij->ai", pos, rot[graph]) + shift[graph]
    return dataclasses.replace(structures, pos=new.to(structures.pos.dtype).to(structures.pos.device))


def _needs_structures(name: str, batch: Any) -> Any:
    structures = batch.get("structures") if isinstance(batch, dict) else None
    if structures is None:
        raise ConfigError(f"{name} needs batches with 'structures' (datamodule=structures)")
    return structures


class RotationInvariance(EvaluationCallback):
    """Decode each evaluated batch again with rigidly moved structures; log ``<prefix>/accuracy`` (rotated copies)
    and ``<prefix>/agreement`` (same answer text as the unmoved batch).

    Args:
        seed: seed of the rotations (batch ``i`` uses ``seed + i``).
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
    """

    def __init__(self, seed: int = 0, stages: Sequence[str] = ("test",), prefix: str = "rotation") -> None:
        super().__init__(stages, allowed=STAGES)
        self.seed = int(seed)
        self.prefix = prefix
        self._counts = {"rows": 0, "correct": 0, "agree": 0}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not callable(getattr(pl_module, "generate_output", None)):
            raise ConfigError(f"RotationInvariance needs a module with generate_output ({type(pl_module).__name__})")

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._counts = {"rows": 0, "correct": 0, "agree": 0}

    @torch.no_grad()
    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        if not isinstance(outputs, dict) or "texts" not in outputs:
            raise ConfigError("RotationInvariance needs the generation-protocol dict (generate_on_eval: true)")
        structures = _needs_structures("RotationInvariance", batch)
        generator = torch.Generator().manual_seed(self.seed + batch_idx)
        rotated, _ = pl_module.generate_output({**batch, "structures": moved(structures, generator)})
        self._counts["rows"] += len(rotated["texts"])
        self._counts["correct"] += sum(bool(c) for c in rotated["meta"]["correct"])
        self._counts["agree"] += sum(a.strip() == b.strip() for a, b in zip(rotated["texts"], outputs["texts"]))

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        rows = self._counts["rows"]
        if rows:
            pl_module.log(f"{self.prefix}/accuracy", self._counts["correct"] / rows, batch_size=rows)
            pl_module.log(f"{self.prefix}/agreement", self._counts["agree"] / rows, batch_size=rows)


@torch.no_grad()
def pooled_atom_features(encoder: torch.nn.Module, structures: Any) -> torch.Tensor:
    """``[B, 2D]``: mean and max over each structure's atom embeddings of the (frozen) encoder."""
    from zoo.multimodal.structure_encoder import encode_dense

    dtype = next(encoder.parameters()).dtype
    h, _, mask = encode_dense(
        encoder,
        structures.atom_types,
        structures.pos.to(dtype),
        structures.edge_index,
        structures.batch,
        structures.num_graphs,
    )
    m = mask.unsqueeze(-1)
    mean = (h * m).sum(1) / m.sum(1).clamp_min(1)
    top = h.masked_fill(~m, torch.finfo(h.dtype).min).amax(1)
    return torch.cat([mean, top], -1).double().cpu()


class EncoderMotifProbe(EvaluationCallback):
    """Linear probe of the answers from the frozen encoder's pooled atom embeddings, per question kind.

    Collects ``(features, answer)`` of every evaluated structure whose question kind is in ``kinds``; at the end of
    the epoch fits a multinomial :class:`~zoo.interp.probes.LinearProbe` (one class per distinct answer: yes/no,
    or the counts ``0``, ``1``, ...) on the first half of each kind and logs ``<prefix>/<kind>_accuracy`` on the
    second half and ``<prefix>/<kind>_majority`` (the most frequent answer's rate on that half). The features are
    pooled over all atoms (mean + max), so the probe says what a size-independent summary of the encoder holds.

    Args:
        kinds: question kinds to probe (``ring``, ``triad``, ``ring_count``, ``triad_count``, ``contact``).
        stages: among ``validate`` and ``test``.
        prefix: metric name prefix.
        l2: L2 penalty of the probe.
    """

    def __init__(
        self,
        kinds: Sequence[str] = ("ring", "triad"),
        stages: Sequence[str] = ("test",),
        prefix: str = "encoder_probe",
        l2: float = 1e-2,
    ) -> None:
        super().__init__(stages, allowed=STAGES)
        if not kinds:
            raise ConfigError("EncoderMotifProbe needs at least one question kind")
        self.kinds = tuple(kinds)
        self.prefix = prefix
        self.l2 = float(l2)
        self._data: dict[str, list[tuple[torch.Tensor, str]]] = {}
        self.last: dict[str, float] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not hasattr(pl_module, "structure_encoder"):
            raise ConfigError(f"EncoderMotifProbe needs a module with structure_encoder ({type(pl_module).__name__})")

    def eval_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._data = {k: [] for k in self.kinds}

    def eval_batch(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, stage: str
    ) -> None:
        s = _needs_structures("EncoderMotifProbe", batch)
        wanted = [i for i, k in enumerate(s.kinds) if k in self._data]
        if not wanted:
            return
        feats = pooled_atom_features(pl_module.structure_encoder, s)
        for i in wanted:
            self._data[s.kinds[i]].append((feats[i], str(s.answers[i]).strip().lower()))

    def measure(self) -> dict[str, float]:
        """Probe accuracy and majority rate per kind from what was collected (kinds with < 4 rows are skipped)."""
        out: dict[str, float] = {}
        # the features were collected under the evaluation loop's inference mode: fit on plain copies
        with torch.inference_mode(False), torch.enable_grad():
            for kind, rows in self._data.items():
                self._measure_kind(kind, rows, out)
        return out

    def _measure_kind(self, kind: str, rows: list[tuple[torch.Tensor, Any]], out: dict[str, float]) -> None:
        if len(rows) < 4:
            return
        x = torch.stack([f for f, _ in rows]).clone()
        classes = sorted({str(label) for _, label in rows})
        y = torch.tensor([classes.index(str(label)) for _, label in rows])
        half = len(rows) // 2
        out[f"{kind}_majority"] = float(torch.bincount(y[half:], minlength=len(classes)).max()) / (len(rows) - half)
        if len(set(y[:half].tolist())) < 2:  # one class only in the fitting half: the probe is that constant
            out[f"{kind}_accuracy"] = float((y[half:] == y[0]).double().mean())
            return
        probe = LinearProbe(num_classes=len(classes), l2=self.l2).fit(x[:half], y[:half])
        out[f"{kind}_accuracy"] = probe.accuracy(x[half:], y[half:])

    def eval_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.last = self.measure()
        for name, value in self.last.items():
            pl_module.log(f"{self.prefix}/{name}", value, batch_size=1)


__all__ = ["EncoderMotifProbe", "RotationInvariance", "moved", "pooled_atom_features", "random_rigid_motion"]
