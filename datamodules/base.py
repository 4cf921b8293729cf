"""Shared pieces of the zoo's datamodules: tokenized rows, padding, the training sampler seam and mid-epoch resume."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from zoo.data.samplers import ResumableSampler, TrainSampler
from zoo.data.sources import Row, RowSource
from zoo.errors import ConfigError, DataError

log = logging.getLogger("zoo")

__all__ = [
    "IGNORE_INDEX",
    "ListDataset",
    "RowDataModule",
    "RowTooLong",
    "collate_columns",
    "encode_completion",
]

IGNORE_INDEX = -100
# distinct characters probed when naming the characters that a tokenizer maps to its unknown token
UNK_PROBE_CHARACTERS = 5000


class RowTooLong(DataError):
    """One row is longer than the datamodule's token limit (:meth:`RowDataModule.check_length`); the datamodule
    collects them and reports all at once."""

    def __init__(self, split: str, index: int, num_tokens: int, what: str) -> None:
        super().__init__(f"{split} row {index}: {what} has {num_tokens} tokens")
        self.split, self.index, self.num_tokens, self.what = split, index, num_tokens, what


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

    Rows are limited to :attr:`token_limit` tokens: ``max_length``, or the backbone's context length when that is
    smaller (``train.py`` passes it with :meth:`set_context_length`). Subclasses call :meth:`check_length`; the rows
    of a split that are too long are reported together, with their count. Tokens that the tokenizer maps to its
    unknown token (characters it has no token for) are counted and reported once per split with a warning.
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
        for name, value in (
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
            ("max_length", max_length),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"datamodule.{name} must be a positive whole number, got {value!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(f"datamodule.num_workers must be a whole number >= 0, got {num_workers!r}")
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
        self.context_length: int | None = None

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
        """Encode ``rows`` as the split's dataset; item ``i`` comes from ``rows[i]`` (the sampler reads its columns).

        Raises:
            DataError: naming how many rows exceed :attr:`token_limit` (and the first of them), if any do.
        """
        items, too_long = [], []
        for i, row in enumerate(rows):
            try:
                items.append(self.encode(row, i, split))
            except RowTooLong as err:
                too_long.append(err)
        if too_long:
            first, longest = too_long[0], max(e.num_tokens for e in too_long)
            raise DataError(
                f"{split}: {len(too_long)} of {len(rows)} rows are longer than {self.token_limit} tokens "
                f"({self.limit_reason()}); the longest has {longest} tokens, the first is {first}. "
                f"{self.limit_advice()}"
            )
        self.warn_unknown_tokens(split, rows, items)
        self.datasets[split] = ListDataset(items)
        self.dataset_rows[split] = rows
        return self.datasets[split]

    # -- length and vocabulary checks -----------------------------------------------------------------------
    def set_context_length(self, tokens: int | None) -> None:
        """Limit rows to the backbone's context (``None``: unknown, ``max_length`` alone applies); a ``max_length``
        above it is lowered to it, with a warning."""
        self.context_length = tokens
        if tokens is not None and self.max_length > tokens:
            log.warning(
                "datamodule.max_length=%d exceeds the backbone's context of %d tokens (its max_position_embeddings): "
                "rows are limited to %d tokens",
                self.max_length,
                tokens,
                tokens,
            )

    @property
    def token_limit(self) -> int:
        """The most tokens a row may have: ``max_length``, or the backbone's context length when smaller."""
        if self.context_length is None:
            return self.max_length
        return min(self.max_length, self.context_length)

    def limit_reason(self) -> str:
        if self.context_length is not None and self.context_length < self.max_length:
            return f"the backbone's context length; datamodule.max_length={self.max_length} is above it"
        return f"datamodule.max_length={self.max_length}"

    def limit_advice(self) -> str:
        if self.context_length is not None and self.context_length <= self.max_length:
            return "Shorten or drop these rows, or use a backbone with a longer context"
        if self.context_length is not None:
            return f"Raise datamodule.max_length (up to the context of {self.context_length}), or shorten these rows"
        return "Raise datamodule.max_length, or shorten these rows"

    def check_length(self, split: str, index: int, num_tokens: int, what: str = "prompt + completion") -> None:
        """Raise :class:`RowTooLong` when a row's ``num_tokens`` exceed :attr:`token_limit` (collected by
        :meth:`build_dataset` into one error with the count)."""
        if num_tokens > self.token_limit:
            raise RowTooLong(split, index, num_tokens, what)

    def warn_unknown_tokens(self, split: str, rows: Sequence[Row], items: Sequence[dict[str, Any]]) -> int:
        """Count the unknown-token ids in the encoded ``items`` (every ``*_ids`` list) and, when there are any, warn
        once with the characters of the rows that the tokenizer cannot represent. Returns the count."""
        unk = self.tokenizer.unk_token_id
        if unk is None:
            return 0
        count, bad_rows = 0, 0
        for item in items:
            found = sum(ids.count(unk) for key, ids in item.items() if key.endswith("_ids") and isinstance(ids, list))
            count += found
            bad_rows += found > 0
        if count:
            written = self.written_unknown_tokens(rows)
            if written >= count:
                log.warning(
                    "%s split: %d tokens in %d of %d rows are %s, each written as the text %r: a model sampled its "
                    "unknown-token id when these rows were generated (e.g. rollouts of a reference policy) and they "
                    "are kept as it wrote them; no character of the data is missing from the tokenizer",
                    split,
                    count,
                    bad_rows,
                    len(rows),
                    self.tokenizer.unk_token,
                    self.tokenizer.unk_token,
                )
                return count
            examples = self.unknown_characters(rows)
            log.warning(
                "%s split: %d tokens in %d of %d rows are %s: the tokenizer has no token for %s; the model can neither "
                "read nor write them (use a tokenizer that covers them, or clean the data)",
                split,
                count,
                bad_rows,
                len(rows),
                self.tokenizer.unk_token,
                ", ".join(repr(c) for c in examples[:10]) + (" ..." if len(examples) > 10 else "")
                if examples
                else "some of their text",
            )
        return count

    def written_unknown_tokens(self, rows: Sequence[Row]) -> int:
        """How often the rows' string fields hold the unknown token's own text (``<unk>``): what a model writes when it
        samples that id, encoded back to it (not text the tokenizer lacks a token for)."""
        text = self.tokenizer.unk_token
        if not text:
            return 0
        return sum(value.count(text) for row in rows for value in row.values() if isinstance(value, str))

    def unknown_characters(self, rows: Sequence[Row]) -> list[str]:
        """Characters of the rows' string fields that the tokenizer encodes as its unknown token."""
        unk = self.tokenizer.unk_token_id
        seen: set[str] = set()
        for row in rows:
            for value in row.values():
                if isinstance(value, str):
                    seen.update(value)
            if len(seen) > UNK_PROBE_CHARACTERS:
                break
        return sorted(c for c in seen if unk in self.tokenizer(c, add_special_tokens=False)["input_ids"] and c.strip())

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
        """Where training stands: ``epoch`` (the epoch to continue) and ``items_done`` (its items already drawn).

        The batch counter of the fit loop keeps counting the last epoch that was started until the next one starts:
        a checkpoint written after an epoch finished (``current_epoch`` already moved on) continues the next
        epoch from its first item.
        """
        trainer = self.trainer
        if trainer is None:
            return {}
        loop = trainer.fit_loop
        epoch = trainer.current_epoch
        batches_done = loop.epoch_loop.batch_progress.current.processed
        if loop.epoch_progress.current.started <= epoch:  # the counted batches belong to a finished epoch
            batches_done = 0
        items_done = batches_done * self.batch_size
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
