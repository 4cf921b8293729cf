"""Worker of ``tests/rl/test_fsdp_grpo.py``: two gloo processes (CPU) under Lightning's ``FSDPStrategy``
(``FULL_SHARD``, one unit per decoder layer from :class:`~zoo.backbones.sharding.DecoderLayerWrapPolicy`), started by
the test as ``python fsdp_worker.py OUT_DIR MODE``; Lightning starts the second rank by running the same command.

``MODE=decode``: ``trainer.predict`` of a GRPO module: batch 0 with the sampler's loop (GRPO's rollout decoder),
batch 1 with DTS. Rank 0's rows stop at the first "=" (the untrained model's first token), rank 1's run the whole
24-token budget, so the ranks' loops end at different steps while every forward all-gathers each decoder layer (a rank
that left early would leave the other's next all-gather waiting until the 60 s timeout). Each rank writes
``rank{r}.pt``: the classes FSDP wrapped and, per batch, the completion width, the number of forwards of the policy and
the texts.

``MODE=fit``: ``trainer.fit`` of the same GRPO module for two rollout steps with gradient clipping on and a KL
reference (``beta > 0``), then ``trainer.save_checkpoint(OUT_DIR/last.ckpt)``. Each rank writes ``rank{r}.pt``: the
gathered full parameters before and after, the global gradient norm after each clipping, the devices of the reference
model and of the module, and the classes FSDP wrapped (the policy first).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType
from torch.distributed.fsdp.wrap import enable_wrap

from zoo.backbones import TinyBackbone
from zoo.backbones.sharding import DecoderLayerWrapPolicy
from zoo.data.sources import JsonlSource
from zoo.datamodules import PromptDataModule
from zoo.generation.dts import DTSDecoder
from zoo.modules import GRPOModule
from zoo.rl.losses import ClippedPolicyLoss

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def text_hash_reward(prompts, completions, **kw):
    return [float(sum(map(ord, c)) % 13) for c in completions]


class Record(pl.Callback):
    """Per predicted batch: the result's completion width (the steps this rank's loop ran) and the number of forwards
    of the policy (the decode's and the agreement's dummy ones)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.record: dict = {"batches": []}

    def on_predict_start(self, trainer, pl_module):
        self.record["wrapped"] = sorted(
            {
                type(m.module).__name__
                for m in trainer.strategy.model.modules()
                if isinstance(m, FullyShardedDataParallel)
            }
        )

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        # batch 0: the sampler's loop (GRPO's rollouts); batch 1: DTS, whose hypotheses branch (every step is a branch
        # point here) and finish at different steps
        if batch_idx == 1:
            pl_module.decoder = DTSDecoder(
                entropy_threshold=10.0, varentropy_threshold=0.0, max_active=4, temperature=1
            )
        self.calls = 0
        self.handle = pl_module.model.register_forward_pre_hook(self.count)

    def count(self, module, args):
        self.calls += 1

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.handle.remove()
        width = int(outputs["completion_ids"].shape[1])
        self.record["batches"].append({"width": width, "forwards": self.calls, "texts": list(outputs["texts"])})


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` on CPU: Lightning refuses the exact class without a GPU and passes FSDP no
    ``device_id`` there (neither when it wraps the LightningModule nor in ``configure_model``'s wrapping context),
    which torch's FSDP then refuses; FSDP itself runs on CPU with gloo given ``device_id=cpu``. The wrapping is
    Lightning's otherwise."""

    def lightning_module_state_dict(self) -> dict[str, torch.Tensor]:
        """The full state dict gathered on rank 0, as Lightning's, without ``offload_to_cpu``: "offloading" parameters
        that are on the CPU already made rank 0 read freed memory while cloning them (a segmentation fault)."""
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FullyShardedDataParallel.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, config):
            return self.model.state_dict()

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)  # wrapped in configure_model: Lightning leaves it as it is
        return FullyShardedDataParallel(
            module=model,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )

    @contextlib.contextmanager
    def model_sharded_context(self):
        with enable_wrap(
            wrapper_cls=FullyShardedDataParallel,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        ):
            yield


def wrapped_classes(model: torch.nn.Module) -> list[str]:
    """The classes FSDP wrapped in ``model``, in module order (the outermost unit first)."""
    return [type(m.module).__name__ for m in model.modules() if isinstance(m, FullyShardedDataParallel)]


def full_state(trainer: pl.Trainer) -> dict[str, torch.Tensor]:
    """The policy's full (gathered) parameters, on every rank: the state dict of the module the strategy holds, as
    its checkpoints gather it."""
    model = trainer.strategy.model
    config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)
    with FullyShardedDataParallel.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    return {k.removeprefix("model."): v.detach().clone() for k, v in state.items() if k.startswith("model.")}


class FitRecord(pl.Callback):
    """The gathered parameters before and after the fit, the gradient norm after each clipping (the sharded
    gradients' squares summed over ranks), and where the reference model and the module are."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.record: dict = {"clipped_norms": []}

    def on_train_start(self, trainer, pl_module):
        self.record["initial"] = full_state(trainer)
        self.record["max_grad_norm"] = pl_module.max_grad_norm
        self.record["wrapped"] = wrapped_classes(trainer.strategy.model)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.model.parameters() if p.grad is not None]
        squares = torch.stack([g.pow(2).sum() for g in grads]).sum()
        torch.distributed.all_reduce(squares)
        self.record["clipped_norms"].append(float(squares.sqrt()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        reference = pl_module.ref_model
        self.record["reference_device"] = str(next(reference.parameters()).device) if reference is not None else None
        self.record["module_device"] = str(pl_module.device)

    def on_train_end(self, trainer, pl_module):
        self.record["final"] = full_state(trainer)
        self.record["steps"] = trainer.global_step


def build_module(stop_strings: list[str], max_grad_norm: float = 0.5) -> GRPOModule:
    return GRPOModule(
        TinyBackbone(seed=0, num_key_value_heads=2, **SMALL),
        rewards={"hash": text_hash_reward},
        group_size=4,
        policy_loss=ClippedPolicyLoss(beta=0.04),  # a reference model
        max_grad_norm=max_grad_norm,
        generation={"max_new_tokens": 24, "stop_strings": list("abcdefghijklmnopqrstuvwxyz")},
        eval_generation={"max_new_tokens": 24, "stop_strings": stop_strings},
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
    )


#: the fit's clipping threshold: far below the gradients' norm, so every update is clipped to it
FIT_MAX_GRAD_NORM = 1e-3


def run_mode(out: Path, mode: str) -> None:
    """One Trainer of ``mode`` (``decode``: predict, ``fit``: two GRPO updates) writing into ``out/<mode>/``."""
    pl.seed_everything(0)
    rank = os.environ.get("LOCAL_RANK", "0")  # Lightning sets it for the started rank
    # decode: rank 0's rows stop at the first "=" or letter (the untrained model writes "=" first), rank 1's run 24
    # tokens
    module = build_module(
        list("=abcdefghijklmnopqrstuvwxyz") if rank == "0" else [],
        max_grad_norm=FIT_MAX_GRAD_NORM if mode == "fit" else 0.5,
    )
    data = PromptDataModule(
        module.tokenizer, JsonlSource(*[str(out / f"train{rank}.jsonl")] * 2), batch_size=2 if mode == "fit" else 4,
        shuffle=False,
    )  # fmt: skip
    where = out / mode
    where.mkdir(exist_ok=True)
    record = FitRecord(where) if mode == "fit" else Record(where)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=CPUFSDPStrategy(auto_wrap_policy=DecoderLayerWrapPolicy(), timeout=timedelta(seconds=60)),
        use_distributed_sampler=False,
        max_steps=2,
        limit_val_batches=0,
        limit_predict_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
    )
    if mode == "fit":
        trainer.fit(module, data)
        trainer.save_checkpoint(where / "last.ckpt")  # what the run's checkpoint callback writes (collective)
    else:
        trainer.predict(module, data)
    torch.save(record.record, where / f"rank{trainer.global_rank}.pt")


def main(out: Path, modes: str) -> None:
    """Run each of the comma-separated ``modes`` in turn in the same two processes (one launch, one process group)."""
    for mode in modes.split(","):
        run_mode(out, mode)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
