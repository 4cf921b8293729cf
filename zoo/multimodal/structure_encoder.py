"""All-atom structure encoder: an E(n)-equivariant graph network (EGNN) in plain torch, plus its pretraining loss.

Paper: "Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning", arXiv 2602.02780, section 4(a) of
``research/multimodal_quant_data.md`` (encoder: EGNN, hidden 256, 8 layers, 32 RBF to 10 Å, coordinate updates,
LayerNorm; pretraining: masked element type + masked-edge distance bins (64 bins, 0-20 Å) + coordinate noise,
weights 1/1/1). The layer is Satorras et al., "E(n) Equivariant Graph Neural Networks" (arXiv 2102.09844), eqs. 3-6.

Equation -> function:

- EGNN eq. 3 (message m_ij = phi_e(h_i, h_j, RBF(||x_i - x_j||))) -> :meth:`EGNNLayer.forward`
- EGNN eq. 4 (coordinate update x_i += C sum_j (x_i - x_j) phi_x(m_ij)) -> :meth:`EGNNLayer.forward`
- EGNN eqs. 5-6 (aggregation and node update) -> :meth:`EGNNLayer.forward`
- Cuttlefish encoder pretraining (masked type + distance-bin CE) -> :func:`structure_pretraining_loss`

Node embeddings depend on coordinates only through pairwise distances, so they are E(3)-invariant (rotations,
reflections, translations); updated coordinates are E(3)-equivariant. Inputs use the concatenated batch format of
:func:`zoo.data.structures.collate_structures`; :func:`to_dense_batch` converts to padded tensors plus a mask.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.errors import ConfigError


def to_dense_batch(x: Tensor, batch: Tensor, num_graphs: int | None = None, fill: float = 0.0) -> tuple[Tensor, Tensor]:
    """Concatenated ``x [A, ...]`` with graph index ``batch [A]`` -> ``(dense [B, N_max, ...], mask [B, N_max])``.

    Atom order inside each graph is kept. ``batch`` need not be sorted.
    """
    if batch.numel() == 0:
        raise ValueError("to_dense_batch got no atoms")
    num_graphs = int(batch.max()) + 1 if num_graphs is None else num_graphs
    counts = torch.bincount(batch, minlength=num_graphs)
    n_max = int(counts.max())
    order = torch.argsort(batch, stable=True)
    sorted_batch = batch[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(batch.numel(), device=batch.device) - starts[sorted_batch]
    dense = x.new_full((num_graphs, n_max, *x.shape[1:]), fill)
    dense[sorted_batch, slot] = x[order]
    mask = torch.zeros(num_graphs, n_max, dtype=torch.bool, device=batch.device)
    mask[sorted_batch, slot] = True
    return dense, mask


class GaussianRBF(nn.Module):
    """``num_rbf`` Gaussians on ``[0, cutoff]`` times a cosine envelope (zero beyond ``cutoff``): ``[E] -> [E, R]``."""

    def __init__(self, num_rbf: int = 32, cutoff: float = 10.0) -> None:
        super().__init__()
        self.cutoff = cutoff
        self.register_buffer("centers", torch.linspace(0.0, cutoff, num_rbf), persistent=False)
        self.gamma = (num_rbf / cutoff) ** 2

    def forward(self, d: Tensor) -> Tensor:
        env = 0.5 * (torch.cos(torch.pi * d.clamp(max=self.cutoff) / self.cutoff) + 1.0)
        return torch.exp(-self.gamma * (d[:, None] - self.centers.to(d.dtype)) ** 2) * env[:, None]


class EGNNLayer(nn.Module):
    """One EGNN layer (EGNN eqs. 3-6) with mean aggregation, bounded coordinate steps and a post-LayerNorm.

    Shapes: ``h [A, D]``, ``pos [A, 3]``, ``edge_index [2, E]`` (messages flow ``edge_index[0] -> edge_index[1]``).
    """

    def __init__(self, hidden: int, num_rbf: int, update_coords: bool = True) -> None:
        super().__init__()
        self.update_coords = update_coords
        self.edge_mlp = nn.Sequential(
            nn.Linear(2 * hidden + num_rbf, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU()
        )
        self.node_mlp = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.norm = nn.LayerNorm(hidden)
        if update_coords:
            last = nn.Linear(hidden, 1, bias=False)
            nn.init.xavier_uniform_(last.weight, gain=0.01)
            self.coord_mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), last)

    def forward(self, h: Tensor, pos: Tensor, edge_index: Tensor, rbf: GaussianRBF) -> tuple[Tensor, Tensor]:
        src, dst = edge_index
        diff = pos[dst] - pos[src]
        dist = diff.norm(dim=-1)
        m = self.edge_mlp(torch.cat([h[dst], h[src], rbf(dist)], dim=-1))  # eq. 3
        deg = torch.zeros(h.shape[0], device=h.device, dtype=h.dtype).index_add_(0, dst, torch.ones_like(dist))
        deg = deg.clamp(min=1.0)[:, None]
        agg = torch.zeros_like(h).index_add_(0, dst, m) / deg  # eq. 5
        if self.update_coords:  # eq. 4, step bounded by tanh and normalised direction
            step = diff / (dist[:, None] + 1.0) * torch.tanh(self.coord_mlp(m))
            pos = pos + torch.zeros_like(pos).index_add_(0, dst, step) / deg
        h = self.norm(h + self.node_mlp(torch.cat([h, agg], dim=-1)))  # eq. 6 (residual)
        return h, pos


class EGNNOutput(NamedTuple):
    node_emb: Tensor  # [A, D], E(3)-invariant
    pos: Tensor  # [A, 3], E(3)-equivariant (input positions if coordinate updates are off)


class StructureEncoder(nn.Module):
    """EGNN over element types and radius-graph distances.

    Args:
        num_types: number of element types; index ``num_types`` is the ``[MASK]`` type used in pretraining.
        hidden: embedding width (paper 256).
        num_layers: EGNN layers (paper 8).
        num_rbf, rbf_cutoff: distance features (paper 32 Gaussians to 10 Å).
        update_coords: EGNN coordinate updates (paper: on).
    """

    def __init__(
        self,
        num_types: int = 5,
        hidden: int = 256,
        num_layers: int = 8,
        num_rbf: int = 32,
        rbf_cutoff: float = 10.0,
        update_coords: bool = True,
    ) -> None:
        super().__init__()
        if num_types < 1 or hidden < 1 or num_layers < 0:
            raise ConfigError(
                f"bad StructureEncoder sizes: num_types={num_types}, hidden={hidden}, layers={num_layers}"
            )
        self.num_types = num_types
        self.mask_type = num_types
        self.hidden = hidden
        self.embed = nn.Embedding(num_types + 1, hidden)
        self.rbf = GaussianRBF(num_rbf, rbf_cutoff)
        self.layers = nn.ModuleList(EGNNLayer(hidden, num_rbf, update_coords) for _ in range(num_layers))

    def forward(self, atom_types: Tensor, pos: Tensor, edge_index: Tensor) -> EGNNOutput:
        """``atom_types [A]``, ``pos [A, 3]``, ``edge_index [2, E]`` -> :class:`EGNNOutput`."""
        h = self.embed(atom_types)
        pos = pos.to(h.dtype)
        for layer in self.layers:
            h, pos = layer(h, pos, edge_index, self.rbf)
        return EGNNOutput(h, pos)


def distance_to_bin(dist: Tensor, num_bins: int = 64, dist_max: float = 20.0) -> Tensor:
    """Distance in Å -> bin index on ``num_bins`` equal bins over ``[0, dist_max]`` (overflow in the last bin)."""
    return (dist / dist_max * num_bins).floor().long().clamp(0, num_bins - 1)


class StructurePretrainHeads(nn.Module):
    """Heads of the masked reconstruction objective: element type per atom, distance bin per held-out edge."""

    def __init__(self, hidden: int, num_types: int = 5, num_dist_bins: int = 64) -> None:
        super().__init__()
        self.type_head = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, num_types))
        self.dist_head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, num_dist_bins))
        self.num_dist_bins = num_dist_bins

    def edge_logits(self, h: Tensor, edge_index: Tensor) -> Tensor:
        """Symmetric in the two endpoints: ``[E, num_dist_bins]``."""
        hi, hj = h[edge_index[0]], h[edge_index[1]]
        return self.dist_head(torch.cat([hi + hj, hi * hj], dim=-1))


def _undirected_hold_out(edge_index: Tensor, num_atoms: int, prob: float, generator: torch.Generator | None) -> Tensor:
    """Boolean ``[E]``: both directions of an undirected pair are held out together."""
    lo = torch.minimum(edge_index[0], edge_index[1])
    hi = torch.maximum(edge_index[0], edge_index[1])
    keys, inverse = torch.unique(lo * num_atoms + hi, return_inverse=True)
    chosen = torch.rand(keys.shape[0], generator=generator, device=edge_index.device) < prob
    if not chosen.any():
        chosen[torch.randint(keys.shape[0], (1,), generator=generator, device=edge_index.device)] = True
    return chosen[inverse]


def structure_pretraining_loss(
    encoder: StructureEncoder,
    heads: StructurePretrainHeads,
    atom_types: Tensor,
    pos: Tensor,
    edge_index: Tensor,
    *,
    atom_mask_prob: float = 0.15,
    edge_mask_prob: float = 0.15,
    dist_max: float = 20.0,
    type_weight: float = 1.0,
    dist_weight: float = 1.0,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Masked reconstruction loss of the Cuttlefish encoder pretraining (notes 4(a), type and distance terms).

    ``L = type_weight * CE(type_head(h_i), type_i | i masked) + dist_weight * CE(dist_head(h_i, h_j), bin(d_ij) | ij
    held out)``. Masked atoms get the ``[MASK]`` type; held-out edges (both directions) are removed from the message
    graph, otherwise their distance would be an input feature and the target trivial. At least one atom and one
    edge (if any) are masked. Returns ``loss``, ``type_loss``, ``dist_loss``, ``type_acc``, ``dist_acc``.
    """
    if not 0.0 < atom_mask_prob <= 1.0 or not 0.0 <= edge_mask_prob < 1.0:
        raise ConfigError(
            f"need 0 < atom_mask_prob <= 1 and 0 <= edge_mask_prob < 1, got {atom_mask_prob}, {edge_mask_prob}"
        )
    n = atom_types.shape[0]
    atom_mask = torch.rand(n, generator=generator, device=atom_types.device) < atom_mask_prob
    if not atom_mask.any():
        atom_mask[torch.randint(n, (1,), generator=generator, device=atom_types.device)] = True
    types_in = torch.where(atom_mask, torch.full_like(atom_types, encoder.mask_type), atom_types)
    if edge_index.shape[1] > 0 and edge_mask_prob > 0:
        held = _undirected_hold_out(edge_index, n, edge_mask_prob, generator)
    else:
        held = torch.zeros(edge_index.shape[1], dtype=torch.bool, device=edge_index.device)
    out = encoder(types_in, pos, edge_index[:, ~held])
    type_logits = heads.type_head(out.node_emb[atom_mask])
    type_loss = F.cross_entropy(type_logits, atom_types[atom_mask])
    type_acc = (type_logits.argmax(-1) == atom_types[atom_mask]).float().mean()
    zero = out.node_emb.sum() * 0.0
    if held.any():
        e = edge_index[:, held]
        target = distance_to_bin((pos[e[0]] - pos[e[1]]).norm(dim=-1), heads.num_dist_bins, dist_max)
        dist_logits = heads.edge_logits(out.node_emb, e)
        dist_loss = F.cross_entropy(dist_logits, target)
        dist_acc = (dist_logits.argmax(-1) == target).float().mean()
    else:
        dist_loss, dist_acc = zero, zero.detach()
    loss = type_weight * type_loss + dist_weight * dist_loss
    return {"loss": loss, "type_loss": type_loss, "dist_loss": dist_loss, "type_acc": type_acc, "dist_acc": dist_acc}


