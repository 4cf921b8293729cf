"""VaLR -- "Vision-aligned Latent Reasoning" (arXiv 2602.04476, ICML 2026).

A multimodal LLM emits K *latent* positions before every chain-of-thought step; at a latent position the
input embedding is the previous position's last hidden state (no LM head, no embedding lookup), and an
alignment loss pulls an intermediate layer's latent states -- upsampled K -> P and projected by an MLP psi --
toward a frozen vision encoder's P patch features. The teacher is used in training only.

Equation -> function map (paper section 3; notation of the notes ``research/multimodal_quant_data.md`` s.3):

* data rewrite  v,q -> (r^1..r^N) -> a   becomes   v,q -> (<latent> l^1_{1:K} </latent> r^1, ...,
  <latent> l^N_{1:K} </latent> r^N) -> a                                     -> :func:`rewrite_with_latents`
* latent mode  E_{t+1} = [E_t; h_t]  (language mode E_{t+1} = [E_t; e(x_{t+1})]), run with a KV cache,
  N*K + 1 forward passes per batch                                             -> :func:`latent_forward`
* the fed-back vector f(h_t): raw (Coconut, the paper's formula), rescaled to the token embeddings' RMS, or a
  learned projection [reconstruction: the paper does not say]                 -> :class:`LatentFeedback`
* per-step targets: latent k of step i <-> the k-th patch of the image row step i looks up [option; the paper
  aligns every step to the whole image]                                       -> :func:`step_row_targets`
* K -> P upsampling of the latent states of step i                            -> :func:`upsample_latents`
* L_REPA = -1/(N P) sum_{i,p} cos(psi(F^{(i)}_MLLM)[p], phi(I^{(i)})[p])       -> :func:`valr_alignment_loss`
* psi: 2-layer MLP (SiLU) from the LLM width to the teacher width             -> :class:`AlignmentProjector`
* L = L_CE + lambda L_REPA (lambda = 0.5); L_CE over the latent-augmented sequence, latent positions
  labelled -100                                                                -> :func:`packed_nll` (+ the module)
* inference: latent segments decoded with hidden-state feedback, teacher unused -> :class:`LatentDecoder` (a decoder
  of the decoder seam, :mod:`zoo.generation.decoders`)

Conventions: ``hidden_states[0]`` is the embedding output and ``hidden_states[L]`` the last layer (after the
final norm, which is what the LM head reads); the fed-back vector is ``f(hidden_states[-1])`` (Coconut's convention
with ``f`` = identity; post-norm states have RMS ~ 1 while token embeddings have RMS ~ 0.02, so the zoo's
default ``f`` rescales to the embeddings' RMS, see :class:`LatentFeedback`). Rows of a batch are laid out so that
latent positions share columns (segment-aligned padding *inside* the sequence, masked out); :func:`packed_nll`
therefore shifts labels over real tokens only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.backbones.vlm import LATENT_END, LATENT_SLOT, LATENT_START
from zoo.generation.decoders import Decoder, ForwardHook, LogitsProcessor, Prefill
from zoo.generation.sampling import cache_kwarg_name, decode_completions
from zoo.losses import IGNORE_INDEX, masked_nll
from zoo.protocols import GenerationResult, SamplingParams

LATENT_TOKENS = (LATENT_START, LATENT_END, LATENT_SLOT)


# ----------------------------------------------------------------------------------------------------------------
# data rewrite
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class LatentBatch:
    """A latent-augmented batch with latent positions aligned across rows.

    Attributes:
        input_ids, attention_mask, labels, position_ids: ``[B, T]``; latent slots hold ``latent_slot_id`` and
            label -100; padding (also between segments) has mask 0 and label -100.
        latent_columns: ``[N, K]`` column of latent slot ``k`` of segment ``i`` (shared by all rows).
        segment_mask: ``[B, N]`` whether row ``b`` has a reasoning step ``i`` (its latents are real).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    latent_columns: torch.Tensor
    segment_mask: torch.Tensor

    @property
    def num_latents(self) -> int:
        return int(self.latent_columns.shape[1])

    @property
    def num_segments(self) -> int:
        return int(self.latent_columns.shape[0])


