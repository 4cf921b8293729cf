"""GEM bucketing as an offline stage (``+method=gem``, ``stage=predict``): embed, cluster, label, measure.

Paper: "GEM: Geometric Entropy Mixing" (arXiv 2605.26121). The mathematics lives in :mod:`zoo.mixing`
(:func:`zoo.mixing.fit_gem` and the baselines, GIS, the student); this module is the thin Lightning adapter: its
``predict_step`` receives a whole corpus split (:class:`zoo.datamodules.mixture.CorpusDataModule`) and returns the
rows with a bucket column and the balance metrics, which :class:`zoo.callbacks.BucketWriter` writes.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from zoo.errors import ConfigError, DataError
from zoo.mixing.bucketing import CLUSTERERS, bucket_metrics, cluster, student_labelling
from zoo.mixing.clustering import check_num_clusters
from zoo.mixing.embeddings import cached_embeddings


class BucketingModule(pl.LightningModule):
    """Bucket a corpus with one clustering arm.

    Args:
        method: ``kmeans`` | ``spherical_kmeans`` | ``vmf_em`` | ``gem``.
        num_clusters: ``K`` buckets (paper: 24).
        lam: GEM's balance strength (paper: 5000, logit scale).
        num_iters: clustering iterations (unofficial config: 50).
        kappa: ``banerjee`` | ``shared`` | a fixed number.
        num_init: restarts of the k-means arms.
        encoder: embedding spec (``minilm``, a local sentence-transformers directory, ``tfidf[:dim]``, ``hashing``).
        cache_dir: artifact cache of the embeddings (``paths.cache_dir``).
        text_column: the column holding the documents.
        bucket_column: the column written with the bucket name (``b00`` .. ``b<K-1>``).
        label_column: the true-label column for NMI (``null``: none).
        student: label the corpus with the GIS-trained student (``bucket_column`` then holds the student's label;
            the clustering's own label goes to ``<bucket_column>_cluster``).
        seed_fraction: share of the corpus used as GIS-selected pseudo-labels (unofficial config: 1%).
        seed: seed of the clustering initialisation and the student.
    """

    def __init__(
        self,
        method: str = "gem",
        num_clusters: int = 24,
        lam: float = 5000.0,
        num_iters: int = 50,
        kappa: str | float = "banerjee",
        num_init: int = 1,
        encoder: str = "minilm",
        cache_dir: str | None = None,
        text_column: str = "text",
        bucket_column: str = "bucket",
        label_column: str | None = "topic",
        student: bool = False,
        seed_fraction: float = 0.01,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if method not in CLUSTERERS:
            raise ConfigError(f"module.method must be one of {CLUSTERERS}, got {method!r}")
        if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
            raise ConfigError(f"module.num_clusters must be a whole number >= 1, got {num_clusters!r}")
        self.save_hyperparameters()
        self.method, self.num_clusters, self.lam = method, num_clusters, lam
        self.num_iters, self.kappa, self.num_init = num_iters, kappa, num_init
        self.encoder, self.cache_dir = encoder, cache_dir
        self.text_column, self.bucket_column, self.label_column = text_column, bucket_column, label_column
        self.student, self.seed_fraction, self.seed = student, seed_fraction, seed

    def check_data(self, datamodule: Any, stage: str) -> None:
        """Before the run: ``num_clusters`` must not exceed the rows of the corpus split to bucket
        (``datamodule.rows``, set by its ``setup``)."""
        rows = getattr(datamodule, "rows", None)
        if rows is None:
            return
        try:
            check_num_clusters(len(rows), self.num_clusters)
        except ConfigError as err:
            split = getattr(datamodule, "split", None)
            raise ConfigError(f"module.{err}{f' (the corpus split {split!r})' if split else ''}") from None

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            self.check_data(datamodule, stage)

    def bucket_name(self, index: int) -> str:
        return f"b{index:0{len(str(self.num_clusters - 1))}d}"

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        # the student is trained here: leave Lightning's inference mode for this step
        with torch.inference_mode(False), torch.enable_grad():
            return self.bucket(batch)

    def bucket(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Bucket ``batch["rows"]``: the rows with the bucket column, the metrics and the bucket sizes."""
        rows = batch["rows"]
        texts = []
        for index, row in enumerate(rows):
            text = row.get(self.text_column)
            if not isinstance(text, str) or not text.strip():
                raise DataError(
                    f"row {index}: column '{self.text_column}' must be a non-empty string, got {text!r:.60}"
                )
            texts.append(text)
        embeddings = cached_embeddings(texts, self.encoder, self.cache_dir)
        result = cluster(
            embeddings,
            self.method,
            self.num_clusters,
            lam=self.lam,
            num_iters=self.num_iters,
            seed=self.seed,
            kappa=self.kappa,
            num_init=self.num_init,
        )
        truth = None
        if self.label_column is not None:
            truth = [row.get(self.label_column) for row in rows]
            if any(value is None for value in truth):
                raise DataError(f"module.label_column='{self.label_column}': some rows lack it (set it to null)")
        metrics = bucket_metrics(result, truth)
        labels = result.labels
        if self.student:
            outcome = student_labelling(texts, embeddings, result, self.seed_fraction, seed=self.seed)
            metrics["student_accuracy"] = outcome.accuracy
            labels = outcome.labels
        out = []
        for row, cluster_label, label in zip(rows, result.labels.tolist(), labels.tolist()):
            new = {**row, self.bucket_column: self.bucket_name(label)}
            if self.student:
                new[f"{self.bucket_column}_cluster"] = self.bucket_name(cluster_label)
            out.append(new)
        sizes = torch.bincount(labels, minlength=self.num_clusters).tolist()
        return {
            "rows": out,
            "extra": batch.get("extra", {}),
            "metrics": metrics,
            "buckets": {self.bucket_name(k): n for k, n in enumerate(sizes)},
        }

    def configure_optimizers(self) -> None:
        return None
