"""Directions and linear probes on frozen activations, deterministic by construction.

* :func:`diff_of_means` -- ``v = mean(pos) - mean(neg)`` (the difference-of-means direction).
* :class:`LinearProbe` -- multinomial logistic regression (``K >= 2`` classes) fitted full-batch by L-BFGS
  from a zero initialisation in float64 with an L2 penalty: a strictly convex problem with one solution and no
  random draws, so repeated fits give the same weights (unlike randomized PCA solvers, research notes
  inference.md 0.7).
* :func:`auroc` (torchmetrics' binary AUROC) and :func:`cosine`.
* :func:`save_vectors` / :func:`load_vector` -- directions on disk (safetensors), e.g. to steer with a direction a
  run extracted: ``ResidualSteerer`` as a decoder hook, ``vector: {_target_: zoo.interp.load_vector, path: ...}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torchmetrics.functional.classification import binary_auroc

from zoo.errors import ConfigError, DataError


def _check_matrix(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise DataError(f"{name} must be a [N, d] tensor, got {shape}")
    if x.shape[0] == 0:
        raise DataError(f"{name} has no rows")


def diff_of_means(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
    """Difference-of-means direction ``v = (1/N) sum_i pos_i - (1/M) sum_j neg_j``.

    Args:
        pos: ``[N, d]`` activations of the positive set.
        neg: ``[M, d]`` activations of the negative set (``M`` may differ from ``N``).

    Returns:
        ``[d]`` (not normalised; in ``pos``'s dtype, accumulated in float64).
    """
    _check_matrix(pos, "pos")
    _check_matrix(neg, "neg")
    if pos.shape[1] != neg.shape[1]:
        raise DataError(f"pos and neg widths differ: {pos.shape[1]} vs {neg.shape[1]}")
    return (pos.double().mean(0) - neg.double().mean(0)).to(pos.dtype)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two ``[d]`` vectors."""
    if a.shape != b.shape or a.dim() != 1:
        raise DataError(f"cosine needs two vectors of the same width, got {list(a.shape)} and {list(b.shape)}")
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` (higher = positive) for binary ``labels`` (0/1)."""
    scores = torch.as_tensor(scores).flatten().float()
    labels = torch.as_tensor(labels).flatten().long()
    if scores.shape != labels.shape:
        raise DataError(f"scores ({scores.numel()}) and labels ({labels.numel()}) differ in length")
    present = set(labels.unique().tolist())
    if not present <= {0, 1}:
        raise DataError(f"labels must be 0/1, got values {sorted(present)}")
    if len(present) < 2:
        raise DataError("AUROC needs both classes among the labels; only one is present")
    return float(binary_auroc(scores, labels))


class LinearProbe:
    """Multinomial logistic regression on activations, fitted deterministically.

    Minimises ``CE(softmax(W z + b), y) + (l2 / 2) ||W||^2`` over ``W [K, d]``, ``b [K]`` where ``z`` is ``x``
    standardised per feature (training mean and std) when ``standardize``; weights are reported in the input
    space (``logits = x @ weight.T + bias``). Full-batch L-BFGS (strong Wolfe line search) from zeros in
    float64: no randomness anywhere.

    Args:
        num_classes: ``K`` (2 for a binary probe).
        l2: L2 penalty on ``W`` (> 0 makes the solution unique).
        max_iter: L-BFGS iterations.
        standardize: fit on per-feature standardised inputs.
    """

    def __init__(self, num_classes: int = 2, l2: float = 1e-3, max_iter: int = 200, standardize: bool = True) -> None:
        if num_classes < 2:
            raise ConfigError(f"num_classes={num_classes} must be >= 2")
        if l2 <= 0:
            raise ConfigError(f"l2={l2} must be > 0 (it makes the fit unique and deterministic)")
        if max_iter < 1:
            raise ConfigError(f"max_iter={max_iter} must be >= 1")
        self.num_classes = num_classes
        self.l2 = l2
        self.max_iter = max_iter
        self.standardize = standardize
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    @classmethod
    def from_weights(cls, weight: torch.Tensor, bias: torch.Tensor) -> LinearProbe:
        """A probe with given input-space weights ``[K, d]`` and bias ``[K]`` (e.g. loaded from disk)."""
        if weight.dim() != 2 or bias.shape != (weight.shape[0],):
            raise DataError(f"weight must be [K, d] and bias [K], got {list(weight.shape)} and {list(bias.shape)}")
        probe = cls(num_classes=weight.shape[0])
        probe.weight, probe.bias = weight.double().clone(), bias.double().clone()
        return probe

    @property
    def fitted(self) -> bool:
        """Whether weights are set."""
        return self.weight is not None

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> LinearProbe:
        """Fit on activations ``x [N, d]`` with integer labels ``y [N]`` in ``[0, K)``; returns ``self``."""
        _check_matrix(x, "x")
        y = torch.as_tensor(y).long().flatten().cpu()
        if y.shape[0] != x.shape[0]:
            raise DataError(f"x has {x.shape[0]} rows but y has {y.shape[0]} labels")
        if y.min() < 0 or y.max() >= self.num_classes:
            raise DataError(f"labels must lie in [0, {self.num_classes}), got range [{int(y.min())}, {int(y.max())}]")
        # a fit works also when called under torch.inference_mode / no_grad (e.g. from an evaluation loop)
        with torch.inference_mode(False), torch.enable_grad():
            self._fit(x.detach().double().cpu().clone(), y.clone())
        return self

    def _fit(self, x64: torch.Tensor, y: torch.Tensor) -> None:
        if self.standardize:
            mean, std = x64.mean(0), x64.std(0, unbiased=False).clamp_min(1e-8)
        else:
            mean, std = torch.zeros(x64.shape[1], dtype=torch.float64), torch.ones(x64.shape[1], dtype=torch.float64)
        z = (x64 - mean) / std
        w = torch.zeros(self.num_classes, z.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(self.num_classes, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS(
            [w, b],
            lr=1.0,
            max_iter=self.max_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-12,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(z @ w.T + b, y) + 0.5 * self.l2 * (w * w).sum()
            loss.backward()
            return loss

        opt.step(closure)
        weight = w.detach() / std
        self.weight = weight
        self.bias = b.detach() - weight @ mean

    def _require_fit(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.weight is None or self.bias is None:
            raise RuntimeError("the probe is not fitted: call fit(x, y) first")
        return self.weight, self.bias

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits ``[N, K]`` (float32, on ``x``'s device)."""
        weight, bias = self._require_fit()
        if x.shape[-1] != weight.shape[1]:
            raise DataError(f"x has width {x.shape[-1]}; the probe was fitted on width {weight.shape[1]}")
        w = weight.to(device=x.device, dtype=torch.float32)
        return x.float() @ w.T + bias.to(device=x.device, dtype=torch.float32)

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities ``[N, K]``."""
        return self.logits(x).softmax(-1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted classes ``[N]``."""
        return self.logits(x).argmax(-1)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Fraction of rows classified correctly."""
        return float((self.predict(x).cpu() == torch.as_tensor(y).long().cpu()).float().mean())

    def _require_binary(self) -> None:
        if self.num_classes != 2:
            raise ConfigError(f"this needs a binary probe; the probe has {self.num_classes} classes")

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """Binary probes: the log-odds of class 1, ``[N]``."""
        self._require_binary()
        logits = self.logits(x)
        return logits[:, 1] - logits[:, 0]

    def auroc(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Binary probes: AUROC of :meth:`score` against ``y``."""
        return auroc(self.score(x).cpu(), y)

    @property
    def direction(self) -> torch.Tensor:
        """Binary probes: the unit normal ``(w_1 - w_0) / ||w_1 - w_0||`` in input space, ``[d]`` float32."""
        self._require_binary()
        weight, _ = self._require_fit()
        normal = weight[1] - weight[0]
        return (normal / normal.norm().clamp_min(1e-12)).float()


def save_vectors(path: str | Path, vectors: Mapping[str, torch.Tensor]) -> Path:
    """Write named ``[d]`` vectors to a safetensors file (parent folders created); returns the path."""
    if not vectors:
        raise DataError("save_vectors: no vectors to write")
    for name, vector in vectors.items():
        if not isinstance(vector, torch.Tensor) or vector.dim() != 1:
            raise DataError(f"save_vectors: '{name}' must be a 1-D tensor")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: v.detach().float().cpu().contiguous() for name, v in vectors.items()}, str(path))
    return path


def load_vector(path: str | Path, name: str | None = None) -> torch.Tensor:
    """The vector ``name`` of a file written by :func:`save_vectors` (``None``: the file must hold exactly one)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: no vector file (write one with zoo.interp.save_vectors)")
    vectors = load_file(str(path))
    if name is None:
        if len(vectors) != 1:
            raise DataError(f"{path} holds {len(vectors)} vectors {sorted(vectors)}; name the one to load")
        return next(iter(vectors.values()))
    if name not in vectors:
        raise DataError(f"{path} has no vector '{name}'; it holds {sorted(vectors)}")
    return vectors[name]
