"""Fixed-budget baseline connectors with the Cuttlefish interface (notes 4(d) arms, 5 "Connectors").

- :class:`QueryConnector`: Q-Former / Perceiver-resampler style, ``k`` learned queries (BLIP-2, arXiv 2301.12597)
- :class:`MeanPoolConnector`: one token, masked mean then a LLaVA-1.5-style 2-layer GELU MLP (arXiv 2310.03744)

Interface (same as :class:`~zoo.multimodal.cuttlefish.adapter.CuttlefishConnector`)::

    connector(node_emb [B, N, D], pos [B, N, 3], atom_mask [B, N], instruction [B, H] | None) -> ConnectorOutput
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zoo.errors import ConfigError
from zoo.multimodal.cuttlefish.adapter import ConnectorOutput, GeometryGroundingAdapter


class QueryConnector(nn.Module):
    """Fixed-length baseline: ``num_queries`` learned queries through fusion blocks (self-attn among queries,
    cross-attn to all atoms, FFN), then a projection; always ``num_queries`` tokens (BLIP-2 Q-Former style)."""

    def __init__(
        self,
        node_dim: int,
        llm_dim: int,
        *,
        num_queries: int = 8,
        fusion_dim: int | None = None,
        num_blocks: int = 2,
        num_heads: int = 8,
        ffn_mult: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_queries < 1:
            raise ConfigError(f"num_queries must be >= 1, got {num_queries}")
        fusion_dim = fusion_dim or llm_dim
        self.queries = nn.Parameter(torch.randn(num_queries, fusion_dim) * 0.02)
        self.adapter = GeometryGroundingAdapter(node_dim, llm_dim, fusion_dim, num_blocks, num_heads, ffn_mult, dropout)
        self.adapter.in_proj = nn.Identity()  # queries already live in the fusion width

    def forward(
        self, node_emb: Tensor, pos: Tensor, atom_mask: Tensor, instruction: Tensor | None = None
    ) -> ConnectorOutput:
        bsz, k = node_emb.shape[0], self.queries.shape[0]
        q = self.queries.to(node_emb.dtype)[None].expand(bsz, -1, -1)
        mask = torch.ones(bsz, k, dtype=torch.bool, device=node_emb.device)
        tokens = self.adapter(q, mask, node_emb, atom_mask)
        return ConnectorOutput(tokens, mask, torch.full((bsz,), k, dtype=torch.long, device=node_emb.device))


class MeanPoolConnector(nn.Module):
    """One-token baseline: masked mean of atom embeddings, then a 2-layer GELU MLP to the LLM width."""

    def __init__(self, node_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(node_dim, llm_dim), nn.GELU(), nn.Linear(llm_dim, llm_dim))

    def forward(
        self, node_emb: Tensor, pos: Tensor, atom_mask: Tensor, instruction: Tensor | None = None
    ) -> ConnectorOutput:
        m = atom_mask[..., None].to(node_emb.dtype)
        pooled = (node_emb * m).sum(1) / m.sum(1).clamp_min(1.0)
        bsz = node_emb.shape[0]
        ones = torch.ones(bsz, 1, dtype=torch.bool, device=node_emb.device)
        return ConnectorOutput(
            self.mlp(pooled)[:, None], ones, torch.ones(bsz, dtype=torch.long, device=node_emb.device)
        )
