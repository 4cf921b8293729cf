"""RegMix's selection split: the proxies score their mixtures on a split the final model is not reported on.

RegMix (arXiv 2407.01492) chooses the mixture whose proxies reach the lowest target loss. When the proxies are scored
on the same held-out documents as the final LM, the choice is made on the reported split (a bias in RegMix's
favour). :class:`RegMixSelectionSource` wraps a row source so that its ``val`` split is another split of the inner
source (``test`` by default): a proxy run's ``val/loss`` is then the loss on documents the final LM never reports.
The GEM demo (``conf/demo/gem/mixer/regmix.yaml``) gives it to RegMix's proxies; the final LM reads the inner source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zoo.data.sources import Row, RowSource
from zoo.errors import ConfigError

SPLITS = ("train", "val", "test")


class RegMixSelectionSource(RowSource):
    """``source`` with its ``val`` split read from ``source``'s ``val_split`` (``train`` and ``test`` unchanged).

    Args:
        source: the inner row source (e.g. :class:`~zoo.data.mixture_corpus.BucketedCorpusSource`).
        val_split: the inner split the wrapped ``val`` reads (``test``: the proxies select on the test documents
            while the final LM is reported on ``val``).
    """

    def __init__(self, source: RowSource, val_split: str = "test") -> None:
        if val_split not in SPLITS:
            raise ConfigError(f"RegMixSelectionSource.val_split must be one of {SPLITS}, got {val_split!r}")
        if not callable(getattr(source, "rows", None)):
            raise ConfigError(f"RegMixSelectionSource.source must be a row source, got {type(source).__name__}")
        self.source = source
        self.val_split = val_split

    def rows(self, split: str, required_fields: Sequence[str] = ()) -> list[Row]:
        return self.source.rows(self.val_split if split == "val" else split, required_fields)

    def describe(self) -> dict[str, Any]:
        inner = self.source.describe() if callable(getattr(self.source, "describe", None)) else {}
        return {"kind": type(self).__name__, "val_split": self.val_split, "source": inner}
