"""DoReMi proxy runs on fixed batches (``tests/mixing/test_doremi_steps.py``): the builders, and the two-process gloo
run (``python doremi_ddp_worker.py OUT_DIR``; Lightning starts rank 1 by running the same command again; rank ``r``
trains on micro-batch ``r`` of every step and writes its weights to ``OUT_DIR/rank{r}.json``).

Every step's micro-batches have the same domain make-up and rows of one length, so a step's gradient is the same
whether its rows come as one batch, as accumulated micro-batches or spread over ranks; the domains absent from a step
exercise the absent-domain rule.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy

from zoo.backbones import TinyBackbone
from zoo.callbacks import DoReMiReweighting
from zoo.data.samplers import WeightedDomainSampler
from zoo.losses import IGNORE_INDEX
from zoo.modules import CausalLMModule

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
#: the domains of each step's two micro-batches (each micro-batch has this make-up)
STEPS = (("a", "a", "b", "b"), ("a", "c", "a", "c"), ("b", "c", "c", "b"))


def backbone(seed: int) -> TinyBackbone:
    return TinyBackbone(seed=seed, num_key_value_heads=2, **SMALL)


def save_reference(directory: Path) -> None:
    """A reference LM (another random init) as a ``save_pretrained`` directory."""
    b = backbone(seed=1)
    b.build_model().save_pretrained(directory)
    b.tokenizer.save_pretrained(directory)


def micro_batches(tokenizer) -> list[list[tuple[str, str]]]:
    """``[step][micro-batch]`` rows ``(text, domain)``: two micro-batches per step, texts of one length."""
    out = []
    for step, domains in enumerate(STEPS):
        out.append([[(f"{d * 3} {step}{half}{i:02d} {d * 4}", d) for i, d in enumerate(domains)] for half in range(2)])
    return out


def collate(tokenizer, rows: list[tuple[str, str]]) -> dict:
    ids = torch.tensor([tokenizer(text)["input_ids"] for text, _ in rows])
    labels = ids.clone()
    labels[:, 0] = IGNORE_INDEX
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": labels,
        "columns": {"topic": [d for _, d in rows]},
    }


class FixedBatches(pl.LightningDataModule):
    """The given batches in order; ``sampler`` is the weighted-sampler seam the callback reads the domains from."""

    def __init__(self, batches: list[dict]) -> None:
        super().__init__()
        self.batches = batches
        self.sampler = WeightedDomainSampler(domain_column="topic")
        rows = [{"topic": d} for b in batches for d in b["columns"]["topic"]] + [{"topic": d} for d in "abc"]
        self.sampler.bind(rows, batch_size=4, seed=0, shuffle=False)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.batches, batch_size=None, shuffle=False)


def fit(out: Path, reference: Path, batches: list[dict], accumulate: int = 1, **trainer_kwargs) -> DoReMiReweighting:
    pl.seed_everything(0)
    module = CausalLMModule(
        backbone(seed=0), optimizer=functools.partial(torch.optim.SGD, lr=0.5), generate_on_eval=False
    )
    doremi = DoReMiReweighting(reference, out / "weights.json", eta=0.5, smoothing=0.01)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=len(STEPS),
        accumulate_grad_batches=accumulate,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[doremi],
        **trainer_kwargs,
    )
    trainer.fit(module, FixedBatches(batches))
    return doremi


def main(out: Path) -> None:
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning sets it for the rank it starts
    tokenizer = backbone(seed=0).tokenizer
    batches = [collate(tokenizer, step[rank]) for step in micro_batches(tokenizer)]
    doremi = fit(
        out,
        out / "reference",
        batches,
        devices=2,
        strategy=DDPStrategy(timeout=timedelta(seconds=60)),
        use_distributed_sampler=False,
    )
    record = {"current": doremi.state.current.tolist(), "average": doremi.state.average.tolist()}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