def rewrite_with_latents(
    segments: Sequence[dict[str, Sequence[int] | Sequence[Sequence[int]]]],
    num_latents: int,
    *,
    latent_start_id: int,
    latent_end_id: int,
    latent_slot_id: int,
    pad_id: int,
    label_latent_start: bool = True,
) -> LatentBatch:
    """Insert ``<latent> l_1..l_K </latent>`` before every reasoning step (paper's data rewrite, s.3).

    Args:
        segments: per row ``{"prompt": ids, "head": ids, "steps": [ids, ...], "tail": ids}`` (the
            :class:`~zoo.datamodules.visual.VisualReasoningDataModule` batch field ``segments``). Loss
            covers ``head``, ``steps``, ``tail`` and (with ``label_latent_start``) the ``<latent>`` token; the
            K slots and ``</latent>`` (forced at inference) are labelled -100.
        num_latents: K >= 1.

    Returns:
        A :class:`LatentBatch`; the prompt block is left-padded, each segment block and the tail block are
        right-padded to the batch maximum so that latent columns coincide across rows.
    """
    if num_latents < 1:
        raise ValueError(f"num_latents must be >= 1, got {num_latents}")
    k = num_latents
    n_seg = max((len(s["steps"]) for s in segments), default=0)
    prefix = [list(s["prompt"]) + list(s["head"]) for s in segments]
    prefix_w = max(len(p) for p in prefix)
    seg_w = [
        2 + k + max((len(s["steps"][i]) for s in segments if len(s["steps"]) > i), default=0) for i in range(n_seg)
    ]
    tail_w = max(len(s["tail"]) for s in segments)
    width = prefix_w + sum(seg_w) + tail_w
    b = len(segments)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.long)
    seg_mask = torch.zeros((b, n_seg), dtype=torch.bool)
    columns = torch.zeros((n_seg, k), dtype=torch.long)
    start = prefix_w
    for i in range(n_seg):
        columns[i] = torch.arange(start + 1, start + 1 + k)
        start += seg_w[i]

    def put(row: int, col: int, tokens: Sequence[int], labelled: bool) -> None:
        if not tokens:
            return
        t = torch.as_tensor(list(tokens), dtype=torch.long)
        ids[row, col : col + len(t)] = t
        mask[row, col : col + len(t)] = 1
        if labelled:
            labels[row, col : col + len(t)] = t

    for r, s in enumerate(segments):
        prompt, head = list(s["prompt"]), list(s["head"])
        off = prefix_w - len(prompt) - len(head)
        put(r, off, prompt, False)
        put(r, off + len(prompt), head, True)
        col = prefix_w
        for i in range(n_seg):
            if i < len(s["steps"]):
                seg_mask[r, i] = True
                put(r, col, [latent_start_id], label_latent_start)
                put(r, col + 1, [latent_slot_id] * k, False)
                put(r, col + 1 + k, [latent_end_id], False)
                put(r, col + 2 + k, list(s["steps"][i]), True)
            col += seg_w[i]
        put(r, col, list(s["tail"]), True)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return LatentBatch(ids, mask, labels, position_ids, columns, seg_mask)