def encode_dense(
    encoder: StructureEncoder, atom_types: Tensor, pos: Tensor, edge_index: Tensor, batch: Tensor, num_graphs: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Encode a concatenated batch and return padded ``(node_emb [B, N, D], pos [B, N, 3], atom_mask [B, N])``.

    ``pos`` are the *input* coordinates (the ``P`` of the Cuttlefish assignment, notes 4(a)); only their pairwise
    distances are used downstream, so the result is E(3)-invariant.
    """
    out = encoder(atom_types, pos, edge_index)
    h, mask = to_dense_batch(out.node_emb, batch, num_graphs)
    p, _ = to_dense_batch(pos.to(out.node_emb.dtype), batch, num_graphs)
    return h, p, mask


class FeatureStandardizer(nn.Module):
    """Per-dimension standardization ``(h - mean) / std`` of atom embeddings (fixed buffers).

    A frozen pretrained encoder's atom embeddings can share a large common vector with small per-atom variation;
    a freshly initialised connector then sees almost constant inputs. Standardizing each dimension with statistics
    measured once on training structures (:func:`atom_feature_stats`) fixes that. With the default buffers
    (mean 0, std 1) it is the identity. Padding stays 0.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    def set_stats(self, mean: Tensor, std: Tensor) -> None:
        """Set the statistics (``[D]`` each)."""
        self.mean.copy_(mean)
        self.std.copy_(std)

    def forward(self, node_emb: Tensor, atom_mask: Tensor) -> Tensor:
        """``node_emb [B, N, D]``, ``atom_mask [B, N]`` -> standardized ``[B, N, D]`` (0 on padding)."""
        return ((node_emb - self.mean) / self.std) * atom_mask[..., None].to(node_emb.dtype)


@torch.no_grad()
def atom_feature_stats(
    encoder: StructureEncoder, batches: Iterable[tuple[Tensor, Tensor, Tensor, Tensor, int]], eps: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """Per-dimension mean and std (+ ``eps``) of the encoder's atom embeddings over all atoms of ``batches``.

    Each batch is ``(atom_types, pos, edge_index, batch_index, num_graphs)`` as in :func:`encode_dense`.
    """
    feats = []
    for atom_types, pos, edge_index, batch_index, num_graphs in batches:
        h, _, mask = encode_dense(encoder, atom_types, pos, edge_index, batch_index, num_graphs)
        feats.append(h[mask])
    h = torch.cat(feats)
    return h.mean(0), h.std(0) + eps
