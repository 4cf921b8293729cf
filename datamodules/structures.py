"""Structure-grounded QA data (Cuttlefish, arXiv 2602.02780): tokenized prompts with a ``<structure>`` placeholder,
completions with labels, and the structures themselves as a concatenated :class:`~zoo.data.structures.StructureBatch`.

Rows come from the synthetic all-atom task of :mod:`zoo.data.structures` (notes 4(d)); any other
:class:`~zoo.data.sources.RowSource` whose rows carry a ``sample`` (:class:`~zoo.data.structures.StructureSample`)
works too. Structures above ``max_atoms`` are dropped with a logged count (paper filter: 30k atoms), never truncated;
malformed samples (NaN coordinates, empty structure, mismatched arrays, a prompt without the placeholder) raise
:class:`~zoo.errors.DataError` naming the sample id.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from zoo.data.samplers import TrainSampler
from zoo.data.sources import GeneratedSource, Row, RowSource
from zoo.data.structures import (
    SIZE_BIN_LABELS,
    STRUCTURE_TOKEN,
    StructureSample,
    StructureTaskConfig,
    collate_structures,
    make_structure_samples,
    validate_structure_sample,
)
from zoo.datamodules.base import IGNORE_INDEX, ListDataset, RowDataModule, encode_completion
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import ConfigError, DataError

log = logging.getLogger("zoo")
SPLITS = ("train", "val", "test")


class StructureTaskSource(GeneratedSource):
    """Rows of the synthetic structure task: ``prompt``, ``completion``, ``answer``, ``kind``, ``sample``.

    Args:
        num_train, num_val, num_test: rows per split (``val`` uses ``seed + 1``, ``test`` ``seed + 2``).
        seed: base seed.
        task: :class:`~zoo.data.structures.StructureTaskConfig` fields (``min_atoms``, ``max_atoms``, ...).
        split_task: per-split overrides of ``task`` (``{"val": {"max_atoms": 300}}``), e.g. a size-extrapolation
            split: train on small structures, evaluate on larger ones.
    """

    def __init__(
        self,
        num_train: int = 4000,
        num_val: int = 128,
        num_test: int = 128,
        seed: int = 0,
        task: dict[str, Any] | None = None,
        split_task: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(num_train, num_val, num_test, seed)
        task = dict(task or {})
        split_task = {k: dict(v or {}) for k, v in dict(split_task or {}).items()}
        unknown = set(split_task) - set(SPLITS)
        if unknown:
            raise ConfigError(f"datamodule.source.split_task: unknown split(s) {sorted(unknown)}; use {SPLITS}")
        self.config = self._config(task)
        self.split_configs = {split: self._config({**task, **split_task.get(split, {})}) for split in SPLITS}

    @staticmethod
    def _config(task: dict[str, Any]) -> StructureTaskConfig:
        task = dict(task)
        if "question_kinds" in task:
            task["question_kinds"] = tuple(task["question_kinds"])
        try:
            return StructureTaskConfig(**task)
        except TypeError as err:  # an unknown field
            raise ConfigError(f"datamodule.source.task: {err}") from None

    def generate(self, split: str, size: int) -> list[Row]:
        samples = make_structure_samples(size, self.split_seed(split), self.split_configs[split])
        return [{**s.as_row(), "sample": s} for s in samples]

    def describe(self) -> dict[str, Any]:
        configs = {k: repr(v) for k, v in self.split_configs.items() if v != self.config}
        return {
            "kind": "structure_task",
            "config": repr(self.config),
            **({"split_config": configs} if configs else {}),
            "sizes": self.sizes,
            "seed": self.seed,
        }


class StructureDataModule(RowDataModule):
    """Prompt + completion rows with one all-atom structure each.

    Args:
        tokenizer: must know the placeholder as a single token (``backbone.extra_tokens: ['<structure>']``).
        source: a row source whose rows have ``prompt``, ``completion`` and ``sample``.
        max_atoms: atom limit; larger structures are filtered out of every split with a logged count.
        placeholder: the placeholder token.

    Batch (``collate``):

    - ``input_ids``, ``attention_mask``, ``labels``: ``[B, T]`` right-padded text (placeholder included, structure
      tokens *not yet* inserted); labels are ``-100`` on prompt and padding;
    - ``prompt_ids``, ``prompt_attention_mask``: ``[B, P]`` left-padded prompts (for generation);
    - ``structures``: :class:`~zoo.data.structures.StructureBatch` (atoms concatenated with a graph index);
    - ``prompts``, ``answers``, ``kinds``, ``sample_ids``, ``size_bins``: lists; ``num_atoms``: ``[B]`` long.
    """

    required_fields = ("prompt", "completion")

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        source: RowSource,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        max_length: int = 192,
        num_workers: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        max_atoms: int | None = 30_000,
        placeholder: str = STRUCTURE_TOKEN,
        sampler: TrainSampler | None = None,
    ) -> None:
        super().__init__(
            tokenizer, source, batch_size, eval_batch_size, max_length, num_workers, seed, shuffle, sampler
        )
        vocab = tokenizer.get_vocab()
        if placeholder not in vocab:
            raise ConfigError(
                f"the tokenizer has no {placeholder!r} token; add it with backbone.extra_tokens=['{placeholder}'] "
                "(the structure methods set this in their method file)"
            )
        self.placeholder = placeholder
        self.placeholder_id = int(vocab[placeholder])
        self.max_atoms = max_atoms
        self.num_filtered: dict[str, int] = {}

    # -- data ------------------------------------------------------------------------------------------------------
    def dataset(self, split: str) -> ListDataset:
        if split not in self.datasets:
            rows = self.source.rows(split, self.required_fields)
            for i, row in enumerate(rows):
                if not isinstance(row.get("sample"), StructureSample):
                    raise DataError(f"{split} row {i}: no 'sample' (StructureSample) column in the structure rows")
            kept = rows
            if self.max_atoms is not None:
                kept = [r for r in rows if r["sample"].num_atoms <= self.max_atoms]
            self.num_filtered[split] = len(rows) - len(kept)
            if self.num_filtered[split]:
                log.info(
                    "%s: filtered %d of %d structures above datamodule.max_atoms=%d (never truncated)",
                    split,
                    self.num_filtered[split],
                    len(rows),
                    self.max_atoms,
                )
            if not kept:
                raise DataError(f"{split}: every structure exceeds datamodule.max_atoms={self.max_atoms}")
            self.build_dataset(split, kept)
        return self.datasets[split]

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        sample: StructureSample = row["sample"]
        if sample.prompt != row["prompt"]:  # the row's prompt wins (a source may rephrase the question)
            sample = dataclasses.replace(sample, prompt=row["prompt"])
        validate_structure_sample(sample, self.max_atoms)
        prompt_ids = encode_prompt(self.tokenizer, row["prompt"])
        found = prompt_ids.count(self.placeholder_id)
        if found != 1:
            raise DataError(
                f"structure sample {sample.sample_id!r}: the tokenized prompt holds {found} {self.placeholder} tokens "
                f"(id {self.placeholder_id}), expected exactly one"
            )
        completion_ids = encode_completion(self.tokenizer, row["completion"])
        self.check_length(split, index, len(prompt_ids) + len(completion_ids), f"structure sample {sample.sample_id!r}")
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "prompt": row["prompt"],
            "answer": str(row.get("answer", row["completion"])),
            "sample": sample,
        }

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        pad = self.tokenizer.pad_token_id
        full = [it["prompt_ids"] + it["completion_ids"] for it in items]
        labels = [[IGNORE_INDEX] * len(it["prompt_ids"]) + it["completion_ids"] for it in items]
        structures = collate_structures([it["sample"] for it in items], max_atoms=self.max_atoms)
        return {
            "input_ids": pad_sequences(full, pad, "right"),
            "attention_mask": pad_sequences([[1] * len(f) for f in full], 0, "right"),
            "labels": pad_sequences(labels, IGNORE_INDEX, "right"),
            "prompt_ids": pad_sequences([it["prompt_ids"] for it in items], pad, "left"),
            "prompt_attention_mask": pad_sequences([[1] * len(it["prompt_ids"]) for it in items], 0, "left"),
            "structures": structures,
            "prompts": structures.prompts,
            "answers": structures.answers,
            "kinds": structures.kinds,
            "sample_ids": structures.sample_ids,
            "size_bins": structures.size_bins,
            "num_atoms": structures.num_atoms.clone(),
        }

    def size_bin_counts(self, split: str) -> dict[str, int]:
        """Number of structures of each evaluation size bin in a split (labels of ``SIZE_BIN_LABELS``)."""
        counts = Counter(it["sample"].size_bin for it in self.dataset(split).items)
        return {label: counts.get(label, 0) for label in SIZE_BIN_LABELS}


def structure_batch_from_samples(
    samples: Sequence[StructureSample], tokenizer: PreTrainedTokenizerBase, max_atoms: int | None = None
) -> dict[str, Any]:
    """Collate samples directly (no source): the batch of :class:`StructureDataModule` (tests, demos, notebooks)."""

    class _Rows(RowSource):
        def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
            return []

    dm = StructureDataModule(tokenizer, _Rows(), max_atoms=max_atoms, max_length=100_000)
    items = [dm.encode({**s.as_row(), "sample": s}, i, "batch") for i, s in enumerate(samples)]
    return dm.collate(items)


__all__ = ["StructureDataModule", "StructureTaskSource", "structure_batch_from_samples"]
