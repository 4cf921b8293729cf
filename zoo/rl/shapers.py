"""Reward shapers (seam (i) of the GRPO family): applied to a step's rewards *before* the advantage.

Every shaper maps ``rewards [num_groups, G], lengths [num_groups, G] (, max_length) -> shaped [num_groups, G]``
and is a plain class with a typed ``__init__`` (usable as a Hydra ``_target_``).

- :class:`NoShaping`: identity.
- :class:`GR3Shaper`: GR3 multiplicative group-relative rescaling (``zoo.rl.gr3``, eq. GR3-1/GR3-3).
- :class:`AdditiveLengthPenalty`: ``r - lam * l / L_max`` (the "compensatory" baseline GR3 argues against).
- :class:`DAPOOverlongPenalty`: DAPO soft overlong punishment ``r + factor * R_len(l)``.

``lengths`` count completion tokens (prompt excluded). ``max_length`` is the generation budget; a shaper built
with its own ``max_length`` uses that, otherwise the value passed at call time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from zoo.errors import ConfigError
from zoo.rl.gr3 import gr3_rescale, rlhf_sigmoid, satisfaction_rate


def _check(rewards: Tensor, lengths: Tensor, who: str) -> tuple[Tensor, Tensor]:
    if rewards.dim() != 2 or rewards.shape != lengths.shape:
        raise ValueError(
            f"{who}: rewards and lengths must both be [num_groups, group_size]; got {tuple(rewards.shape)} "
            f"and {tuple(lengths.shape)}"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    return r, lengths.to(r.dtype)


class RewardShaper(ABC):
    """Base class: ``shaper(rewards, lengths, max_length=None) -> shaped rewards`` (all ``[num_groups, G]``).

    :meth:`metrics` reports the shaper's own state (e.g. GR3's current alpha); the GRPO family logs it every step
    under ``train/`` (the family never reads a shaper's attributes by name).
    """

    name: str = "base"

    @abstractmethod
    def __call__(self, rewards: Tensor, lengths: Tensor, max_length: int | None = None) -> Tensor:
        """Apply the transform (see the class docstring)."""

    def metrics(self) -> dict[str, float | Tensor]:
        """Scalars to log every training step, by name (none by default)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The shaper's state that changes during training (none by default); the GRPO family saves it in its
        checkpoints and restores it on resume (:meth:`load_state_dict`)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (nothing by default)."""
        del state  # a shaper without changing state has nothing to restore


class NoShaping(RewardShaper):
    """Identity shaper (plain GRPO)."""

    name = "none"

    def __call__(self, rewards: Tensor, lengths: Tensor, max_length: int | None = None) -> Tensor:
        r, _ = _check(rewards, lengths, "NoShaping")
        return r

    def __repr__(self) -> str:
        return "NoShaping()"


class GR3Shaper(RewardShaper):
    """GR3: ``r_hat = r / (1 + alpha * l / l_bar_g)`` (eq. GR3-1), optionally after the RLHF sigmoid (GR3-3).

    Args:
        alpha: rescaling strength (QGLAS: 0.3). A calibration callback changes it through :meth:`set_alpha`; it is
            the shaper's state (:meth:`state_dict`), saved in the module's checkpoints, so a resumed run goes on
            with the alpha in force when the checkpoint was written.
        rlhf_sigmoid: squash raw reward-model scores with ``sigmoid((r - median_g r) / tau)`` first; needed when
            scores can be negative. Without it negative rewards raise ``ConfigError`` (a ``ValueError``).
        sigmoid_temperature: ``tau`` (2.0).
        sigmoid_reference: ``"median"`` (default), ``"mean"`` or a fixed number.
    """

    name = "gr3"

    def __init__(
        self,
        alpha: float = 0.3,
        rlhf_sigmoid: bool = False,
        sigmoid_temperature: float = 2.0,
        sigmoid_reference: str | float = "median",
    ) -> None:
        if alpha < 0:
            raise ConfigError(f"GR3Shaper: alpha must be >= 0, got {alpha}")
        if sigmoid_temperature <= 0:
            raise ConfigError(f"GR3Shaper: sigmoid_temperature must be > 0, got {sigmoid_temperature}")
        self.alpha = float(alpha)
        self.rlhf_sigmoid = bool(rlhf_sigmoid)
        self.sigmoid_temperature = float(sigmoid_temperature)
        self.sigmoid_reference = sigmoid_reference

    def base_rewards(self, rewards: Tensor) -> Tensor:
        """The rewards GR3 rescales: ``rewards`` itself, or their RLHF sigmoid when ``rlhf_sigmoid``.
        Feed these (not the raw scores) to ``zoo.rl.gr3.calibrate_alpha``."""
        if self.rlhf_sigmoid:
            return rlhf_sigmoid(rewards, self.sigmoid_temperature, self.sigmoid_reference)
        return rewards

    def __call__(self, rewards: Tensor, lengths: Tensor, max_length: int | None = None) -> Tensor:
        r, length = _check(rewards, lengths, "GR3Shaper")
        return gr3_rescale(self.base_rewards(r), length, self.alpha)

    def metrics(self) -> dict[str, float | Tensor]:
        """``gr3_alpha``: the alpha in force (a calibration callback may change it during training)."""
        return {"gr3_alpha": self.alpha}

    def set_alpha(self, alpha: float) -> None:
        """Put ``alpha`` (>= 0) in force (e.g. the calibrated value, ``GR3AlphaCalibration(adapt=True)``)."""
        if not alpha >= 0:
            raise ConfigError(f"GR3Shaper: alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)

    def state_dict(self) -> dict[str, Any]:
        """``{"alpha": the alpha in force}``."""
        return {"alpha": self.alpha}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "alpha" in state:
            self.set_alpha(float(state["alpha"]))

    def satisfaction_rate(self, rewards: Tensor, lengths: Tensor, alpha: float | None = None) -> float:
        """Calibration constraint (GR3-4) satisfaction rate at ``alpha`` (default: the current alpha)."""
        r, length = _check(rewards, lengths, "GR3Shaper")
        return satisfaction_rate(self.base_rewards(r), length, self.alpha if alpha is None else alpha)

    def __repr__(self) -> str:
        return (
            f"GR3Shaper(alpha={self.alpha}, rlhf_sigmoid={self.rlhf_sigmoid}, "
            f"sigmoid_temperature={self.sigmoid_temperature}, sigmoid_reference={self.sigmoid_reference!r})"
        )


def _resolve_max_length(own: int | None, given: int | None, who: str) -> int:
    value = own if own is not None else given
    if value is None:
        raise ConfigError(f"{who}: max_length is not set; pass it to the constructor or to the call")
    if value <= 0:
        raise ConfigError(f"{who}: max_length must be > 0, got {value}")
    return int(value)


class AdditiveLengthPenalty(RewardShaper):
    """Additive length penalty ``r_hat = r - lam * l / L_max`` (the baseline of the GR3 comparison).

    Args:
        lam: penalty weight ``lambda >= 0``.
        max_length: ``L_max``; ``None`` takes the value passed at call time.
    """

    name = "additive_len"

    def __init__(self, lam: float = 0.1, max_length: int | None = None) -> None:
        if lam < 0:
            raise ConfigError(f"AdditiveLengthPenalty: lam must be >= 0, got {lam}")
        self.lam = float(lam)
        self.max_length = max_length

    def __call__(self, rewards: Tensor, lengths: Tensor, max_length: int | None = None) -> Tensor:
        r, length = _check(rewards, lengths, "AdditiveLengthPenalty")
        lmax = _resolve_max_length(self.max_length, max_length, "AdditiveLengthPenalty")
        return r - self.lam * length / lmax

    def __repr__(self) -> str:
        return f"AdditiveLengthPenalty(lam={self.lam}, max_length={self.max_length})"


def soft_overlong_punishment(lengths: Tensor, max_length: int, buffer: int) -> Tensor:
    """DAPO soft overlong punishment ``R_len(l)`` (DAPO; TRL ``get_soft_overlong_punishment``):

    ``0`` if ``l <= L_max - L_c``; ``((L_max - L_c) - l) / L_c`` if ``L_max - L_c < l <= L_max``; ``-1`` beyond.
    Shape-preserving. Example: ``L_max=100, L_c=20, l=90 -> -0.5``.
    """
    if not 0 < buffer <= max_length:
        raise ConfigError(f"soft_overlong_punishment: need 0 < buffer <= max_length, got {buffer}, {max_length}")
    length = lengths.float() if not lengths.is_floating_point() else lengths
    start = max_length - buffer
    inside = (start - length) / buffer
    return torch.where(
        length <= start, torch.zeros_like(length), torch.where(length <= max_length, inside, -torch.ones_like(length))
    )


class DAPOOverlongPenalty(RewardShaper):
    """DAPO overlong reward shaping ``r_hat = r + penalty_factor * R_len(l)``; see :func:`soft_overlong_punishment`.

    Args:
        max_length: ``L_max`` (the generation budget); ``None`` takes the value passed at call time.
        buffer: ``L_c``, the soft-punishment window before ``L_max`` (verl ``overlong_buffer.len``).
        penalty_factor: scale of the punishment (verl ``overlong_buffer.penalty_factor``, default 1.0).

    The shaped rewards can be negative, so this shaper does not compose with GR3 after it.
    """

    name = "dapo_overlong"

    def __init__(self, max_length: int | None = None, buffer: int = 20, penalty_factor: float = 1.0) -> None:
        if buffer <= 0:
            raise ConfigError(f"DAPOOverlongPenalty: buffer must be > 0, got {buffer}")
        if max_length is not None and buffer > max_length:
            raise ConfigError(f"DAPOOverlongPenalty: buffer {buffer} exceeds max_length {max_length}")
        self.max_length = max_length
        self.buffer = int(buffer)
        self.penalty_factor = float(penalty_factor)

    def __call__(self, rewards: Tensor, lengths: Tensor, max_length: int | None = None) -> Tensor:
        r, length = _check(rewards, lengths, "DAPOOverlongPenalty")
        lmax = _resolve_max_length(self.max_length, max_length, "DAPOOverlongPenalty")
        return r + self.penalty_factor * soft_overlong_punishment(length, lmax, self.buffer)

    def __repr__(self) -> str:
        return (
            f"DAPOOverlongPenalty(max_length={self.max_length}, buffer={self.buffer}, "
            f"penalty_factor={self.penalty_factor})"
        )
