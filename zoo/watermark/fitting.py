"""Partitions fit offline on a domain corpus, and watermark schemes built from plain settings (configs).

A partition is trained once from a *domain corpus* and then shared by generation and detection:

* :func:`domain_corpus` -- the sentences to fit on: the seeded multi-topic grammar (``"topics"``,
  :mod:`zoo.text.topics`), a UTF-8 text file (``.txt``: split into sentences by the detector's rule) or a
  JSONL file (one object per line; its ``text_field`` is split into sentences);
* :class:`PartitionSpec` -- kind, number of regions, seed, constructor options and corpus of a partition;
  :func:`fit_partition` is the fit as a pure function: the same spec and encoder give the same partition;
  :func:`partition_artifact` makes it a trained-once artifact of the cache (:func:`zoo.artifacts.ensure`);
* :class:`SchemeSpec` -- encoder, partition (fit settings or a saved file), key and gamma: what a
  decoder, a callback or a benchmark is configured with; :meth:`SchemeSpec.build` returns the
  :class:`~zoo.watermark.sampler.WatermarkScheme`;
* :func:`margin_at_rejection` -- the acceptance margin that rejects a given fraction of domain sentences: a margin
  budget in the same units (a rejection rate) for partitions whose margins are in different units (SemStamp's
  ``|cos|`` to a hyperplane, k-SemStamp's cosine gap, X-Guard's whitened distance to a cell boundary).

Encoders and fitted partitions are kept per process (:func:`shared_encoder`, :func:`fitted_partition`), so a
callback, its decoder and the unwatermarked baseline load MiniLM and fit a partition once; with a ``cache_dir``
the fit is also kept across runs.

Command line (writes ``<out>.safetensors`` + ``<out>.json``, ready for ``python -m zoo.watermark.detect``)::

    python -m zoo.watermark.fitting --out partitions/xguard [--kind balanced|lsh|kmeans] [--regions 8] [--seed 0]
        [--encoder minilm|hashing:<dim>|<dir>] [--corpus topics|<file.txt>|<file.jsonl>] [--size 2000]
        [--corpus-seed 0] [--text-field text] [--option name=value ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from zoo.errors import ConfigError, DataError, ZooError
from zoo.text.encoders import SentenceEncoder, load_encoder
from zoo.text.topics import TopicGrammar
from zoo.watermark import xguard as _xguard  # noqa: F401  (registers the "balanced" partition kind)
from zoo.watermark.green import check_gamma
from zoo.watermark.partition import Partitioner, load_partitioner, partitioner_class
from zoo.watermark.sampler import WatermarkScheme
from zoo.watermark.sentences import split_sentences

_Spec = TypeVar("_Spec")
TOPICS_CORPUS = "topics"
PARTITION_STEM = "partition"


def domain_corpus(source: str = TOPICS_CORPUS, size: int = 2000, seed: int = 0, text_field: str = "text") -> list[str]:
    """Sentences of a domain corpus.

    Args:
        source: ``"topics"`` (the seeded multi-topic template grammar), a ``.txt`` file (split into sentences) or
            a ``.jsonl`` file (``text_field`` of every line, split into sentences).
        size: number of sentences. The grammar draws exactly ``size``; from a file, all its sentences when it has
            at most ``size``, else a seeded random subset of ``size`` (in file order).
        seed: seed of the grammar / of the subset.
        text_field: the JSONL field holding the text.
    """
    if size < 1:
        raise ConfigError(f"corpus size must be >= 1, got {size}")
    if source == TOPICS_CORPUS:
        return TopicGrammar().corpus(size, seed)
    path = Path(source).expanduser()
    if not path.is_file():
        raise DataError(
            f"domain corpus {source!r} is neither 'topics' nor an existing .txt / .jsonl file (one text per line)"
        )
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"domain corpus {path}: not UTF-8 text ({err})") from err
    if path.suffix == ".jsonl":
        sentences = []
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {number}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
                raise DataError(f"{path}, line {number}: needs a string field {text_field!r} (text_field)")
            sentences += split_sentences(row[text_field])
    else:
        sentences = split_sentences(content)
    if not sentences:
        raise DataError(f"domain corpus {path} holds no sentence")
    if len(sentences) > size:
        keep = sorted(random.Random(f"corpus:{seed}").sample(range(len(sentences)), size))
        sentences = [sentences[i] for i in keep]
    return sentences


@dataclass(frozen=True)
class PartitionSpec:
    """How to fit a partition: the partitioner and the domain corpus.

    Attributes:
        kind: ``balanced`` (X-Guard), ``lsh`` (SemStamp) or ``kmeans`` (k-SemStamp).
        num_regions: ``R``.
        seed: seed of the partitioner's random choices.
        options: further constructor arguments of the partitioner (e.g. ``mass_balance`` of ``balanced``).
        corpus: domain corpus (see :func:`domain_corpus`).
        corpus_size: sentences of the corpus to fit on.
        corpus_seed: seed of the corpus.
        text_field: JSONL field of a ``.jsonl`` corpus.
    """

    kind: str = "balanced"
    num_regions: int = 8
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)
    corpus: str = TOPICS_CORPUS
    corpus_size: int = 2000
    corpus_seed: int = 0
    text_field: str = "text"

    def build(self) -> Partitioner:
        """The unfitted partitioner (refuses unknown kinds and options at once)."""
        cls = partitioner_class(self.kind)
        try:
            return cls(self.num_regions, self.seed, **dict(self.options))
        except TypeError as err:
            raise ConfigError(
                f"partition options {dict(self.options)} do not fit a {self.kind} partition ({err})"
            ) from err

    def describe(self) -> dict[str, Any]:
        """JSON-able settings (a cache key together with the encoder's name)."""
        return {**asdict(self), "options": dict(self.options)}


def fit_partition(spec: PartitionSpec, encoder: SentenceEncoder) -> Partitioner:
    """Fit ``spec``'s partitioner on the encoder's embeddings of ``spec``'s corpus (a pure function)."""
    partitioner = spec.build()
    sentences = domain_corpus(spec.corpus, spec.corpus_size, spec.corpus_seed, spec.text_field)
    try:
        return partitioner.fit(encoder.encode(sentences))
    except DataError as err:
        raise DataError(f"fitting a {spec.kind} partition on corpus {spec.corpus!r}: {err}") from err


def margin_at_rejection(partitioner: Partitioner, embeddings: torch.Tensor, rate: float) -> float:
    """The margin that rejects ``rate`` of the embedded sentences: the ``rate``-quantile of their margins.

    The rejection sampler accepts a candidate when its margin is ``>= margin``, so about ``rate`` of sentences drawn
    like ``embeddings`` fail the margin test whatever their region. Each method's margin has its own units
    (SemStamp and k-SemStamp use 0.01 in theirs, MarkLLM ``margin_m``); the same ``rate`` gives every partition the
    same rejection budget. ``rate = 0`` is margin 0 (no margin test)."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"the margin rejection rate must be in [0, 1), got {rate}")
    if rate == 0.0:
        return 0.0
    _, margins = partitioner.assign_with_margin(embeddings)
    if margins.numel() == 0:
        raise DataError("no sentences to measure the margin rejection rate on")
    return max(0.0, float(torch.quantile(margins.double(), rate)))


_ENCODERS: dict[str, SentenceEncoder] = {}
_PARTITIONS: dict[str, Partitioner] = {}


def shared_encoder(spec: str) -> SentenceEncoder:
    """:func:`~zoo.text.encoders.load_encoder` once per process and spec."""
    if spec not in _ENCODERS:
        _ENCODERS[spec] = load_encoder(spec)
    return _ENCODERS[spec]


def partition_artifact(spec: PartitionSpec, encoder: SentenceEncoder, cache_dir: str | Path | None = None) -> Path:
    """The partition as a trained-once artifact (:func:`zoo.artifacts.ensure`, kind ``watermark_partition``): fit on
    first use, then loaded from ``<cache_dir>/watermark_partition/<kind>-<key>/partition.safetensors``; the key is
    the spec and the encoder's name. Returns the ``.safetensors`` path."""
    from zoo.artifacts import ensure

    def build(folder: Path) -> dict[str, Any]:
        partition = fit_partition(spec, encoder)
        partition.save(folder / PARTITION_STEM, encoder=encoder.name)
        return {"num_regions": partition.num_regions, "dim": partition.dim}

    artifact_spec = {"partition": spec.describe(), "encoder": encoder.name}
    folder = ensure("watermark_partition", artifact_spec, build, cache_dir, name=spec.kind, reason="a watermark scheme")
    return folder / f"{PARTITION_STEM}.safetensors"


def fitted_partition(spec: PartitionSpec, encoder: SentenceEncoder, cache_dir: str | Path | None = None) -> Partitioner:
    """:func:`fit_partition` once per process, spec and encoder (and once per cache with ``cache_dir``: through
    :func:`partition_artifact`)."""
    key = json.dumps({"partition": spec.describe(), "encoder": encoder.name}, sort_keys=True, default=str)
    if key not in _PARTITIONS:
        if cache_dir is None:
            _PARTITIONS[key] = fit_partition(spec, encoder)
        else:
            _PARTITIONS[key] = load_partitioner(partition_artifact(spec, encoder, cache_dir))[0]
    return _PARTITIONS[key]


def _from_mapping(cls: type[_Spec], value: _Spec | Mapping[str, Any], what: str) -> _Spec:
    """``cls`` from itself or a mapping of its fields (unknown fields are one clear error naming them)."""
    if isinstance(value, cls):
        return value
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(f"{what} settings {unknown} are unknown; {what} settings are {sorted(known)}")
    return cls(**dict(value))


def as_partition_spec(value: PartitionSpec | Mapping[str, Any]) -> PartitionSpec:
    """A :class:`PartitionSpec` from itself or a mapping of its fields."""
    spec = _from_mapping(PartitionSpec, value, "partition")
    return replace(spec, options=dict(spec.options or {}))


@dataclass(frozen=True)
class SchemeSpec:
    """What a watermark is configured with.

    Attributes:
        encoder: encoder spec (``minilm``, ``hashing[:<dim>]``, a local directory); ``None`` with a
            ``partition_file`` = the encoder recorded with it.
        partition: fit settings (a :class:`PartitionSpec` or mapping of its fields), fit on first use.
        partition_file: a saved partition (``.safetensors`` path, :meth:`~zoo.watermark.partition.Partitioner.save`
            or ``python -m zoo.watermark.fitting``); when set it is used and ``partition`` is ignored.
        key: the secret integer key.
        gamma: green fraction of regions.
        cache_dir: artifact cache of fitted partitions (:func:`partition_artifact`; ``paths.cache_dir`` in configs);
            ``None`` fits in the process, once.
    """

    encoder: str | None = "minilm"
    partition: PartitionSpec | Mapping[str, Any] = field(default_factory=PartitionSpec)
    partition_file: str | None = None
    key: int = 42
    gamma: float = 0.25
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        if isinstance(self.key, bool) or not isinstance(self.key, int):
            raise ConfigError(f"the watermark key must be an integer, got {self.key!r}")
        object.__setattr__(self, "partition", as_partition_spec(self.partition))
        if self.partition_file is None and self.encoder is None:
            raise ConfigError("fitting a partition needs an encoder spec (encoder: minilm, hashing:<dim> or a dir)")

    def heldout_sentences(self) -> list[str]:
        """``corpus_size`` sentences of the partition's domain corpus drawn with ``corpus_seed + 1``: held out from
        the fit sentences for the grammar, or for a file larger than ``corpus_size`` (a smaller file gives its
        sentences again)."""
        spec = self.partition
        assert isinstance(spec, PartitionSpec)
        return domain_corpus(spec.corpus, spec.corpus_size, spec.corpus_seed + 1, spec.text_field)

    def build(self) -> WatermarkScheme:
        """Load (or fit) the partition and the encoder; returns the scheme."""
        if self.partition_file is None:
            assert self.encoder is not None
            assert isinstance(self.partition, PartitionSpec)
            encoder = shared_encoder(self.encoder)
            partition = fitted_partition(self.partition, encoder, self.cache_dir)
            return WatermarkScheme(encoder, partition, self.key, self.gamma)
        partitioner, recorded = load_partitioner(self.partition_file)
        spec = self.encoder or recorded
        if spec is None:
            raise ConfigError(
                f"partition {self.partition_file!r} records no encoder: set the encoder (minilm, hashing:<dim>, a dir)"
            )
        try:
            return WatermarkScheme(shared_encoder(spec), partitioner, self.key, self.gamma)
        except ConfigError as err:
            raise ConfigError(f"partition {self.partition_file!r}: {err}") from err


def as_scheme_spec(value: SchemeSpec | Mapping[str, Any]) -> SchemeSpec:
    """A :class:`SchemeSpec` from itself or a mapping of its fields."""
    return _from_mapping(SchemeSpec, value, "watermark scheme")


def _option(text: str) -> tuple[str, Any]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"--option {text!r}: expected name=value (e.g. mass_balance=0.5)")
    try:
        return name, json.loads(raw)
    except json.JSONDecodeError:
        return name, raw


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zoo.watermark.fitting``: fit a partition on a domain corpus and save it."""
    parser = argparse.ArgumentParser(prog="python -m zoo.watermark.fitting", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output path (without suffix): <out>.safetensors + <out>.json")
    parser.add_argument("--kind", default="balanced", help="balanced (X-Guard) | lsh (SemStamp) | kmeans (k-SemStamp)")
    parser.add_argument("--regions", type=int, default=8, help="number of regions R")
    parser.add_argument("--seed", type=int, default=0, help="partition seed")
    parser.add_argument(
        "--encoder", default="minilm", help="minilm | hashing:<dim> | a local sentence-transformers dir"
    )
    parser.add_argument("--corpus", default=TOPICS_CORPUS, help="topics | a .txt file | a .jsonl file")
    parser.add_argument("--size", type=int, default=2000, help="corpus sentences")
    parser.add_argument("--corpus-seed", type=int, default=0, help="corpus seed")
    parser.add_argument("--text-field", default="text", help="text field of a .jsonl corpus")
    parser.add_argument("--option", action="append", default=[], help="partitioner option name=value (repeatable)")
    args = parser.parse_args(argv)
    try:
        spec = PartitionSpec(
            kind=args.kind,
            num_regions=args.regions,
            seed=args.seed,
            options=dict(_option(o) for o in args.option),
            corpus=args.corpus,
            corpus_size=args.size,
            corpus_seed=args.corpus_seed,
            text_field=args.text_field,
        )
        encoder = load_encoder(args.encoder)
        path = fit_partition(spec, encoder).save(args.out, encoder=encoder.name)
    except ZooError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
