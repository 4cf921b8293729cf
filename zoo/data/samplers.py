"""Training samplers, the ``datamodule/sampler=<name>`` seam: which rows each training batch holds, in which order.

A sampler is a ``torch.utils.data.Sampler`` of row indices, built by Hydra with its own options and bound to the
training split by the datamodule (:meth:`TrainSampler.bind`: the rows, the batch size, the seed). The datamodule
groups consecutive indices into batches of ``batch_size``, saves :meth:`TrainSampler.state_dict` in its checkpoint
state and calls :meth:`TrainSampler.load_state_dict` and :meth:`TrainSampler.resume_at` on resume, so that a
resumed run draws exactly the batches an uninterrupted run would.

- :class:`ResumableSampler` (``resumable``, the default): a permutation of the rows per epoch, seeded by
  ``seed + epoch``.
- :class:`WeightedDomainSampler` (``weighted``): multi-source sampling. Every row carries a domain (a column);
  every batch draws its rows' domains from per-domain weights. The weights come from the config, from a JSON file,
  or from a callback during training (:meth:`WeightedDomainSampler.set_weights`, e.g. DoReMi's online
  reweighting, notes ``multimodal_quant_data.md`` §2); they are logged and saved in checkpoints.

Plain torch and numpy (no Lightning): usable with any ``DataLoader``.
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from zoo.errors import ConfigError, DataError

log = logging.getLogger("zoo")

Row = dict[str, Any]


class TrainSampler(Sampler[int], ABC):
    """Base of the training samplers: row indices for one epoch, bound to the data by the datamodule.

    Lightning calls :meth:`set_epoch` at every epoch start. ``state_dict(epoch, items_done)`` is the state to resume
    at item ``items_done`` of epoch ``epoch``; the datamodule saves it and, on resume, calls ``load_state_dict``
    and ``resume_at(epoch, items_done)`` after :meth:`bind`.
    """

    epoch: int = 0

    @abstractmethod
    def bind(self, rows: Sequence[Row], batch_size: int, seed: int, shuffle: bool) -> None:
        """Attach the training rows (index ``i`` of the dataset is ``rows[i]``), batch size, seed and shuffle flag."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @abstractmethod
    def resume_at(self, epoch: int, items_done: int) -> None:
        """Skip the first ``items_done`` items the next time epoch ``epoch`` is iterated."""

    def state_dict(self, epoch: int, items_done: int) -> dict[str, Any]:
        """What besides the position a resume at ``(epoch, items_done)`` needs (nothing by default)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (called after :meth:`bind`)."""

    def metrics(self) -> dict[str, float]:
        """Values worth logging during training (e.g. the weights in force); none by default."""
        return {}


class ResumableSampler(TrainSampler):
    """A per-epoch permutation (seeded by ``seed + epoch``) that can start part-way through an epoch.

    Lightning calls :meth:`set_epoch` at every epoch start; the datamodule restores ``(epoch, skip)`` from
    a checkpoint so that a resumed run sees exactly the batches an uninterrupted run would.

    Args:
        num_items, seed, shuffle: set by :meth:`bind` from the datamodule (``datamodule.seed``,
            ``datamodule.shuffle``) when used through a datamodule; given directly otherwise.
    """

    def __init__(self, num_items: int = 0, seed: int = 0, shuffle: bool = True) -> None:
        self.num_items = num_items
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self._resume: tuple[int, int] | None = None

    def bind(self, rows: Sequence[Row], batch_size: int, seed: int, shuffle: bool) -> None:
        self.num_items = len(rows)
        self.seed = seed
        self.shuffle = shuffle

    def resume_at(self, epoch: int, items_done: int) -> None:
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


def check_weights(weights: Mapping[str, float], where: str) -> dict[str, float]:
    """Validate per-domain weights (finite, ``>= 0``, positive sum) and return them normalized to sum 1."""
    if not weights:
        raise ConfigError(f"{where}: no domain weights given")
    values = {}
    for name, given in weights.items():
        try:
            value = float(given) if not isinstance(given, (bool, str)) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"{where}: weight of domain '{name}' must be a finite number, got {given!r}")
        if value < 0:
            raise ConfigError(f"{where}: weight of domain '{name}' is negative ({value}); weights must be >= 0")
        values[str(name)] = value
    total = sum(values.values())
    if total <= 0:
        raise ConfigError(f"{where}: the weights sum to {total}; at least one domain needs a positive weight")
    return {name: value / total for name, value in values.items()}


