"""Partitions of the sentence-embedding space into regions, fit offline and saved as safetensors + JSON.

A partitioner maps embeddings ``[N, d]`` to region ids ``[N]`` in ``[0, R)`` and a *margin* ``[N]`` (how far each
embedding is from leaving its region, in the partitioner's own geometry; the rejection sampler accepts a
candidate only when its margin reaches a threshold). Every partitioner first L2-normalises its input, so region
ids and margins are invariant to a positive rescaling of the embeddings; all arithmetic runs in float64 on CPU,
so a partition gives the same regions whatever device produced the embeddings.

* :class:`LSHPartitioner` -- SemStamp (Hou et al., "SemStamp: A Semantic Watermark with Paraphrastic
  Robustness for Text Generation", arXiv:2310.03991): ``log2 R`` random hyperplanes through the origin, region =
  the sign pattern as a binary number; margin = ``min_i |cos(e, n_i)|`` (MarkLLM ``margin_m``).
* :class:`KMeansPartitioner` -- k-SemStamp (Hou et al., "k-SemStamp: A Clustering-Based Semantic Watermark for
  Detection of Machine-Generated Text", arXiv:2402.11399): ``R`` k-means centroids fit on domain embeddings,
  region = nearest centroid by cosine similarity; margin = ``cos(e, c_1) - cos(e, c_2)`` (nearest minus
  second-nearest, i.e. the gap in cosine distance).
* X-Guard's balanced product partition lives in :mod:`zoo.watermark.xguard` on the same base class.

Files: :meth:`Partitioner.save` writes ``<stem>.safetensors`` (the fitted tensors) and ``<stem>.json`` (kind,
constructor settings, embedding dimension, the encoder spec it was fit with); :func:`load_partitioner` reads
them back and checks they agree.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors.torch import load_file, save_file

from zoo.errors import CheckpointNotFoundError, ConfigError, DataError

FORMAT_VERSION = 1
P = TypeVar("P", bound="Partitioner")
_REGISTRY: dict[str, type[Partitioner]] = {}


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed`` (the same stream on every machine)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed) % (2**63))
    return generator


def normalize_rows(embeddings: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` -> float64 CPU rows of unit L2 norm (rows of zero norm are refused)."""
    x = embeddings.detach().to(device="cpu", dtype=torch.float64)
    norms = x.norm(dim=1, keepdim=True)
    zero = (norms[:, 0] == 0).nonzero().flatten()
    if zero.numel():
        raise DataError(f"embedding rows {zero[:5].tolist()} have zero norm; a sentence embedding must be nonzero")
    return x / norms


def kmeans(
    x: torch.Tensor,
    k: int,
    *,
    generator: torch.Generator,
    iters: int = 50,
    restarts: int = 3,
    spherical: bool = False,
) -> torch.Tensor:
    """Lloyd's k-means with k-means++ seeding; returns the centroids ``[k, d]`` of the best restart.

    Args:
        x: ``[N, d]`` float64 points (``N >= k``).
        k: number of centroids.
        generator: CPU generator (seeding and restarts draw from it).
        iters: Lloyd iterations per restart.
        restarts: independent seedings; the one with the lowest within-cluster cost wins.
        spherical: cosine k-means on unit vectors (centroids renormalised after each update; assignment by
            largest cosine) instead of Euclidean.
    """
    n = x.shape[0]
    if n < k:
        raise DataError(f"k-means needs at least k={k} points, got {n}")
    best: tuple[float, torch.Tensor] | None = None
    for _ in range(max(1, restarts)):
        first = torch.randint(n, (1,), generator=generator)
        centroids = x[first]
        for _ in range(1, k):
            d2 = torch.cdist(x, centroids).pow(2).min(dim=1).values
            probs = d2 / d2.sum() if d2.sum() > 0 else torch.full_like(d2, 1.0 / n)
            centroids = torch.cat([centroids, x[torch.multinomial(probs, 1, generator=generator)]])
        for _ in range(iters):
            labels = _nearest(x, centroids, spherical)
            updated = centroids.clone()
            for j in range(k):
                members = x[labels == j]
                if members.shape[0]:
                    updated[j] = members.mean(0)
            if spherical:
                updated = updated / updated.norm(dim=1, keepdim=True).clamp_min(1e-12)
            if torch.equal(updated, centroids):
                break
            centroids = updated
        labels = _nearest(x, centroids, spherical)
        cost = float((x - centroids[labels]).pow(2).sum())
        if best is None or cost < best[0]:
            best = (cost, centroids)
    assert best is not None
    return best[1]


def _nearest(x: torch.Tensor, centroids: torch.Tensor, spherical: bool) -> torch.Tensor:
    if spherical:
        return (x @ centroids.T).argmax(dim=1)
    return torch.cdist(x, centroids).argmin(dim=1)


