"""Multi-domain text: language-model rows with a domain (bucket) column, drawn through the weighted sampler seam.

:class:`MixtureDataModule` trains on every token of a document (an LM-pretraining row: the text is the completion
of an empty prompt, BOS first); the training split is drawn by the ``datamodule/sampler=weighted`` seam
(:class:`~zoo.data.samplers.WeightedDomainSampler`), whose per-domain weights come from the config, a JSON file
(e.g. DoReMi's or RegMix's output) or a callback during training (DoReMi), and are logged and checkpointed.

:class:`CorpusDataModule` hands a whole split to an offline stage as one batch of rows (``+method=gem`` buckets it).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from zoo.data.samplers import ResumableSampler, TrainSampler
from zoo.data.sources import Row, RowSource
from zoo.datamodules.sft import SFTDataModule
from zoo.errors import ConfigError, DataError


class MixtureDataModule(SFTDataModule):
    """Language-model rows ``{text_column: str, <domain column>: ...}``; loss on every text token and EOS.

    Args:
        text_column: the row column holding the document.
        (others: see :class:`~zoo.datamodules.sft.SFTDataModule` / :class:`~zoo.datamodules.base.RowDataModule`;
        the domain column is ``datamodule.sampler.domain_column``.)

    Batch: that of :class:`~zoo.datamodules.sft.SFTDataModule` (empty prompt), with the row's other columns (the
    domain, the true topic) in ``columns``.
    """

    required_fields = ()

    def __init__(self, *args: Any, text_column: str = "text", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text_column = text_column

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        text = row.get(self.text_column)
        if not isinstance(text, str) or not text:
            raise DataError(
                f"{split} row {index}: column '{self.text_column}' (datamodule.text_column) must be non-empty text, "
                f"got {text!r:.60} (row columns: {sorted(row)})"
            )
        lm_row = {k: v for k, v in row.items() if k != self.text_column}
        return super().encode({**lm_row, "prompt": "", "completion": text}, index, split)


class CorpusDataModule(pl.LightningDataModule):
    """One split of a row source as a single predict batch ``{"rows": [...]}`` (no tokenizer).

    Args:
        source: the rows (e.g. :class:`~zoo.data.mixture_corpus.MixtureCorpusSource` or a JSONL source).
        split: the split to hand over (``train`` by default).
        extra_splits: splits copied unchanged next to the output (their rows reach the module as ``extra``).
        sampler: the ``datamodule/sampler=`` seam does not apply (only the default is accepted).
    """

    def __init__(
        self,
        source: RowSource,
        split: str = "train",
        extra_splits: tuple[str, ...] = ("val", "test"),
        sampler: TrainSampler | None = None,
    ) -> None:
        super().__init__()
        if sampler is not None and not isinstance(sampler, ResumableSampler):
            # the training-row samplers (datamodule/sampler=...) do not apply: the whole split is one batch
            raise ConfigError(f"datamodule/sampler={type(sampler).__name__}: a corpus stage is not sampled")
        if split not in ("train", "val", "test"):
            raise ConfigError(f"datamodule.split must be train, val or test, got {split!r}")
        self.source = source
        self.split = split
        self.extra_splits = tuple(s for s in extra_splits if s != split)
        self.rows: list[Row] | None = None
        self.extra: dict[str, list[Row]] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.rows is None:
            self.rows = self.source.rows(self.split)
            for name in self.extra_splits:
                try:
                    self.extra[name] = self.source.rows(name)
                except DataError:
                    self.extra[name] = []

    def predict_dataloader(self) -> DataLoader:
        self.setup()
        batch = {"rows": self.rows, "extra": self.extra}
        return DataLoader([batch], batch_size=None, collate_fn=lambda item: item)
