"""Tokens/s of CausalLMModule under the Lightning Trainer vs a plain PyTorch loop, side by side.

Same model init, same batches (same order), same optimizer and threads; the ratio is what matters.
Writes the ``## SFT throughput`` section of docs/benchmarks.md.

    python benchmarks/sft_throughput.py [--steps 150] [--threads 2]
"""

from __future__ import annotations

import argparse
import functools
import time

import lightning.pytorch as pl
import torch
from _results import write_section

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import SFTDataModule
from zoo.losses import masked_nll
from zoo.modules import CausalLMModule


def make(steps: int, batch_size: int):
    backbone = TinyBackbone(seed=0)
    dm = SFTDataModule(
        backbone.tokenizer,
        TaskSource(Addition(2), num_train=steps * batch_size, num_val=8),
        batch_size=batch_size,
        shuffle=False,
    )
    dm.setup("fit")
    return backbone, dm


def lightning_run(steps: int, batch_size: int) -> tuple[float, int]:
    backbone, dm = make(steps, batch_size)
    module = CausalLMModule(backbone, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3), generate_on_eval=False)
    tokens = sum(int(b["attention_mask"].sum()) for b in dm.train_dataloader())
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return time.perf_counter() - start, tokens


def plain_run(steps: int, batch_size: int) -> tuple[float, int]:
    backbone, dm = make(steps, batch_size)
    model = backbone.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = 0
    start = time.perf_counter()
    model.train()
    for batch in dm.train_dataloader():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss, _ = masked_nll(logits, batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tokens += int(batch["attention_mask"].sum())
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"lightning": [], "plain": []}
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both arms
        for name, fn in (("plain", plain_run), ("lightning", lightning_run)):
            seconds, tokens = fn(args.steps, args.batch_size)
            results[name].append(tokens / seconds)
    best = {k: max(v) for k, v in results.items()}
    ratio = best["lightning"] / best["plain"]
    body = (
        f"Tiny Llama (0.87M params), 2-digit addition, batch {args.batch_size}, {args.steps} steps, "
        f"{args.threads} CPU threads, best of {args.repeats} interleaved repeats.\n\n"
        "| loop | tokens/s |\n|---|---|\n"
        f"| plain PyTorch | {best['plain']:.0f} |\n| CausalLMModule + Trainer | {best['lightning']:.0f} |\n\n"
        f"**Ratio Lightning / plain: {ratio:.3f}** (target >= 0.9).\n"
    )
    write_section("SFT throughput", body)
    print(body)


if __name__ == "__main__":
    main()
