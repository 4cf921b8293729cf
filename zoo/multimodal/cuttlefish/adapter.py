"""Geometry Grounding Adapter and the full Cuttlefish connector (patching + fusion + projection).

Equations (notes 4(a); numbering (G1)-(G4) here):

- (G1) ``q <- q + SelfAttn(LN(q))`` over patch tokens                     -> :class:`FusionBlock`
- (G2) ``q <- q + CrossAttn(LN(q), LN(H))`` to all atom embeddings ``H``   -> :class:`FusionBlock`
- (G3) ``q <- q + FFN(LN(q))``                                             -> :class:`FusionBlock`
- (G4) ``tokens = Linear(LN(q))`` to the LLM width                         -> :class:`GeometryGroundingAdapter`

Every connector has the same interface::

    connector(node_emb [B, N, D], pos [B, N, 3], atom_mask [B, N], instruction [B, H] | None) -> ConnectorOutput

with ``tokens [B, K, H_llm]`` (zero at padding), ``token_mask [B, K]`` (True for the first ``num_tokens[b]``
tokens) and ``num_tokens [B]``. Baselines with this interface live in
:mod:`zoo.multimodal.cuttlefish.connectors`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from zoo.errors import ConfigError
from zoo.multimodal.cuttlefish.patching import PatchOutput, ScalingAwarePatching


@dataclass
class ConnectorOutput:
    """``tokens [B, K, H]``, ``token_mask [B, K]``, ``num_tokens [B]``; ``patches`` only for Cuttlefish."""

    tokens: Tensor
    token_mask: Tensor
    num_tokens: Tensor
    patches: PatchOutput | None = None


def _check_heads(dim: int, heads: int) -> None:
    if heads < 1 or dim % heads:
        raise ConfigError(f"num_heads={heads} must divide the fusion width {dim}")


class FusionBlock(nn.Module):
    """Pre-LN fusion block, eqs. (G1)-(G3): ``q [B, K, F]``, ``q_mask [B, K]``, ``kv [B, N, F]``, ``kv_mask [B, N]``."""

    def __init__(self, dim: int, num_heads: int, ffn_mult: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        _check_heads(dim, num_heads)
        self.norm_self = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm_q = nn.LayerNorm(dim)
        self.norm_kv = nn.LayerNorm(dim)
        self.cross_attn = nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True)
        self.norm_ffn = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(
            nn.Linear(dim, ffn_mult * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_mult * dim, dim)
        )

    def forward(self, q: Tensor, q_mask: Tensor, kv: Tensor, kv_mask: Tensor) -> Tensor:
        h = self.norm_self(q)
        q = q + self.self_attn(h, h, h, key_padding_mask=~q_mask, need_weights=False)[0]
        kvn = self.norm_kv(kv)
        q = q + self.cross_attn(self.norm_q(q), kvn, kvn, key_padding_mask=~kv_mask, need_weights=False)[0]
        return q + self.ffn(self.norm_ffn(q))


class GeometryGroundingAdapter(nn.Module):
    """``num_blocks`` fusion blocks then the projection to the LLM width (eqs. G1-G4).

    Args:
        node_dim: encoder width (patch tokens and atom embeddings).
        llm_dim: LLM embedding width.
        fusion_dim: width inside the blocks; ``None`` = ``llm_dim`` (official code default; tiny demos should set
            it to ``node_dim``).
        num_blocks: fusion blocks (code default 4; paper 8 at 8B). 0 = projection only ("patching without GGA").
        num_heads: attention heads (code default 8; paper 32 at 8B).
    """

    def __init__(
        self,
        node_dim: int,
        llm_dim: int,
        fusion_dim: int | None = None,
        num_blocks: int = 4,
        num_heads: int = 8,
        ffn_mult: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        fusion_dim = fusion_dim or llm_dim
        self.in_proj = nn.Identity() if fusion_dim == node_dim else nn.Linear(node_dim, fusion_dim)
        self.kv_proj = nn.Identity() if fusion_dim == node_dim else nn.Linear(node_dim, fusion_dim)
        self.blocks = nn.ModuleList(FusionBlock(fusion_dim, num_heads, ffn_mult, dropout) for _ in range(num_blocks))
        self.out_norm = nn.LayerNorm(fusion_dim)
        self.out_proj = nn.Linear(fusion_dim, llm_dim)

    def forward(self, patches: Tensor, patch_mask: Tensor, node_emb: Tensor, atom_mask: Tensor) -> Tensor:
        """``patches [B, K, D]``, ``patch_mask [B, K]``, ``node_emb [B, N, D]``, ``atom_mask [B, N]`` -> ``[B, K, H]``.

        Eqs. (G1)-(G4); padded patches are zero in the output.
        """
        q = self.in_proj(patches)
        if self.blocks:
            kv = self.kv_proj(node_emb)
            for block in self.blocks:
                q = block(q, patch_mask, kv, atom_mask)
        return self.out_proj(self.out_norm(q)) * patch_mask[..., None]


class CuttlefishConnector(nn.Module):
    """Scaling-Aware Patching followed by the Geometry Grounding Adapter (the full Cuttlefish connector).

    Patching arguments (``rho``, ``k_max``, ``beta``, ``tau``, ``r_max``, ``use_anchor_bias``,
    ``prob_straight_through``, ``gate``) are those of :class:`ScalingAwarePatching`; fusion arguments those of
    :class:`GeometryGroundingAdapter`. ``instr_dim`` defaults to ``llm_dim`` (the instruction vector is a mean of
    LLM input embeddings, :func:`zoo.multimodal.cuttlefish.instruction_embedding`); pass 0 to disable conditioning.
    """

    def __init__(
        self,
        node_dim: int,
        llm_dim: int,
        *,
        instr_dim: int | None = None,
        rho: float = 0.1,
        k_max: int = 256,
        beta: float = 1.0,
        tau: float = 1.0,
        r_max: int | None = None,
        use_anchor_bias: bool = True,
        prob_straight_through: bool = True,
        gate_hidden: int | None = None,
        gate: str = "learned",
        fusion_dim: int | None = None,
        num_fusion_blocks: int = 4,
        num_heads: int = 8,
        ffn_mult: int = 4,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.patching = ScalingAwarePatching(
            node_dim,
            llm_dim if instr_dim is None else instr_dim,
            rho=rho,
            k_max=k_max,
            beta=beta,
            tau=tau,
            r_max=r_max,
            use_anchor_bias=use_anchor_bias,
            prob_straight_through=prob_straight_through,
            gate_hidden=gate_hidden,
            gate=gate,
        )
        self.adapter = GeometryGroundingAdapter(
            node_dim, llm_dim, fusion_dim, num_fusion_blocks, num_heads, ffn_mult, dropout
        )

    def forward(
        self, node_emb: Tensor, pos: Tensor, atom_mask: Tensor, instruction: Tensor | None = None
    ) -> ConnectorOutput:
        patches = self.patching(node_emb, pos, atom_mask, instruction)
        tokens = self.adapter(patches.tokens, patches.patch_mask, node_emb, atom_mask)
        return ConnectorOutput(tokens, patches.patch_mask, patches.num_patches, patches)
