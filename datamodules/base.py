"""Shared pieces of the zoo's datamodules: tokenized rows, padding and mid-epoch resume."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from transformers import PreTrainedTokenizerBase

from zoo.data.encoding import encode_prompt, pad_sequences  # noqa: F401  (re-exported: datamodules import them here)
from zoo.data.sources import Row, RowSource

IGNORE_INDEX = -100


class ResumableSampler(Sampler[int]):
    """A per-epoch permutation (seeded by ``seed + epoch``) that can start part-way through an epoch.

    Lightning calls :meth:`set_epoch` at every epoch start; the datamodule restores ``(epoch, skip)`` from
    a checkpoint so that a resumed run sees exactly the batches an uninterrupted run would.
    """

    def __init__(self, num_items: int, seed: int = 0, shuffle: bool = True) -> None:
        self.num_items = num_items
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, items_done: int) -> None:
        """Skip the first ``items_done`` items the next time epoch ``epoch`` is iterated."""
        self._resume = (epoch, items_done)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=generator).tolist()
        else:
            order = list(range(self.num_items))
        if self._resume is not None and self._resume[0] == self.epoch:
            order = order[self._resume[1] :]
            self._resume = None
        return iter(order)

    def __len__(self) -> int:
        return self.num_items


class ListDataset(Dataset):
    """A list of already-encoded items."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Completion token ids followed by EOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


class RowDataModule(pl.LightningDataModule, ABC):
    """Base of the zoo's datamodules: rows from a :class:`~zoo.data.sources.RowSource`, tokenized once.

    Subclasses set ``required_fields`` and implement :meth:`encode` and :meth:`collate`. The training
    loader uses a :class:`ResumableSampler`; the datamodule's ``state_dict`` records the position inside
    the epoch so that ``ckpt_path=last`` resumes mid-epoch on the exact next batch.
    """

    required_fields: tuple[str, ...] = ("prompt",)

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        source: RowSource,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        max_length: int = 256,
        num_workers: int = 0,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.source = source
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.max_length = max_length
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.datasets: dict[str, ListDataset] = {}
        self._train_sampler: ResumableSampler | None = None
        self._pending_resume: tuple[int, int] | None = None

    # -- subclass API -------------------------------------------------------------------------------------------
    @abstractmethod
    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        """Encode one row into the item the collate function consumes."""

    @abstractmethod
    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Collate encoded items into a batch."""

    # -- Lightning hooks ----------------------------------------------------------------------------------------
    def dataset(self, split: str) -> ListDataset:
        """The encoded dataset of a split (built on first use)."""
        if split not in self.datasets:
            rows = self.source.rows(split, self.required_fields)
            self.datasets[split] = ListDataset([self.encode(r, i, split) for i, r in enumerate(rows)])
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit"):
            self.dataset("train")
            self.dataset("val")
        elif stage == "validate":
            self.dataset("val")
        elif stage in ("test", "predict"):
            self.dataset("test")

    def train_dataloader(self) -> DataLoader:
        data = self.dataset("train")
        self._train_sampler = ResumableSampler(len(data), seed=self.seed, shuffle=self.shuffle)
        if self._pending_resume is not None:
            self._train_sampler.resume_at(*self._pending_resume)
            self._pending_resume = None
        return DataLoader(
            data,
            batch_size=self.batch_size,
            sampler=self._train_sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            drop_last=True,
        )

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(
            self.dataset(split), batch_size=self.eval_batch_size, collate_fn=self.collate, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    # -- resume -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            return {}
        batches_done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"epoch": trainer.current_epoch, "items_done": batches_done * self.batch_size, "seed": self.seed}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "epoch" in state_dict:
            self._pending_resume = (int(state_dict["epoch"]), int(state_dict["items_done"]))
