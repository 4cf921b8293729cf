"""Worker of ``test_collective_timeout.py``: a two-process gloo DDP fit through ``zoo.cli.train.fit`` (Lightning's
launcher starts rank 1); rank 1 skips an all_reduce that rank 0 makes, so rank 0 waits until the timeout. The error is
reported as ``train.py``'s task does: ``error: <message>`` and exit status 2 for an actionable error.

The skipped all_reduce runs on a process group of the same two ranks whose timeout is the few seconds that
``trainer.strategy.timeout.minutes`` says (the default group keeps a long one: on a loaded machine rank 1 may take
longer than a few seconds just to start and join the rendezvous)."""

import sys
import time
from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import OmegaConf

from zoo.cli.train import fit, user_message

SECONDS = float(sys.argv[1])


class SkipsOnRankOne(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        group = torch.distributed.new_group([0, 1], timeout=timedelta(seconds=SECONDS))
        if self.global_rank == 0:
            torch.distributed.all_reduce(torch.ones(1), group=group)  # rank 1 never joins this one
        else:
            time.sleep(3 * SECONDS)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    cfg = OmegaConf.create({"trainer": {"strategy": {"timeout": {"minutes": SECONDS / 60}}}})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=300)),
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(torch.ones(4, 2), batch_size=2)
    try:
        fit(cfg, SkipsOnRankOne(), data, trainer, None)
    except Exception as err:
        message = user_message(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