def packed_nll(
    logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor, normalizer: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token NLL over the *real* tokens of each row (padding inside the sequence is skipped).

    Real positions (mask 1) are moved to the front of each row in order, then :func:`zoo.losses.masked_nll`
    applies: position ``t`` predicts the next real token. Without interior padding this equals
    ``masked_nll(logits, labels)``.

    Args:
        logits: ``[B, T, V]``; labels, attention_mask: ``[B, T]``.

    Returns:
        ``(loss, num_tokens)``.
    """
    real = attention_mask.bool()
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)
    packed_logits = logits.gather(1, order[..., None].expand(-1, -1, logits.shape[-1]))
    packed_labels = labels.gather(1, order).masked_fill(~real.gather(1, order), IGNORE_INDEX)
    return masked_nll(packed_logits, packed_labels, None, normalizer)


# ----------------------------------------------------------------------------------------------------------------
# recurrent latent forward
# ----------------------------------------------------------------------------------------------------------------
FEEDBACK_MODES = ("raw", "embedding_rms", "projection")


class LatentFeedback(nn.Module):
    """``f`` of the latent recurrence ``E_{t+1} = [E_t; f(h_t)]``: what the last hidden state becomes as the next
    input embedding.

    Modes: ``raw`` -- ``f(h) = h`` (the paper's formula, Coconut); ``embedding_rms`` -- ``f(h) = h * rms(E) /
    rms(h)`` per vector, with ``rms(E)`` the RMS of the input-embedding matrix (no parameters; the fed-back vector
    has the scale of a token embedding); ``projection`` -- a learned ``H x H`` linear map (initialised to the
    identity) followed by the same rescaling. [reconstruction] The paper feeds ``h_t`` unchanged; after the final
    norm ``h_t`` has RMS ~ 1 against ~ 0.02 for token embeddings, which makes the K latents of a segment nearly
    identical (the fed vector dominates every input), hence the rescaling default of the zoo's configs.

    Shapes: ``h [..., H]`` -> ``[..., H]``.
    """

    def __init__(self, mode: str = "embedding_rms", hidden_size: int | None = None) -> None:
        super().__init__()
        if mode not in FEEDBACK_MODES:
            raise ValueError(f"latent feedback mode must be one of {FEEDBACK_MODES}, got {mode!r}")
        if mode == "projection" and not hidden_size:
            raise ValueError("latent feedback 'projection' needs hidden_size")
        self.mode = mode
        self.proj = None
        if mode == "projection":
            self.proj = nn.Linear(int(hidden_size), int(hidden_size), bias=False)
            nn.init.eye_(self.proj.weight)

    def forward(self, h: torch.Tensor, embedding: nn.Module) -> torch.Tensor:
        if self.mode == "raw":
            return h
        if self.proj is not None:
            h = self.proj(h.to(self.proj.weight.dtype))
        target = embedding.weight.detach().float().square().mean().sqrt()
        rms = h.float().square().mean(-1, keepdim=True).clamp_min(1e-12).sqrt()
        return (h.float() * (target / rms)).to(h.dtype)


def step_row_targets(teacher_feats: torch.Tensor, rows: torch.Tensor, grid: int) -> torch.Tensor:
    """Per-step alignment targets: the teacher features of the image row each step looks up.

    Args:
        teacher_feats: ``[B, P, D]`` patch features in row-major order of a ``grid x grid`` patch grid (``P =
            grid^2``).
        rows: ``[B, N]`` row index looked up by step ``i`` (``-1`` for padding steps; their targets are zeros and
            must be masked out of the loss).
        grid: patches per row.

    Returns:
        ``[B, N, grid, D]``: step ``i``'s target is its row's ``grid`` patches, so with ``K = grid`` latent ``k``
        aligns to patch ``k`` of that row (no upsampling across rows).
    """
    b, p, d = teacher_feats.shape
    if grid * grid != p:
        raise ValueError(f"per-step targets need a square patch grid: P={p} is not {grid}^2")
    per_row = teacher_feats.reshape(b, grid, grid, d)
    index = rows.clamp(min=0).to(teacher_feats.device)
    picked = per_row[torch.arange(b, device=teacher_feats.device)[:, None], index]  # [B, N, grid, D]
    return picked * (rows >= 0).to(picked.device, picked.dtype)[..., None, None]


@dataclass
class LatentForwardOutput:
    """Output of :func:`latent_forward`.

    Attributes:
        logits: ``[B, T, V]``.
        latent_states: ``[B, N, K, H]`` hidden states of ``hidden_layer`` at the latent positions (None when
            no layer was asked for).
        latent_inputs: ``[B, N, K, H]`` the vectors fed at the latent positions (= last hidden state of the
            previous position).
        last_hidden: ``[B, T, H]`` last-layer hidden states (post final norm).
        num_passes: forward calls made (``N*K + 1``).
    """

    logits: torch.Tensor
    latent_states: torch.Tensor | None
    latent_inputs: torch.Tensor
    last_hidden: torch.Tensor
    num_passes: int


def _forward(model: nn.Module, cache_kw: str, cache: object, **kwargs: object) -> object:
    return model(use_cache=True, output_hidden_states=True, return_dict=True, **{cache_kw: cache}, **kwargs)


def latent_forward(
    model: nn.Module,
    batch: LatentBatch,
    pixel_values: torch.Tensor | None = None,
    hidden_layer: int | None = None,
    feedback: LatentFeedback | None = None,
) -> LatentForwardOutput:
    """Teacher-forced forward of a latent-augmented batch with recurrent latent positions (E_{t+1} = [E_t; h_t]).

    The sequence is cut at every latent column; each chunk is run with the KV cache of the previous ones,
    and the first position of a chunk (a latent slot) receives the last hidden state of the position before
    it. Gradients flow through the fed-back states and the cache. Cost: ``N*K + 1`` forward calls over a
    total of ``T`` positions (each position is computed once).

    Args:
        model: a Hugging Face (vision-)language model taking ``input_ids``/``inputs_embeds``,
            ``pixel_values``, ``attention_mask``, ``position_ids`` and a cache.
        batch: from :func:`rewrite_with_latents`; the image placeholders must lie before the first latent.
        pixel_values: images of the batch (passed with the first chunk only).
        hidden_layer: index into ``hidden_states`` (0 = embeddings) whose latent states are returned.
        feedback: ``f`` of ``E_{t+1} = [E_t; f(h_t)]`` (:class:`LatentFeedback`); ``None`` feeds ``h_t`` unchanged.
    """
    cache_kw = cache_kwarg_name(model)
    embed = model.get_input_embeddings()
    cols = batch.latent_columns.reshape(-1).tolist()
    b, t = batch.input_ids.shape
    n, k = batch.num_segments, batch.num_latents
    bounds = [0, *cols, t] if cols else [0, t]
    cache = None
    logits_chunks, last_chunks, layer_chunks = [], [], []
    latent_inputs: list[torch.Tensor] = []
    previous_last: torch.Tensor | None = None
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]
        common = {"attention_mask": batch.attention_mask[:, :hi], "position_ids": batch.position_ids[:, lo:hi]}
        if j == 0:
            out = _forward(
                model, cache_kw, cache, input_ids=batch.input_ids[:, lo:hi], pixel_values=pixel_values, **common
            )
        else:
            seg = (j - 1) // k
            tokens = embed(batch.input_ids[:, lo:hi])
            back = previous_last if feedback is None else feedback(previous_last, embed)
            fed = torch.where(batch.segment_mask[:, seg, None], back, tokens[:, 0])
            latent_inputs.append(fed)
            out = _forward(model, cache_kw, cache, inputs_embeds=torch.cat([fed[:, None], tokens[:, 1:]], 1), **common)
        cache = getattr(out, cache_kw, None) or getattr(out, "past_key_values", None)
        hidden = out.hidden_states
        logits_chunks.append(out.logits)
        last_chunks.append(hidden[-1])
        if hidden_layer is not None:
            layer_chunks.append(hidden[hidden_layer])
        previous_last = hidden[-1][:, -1]
    last_hidden = torch.cat(last_chunks, 1)
    width = last_hidden.shape[-1]
    col_index = batch.latent_columns.reshape(-1).to(last_hidden.device)
    latent_states = None
    if hidden_layer is not None:
        layer = torch.cat(layer_chunks, 1)
        latent_states = layer[:, col_index].reshape(b, n, k, layer.shape[-1])
    stacked = torch.stack(latent_inputs, 1) if latent_inputs else last_hidden.new_zeros(b, 0, width)
    return LatentForwardOutput(
        logits=torch.cat(logits_chunks, 1),
        latent_states=latent_states,
        latent_inputs=stacked.reshape(b, n, k, width),
        last_hidden=last_hidden,
        num_passes=len(bounds) - 1,
    )


# ----------------------------------------------------------------------------------------------------------------
# alignment loss
# ----------------------------------------------------------------------------------------------------------------
def upsample_latents(x: torch.Tensor, num_patches: int, mode: str = "nearest") -> torch.Tensor:
    """Upsample ``[..., K, H]`` latent states to ``[..., P, H]`` (paper: "upsample K -> P").

    Modes: ``nearest`` -- 2-D nearest neighbour when K and P are perfect squares (a sqrt(K) x sqrt(K) grid
    of latents becomes sqrt(P) x sqrt(P) patch blocks, e.g. 4x4 -> 8x8), else 1-D nearest; ``nearest1d``;
    ``linear`` (1-D, align_corners=False). ``P == K`` is the identity in every mode.
    """
    k, h = x.shape[-2], x.shape[-1]
    if k == num_patches:
        return x
    lead = x.shape[:-2]
    flat = x.reshape(-1, k, h).transpose(1, 2)  # [M, H, K]
    sk, sp = math.isqrt(k), math.isqrt(num_patches)
    if mode == "nearest" and sk * sk == k and sp * sp == num_patches:
        grid = flat.reshape(-1, h, sk, sk)
        out = F.interpolate(grid, size=(sp, sp), mode="nearest").reshape(-1, h, num_patches)
    elif mode in ("nearest", "nearest1d"):
        out = F.interpolate(flat, size=num_patches, mode="nearest")
    elif mode == "linear":
        out = F.interpolate(flat, size=num_patches, mode="linear", align_corners=False)
    else:
        raise ValueError(f"upsample mode must be nearest, nearest1d or linear, got {mode!r}")
    return out.transpose(1, 2).reshape(*lead, num_patches, h)


class AlignmentProjector(nn.Module):
    """psi: 2-layer MLP (SiLU) mapping LLM hidden states to the teacher's feature width (REPA's projector)."""

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden_dim), nn.SiLU(), nn.Linear(hidden_dim, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def valr_alignment_loss(
    latent_states: torch.Tensor,
    teacher_feats: torch.Tensor,
    projector: Callable[[torch.Tensor], torch.Tensor],
    upsample: str | Callable[[torch.Tensor, int], torch.Tensor] = "nearest",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_REPA = -(1/(N P)) sum_{i,p} cos(psi(up(F^{(i)}))[p], phi(I^{(i)})[p]) (paper, alignment loss).

    Args:
        latent_states: ``[B, N, K, H]`` states of the chosen layer at the K latent positions of N steps.
        teacher_feats: ``[B, P, D]`` patch features of the (frozen) teacher, shared by all steps, or
            ``[B, N, P, D]`` one image per step.
        projector: psi, ``[..., H] -> [..., D]``.
        upsample: K -> P mode for :func:`upsample_latents`, or a callable ``(x [..., K, H], P) -> [..., P, H]``.
        mask: ``[B, N]`` which steps exist (padding steps are excluded from the mean).

    Returns:
        Scalar in ``[-1, 1]``; ``-1`` when the projected states equal the targets (up to positive scale).
    """
    b, n = latent_states.shape[:2]
    p = teacher_feats.shape[-2]
    up = upsample(latent_states, p) if callable(upsample) else upsample_latents(latent_states, p, upsample)
    projected = projector(up)  # [B, N, P, D]
    target = teacher_feats if teacher_feats.dim() == 4 else teacher_feats[:, None].expand(b, n, -1, -1)
    cos = F.cosine_similarity(projected.float(), target.float(), dim=-1).mean(-1)  # [B, N]
    if mask is None:
        return -cos.mean()
    weights = mask.to(cos.dtype)
    return -(cos * weights).sum() / weights.sum().clamp(min=1.0)


# ----------------------------------------------------------------------------------------------------------------
# inference
# ----------------------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class LatentGenerationResult(GenerationResult):
    """Output of :class:`LatentDecoder`: the :class:`~zoo.protocols.GenerationResult` fields
    (``completion_ids`` show latent slots as the slot id; ``logprobs`` are 0 on forced tokens: slots and
    ``</latent>``) plus:

    Attributes:
        num_latent_segments: ``[B]`` latent segments per row.
        latent_states: per row a list of ``[K, H]`` tensors of ``hidden_layer`` (``None`` unless asked).
    """

    num_latent_segments: torch.Tensor
    latent_states: list[list[torch.Tensor]] | None = None


class LatentDecoder(Decoder):
    """Decoding with latent segments: after the model emits ``<latent>``, K steps feed back the last hidden state
    (E_{t+1} = [E_t; h_t]); then ``</latent>`` is forced and language mode resumes. One position per row per
    step with the KV cache; the teacher is not involved.

    In language mode the next token is chosen like every decoder's (logits processors, then greedy or sampled
    with ``params``); ``</latent>`` and the slot token are never chosen freely, and ``<latent>`` is masked once a
    row has ``max_segments`` segments. ``num_latents=0`` is plain decoding with the latent tokens banned.
    Extra prefill inputs (``pixel_values``) pass through the call.

    Args:
        num_latents: K latent positions per segment.
        max_segments: cap of latent segments per row.
        hidden_layer: ``hidden_states`` index whose latent states are returned (``None``: not recorded).
        processors, hooks: as :class:`~zoo.generation.decoders.Decoder`.
        feedback: ``f`` of the recurrence (:class:`LatentFeedback`, the one the model was trained with); ``None``
            feeds the last hidden state unchanged.
    """

    def __init__(
        self,
        num_latents: int,
        max_segments: int = 8,
        hidden_layer: int | None = None,
        processors: Iterable[LogitsProcessor] = (),
        hooks: Iterable[ForwardHook] = (),
        feedback: LatentFeedback | None = None,
    ) -> None:
        super().__init__(processors, hooks)
        self.feedback = feedback
        if num_latents < 0 or max_segments < 0:
            raise ValueError(f"num_latents and max_segments must be >= 0, got {num_latents}, {max_segments}")
        self.num_latents = num_latents
        self.max_segments = max_segments
        self.hidden_layer = hidden_layer

    def recording(self, hidden_layer: int | None) -> LatentDecoder:
        """This decoder (same processor and hook lists) returning the latent states of ``hidden_layer``."""
        other = copy.copy(self)
        other.hidden_layer = hidden_layer
        return other

    def decode(
        self,
        model: nn.Module,
        tokenizer: Any,
        prefill: Prefill,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> LatentGenerationResult:
        vocab = tokenizer.get_vocab()
        start_id, end_id, slot_id = (vocab.get(t) for t in LATENT_TOKENS)
        k, b, device = self.num_latents, prefill.batch_size, prefill.device
        if k > 0 and None in (start_id, end_id, slot_id):
            raise ValueError(f"latent decoding needs the tokens {LATENT_TOKENS} in the tokenizer")
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        embed = model.get_input_embeddings()
        state = prefill.start(model, output_hidden_states=True)
        context = prefill.prompt_ids
        remaining = torch.zeros(b, dtype=torch.long, device=device)  # latent steps left in the current segment
        force_end = torch.zeros(b, dtype=torch.bool, device=device)
        segments = torch.zeros(b, dtype=torch.long, device=device)
        done = torch.zeros(b, dtype=torch.bool, device=device)
        ids, lps, masks = [], [], []
        states: list[list[torch.Tensor]] | None = [[] for _ in range(b)] if self.hidden_layer is not None else None
        current: list[list[torch.Tensor]] = [[] for _ in range(b)]
        for _ in range(params.max_new_tokens):
            in_latent = remaining > 0
            logits = state.next_logits.clone()
            if k > 0:
                logits[:, end_id] = float("-inf")
                logits[segments >= self.max_segments, start_id] = float("-inf")
            if slot_id is not None:
                logits[:, slot_id] = float("-inf")
            token, logprob = self.next_tokens(logits, context, params, generator)
            forced = force_end | in_latent | done
            if k > 0:
                token = torch.where(force_end, torch.full_like(token, end_id), token)
                token = torch.where(in_latent, torch.full_like(token, slot_id), token)
            token = torch.where(done, torch.full_like(token, pad), token)
            ids.append(token)
            lps.append(torch.where(forced, torch.zeros_like(logprob), logprob))
            masks.append((~done).long())
            if self.processors:
                context = torch.cat([context, token[:, None]], dim=1)
            # state transitions (a segment: <latent>, K slots fed back from hidden states, forced </latent>)
            was_end = force_end.clone()
            if k > 0:
                force_end = in_latent & (remaining == 1)
                remaining = torch.where(in_latent, remaining - 1, remaining)
                started = (token == start_id) & ~done
                remaining = torch.where(started, torch.full_like(remaining, k), remaining)
                segments = segments + started.long()
            new_done = done | ((token == eos) & ~in_latent)
            if bool(new_done.all()):
                done = new_done
                break
            back = state.hidden_states[-1] if self.feedback is None else self.feedback(state.hidden_states[-1], embed)
            vec = torch.where(in_latent[:, None], back, embed(token))
            state.feed(embeds=vec[:, None], mask=(~done).long()[:, None])
            if states is not None:
                layer = state.hidden_states[self.hidden_layer]
                for r in in_latent.nonzero().flatten().tolist():
                    current[r].append(layer[r])
                for r in (force_end & ~was_end).nonzero().flatten().tolist():
                    states[r].append(torch.stack(current[r]))
                    current[r] = []
            done = new_done
        completion = torch.stack(ids, 1)
        return LatentGenerationResult(
            prompt_ids=prefill.prompt_ids,
            completion_ids=completion,
            completion_mask=torch.stack(masks, 1),
            logprobs=torch.stack(lps, 1),
            texts=decode_completions(tokenizer, completion.tolist()),
            finished=done,
            num_latent_segments=segments,
            latent_states=states,
        )


__all__ = [
    "FEEDBACK_MODES",
    "AlignmentProjector",
    "LatentFeedback",
    "LatentBatch",
    "LatentForwardOutput",
    "LatentDecoder",
    "LatentGenerationResult",
    "latent_forward",
    "packed_nll",
    "rewrite_with_latents",
    "step_row_targets",
    "upsample_latents",
    "valr_alignment_loss",
]
