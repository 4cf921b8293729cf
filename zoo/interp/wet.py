"""WET -- World Entropy Tethering: entropy-gated rescaling of world-tethering attention heads.

Paper: "WET: World Entropy Tethering" (ICML 2026). No paper text, arXiv id or code could be retrieved; this is a
**reconstruction** from the abstract's nouns and the nearest published mechanisms (research notes
``inference.md`` section 2: entrainment heads, PASTA, ITI head selection by probes, receiver-head amplification).
Every free choice is a constructor argument marked ``[reconstruction]``; the tests pin the mechanism
(entropy-gated head rescaling), not paper numbers.

*World misattribution*: the prompt sets a world (a fictional setting, counterfactual facts, a document) and the
model answers from another one (usually its parametric default). WET reads how uncertain the residual stream is
about the world, finds the heads that carry the world, and amplifies them only when the uncertainty is high.

Equation -> function:

* world probe ``q_phi(k | h_t^l) = softmax(W h_t^l + b)`` over ``K`` worlds -> :class:`WorldEntropyProbe`
  (a ``K``-class :class:`~zoo.interp.probes.LinearProbe` on the residual stream after layer ``l``);
  :func:`fit_world_probe` fits it on labelled prompts.
* drift score ``H_t = -sum_k q_phi(k | h_t) log q_phi(k | h_t)`` -> :func:`world_entropy`,
  :meth:`WorldEntropyProbe.entropy`.
* denoising score matching ``E || s_theta(z + sigma eps, k, sigma) + eps / sigma ||^2`` on each head's outputs
  ``z`` (its slice of the attention output projection's input) -> :class:`ConditionalScoreNets`
  (all heads' nets trained at once), :meth:`ScoreMatchingRanker.score_head_outputs`.
* tethering score ``T_{l,h} = E_z E_{k != k'} || s_theta(z, k) - s_theta(z, k') ||^2`` (how strongly the world
  label reshapes the density of the head's outputs; a Fisher-divergence proxy) -> :class:`ScoreMatchingRanker`.
  Alternative rankers: per-head probe accuracy (ITI) -> :class:`ProbeAccuracyRanker`; activation-patching
  effect -> :class:`PatchingEffectRanker`. Top heads -> :func:`top_heads`.
* gate ``g_t = clip((H_t - eta) / (log K - eta), 0, 1)`` -> :func:`entropy_gate`.
* rescaling ``o^{l,h} <- (1 + alpha g_t) o^{l,h}`` for tethering heads and, optionally,
  ``o^{l,h} <- (1 - beta g_t) o^{l,h}`` for the other heads -> :class:`WETController` (a
  :class:`~zoo.interp.hooks.HeadScaler` whose gate is read from the probe at the same step).
* the rescaling at every decode step of a generating module -> :class:`WETHook` (a decoder hook,
  ``module.decoder.hooks``; per-decode :class:`GateRecord`); the Lightning adapter is
  :class:`zoo.callbacks.WETCallback`.
* the probe and the ranking, fitted once per model -> :func:`fit_wet` -> :class:`WETArtifact` (``save``/``load``);
  the random-head baseline -> :class:`RandomRanker`.

Conventions fixed here [reconstruction]:

* the gate of position ``t`` comes from the probe layer's residual at ``t`` in the same forward pass, so the
  gated heads must lie in layers *above* the probe layer; this keeps the rescaling a per-position function of
  the prefix, hence identical with and without the KV cache (heads at or below the probe layer would need the
  entropy before it is computed: refused with a clear error);
* "other heads" (``beta``) are all heads above the probe layer that are not tethering heads;
* rankers read the last prompt position (left-padded batches) unless told otherwise; the probe is fitted at the
  positions named by ``probe_positions`` (:data:`PROBE_POSITIONS`): ``last`` (the last prompt token, the answer
  position), ``anchors`` (the prompt tokens that name the world, found by a regular expression on the prompt,
  :func:`anchor_mask`) or ``anchors+last`` (both; what ``+method=wet`` uses: the abstract speaks of prompt
  anchors, the research notes of anchors and answer positions, and the gate is applied at every position);
* the gate threshold ``eta`` is a number, or calibrated (:func:`calibrate_eta`): the ``q``-quantile of ``H`` at
  the last prompt token of held-out in-distribution prompts, so the gate stays closed on about ``1 - q`` of
  prompts like the training ones whatever the probe's scale;
* head outputs are standardised per head before score matching, so heads compete on the shape of their
  world-conditional densities, not on their scale.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedTokenizerBase

from zoo.encoding import encode_prompts
from zoo.errors import ConfigError, DataError
from zoo.interp.architectures import model_layout
from zoo.interp.hooks import (
    ActivationCache,
    Head,
    HeadPatcher,
    HeadScaler,
    ModelHook,
    activations_at,
    forward_left_padded,
    hidden_of,
)
from zoo.interp.probes import LinearProbe

# -- the world-entropy probe and the gate ------------------------------------------------------------------------


def world_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` over the last dimension: ``[..., K] -> [...]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_gate(entropy: torch.Tensor, eta: float, num_worlds: int) -> torch.Tensor:
    """``g = clip((H - eta) / (log K - eta), 0, 1)``: 0 while ``H <= eta``, 1 at the maximal entropy ``log K``."""
    check_gate_threshold(eta, num_worlds)
    return ((entropy - eta) / (math.log(num_worlds) - eta)).clamp(0.0, 1.0)


def check_gate_threshold(eta: float, num_worlds: int) -> None:
    """Raise unless ``num_worlds >= 2`` and ``eta < log K`` (the gate's denominator must be positive)."""
    if num_worlds < 2:
        raise ConfigError(f"num_worlds={num_worlds} must be >= 2")
    if not eta < math.log(num_worlds):
        raise ConfigError(f"eta={eta} must be below log K = {math.log(num_worlds):.4f} (K={num_worlds} worlds)")


class WorldEntropyProbe:
    """Linear softmax probe ``q_phi(k | h^l_t)`` over ``K`` worlds on the residual stream after layer ``layer``.

    Args:
        layer: decoder layer whose output the probe reads [reconstruction: a config choice].
        num_worlds: ``K``.
        probe: a fitted ``K``-class :class:`LinearProbe` (``None``: fit one with :meth:`fit`).
        l2: L2 penalty of the fit.
    """

    def __init__(self, layer: int, num_worlds: int, probe: LinearProbe | None = None, l2: float = 1e-3) -> None:
        if num_worlds < 2:
            raise ConfigError(f"num_worlds={num_worlds} must be >= 2")
        if probe is not None and probe.num_classes != num_worlds:
            raise ConfigError(f"the probe has {probe.num_classes} classes but num_worlds={num_worlds}")
        self.layer = layer
        self.num_worlds = num_worlds
        self.probe = probe or LinearProbe(num_classes=num_worlds, l2=l2)

    def fit(self, activations: torch.Tensor, worlds: torch.Tensor) -> WorldEntropyProbe:
        """Fit on residual activations ``[N, d]`` with world labels ``[N]``; returns ``self``."""
        self.probe.fit(activations, worlds)
        return self

    def probabilities(self, hidden: torch.Tensor) -> torch.Tensor:
        """``q_phi(k | h)``: ``[..., d] -> [..., K]``."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return self.probe.predict_proba(flat).reshape(*hidden.shape[:-1], self.num_worlds)

    def entropy(self, hidden: torch.Tensor) -> torch.Tensor:
        """``H = -sum_k q log q``: ``[..., d] -> [...]`` (float32)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return world_entropy(self.probe.logits(flat)).reshape(hidden.shape[:-1])


# -- labelled prompts for probes and rankers ------------------------------------------------------------------------


@dataclass
class WorldBatch:
    """Left-padded prompts, each set in a known world.

    Attributes:
        input_ids, attention_mask: ``[N, P]`` left-padded prompts.
        worlds: ``[N]`` world labels in ``[0, K)``.
        answer_ids: ``[N]`` the correct next token of each prompt (needed by :class:`PatchingEffectRanker`).
        source_ids, source_mask: ``[N, P']`` counterfactual prompts: the same query set in another world (needed by
            :class:`PatchingEffectRanker`; their last position is patched into the clean run).
        anchor_mask: ``[N, P]`` bool, the prompt anchors (the tokens that name the world; :func:`anchor_mask`), for a
            probe fitted at the anchors (``probe_positions`` ``anchors`` or ``anchors+last``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    worlds: torch.Tensor
    answer_ids: torch.Tensor | None = None
    source_ids: torch.Tensor | None = None
    source_mask: torch.Tensor | None = None
    anchor_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.input_ids.shape[0]
        if self.attention_mask.shape != self.input_ids.shape:
            shapes = f"{list(self.attention_mask.shape)} vs {list(self.input_ids.shape)}"
            raise DataError(f"attention_mask and input_ids differ in shape: {shapes}")
        for name in ("worlds", "answer_ids"):
            value = getattr(self, name)
            if value is not None and value.shape != (n,):
                raise DataError(f"{name} must have shape [{n}], got {list(value.shape)}")
        if (self.source_ids is None) != (self.source_mask is None):
            raise DataError("give both source_ids and source_mask, or neither")
        if self.source_ids is not None and self.source_ids.shape[0] != n:
            raise DataError(f"source_ids has {self.source_ids.shape[0]} rows; input_ids has {n}")
        if self.anchor_mask is not None:
            if self.anchor_mask.shape != self.input_ids.shape:
                shapes = f"{list(self.anchor_mask.shape)} vs {list(self.input_ids.shape)}"
                raise DataError(f"anchor_mask and input_ids differ in shape: {shapes}")
            if bool((self.anchor_mask.bool() & ~self.attention_mask.bool()).any()):
                raise DataError("anchor_mask marks padding positions")

    @classmethod
    def from_rows(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        rows: Sequence[Mapping[str, Any]],
        world_field: str = "world",
        answer_field: str | None = "answer",
        counterfactual_field: str | None = "counterfactual_prompt",
        device: torch.device | str = "cpu",
        anchor_pattern: str | None = None,
    ) -> WorldBatch:
        """Build a batch from data rows (e.g. :class:`zoo.data.multiworld.MultiWorldRecallTask` rows).

        Each row needs ``prompt`` and ``world_field``; with ``answer_field`` the answer token is the first token
        of that text; with ``counterfactual_field`` that prompt becomes the patching source (``None`` skips); with
        ``anchor_pattern`` the tokens it matches become :attr:`anchor_mask` (:func:`anchor_mask`).
        """
        if not rows:
            raise DataError("no rows to build a WorldBatch from")
        fields = ["prompt", world_field] + [f for f in (answer_field, counterfactual_field) if f is not None]
        for index, row in enumerate(rows):
            for name in fields:
                if name not in row:
                    raise DataError(f"row {index}: missing field '{name}' (needed: {fields})")
        ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in rows], device)
        worlds = torch.tensor([int(r[world_field]) for r in rows], device=device)
        answers = source_ids = source_mask = None
        if answer_field is not None:
            first = [tokenizer(str(r[answer_field]), add_special_tokens=False)["input_ids"][:1] for r in rows]
            empty = [i for i, f in enumerate(first) if not f]
            if empty:
                raise DataError(f"row {empty[0]}: field '{answer_field}' tokenizes to nothing")
            answers = torch.tensor([f[0] for f in first], device=device)
        if counterfactual_field is not None:
            source_ids, source_mask = encode_prompts(tokenizer, [r[counterfactual_field] for r in rows], device)
        anchors = None
        if anchor_pattern is not None:
            anchors = anchor_mask(tokenizer, [r["prompt"] for r in rows], anchor_pattern, ids.shape[1]).to(device)
        return cls(ids, mask, worlds, answers, source_ids, source_mask, anchors)


def anchor_mask(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], pattern: str, width: int | None = None
) -> torch.Tensor:
    """``[N, P]`` bool: the tokens of each left-padded prompt (as :func:`zoo.encoding.encode_prompts` pads them) whose
    characters overlap the first match of ``pattern`` -- its first group when it has one (``^W(\\d+)``: the digits of
    the multi-world task's world tag), else the whole match.

    Args:
        tokenizer: a fast tokenizer (character offsets are read from it).
        prompts: the prompt texts.
        pattern: a regular expression that matches every prompt.
        width: ``P`` (default: the longest encoded prompt).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("anchor positions need a fast tokenizer (character offsets); this one is not")
    regex = re.compile(pattern)
    rows = []
    for index, prompt in enumerate(prompts):
        match = regex.search(prompt)
        if match is None:
            raise DataError(f"prompt {index} ({prompt[:40]!r}): anchor_pattern {pattern!r} does not match")
        lo, hi = match.span(1) if regex.groups else match.span()
        if hi <= lo:
            raise DataError(f"prompt {index}: anchor_pattern {pattern!r} matches an empty span")
        offsets = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        shift = len(encode_prompts(tokenizer, [prompt])[0][0]) - len(offsets)  # a BOS token put first
        rows.append([False] * shift + [start < hi and end > lo for start, end in offsets])
    width = max(len(r) for r in rows) if width is None else width
    if any(len(r) > width for r in rows):
        raise DataError(f"a prompt encodes to more than width={width} tokens")
    return torch.tensor([[False] * (width - len(r)) + r for r in rows], dtype=torch.bool)


#: where the world probe is fitted: the last prompt token, the prompt anchors, or both [reconstruction]
PROBE_POSITIONS = ("last", "anchors", "anchors+last")


def check_probe_positions(positions: str) -> str:
    """``positions`` if it is one of :data:`PROBE_POSITIONS`, else a :class:`ConfigError`."""
    if positions not in PROBE_POSITIONS:
        raise ConfigError(f"probe_positions={positions!r}: use one of {', '.join(PROBE_POSITIONS)}")
    return positions


def fit_world_probe(
    model: nn.Module,
    batch: WorldBatch,
    layer: int,
    num_worlds: int,
    l2: float = 1e-3,
    position: int = -1,
    batch_size: int = 64,
    positions: str = "last",
) -> WorldEntropyProbe:
    """Fit a :class:`WorldEntropyProbe` on the residual after ``layer`` at ``positions`` (:func:`probe_rows`;
    ``last``: at ``position``, default the last prompt token [reconstruction])."""
    acts, worlds = probe_rows(model, batch, layer, positions, batch_size, position)
    return WorldEntropyProbe(layer, num_worlds, l2=l2).fit(acts, worlds)


def world_activations(
    model: nn.Module, batch: WorldBatch, layer: int, position: int = -1, batch_size: int = 64
) -> torch.Tensor:
    """The residual after ``layer`` at ``position`` of every prompt of ``batch``: ``[N, d]`` (float32, CPU)."""
    model_layout(model).check_layer(layer, "probe layer")
    acts = activations_at(model, batch.input_ids, batch.attention_mask, [layer], "residual", position, batch_size)
    return acts[layer]


@torch.no_grad()
def probe_rows(
    model: nn.Module,
    batch: WorldBatch,
    layer: int,
    positions: str = "last",
    batch_size: int = 64,
    position: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's training rows: the residual after ``layer`` at ``positions`` of every prompt, with its world label.

    ``last``: one row per prompt, at ``position`` (the last prompt token by default); ``anchors``: one row per anchor
    token (``batch.anchor_mask``); ``anchors+last``: both (the last token once, also when it is an anchor).

    Returns:
        ``([M, d], [M])`` float32 activations and world labels, on CPU.
    """
    check_probe_positions(positions)
    if positions == "last":
        return world_activations(model, batch, layer, position, batch_size), batch.worlds.cpu()
    if batch.anchor_mask is None:
        raise ConfigError(
            f"probe_positions={positions!r} needs the prompt anchors: build the WorldBatch with anchor_pattern"
        )
    if not bool(batch.anchor_mask.any(-1).all()):
        raise DataError("some prompts have no anchor token (anchor_mask is all False on them)")
    model_layout(model).check_layer(layer, "probe layer")
    select = batch.anchor_mask.bool().clone()
    if positions == "anchors+last":
        select[:, position] = True
    cache = ActivationCache(model, [layer], site="residual")
    was_training = model.training
    model.eval()
    acts, worlds = [], []
    try:
        for start in range(0, batch.input_ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            with cache:
                forward_left_padded(model, batch.input_ids[rows], batch.attention_mask[rows])
            picked = select[rows].to(cache[layer].device)
            acts.append(cache[layer][picked].float().cpu())
            worlds.append(batch.worlds[rows].to(picked.device)[:, None].expand_as(picked)[picked].cpu())
    finally:
        model.train(was_training)
    return torch.cat(acts), torch.cat(worlds)


def calibrate_eta(
    model: nn.Module, probe: WorldEntropyProbe, batch: WorldBatch, quantile: float, batch_size: int = 64
) -> float:
    """The gate threshold as the ``quantile`` of the world entropy ``H`` at the last prompt token of ``batch``
    (held-out in-distribution prompts): the gate then stays closed on about that share of such prompts
    [reconstruction: the notes leave ``eta`` free].

    Raises:
        DataError: when that quantile is not below ``log K`` (the probe is uninformative on those prompts).
    """
    if not 0.0 < quantile < 1.0:
        raise ConfigError(f"eta_quantile={quantile} must be in (0, 1)")
    entropy = probe.entropy(world_activations(model, batch, probe.layer, -1, batch_size))
    # 'higher': a value of H itself, so the gate opens on at most 1 - quantile of these prompts
    eta = float(torch.quantile(entropy.double(), quantile, interpolation="higher"))
    if not eta < math.log(probe.num_worlds):
        raise DataError(
            f"the {quantile} quantile of H on the calibration prompts is {eta:.4f}, not below log K = "
            f"{math.log(probe.num_worlds):.4f}: the world probe carries no information there"
        )
    return eta


# -- head rankers ---------------------------------------------------------------------------------------------------


def top_heads(scores: torch.Tensor, k: int, min_layer: int = 0) -> list[Head]:
    """The ``k`` heads with the highest scores among layers ``>= min_layer`` (ties: lower index first).

    Args:
        scores: ``[L, H]`` ranker scores.
        k: number of heads.
        min_layer: first eligible layer (WET: the probe layer + 1).
    """
    num_layers, num_heads = scores.shape
    eligible = [
        (float(scores[layer, head]), layer, head) for layer in range(min_layer, num_layers) for head in range(num_heads)
    ]
    if not 1 <= k <= len(eligible):
        raise ConfigError(f"k={k} heads requested; {len(eligible)} heads lie in layers >= {min_layer}")
    eligible.sort(key=lambda item: (-item[0], item[1], item[2]))
    return [(layer, head) for _, layer, head in eligible[:k]]


class HeadRanker(ABC):
    """Scores every attention head for how strongly it carries the world: ``score(model, batch) -> [L, H]``.

    ``needs_counterfactuals``: the ranker reads ``WorldBatch.answer_ids`` and the counterfactual prompts.
    """

    needs_counterfactuals: bool = False

    @abstractmethod
    def score(self, model: nn.Module, batch: WorldBatch) -> torch.Tensor:
        """``[L, H]`` scores (higher = more world-tethering)."""


def head_outputs(model: nn.Module, batch: WorldBatch, position: int = -1, batch_size: int = 64) -> torch.Tensor:
    """Per-head attention outputs at one position: ``[N, L, H, d_head]`` (float32, CPU)."""
    layers = list(range(model_layout(model).num_layers))
    acts = activations_at(model, batch.input_ids, batch.attention_mask, layers, "heads", position, batch_size)
    return torch.stack([acts[layer] for layer in layers], dim=1)


def _check_head_outputs(z: torch.Tensor, worlds: torch.Tensor) -> torch.Tensor:
    if z.dim() != 4:
        raise DataError(f"head outputs must be [N, L, H, d_head], got {list(z.shape)}")
    worlds = torch.as_tensor(worlds).long().flatten()
    if worlds.shape[0] != z.shape[0]:
        raise DataError(f"{z.shape[0]} head-output rows but {worlds.shape[0]} world labels")
    if len(worlds.unique()) < 2:
        raise DataError("head ranking needs prompts from at least two worlds")
    return worlds


class HeadOutputRanker(HeadRanker):
    """A ranker that only needs the heads' outputs at one position (score matching, probe accuracy).

    Subclasses set ``self.position`` (the position read; default the last prompt token [reconstruction]).
    """

    position: int = -1

    def score(self, model: nn.Module, batch: WorldBatch) -> torch.Tensor:
        return self.score_head_outputs(head_outputs(model, batch, self.position), batch.worlds)

    @abstractmethod
    def score_head_outputs(self, z: torch.Tensor, worlds: torch.Tensor) -> torch.Tensor:
        """``z [N, L, H, d_head]``, ``worlds [N]`` -> ``[L, H]``."""


class ConditionalScoreNets(nn.Module):
    """``G`` independent conditional score nets ``s_theta(z, k, sigma) = f_theta([z, onehot(k), log sigma]) / sigma``.

    One small MLP per head (two hidden SiLU layers), evaluated for all heads at once with batched matrix products.
    Initialised from a seeded generator.

    Args:
        num_nets: ``G`` (one per head).
        dim: ``d_head``.
        num_worlds: ``K``.
        hidden: hidden width [reconstruction].
        seed: initialisation seed.
    """

    def __init__(self, num_nets: int, dim: int, num_worlds: int, hidden: int = 64, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        sizes = [(dim + num_worlds + 1, hidden), (hidden, hidden), (hidden, dim)]
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.randn(num_nets, i, o, generator=gen) / math.sqrt(i)) for i, o in sizes]
        )
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(num_nets, 1, o)) for _, o in sizes])
        self.num_worlds = num_worlds

    def forward(self, z: torch.Tensor, worlds: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """``sigma * s_theta``: ``z [G, N, d]``, ``worlds [N]``, ``sigma [N]`` -> ``[G, N, d]``."""
        cond = torch.cat([nn.functional.one_hot(worlds, self.num_worlds).float(), sigma.log()[:, None]], dim=-1)
        x = torch.cat([z, cond.expand(z.shape[0], -1, -1)], dim=-1)
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias, x, weight)
            if i < len(self.weights) - 1:
                x = nn.functional.silu(x)
        return x


class ScoreMatchingRanker(HeadOutputRanker):
    """Tethering score from a conditional score-matching geometry model of each head's outputs [reconstruction].

    For every head, fit ``s_theta(z, k, sigma)`` by denoising score matching,
    ``min E_{z, k, sigma, eps} || sigma s_theta(z + sigma eps, k, sigma) + eps ||^2`` (the sigma^2-weighted DSM
    loss), then score ``T = E_z mean_{k != k'} || sigma_e (s_theta(z, k, sigma_e) - s_theta(z, k', sigma_e)) ||^2``
    at the smallest noise level ``sigma_e``. A head whose output density does not depend on the world has
    ``s(z, k) = s(z, k')`` and ``T ~ 0``.

    Args:
        sigmas: noise levels (each training example draws one) [reconstruction].
        hidden: score-net hidden width [reconstruction].
        steps: Adam steps [reconstruction].
        lr: Adam learning rate.
        batch_size: rows per step (``None``: all rows).
        standardize: standardise each head's outputs (mean 0, unit variance per coordinate) first.
        seed: initialisation, minibatch and noise seed (the fit is deterministic given it).
        position: prompt position whose head outputs are modelled [reconstruction].
    """

    def __init__(
        self,
        sigmas: Sequence[float] = (0.1, 0.2, 0.4, 0.8),
        hidden: int = 64,
        steps: int = 400,
        lr: float = 3e-3,
        batch_size: int | None = 256,
        standardize: bool = True,
        seed: int = 0,
        position: int = -1,
    ) -> None:
        if not sigmas or min(sigmas) <= 0:
            raise ConfigError(f"sigmas={list(sigmas)} must be a non-empty list of positive noise levels")
        if steps < 1 or hidden < 1:
            raise ConfigError(f"steps={steps} and hidden={hidden} must be >= 1")
        self.sigmas = tuple(float(s) for s in sigmas)
        self.hidden = hidden
        self.steps = steps
        self.lr = lr
        self.batch_size = batch_size
        self.standardize = standardize
        self.seed = seed
        self.position = position

    def score_head_outputs(self, z: torch.Tensor, worlds: torch.Tensor) -> torch.Tensor:
        worlds = _check_head_outputs(z, worlds)
        n, num_layers, num_heads, dim = z.shape
        num_worlds = int(worlds.max()) + 1
        x = z.detach().float().cpu().reshape(n, num_layers * num_heads, dim).transpose(0, 1).contiguous()  # [G, N, d]
        if self.standardize:
            x = (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True, unbiased=False).clamp_min(1e-6)
        # the nets train also when called under torch.inference_mode (e.g. from an evaluation loop)
        with torch.inference_mode(False):
            x, worlds = x.clone(), worlds.clone()
            nets = ConditionalScoreNets(x.shape[0], dim, num_worlds, self.hidden, self.seed)
            self._fit(nets, x, worlds)
            return self._tethering(nets, x, num_worlds).reshape(num_layers, num_heads)

    def _fit(self, nets: ConditionalScoreNets, x: torch.Tensor, worlds: torch.Tensor) -> None:
        gen = torch.Generator().manual_seed(self.seed + 1)
        sigmas = torch.tensor(self.sigmas)
        opt = torch.optim.Adam(nets.parameters(), lr=self.lr)
        n = x.shape[1]
        rows = min(self.batch_size or n, n)
        with torch.enable_grad():
            for _ in range(self.steps):
                idx = torch.randperm(n, generator=gen)[:rows]
                sigma = sigmas[torch.randint(len(sigmas), (rows,), generator=gen)]
                eps = torch.randn(x.shape[0], rows, x.shape[2], generator=gen)
                noisy = x[:, idx] + sigma[None, :, None] * eps
                loss = (nets(noisy, worlds[idx], sigma) + eps).pow(2).sum(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()

    @torch.no_grad()
    def _tethering(self, nets: ConditionalScoreNets, x: torch.Tensor, num_worlds: int) -> torch.Tensor:
        n = x.shape[1]
        sigma = torch.full((n,), min(self.sigmas))
        scores = [nets(x, torch.full((n,), k, dtype=torch.long), sigma) for k in range(num_worlds)]
        total = torch.zeros(x.shape[0])
        for k in range(num_worlds):
            for k2 in range(num_worlds):
                if k != k2:
                    total += (scores[k] - scores[k2]).pow(2).sum(-1).mean(-1)
        return total / (num_worlds * (num_worlds - 1))


class ProbeAccuracyRanker(HeadOutputRanker):
    """Held-out accuracy of a ``K``-class linear probe on each head's outputs (ITI-style head selection).

    Args:
        holdout_fraction: fraction of rows held out for the accuracy (a seeded split) [reconstruction].
        l2: probe L2 penalty.
        seed: split seed.
        position: prompt position whose head outputs are probed [reconstruction].
    """

    def __init__(self, holdout_fraction: float = 0.3, l2: float = 1e-2, seed: int = 0, position: int = -1) -> None:
        if not 0 < holdout_fraction < 1:
            raise ConfigError(f"holdout_fraction={holdout_fraction} must be in (0, 1)")
        self.holdout_fraction = holdout_fraction
        self.l2 = l2
        self.seed = seed
        self.position = position

    def score_head_outputs(self, z: torch.Tensor, worlds: torch.Tensor) -> torch.Tensor:
        worlds = _check_head_outputs(z, worlds)
        n, num_layers, num_heads, _ = z.shape
        order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        held = max(1, int(round(self.holdout_fraction * n)))
        test, train = order[:held], order[held:]
        num_worlds = int(worlds.max()) + 1
        scores = torch.zeros(num_layers, num_heads)
        for layer in range(num_layers):
            for head in range(num_heads):
                x = z[:, layer, head].float()
                probe = LinearProbe(num_classes=num_worlds, l2=self.l2).fit(x[train], worlds[train])
                scores[layer, head] = probe.accuracy(x[test], worlds[test])
        return scores


class PatchingEffectRanker(HeadRanker):
    """Activation-patching effect of each head: how much the correct answer's log-probability drops when the
    head's output at the last position is replaced by its output on the counterfactual-world prompt.

    ``effect_{l,h} = mean_i [ log p(a_i | x_i) - log p(a_i | x_i, o^{l,h} <- o^{l,h}(x'_i)) ]`` with ``x'_i`` the
    same query set in another world (``WorldBatch.source_ids``) and ``a_i`` the clean answer token
    (``WorldBatch.answer_ids``) [reconstruction: the metric and the patched position].

    Args:
        batch_size: rows per forward.
    """

    needs_counterfactuals = True

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, model: nn.Module, batch: WorldBatch) -> torch.Tensor:
        if batch.answer_ids is None or batch.source_ids is None or batch.source_mask is None:
            raise DataError("PatchingEffectRanker needs WorldBatch.answer_ids, source_ids and source_mask")
        layout = model_layout(model)
        was_training = model.training
        model.eval()
        try:
            effects = torch.zeros(layout.num_layers, layout.num_heads)
            for start in range(0, batch.input_ids.shape[0], self.batch_size):
                rows = slice(start, start + self.batch_size)
                effects += self._chunk(model, layout.num_layers, layout.num_heads, batch, rows)
        finally:
            model.train(was_training)
        return effects / batch.input_ids.shape[0]

    def _chunk(self, model: nn.Module, num_layers: int, num_heads: int, batch: WorldBatch, rows: slice) -> torch.Tensor:
        ids, mask, answers = batch.input_ids[rows], batch.attention_mask[rows], batch.answer_ids[rows]
        layers = list(range(num_layers))
        source = activations_at(model, batch.source_ids[rows], batch.source_mask[rows], layers, "heads")

        def answer_logprob() -> torch.Tensor:
            logits = forward_left_padded(model, ids, mask)[:, -1].float()
            return torch.log_softmax(logits, -1).gather(-1, answers.to(logits.device)[:, None]).squeeze(-1).cpu()

        clean = answer_logprob()
        effects = torch.zeros(num_layers, num_heads)
        for layer in layers:
            for head in range(num_heads):
                with HeadPatcher(model, {(layer, head): source[layer][:, head]}):
                    effects[layer, head] = (clean - answer_logprob()).sum()
        return effects


class RandomRanker(HeadRanker):
    """Seeded uniform random scores: the random-head baseline (rescaling heads that carry nothing in particular).

    Args:
        seed: the draw's seed (the same seed gives the same heads for every model of the same shape).
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def score(self, model: nn.Module, batch: WorldBatch) -> torch.Tensor:
        layout = model_layout(model)
        return torch.rand(layout.num_layers, layout.num_heads, generator=torch.Generator().manual_seed(self.seed))


# -- the entropy-gated controller --------------------------------------------------------------------------------


class WETController(ModelHook):
    """Entropy-gated rescaling of tethering heads during any forward or generation (a context manager).

    At every forward call the probe reads the residual after its layer and gives ``H_t`` and
    ``g_t = clip((H_t - eta) / (log K - eta), 0, 1)`` per row and position; a :class:`HeadScaler` then multiplies
    tethering heads by ``1 + alpha g_t`` and, with ``beta > 0``, every other head above the probe layer by
    ``1 - beta g_t``. A closed gate (``H_t <= eta``) leaves the logits bit-identical.

    ``entropies`` and ``gates`` record ``[B, T]`` per forward call while ``record`` is true (cleared on enter).

    Args:
        model: the causal LM.
        probe: a fitted :class:`WorldEntropyProbe`.
        heads: tethering heads ``[(layer, head), ...]``, all in layers above ``probe.layer``.
        alpha: amplification of tethering heads at ``g = 1`` [reconstruction].
        eta: entropy threshold of the gate, ``< log K`` [reconstruction].
        beta: suppression of the other heads at ``g = 1`` (0 disables) [reconstruction].
        record: keep the per-call entropies and gates.
    """

    def __init__(
        self,
        model: nn.Module,
        probe: WorldEntropyProbe,
        heads: Sequence[Head],
        alpha: float,
        eta: float,
        beta: float = 0.0,
        record: bool = True,
    ) -> None:
        super().__init__(model)
        self.probe = probe
        self.layout.check_layer(probe.layer, "probe layer")
        if not probe.probe.fitted:
            raise ConfigError("the world probe is not fitted: fit it (fit_world_probe) before building WETController")
        check_gate_threshold(eta, probe.num_worlds)
        if not 0.0 <= beta <= 1.0:
            raise ConfigError(f"beta={beta} must be in [0, 1] (other heads are scaled by 1 - beta * g)")
        heads = [self.layout.check_head(*h, what="tethering head") for h in heads]
        if not heads:
            raise ConfigError("heads is empty: give at least one tethering head")
        below = [h for h in heads if h[0] <= probe.layer]
        if below:
            raise ConfigError(
                f"tethering heads {below} are not above the probe layer {probe.layer}: the gate of a position is "
                "computed from the probe layer's output in the same forward pass, so only heads in layers "
                f">= {probe.layer + 1} can be gated (choose a lower probe layer or heads from higher layers)"
            )
        self.heads = heads
        self.alpha, self.beta, self.eta = float(alpha), float(beta), float(eta)
        scales = dict.fromkeys(heads, 1.0 + self.alpha)
        if self.beta > 0:
            for layer in range(probe.layer + 1, self.layout.num_layers):
                for head in range(self.layout.num_heads):
                    scales.setdefault((layer, head), 1.0 - self.beta)
        self.scaler = HeadScaler(model, scales, gate=self._gate)
        self.record = record
        self.entropies: list[torch.Tensor] = []
        self.gates: list[torch.Tensor] = []
        self._current: torch.Tensor | None = None

    def _attach(self, stack: ExitStack) -> None:
        self.entropies, self.gates, self._current = [], [], None
        handle = self.layout.layers[self.probe.layer].register_forward_hook(self._read_entropy)
        stack.callback(handle.remove)
        stack.enter_context(self.scaler)

    def _read_entropy(self, module: nn.Module, args: tuple, output: Any) -> None:
        entropy = self.probe.entropy(hidden_of(output).detach())
        gate = entropy_gate(entropy, self.eta, self.probe.num_worlds)
        self._current = gate
        if self.record:
            self.entropies.append(entropy.cpu())
            self.gates.append(gate.cpu())

    def _gate(self, layer: int) -> torch.Tensor:
        if self._current is None:
            raise RuntimeError("WETController: a gated head ran before the probe layer in this forward pass")
        return self._current


# -- WET through the decoder seam -----------------------------------------------------------------------------------


@dataclass
class GateRecord:
    """Entropies and gates of one decode (one :class:`WETController` context).

    Attributes:
        prompt_entropy: ``[B]`` ``H`` at the last prefilled position of each row (the position that predicts the
            first generated token; never padding with left-padded prompts).
        prompt_gate: ``[B]`` the gate ``g`` there.
        step_gates: ``[n]`` the gates of every position of the later forward calls (the decode steps; rows that
            already finished but are still fed padding are included).
    """

    prompt_entropy: torch.Tensor
    prompt_gate: torch.Tensor
    step_gates: torch.Tensor

    @classmethod
    def from_controller(cls, controller: WETController) -> GateRecord | None:
        """The record of a controller's last context (``None`` when the model did not run inside it)."""
        if not controller.entropies:
            return None
        steps = [g.flatten() for g in controller.gates[1:]]
        return cls(
            prompt_entropy=controller.entropies[0][:, -1].float(),
            prompt_gate=controller.gates[0][:, -1].float(),
            step_gates=torch.cat(steps).float() if steps else torch.zeros(0),
        )


class WETHook:
    """WET as a decoder hook: ``hook(model)`` is a context manager running a :class:`WETController` on ``model``.

    Append it to a generating module's ``decoder.hooks`` (:mod:`zoo.generation.decoders`) and the entropy-gated
    rescaling acts at every step of every decode of that decoder (sample, step-wise, ...), the prefill included;
    after each decode a :class:`GateRecord` is appended to :attr:`records` (read and cleared with :meth:`take`).

    Args:
        probe: a fitted :class:`WorldEntropyProbe`.
        heads: tethering heads (all above ``probe.layer``).
        alpha, eta, beta: as :class:`WETController`.
    """

    def __init__(
        self, probe: WorldEntropyProbe, heads: Sequence[Head], alpha: float, eta: float, beta: float = 0.0
    ) -> None:
        check_gate_threshold(eta, probe.num_worlds)
        if not probe.probe.fitted:
            raise ConfigError("the world probe is not fitted: fit it (fit_world_probe) before building WETHook")
        self.probe = probe
        self.heads = [tuple(h) for h in heads]
        self.alpha, self.eta, self.beta = float(alpha), float(eta), float(beta)
        self.records: list[GateRecord] = []

    def controller(self, model: nn.Module) -> WETController:
        """A :class:`WETController` on ``model`` (every setting is checked against the model here)."""
        return WETController(model, self.probe, self.heads, self.alpha, self.eta, self.beta, record=True)

    @contextlib.contextmanager
    def __call__(self, model: nn.Module) -> Iterator[WETController]:
        controller = self.controller(model)
        with controller:
            yield controller
        record = GateRecord.from_controller(controller)
        if record is not None:
            self.records.append(record)

    def take(self) -> list[GateRecord]:
        """The records of the decodes since the last call (cleared)."""
        records, self.records = self.records, []
        return records

    def __repr__(self) -> str:
        return (
            f"WETHook(probe_layer={self.probe.layer}, heads={self.heads}, alpha={self.alpha}, eta={self.eta}, "
            f"beta={self.beta})"
        )


# -- the fitted pieces, trained once per model ---------------------------------------------------------------------

WET_TENSORS = "wet.safetensors"
WET_META = "wet.json"


@dataclass
class WETArtifact:
    """What WET fits once for a model: the world probe and the head ranking.

    Written by :meth:`save` (``wet.safetensors`` + ``wet.json``) and read by :meth:`load`; ``save`` has the
    ``build(directory)`` shape of an artifact builder, so ``lambda d: fit_wet(...).save(d)`` plugs into a cache.

    Attributes:
        probe: the fitted :class:`WorldEntropyProbe`.
        head_scores: ``[L, H]`` ranker scores.
        ranker: the ranker's class name.
        metrics: fit diagnostics (in-sample probe accuracy, mean entropy, rows).
        eta: the calibrated gate threshold (:func:`calibrate_eta`); ``None`` when the fit did not calibrate one.
    """

    probe: WorldEntropyProbe
    head_scores: torch.Tensor
    ranker: str
    metrics: dict[str, float] = field(default_factory=dict)
    eta: float | None = None

    def heads(self, k: int) -> list[Head]:
        """The ``k`` top-ranked heads above the probe layer (the tethering heads)."""
        return top_heads(self.head_scores, k, min_layer=self.probe.layer + 1)

    def save(self, directory: str | Path) -> dict[str, float]:
        """Write the artifact into ``directory`` (created); returns :attr:`metrics`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        weight, bias = self.probe.probe.weight, self.probe.probe.bias
        if weight is None or bias is None:
            raise ConfigError("WETArtifact.save: the probe is not fitted")
        tensors = {"probe.weight": weight, "probe.bias": bias, "head_scores": self.head_scores.double()}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / WET_TENSORS))
        meta = {
            "probe_layer": self.probe.layer,
            "num_worlds": self.probe.num_worlds,
            "ranker": self.ranker,
            "eta": self.eta,
        }
        (directory / WET_META).write_text(json.dumps({**meta, "metrics": self.metrics}, indent=2))
        return dict(self.metrics)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        """Whether ``directory`` holds a saved artifact."""
        return (Path(directory) / WET_META).is_file() and (Path(directory) / WET_TENSORS).is_file()

    @classmethod
    def load(cls, directory: str | Path) -> WETArtifact:
        """Read an artifact written by :meth:`save`."""
        directory = Path(directory)
        if not cls.exists(directory):
            raise DataError(f"{directory}: no WET artifact ({WET_META} and {WET_TENSORS}); fit one with fit_wet")
        meta = json.loads((directory / WET_META).read_text())
        tensors = load_file(str(directory / WET_TENSORS))
        probe = WorldEntropyProbe(
            int(meta["probe_layer"]),
            int(meta["num_worlds"]),
            LinearProbe.from_weights(tensors["probe.weight"], tensors["probe.bias"]),
        )
        eta = meta.get("eta")
        metrics = dict(meta.get("metrics", {}))
        return cls(
            probe, tensors["head_scores"].float(), str(meta["ranker"]), metrics, None if eta is None else float(eta)
        )


def fit_wet(
    model: nn.Module,
    batch: WorldBatch,
    probe_layer: int,
    num_worlds: int,
    ranker: HeadRanker,
    l2: float = 1e-3,
    position: int = -1,
    batch_size: int = 64,
    probe_positions: str = "last",
    calibration: WorldBatch | None = None,
    eta_quantile: float | None = None,
) -> WETArtifact:
    """Fit the world probe at ``probe_layer`` and rank every head with ``ranker`` on labelled prompts.

    Args:
        model: the (frozen) causal LM.
        batch: prompts with world labels (answers and counterfactuals too when ``ranker.needs_counterfactuals``;
            the anchor mask when ``probe_positions`` reads the anchors).
        probe_layer, num_worlds, l2, position: the probe (:func:`fit_world_probe`).
        ranker: scores ``[L, H]``.
        batch_size: rows per forward.
        probe_positions: where the probe is fitted (:data:`PROBE_POSITIONS`, :func:`probe_rows`).
        calibration: held-out in-distribution prompts; with ``eta_quantile`` the gate threshold is calibrated on
            them (:func:`calibrate_eta`) and stored as :attr:`WETArtifact.eta`.
        eta_quantile: the quantile of ``H`` that becomes ``eta`` (``None``: no calibration).
    """
    layout = model_layout(model)
    present = int(batch.worlds.max()) + 1 if batch.worlds.numel() else 0
    if present > num_worlds or int(batch.worlds.min()) < 0:
        raise DataError(f"world labels span [0, {present}) but num_worlds={num_worlds}")
    if (eta_quantile is None) != (calibration is None):
        raise ConfigError("give both calibration prompts and eta_quantile, or neither")
    acts, worlds = probe_rows(model, batch, probe_layer, probe_positions, batch_size, position)
    probe = WorldEntropyProbe(probe_layer, num_worlds, l2=l2).fit(acts, worlds)
    scores = ranker.score(model, batch).float().cpu()
    if tuple(scores.shape) != (layout.num_layers, layout.num_heads):
        raise DataError(
            f"{type(ranker).__name__} returned scores of shape {list(scores.shape)}; expected "
            f"[{layout.num_layers}, {layout.num_heads}] (layers x heads)"
        )
    last = acts if probe_positions == "last" else world_activations(model, batch, probe_layer, position, batch_size)
    metrics = {
        "probe_accuracy": probe.probe.accuracy(acts, worlds),
        "probe_entropy": float(probe.entropy(acts).mean()),
        "probe_accuracy_last": probe.probe.accuracy(last, batch.worlds.cpu()),
        "probe_entropy_last": float(probe.entropy(last).mean()),
        "rows": float(batch.input_ids.shape[0]),
        "probe_rows": float(acts.shape[0]),
    }
    eta = None
    if calibration is not None and eta_quantile is not None:
        eta = calibrate_eta(model, probe, calibration, eta_quantile, batch_size)
        metrics.update(eta=eta, eta_quantile=float(eta_quantile), calibration_rows=float(calibration.worlds.numel()))
    return WETArtifact(probe, scores, type(ranker).__name__, metrics, eta)
