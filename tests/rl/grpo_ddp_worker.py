"""Worker of ``tests/rl/test_grpo_ddp.py``: a GRPO fit on two gloo processes (CPU), started by the test as
``python grpo_ddp_worker.py OUT_DIR``; Lightning starts the second rank by running the same command again.

Rank ``r`` reads its own prompts from ``OUT_DIR/train{r}.jsonl`` (``use_distributed_sampler=False``; rank 0 short
prompts, rank 1 long ones) and completions stop at any lower-case letter, so the ranks' rows have different lengths and
the default token budget (``micro_batch_tokens=1024``) packs them into different numbers of micro-batches. Each rank
writes ``rank{r}.pt``: the initial parameters, its first rollout, the (reduced) gradients of the first update, the
micro-batch counts it packed, the final parameters and the number of steps run.
"""

from __future__ import annotations

import functools
import os
import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy

from zoo.backbones import TinyBackbone
from zoo.data.sources import JsonlSource
from zoo.datamodules import PromptDataModule
from zoo.modules import GRPOModule

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def text_hash_reward(prompts, completions, **kw):
    return [float(sum(map(ord, c)) % 13) for c in completions]


class RecordingGRPO(GRPOModule):
    """Records how many micro-batches each update's rows were packed into (before the ranks agree on a count)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.packed: list[int] = []

    def row_micro_batches(self, rows, start):
        chunks = super().row_micro_batches(rows, start)
        if torch.is_grad_enabled():  # the loss passes, not the no-grad log-prob passes
            self.packed.append(len(chunks))
        return chunks


class Record(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out
        self.record: dict = {}

    def on_train_start(self, trainer, pl_module):
        self.record["initial"] = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if "grads" not in self.record:
            self.record["grads"] = {n: p.grad.detach().clone() for n, p in pl_module.model.named_parameters()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.record.setdefault("rollout", pl_module.last_rollout)

    def on_train_end(self, trainer, pl_module):
        self.record["final"] = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        self.record["steps"] = trainer.global_step
        self.record["packed"] = list(pl_module.packed)
        torch.save(self.record, self.out / f"rank{trainer.global_rank}.pt")


def build_module() -> RecordingGRPO:
    """The module of the run (also built by the test for the single-process comparison)."""
    return RecordingGRPO(
        TinyBackbone(seed=0, num_key_value_heads=2, **SMALL),
        rewards={"hash": text_hash_reward},
        group_size=4,
        micro_batch_tokens=1024,  # the config default (conf/module/grpo.yaml)
        max_grad_norm=None,  # the recorded gradients are the reduced ones, unclipped
        generation={"max_new_tokens": 24, "stop_strings": list("abcdefghijklmnopqrstuvwxyz")},
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
    )


def main(out: Path) -> None:
    pl.seed_everything(0)
    module = build_module()
    train = str(out / f"train{os.environ.get('LOCAL_RANK', '0')}.jsonl")  # Lightning sets it for the started rank
    data = PromptDataModule(module.tokenizer, JsonlSource(train, train), batch_size=4, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(timeout=timedelta(seconds=60)),
        max_steps=4,
        use_distributed_sampler=False,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record(out)],
    )
    trainer.fit(module, data)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
