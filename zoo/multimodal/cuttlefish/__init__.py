"""Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning (arXiv 2602.02780, ICML 2026).

Official code: zihao-jing/Cuttlefish (internal names "Octopus"/"EntroAdap"). An all-atom structure is encoded by an
EGNN (:mod:`zoo.multimodal.structure_encoder`); an instruction-conditioned gate picks ``k_g`` anchor atoms, with
``k_g`` growing with the structure's size and complexity (the smallest k whose anchor probabilities reach mass
``rho``); atoms are softly assigned to anchors and pooled into patch tokens; a Geometry Grounding Adapter refines them
with attention to all atoms and projects them to the LLM width; they are inserted at the ``<structure>`` placeholder.

Equation -> function (numbering of ``research/multimodal_quant_data.md`` section 4(a), labelled here):

- (P1) instruction vector ``z = Linear(LN(mean of prompt input embeddings))``
  -> :func:`instruction_embedding`, :class:`~zoo.multimodal.cuttlefish.patching.InstructionProjector`
- (P2) anchor logits ``l = MLP([x_i; z])``, ``p = softmax(l)`` per structure
  -> :class:`~zoo.multimodal.cuttlefish.patching.AnchorGate`
- (P3) ``k_g = min{k : sum_{j<=k} p_(j) >= rho}``, clipped to ``[1, k_max]`` -> :func:`num_patches`,
  :func:`num_patches_batched`
- (P4) ``W_ia = softmax_a((-beta ||P_i - P_a||^2 + l_a) / tau)`` -> :meth:`ScalingAwarePatching.forward`
- (P5) ``t_a = sum_i W_ia x_i / sum_i W_ia`` (optional top-r truncation) -> :meth:`ScalingAwarePatching.forward`
- gate diagnostics/controls (not in the paper): :func:`gate_entropy`, :func:`patch_count_stats`, ``gate="uniform"``
- (G1-G3) fusion block: self-attn over patches, cross-attn to atoms, FFN (pre-LN)
  -> :class:`~zoo.multimodal.cuttlefish.adapter.FusionBlock`
- (G4) projection to the LLM width -> :class:`GeometryGroundingAdapter`
- (I1) insertion after the placeholder, mask 1, labels -100 -> :func:`insert_structure_tokens`
- encoder pretraining (masked type + distance bins)
  -> :func:`zoo.multimodal.structure_encoder.structure_pretraining_loss`

Paper vs code: the paper's (P4) has no ``beta``/``tau``; the code uses ``beta = 1``, ``tau = 0.1``. Defaults here
are the paper's (``tau = 1``), the code value is one argument away. ``rho = 0.1`` and ``k_max = 256`` are the code
defaults. Baselines with the same interface: :class:`QueryConnector` (fixed k learned queries) and
:class:`MeanPoolConnector`.
"""

from zoo.multimodal.cuttlefish.adapter import (
    ConnectorOutput,
    CuttlefishConnector,
    FusionBlock,
    GeometryGroundingAdapter,
)
from zoo.multimodal.cuttlefish.connectors import MeanPoolConnector, QueryConnector
from zoo.multimodal.cuttlefish.insertion import (
    IGNORE_INDEX,
    InsertedInputs,
    insert_structure_tokens,
    instruction_embedding,
)
from zoo.multimodal.cuttlefish.patching import (
    AnchorGate,
    InstructionProjector,
    PatchOutput,
    ScalingAwarePatching,
    gate_entropy,
    masked_softmax,
    num_patches,
    num_patches_batched,
    patch_count_stats,
)

__all__ = [
    "IGNORE_INDEX",
    "AnchorGate",
    "ConnectorOutput",
    "CuttlefishConnector",
    "FusionBlock",
    "GeometryGroundingAdapter",
    "InsertedInputs",
    "InstructionProjector",
    "MeanPoolConnector",
    "PatchOutput",
    "QueryConnector",
    "ScalingAwarePatching",
    "insert_structure_tokens",
    "gate_entropy",
    "instruction_embedding",
    "masked_softmax",
    "num_patches",
    "num_patches_batched",
    "patch_count_stats",
]