def read_weights_file(path: str | Path) -> dict[str, float]:
    """Per-domain weights from a JSON file holding one object ``{"domain": weight, ...}``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: weights file not found (datamodule.sampler.weights_file)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(data, dict):
        raise DataError(f'{path}: expected a JSON object {{"domain": weight, ...}}, got {type(data).__name__}')
    return check_weights(data, str(path))


class WeightedDomainSampler(TrainSampler):
    """Weighted multi-source sampling: each batch draws its rows' domains from per-domain weights.

    Batch ``s`` of the run (``s = epoch * batches_per_epoch + b``, ``batches_per_epoch = len(rows) // batch_size``)
    is a pure function of ``(seed, s)`` and the weights ``p`` in force at ``s``, drawn with a numpy generator seeded
    by ``[seed, s]``: the domain counts ``n ~ Multinomial(batch_size, p)``; for each domain ``d``, ``n_d`` of its rows
    uniformly (without replacement inside the batch when the domain has enough rows; rows repeat across batches);
    the batch is then shuffled. Expected share of domain ``d`` in the batches: ``p_d``. ``datamodule.shuffle``
    does not apply (sampling is random by construction).

    Weights (normalized to sum 1; every domain of the data must be named, 0 excludes a domain): ``weights`` from the
    config, else ``weights_file`` (JSON object ``{"domain": weight}``), else uniform over the domains found.
    :meth:`set_weights` changes them during training: the new weights apply from the next batch the loader draws
    (with prefetching, a batch or two after the current step). Each change is recorded with the batch it applies
    from; the checkpoint keeps that history, so a resumed run draws the same batches with the same weights.

    Args:
        domain_column: the row column naming each row's domain (values are compared as strings).
        weights: ``{domain: weight}``; ``None`` = from ``weights_file`` or uniform.
        weights_file: JSON file with ``{domain: weight}`` (exclusive with ``weights``).

    Raises:
        ConfigError: unknown or missing domain names, negative or non-finite weights, an all-zero weight vector,
            both ``weights`` and ``weights_file``, a weights file whose domains do not match the data.
        DataError: a training row without ``domain_column``.
    """

    def __init__(
        self,
        domain_column: str = "domain",
        weights: Mapping[str, float] | None = None,
        weights_file: str | None = None,
    ) -> None:
        if weights is not None and weights_file is not None:
            raise ConfigError(
                "datamodule.sampler: give either weights or weights_file, not both "
                f"(weights={dict(weights)}, weights_file={weights_file})"
            )
        self.domain_column = domain_column
        self.weights_file = weights_file
        self._configured: dict[str, float] | None = None
        self._config_source = "datamodule.sampler.weights"
        if weights is not None:
            self._configured = check_weights(weights, self._config_source)
        elif weights_file is not None:
            self._configured = read_weights_file(weights_file)
            self._config_source = f"weights file {weights_file}"
        self.epoch = 0
        self.batch_size = 0
        self.seed = 0
        self.num_items = 0
        self.domains: tuple[str, ...] = ()
        self.domain_rows: list[np.ndarray] = []
        self.history: list[tuple[int, tuple[float, ...]]] = []  # (first batch, weights in domain order)
        self._next_draw = 0
        self._resume: tuple[int, int] | None = None

    # -- data ------------------------------------------------------------------------------------------------------
    def bind(self, rows: Sequence[Row], batch_size: int, seed: int, shuffle: bool) -> None:
        labels = []
        for index, row in enumerate(rows):
            if self.domain_column not in row:
                raise DataError(
                    f"train row {index}: no '{self.domain_column}' column (datamodule.sampler.domain_column); "
                    f"weighted sampling needs a domain on every training row (row columns: {sorted(row)})"
                )
            labels.append(str(row[self.domain_column]))
        domains = tuple(sorted(set(labels)))
        if self.history and domains != self.domains:
            raise ConfigError(f"the training data's domains changed from {list(self.domains)} to {list(domains)}")
        if len(rows) < batch_size:
            raise ConfigError(f"{len(rows)} training rows < datamodule.batch_size={batch_size}: no full batch")
        self.domains = domains
        self.batch_size = batch_size
        self.seed = seed
        index_of = {d: i for i, d in enumerate(domains)}
        members: list[list[int]] = [[] for _ in domains]
        for index, label in enumerate(labels):
            members[index_of[label]].append(index)
        self.domain_rows = [np.asarray(m, dtype=np.int64) for m in members]
        self.num_items = len(rows)
        if not self.history:
            initial = self._configured or {d: 1.0 / len(domains) for d in domains}
            self.history = [(0, self._ordered(initial, self._config_source))]
            log.info("weighted sampler over %d domains, weights %s", len(domains), self.weights())

    @property
    def batches_per_epoch(self) -> int:
        return self.num_items // self.batch_size if self.batch_size else 0

    def _ordered(self, weights: Mapping[str, float] | Sequence[float] | torch.Tensor, where: str) -> tuple[float, ...]:
        """Validated weights as a tuple in :attr:`domains` order (a mapping by name, or a sequence in that order)."""
        if not isinstance(weights, Mapping):
            values = weights.tolist() if isinstance(weights, (torch.Tensor, np.ndarray)) else list(weights)
            if len(values) != len(self.domains):
                raise ConfigError(
                    f"{where}: {len(values)} weights for {len(self.domains)} domains {list(self.domains)} "
                    "(a sequence of weights follows the sorted domain names; or pass a mapping by name)"
                )
            weights = dict(zip(self.domains, values))
        names = {str(k) for k in weights}
        unknown, missing = sorted(names - set(self.domains)), sorted(set(self.domains) - names)
        if unknown or missing:
            raise ConfigError(
                f"{where}: the weights do not match the data's domains {list(self.domains)} (column "
                f"'{self.domain_column}'): unknown {unknown}, missing {missing}; give every domain a weight "
                "(0 excludes one)"
            )
        normalized = check_weights(weights, where)
        return tuple(normalized[d] for d in self.domains)

    # -- weights ---------------------------------------------------------------------------------------------------
    def weights(self, step: int | None = None) -> dict[str, float]:
        """The weights batch ``step`` is drawn with (default: the latest weights set)."""
        self._require_bound()
        if step is None:
            return dict(zip(self.domains, self.history[-1][1]))
        return dict(zip(self.domains, self._weights_at(step)))

    def _weights_at(self, step: int) -> tuple[float, ...]:
        position = bisect.bisect_right(self.history, step, key=lambda entry: entry[0]) - 1
        return self.history[max(position, 0)][1]

    def set_weights(self, weights: Mapping[str, float] | Sequence[float] | torch.Tensor) -> int:
        """Use ``weights`` (by domain name, or a sequence in :attr:`domains` order) from the next batch drawn.

        Returns the index of the first batch drawn with them (recorded in the checkpointed history).
        """
        self._require_bound()
        values = self._ordered(weights, "set_weights")
        start = self._next_draw
        while self.history and self.history[-1][0] >= start:  # superseded before any batch was drawn with them
            self.history.pop()
        self.history.append((start, values))
        log.info("weighted sampler: weights %s from batch %d", dict(zip(self.domains, values)), start)
        return start

    def metrics(self) -> dict[str, float]:
        if not self.history:
            return {}
        return {f"weight/{d}": w for d, w in zip(self.domains, self.history[-1][1])}

    # -- drawing ---------------------------------------------------------------------------------------------------
    def batch_indices(self, step: int) -> list[int]:
        """The row indices of batch ``step`` of the run (a pure function of seed, step and weights)."""
        self._require_bound()
        rng = np.random.default_rng([int(self.seed) & (2**63 - 1), int(step)])
        counts = rng.multinomial(self.batch_size, np.asarray(self._weights_at(step), dtype=np.float64))
        picked = []
        for rows, count in zip(self.domain_rows, counts):
            if count:
                picked.append(rows[rng.choice(len(rows), size=int(count), replace=int(count) > len(rows))])
        batch = np.concatenate(picked)
        return batch[rng.permutation(len(batch))].tolist()

    def resume_at(self, epoch: int, items_done: int) -> None:
        self._resume = (epoch, items_done)
        self._next_draw = epoch * self.batches_per_epoch + items_done // max(self.batch_size, 1)

    def __iter__(self) -> Iterator[int]:
        self._require_bound()
        first = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            first = self._resume[1] // self.batch_size
            self._resume = None
        start = self.epoch * self.batches_per_epoch
        return self._draw(start + first, start + self.batches_per_epoch)

    def _draw(self, start: int, stop: int) -> Iterator[int]:
        for step in range(start, stop):
            self._next_draw = step + 1
            yield from self.batch_indices(step)

    def __len__(self) -> int:
        return self.batches_per_epoch * self.batch_size

    # -- checkpoints -----------------------------------------------------------------------------------------------
    def state_dict(self, epoch: int, items_done: int) -> dict[str, Any]:
        """Domains and the weight history from the resume point on (older entries are never needed again)."""
        if not self.history:
            return {}
        resume_step = epoch * self.batches_per_epoch + items_done // max(self.batch_size, 1)
        kept = [entry for entry in self.history if entry[0] > resume_step]
        earlier = [entry for entry in self.history if entry[0] <= resume_step]
        if earlier:
            kept.insert(0, earlier[-1])
        return {
            "domain_column": self.domain_column,
            "domains": list(self.domains),
            "history": [[step, list(values)] for step, values in kept],
            "weights": self.weights(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self._require_bound()
        saved = tuple(state["domains"])
        if saved != self.domains:
            raise ConfigError(
                f"the checkpoint's sampler weights are for domains {list(saved)} but the training data has "
                f"{list(self.domains)} (column '{self.domain_column}'); resume with the same data"
            )
        self.history = [(int(step), tuple(float(v) for v in values)) for step, values in state["history"]]

    def _require_bound(self) -> None:
        if not self.domains:
            raise ConfigError(
                "WeightedDomainSampler is not bound to data yet: the datamodule binds it when it builds the training "
                "loader (call sampler.bind(rows, batch_size, seed, shuffle) when using it directly)"
            )
