"""Shared pieces of the zoo's datamodules: tokenized rows, padding, the training sampler seam and mid-epoch resume."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from zoo.data.encoding import encode_prompt, pad_sequences
from zoo.data.samplers import ResumableSampler, TrainSampler
from zoo.data.sources import Row, RowSource
from zoo.errors import ConfigError

__all__ = [
    "IGNORE_INDEX",
    "ListDataset",
    "ResumableSampler",
    "RowDataModule",
    "TrainSampler",
    "collate_columns",
    "encode_completion",
    "encode_prompt",
    "pad_sequences",
]

IGNORE_INDEX = -100


class ListDataset(Dataset):
    """A list of already-encoded items."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def collate_columns(items: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """The ``columns`` of a batch: for every field that some item's ``columns`` holds, the list of its values over
    the items (``None`` where an item lacks it)."""
    keys = sorted({k for it in items for k in it["columns"]})
    return {k: [it["columns"].get(k) for it in items] for k in keys}


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Completion token ids followed by EOS."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


class RowDataModule(pl.LightningDataModule, ABC):
    """Base of the zoo's datamodules: rows from a :class:`~zoo.data.sources.RowSource`, tokenized once.

    Subclasses set ``required_fields`` and implement :meth:`encode` and :meth:`collate`. The training loader
    draws its rows with ``sampler`` (the ``datamodule/sampler=`` seam, :mod:`zoo.data.samplers`; default
    :class:`~zoo.data.samplers.ResumableSampler`), bound to the encoded training rows. The datamodule's
    ``state_dict`` records the position inside the epoch and the sampler's state (e.g. the domain weights in
    force), so that ``ckpt_path=last`` resumes mid-epoch on the exact next batch. A callback reaches the sampler
    as ``trainer.datamodule.sampler``. ``predict_split`` names the split the predict stage reads (``test`` by
    default; offline data stages read ``train``).
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
        sampler: TrainSampler | None = None,
        predict_split: str = "test",
    ) -> None:
        super().__init__()
        if predict_split not in ("train", "val", "test"):
            raise ConfigError(f"datamodule.predict_split must be train, val or test, got {predict_split!r}")
        self.predict_split = predict_split
        self.tokenizer = tokenizer
        self.source = source
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.max_length = max_length
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.sampler = sampler if sampler is not None else ResumableSampler()
        self.datasets: dict[str, ListDataset] = {}
        self.dataset_rows: dict[str, Sequence[Row]] = {}
        self._pending_resume: tuple[int, int, dict[str, Any]] | None = None

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
            self.build_dataset(split, self.source.rows(split, self.required_fields))
        return self.datasets[split]

    def build_dataset(self, split: str, rows: Sequence[Row]) -> ListDataset:
        """Encode ``rows`` as the split's dataset; item ``i`` comes from ``rows[i]`` (the sampler reads its columns)."""
        self.datasets[split] = ListDataset([self.encode(r, i, split) for i, r in enumerate(rows)])
        self.dataset_rows[split] = rows
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        if stage in (None, "fit"):
            self.dataset("train")
            self.dataset("val")
        elif stage == "validate":
            self.dataset("val")
        elif stage == "test":
            self.dataset("test")
        elif stage == "predict":
            self.dataset(self.predict_split)

    def train_dataloader(self) -> DataLoader:
        data = self.dataset("train")
        self.sampler.bind(self.dataset_rows["train"], self.batch_size, self.seed, self.shuffle)
        if self._pending_resume is not None:
            epoch, items_done, sampler_state = self._pending_resume
            self.sampler.load_state_dict(sampler_state)
            self.sampler.resume_at(epoch, items_done)
            self._pending_resume = None
        return DataLoader(
            data,
            batch_size=self.batch_size,
            sampler=self.sampler,
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
        return self._eval_loader(self.predict_split)

    # -- resume -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            return {}
        batches_done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        epoch, items_done = trainer.current_epoch, batches_done * self.batch_size
        return {
            "epoch": epoch,
            "items_done": items_done,
            "seed": self.seed,
            "sampler": self.sampler.state_dict(epoch, items_done),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "epoch" in state_dict:
            epoch, items_done = int(state_dict["epoch"]), int(state_dict["items_done"])
            self._pending_resume = (epoch, items_done, dict(state_dict.get("sampler") or {}))