class Partitioner(ABC):
    """Base class: fit on domain embeddings, then map embeddings to regions and margins.

    Subclasses set ``kind`` (the name in saved files), implement :meth:`_fit`, :meth:`_assign_with_margin`,
    :meth:`settings` (constructor keyword arguments), :meth:`state_tensors` and :meth:`_load_state_tensors`.

    Args:
        num_regions: number of regions ``R`` (>= 2).
        seed: seed of every random choice of the fit (CPU generator).
    """

    kind: ClassVar[str] = ""

    def __init__(self, num_regions: int, seed: int = 0) -> None:
        if int(num_regions) != num_regions or num_regions < 2:
            raise ConfigError(f"num_regions must be an integer >= 2, got {num_regions!r}")
        self.num_regions = int(num_regions)
        self.seed = int(seed)
        self.dim: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _REGISTRY[cls.kind] = cls

    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` (or loading) has set the parameters."""
        return self.dim is not None

    def fit(self: P, embeddings: torch.Tensor) -> P:
        """Fit on domain embeddings ``[N, d]``; returns ``self``."""
        x = self._check(embeddings, fitting=True)
        self.dim = int(x.shape[1])
        self._fit(x)
        return self

    def assign(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Region ids: ``[N, d]`` -> LongTensor ``[N]`` in ``[0, num_regions)``."""
        return self.assign_with_margin(embeddings)[0]

    def margin(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Margins ``[N]`` (float64, >= 0): distance from the region's boundary in this partitioner's geometry."""
        return self.assign_with_margin(embeddings)[1]

    def assign_with_margin(self, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Regions ``[N]`` (long) and margins ``[N]`` (float64) in one pass."""
        if not self.fitted:
            raise ConfigError(f"{type(self).__name__} is not fitted: call .fit(embeddings) or load a saved partition")
        x = self._check(embeddings, fitting=False)
        if x.shape[0] == 0:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.float64)
        return self._assign_with_margin(x)

    def _check(self, embeddings: torch.Tensor, *, fitting: bool) -> torch.Tensor:
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2:
            shape = tuple(embeddings.shape) if isinstance(embeddings, torch.Tensor) else type(embeddings).__name__
            raise DataError(f"embeddings must be a 2-D tensor [N, d], got {shape}")
        if not fitting and embeddings.shape[1] != self.dim:
            raise ConfigError(
                f"{type(self).__name__} was fit on {self.dim}-dim embeddings but got {embeddings.shape[1]}-dim ones: "
                "use the same sentence encoder for fitting, generation and detection"
            )
        if not torch.isfinite(embeddings).all():
            raise DataError("embeddings contain NaN or inf")
        if fitting and embeddings.shape[0] < 2 * self.num_regions:
            raise DataError(
                f"fitting {self.num_regions} regions needs at least {2 * self.num_regions} embeddings, "
                f"got {embeddings.shape[0]}"
            )
        return normalize_rows(embeddings)

    @abstractmethod
    def _fit(self, x: torch.Tensor) -> None:
        """Fit on unit-norm float64 rows ``[N, d]``."""

    @abstractmethod
    def _assign_with_margin(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Regions and margins of unit-norm float64 rows ``[N, d]``."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """Constructor keyword arguments (JSON-serialisable) that rebuild an unfitted equal partitioner."""

    @abstractmethod
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The fitted parameters."""

    @abstractmethod
    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore the fitted parameters (``self.dim`` is already set)."""

    def save(self, path: str | Path, *, encoder: str | None = None) -> Path:
        """Write ``<stem>.safetensors`` and ``<stem>.json``; returns the safetensors path.

        Args:
            path: file path with or without the ``.safetensors`` suffix.
            encoder: spec of the sentence encoder the fit embeddings came from (see
                :func:`zoo.text.encoders.load_encoder`); detection uses it by default.
        """
        if not self.fitted:
            raise ConfigError(f"cannot save an unfitted {type(self).__name__}")
        tensor_path, settings_path = partition_paths(path)
        tensor_path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_tensors().items()}, str(tensor_path))
        record = {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "settings": self.settings(),
            "dim": self.dim,
            "encoder": encoder,
        }
        settings_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return tensor_path


def partitioner_class(kind: str) -> type[Partitioner]:
    """The partitioner class saved under ``kind`` (``lsh``, ``kmeans``, ``balanced``, or a registered subclass)."""
    if kind not in _REGISTRY:
        raise ConfigError(f"unknown partition kind {kind!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[kind]


def partition_paths(path: str | Path) -> tuple[Path, Path]:
    """``(<stem>.safetensors, <stem>.json)`` for a partition path given with or without its suffix."""
    path = Path(path).expanduser()
    stem = path.with_suffix("") if path.suffix in (".safetensors", ".json") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def load_partitioner(path: str | Path) -> tuple[Partitioner, str | None]:
    """Load a partition saved by :meth:`Partitioner.save`.

    Returns:
        the fitted partitioner and the encoder spec recorded with it (None when none was recorded).
    """
    tensor_path, settings_path = partition_paths(path)
    for needed in (tensor_path, settings_path):
        if not needed.is_file():
            raise CheckpointNotFoundError(
                f"partition file {str(needed)!r} does not exist (a partition is a .safetensors + .json pair "
                "written by Partitioner.save)"
            )
    try:
        record = json.loads(settings_path.read_text())
        kind, settings, dim = record["kind"], record["settings"], int(record["dim"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise DataError(f"{settings_path}: not a partition settings file ({err})") from err
    if kind not in _REGISTRY:
        raise DataError(f"{settings_path}: unknown partition kind {kind!r}; known: {sorted(_REGISTRY)}")
    try:
        partitioner = _REGISTRY[kind](**settings)
    except TypeError as err:
        raise DataError(f"{settings_path}: settings {settings} do not fit a {kind} partition ({err})") from err
    partitioner.dim = dim
    tensors = load_file(str(tensor_path))
    try:
        partitioner._load_state_tensors(tensors)
    except KeyError as err:
        raise DataError(f"{tensor_path}: missing tensor {err} for a {kind} partition") from err
    except ValueError as err:
        raise DataError(f"{tensor_path}: {err}") from err
    return partitioner, record.get("encoder")


def expect_tensor(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """``tensors[name]`` as float64, checked to have ``shape`` (ValueError naming the tensor otherwise)."""
    tensor = tensors[name]
    if tuple(tensor.shape) != shape:
        raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {shape}")
    return tensor.to(torch.float64)


class LSHPartitioner(Partitioner):
    """SemStamp's locality-sensitive hashing: ``log2 R`` random hyperplanes through the origin.

    Region of ``e``: ``sum_i [<e, n_i> > 0] 2^i``. Margin: ``min_i |cos(e, n_i)|`` (the sampler's margin test
    ``|cos| >= m`` on every hyperplane, MarkLLM ``margin_m``). The normals are drawn from a standard Gaussian
    with a CPU generator seeded by ``seed``; fitting uses only the dimension of the data.

    Args:
        num_regions: ``R = 2^b`` (SemStamp: b = 3, R = 8).
        seed: seed of the hyperplanes.
    """

    kind = "lsh"

    def __init__(self, num_regions: int = 8, seed: int = 0) -> None:
        super().__init__(num_regions, seed)
        bits = math.log2(self.num_regions)
        if bits != int(bits):
            raise ConfigError(f"LSH needs num_regions = 2^bits, got {num_regions}")
        self.num_bits = int(bits)
        self.normals = torch.zeros(0)

    def _fit(self, x: torch.Tensor) -> None:
        normals = torch.randn(self.num_bits, x.shape[1], generator=seeded_generator(self.seed), dtype=torch.float64)
        self.normals = normals / normals.norm(dim=1, keepdim=True)

    def _assign_with_margin(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = x @ self.normals.T  # [N, bits]; x and the normals have unit norm
        weights = 2 ** torch.arange(self.num_bits, dtype=torch.long)
        regions = ((cos > 0).long() * weights).sum(dim=1)
        return regions, cos.abs().min(dim=1).values

    def settings(self) -> dict[str, Any]:
        return {"num_regions": self.num_regions, "seed": self.seed}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"normals": self.normals}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.normals = expect_tensor(tensors, "normals", (self.num_bits, self.dim))


class KMeansPartitioner(Partitioner):
    """k-SemStamp's partition: ``R`` cosine k-means centroids fit on domain embeddings.

    Region of ``e``: ``argmax_j cos(e, c_j)``. Margin: ``cos(e, c_(1)) - cos(e, c_(2))`` (the margin test
    "second-nearest minus nearest cosine distance > delta").

    Args:
        num_regions: ``R`` centroids (k-SemStamp: 8).
        seed: seed of the k-means++ seeding.
        iters: Lloyd iterations.
        restarts: k-means restarts (lowest cost wins).
        spherical: cosine k-means on unit vectors (default), as the official k-SemStamp code and MarkLLM's port
            (``kmeans_pytorch.kmeans(..., distance="cosine")``, assignment by largest cosine): the same Lloyd
            iteration on the sphere; the zoo seeds with k-means++ and keeps the best of ``restarts`` (the official
            seeds with random points, one run), so centroids differ by seed, not by rule. False runs Euclidean
            k-means (scikit-learn's rule) and still assigns by cosine.
    """

    kind = "kmeans"

    def __init__(
        self, num_regions: int = 8, seed: int = 0, *, iters: int = 50, restarts: int = 3, spherical: bool = True
    ) -> None:
        super().__init__(num_regions, seed)
        self.iters = iters
        self.restarts = restarts
        self.spherical = spherical
        self.centroids = torch.zeros(0)

    def _fit(self, x: torch.Tensor) -> None:
        centroids = kmeans(
            x,
            self.num_regions,
            generator=seeded_generator(self.seed),
            iters=self.iters,
            restarts=self.restarts,
            spherical=self.spherical,
        )
        self.centroids = centroids / centroids.norm(dim=1, keepdim=True).clamp_min(1e-12)

    def _assign_with_margin(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = (x @ self.centroids.T).topk(2, dim=1)
        return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]

    def settings(self) -> dict[str, Any]:
        return {
            "num_regions": self.num_regions,
            "seed": self.seed,
            "iters": self.iters,
            "restarts": self.restarts,
            "spherical": self.spherical,
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"centroids": self.centroids}

    def _load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        self.centroids = expect_tensor(tensors, "centroids", (self.num_regions, self.dim))
