"""RL post-training cores: rewards, reward shapers (GR3, ...), advantages, policy losses, aggregation.

Pure torch (no Lightning, no Hydra). The pipeline of one GRPO step, with the seam that owns each stage:

``rewards (zoo.rl.rewards) -> shaper (zoo.rl.shapers, GR3 in zoo.rl.gr3) -> advantage (zoo.rl.advantages)
-> per-token clipped loss (zoo.rl.losses) -> aggregation with a per-step normalizer (zoo.rl.losses)``.
Pairwise preference learning uses :func:`masked_dpo_loss` (``zoo.rl.losses``).
"""

from zoo.losses import IGNORE_INDEX, masked_mean, masked_token_entropy, masked_token_logprobs
from zoo.rl.advantages import (
    AdvantageEstimator,
    DrGRPOAdvantage,
    GRPOAdvantage,
    RLOOAdvantage,
    constant_groups,
    grpo_advantages,
    reward_group_stats,
    rloo_advantages,
    to_groups,
)
from zoo.rl.gr3 import (
    AlphaCalibration,
    calibrate_alpha,
    gr3_rescale,
    rlhf_sigmoid,
    satisfaction_rate,
    satisfied_groups,
)
from zoo.rl.losses import (
    AGGREGATION_ALIASES,
    AGGREGATION_MODES,
    ClippedPolicyLoss,
    LossAggregator,
    aggregate,
    clipped_policy_loss,
    compute_normalizer,
    k3_kl,
    masked_dpo_loss,
    resolve_aggregation_mode,
)
from zoo.rl.rewards import (
    ExactMatchReward,
    FormatReward,
    LengthBiasedProxyReward,
    RewardContext,
    RewardFunctionError,
    WeightedSumReward,
    reward_matrix,
    reward_name,
    score_rewards,
    weighted_rewards,
)
from zoo.rl.shapers import (
    AdditiveLengthPenalty,
    DAPOOverlongPenalty,
    GR3Shaper,
    NoShaping,
    RewardShaper,
    soft_overlong_punishment,
)

__all__ = [
    "AGGREGATION_ALIASES",
    "AGGREGATION_MODES",
    "IGNORE_INDEX",
    "AdditiveLengthPenalty",
    "AdvantageEstimator",
    "AlphaCalibration",
    "ClippedPolicyLoss",
    "DAPOOverlongPenalty",
    "DrGRPOAdvantage",
    "ExactMatchReward",
    "FormatReward",
    "GR3Shaper",
    "GRPOAdvantage",
    "LengthBiasedProxyReward",
    "LossAggregator",
    "NoShaping",
    "RLOOAdvantage",
    "RewardContext",
    "RewardFunctionError",
    "RewardShaper",
    "WeightedSumReward",
    "aggregate",
    "calibrate_alpha",
    "clipped_policy_loss",
    "constant_groups",
    "compute_normalizer",
    "gr3_rescale",
    "grpo_advantages",
    "k3_kl",
    "masked_dpo_loss",
    "masked_mean",
    "masked_token_entropy",
    "masked_token_logprobs",
    "resolve_aggregation_mode",
    "reward_group_stats",
    "reward_matrix",
    "reward_name",
    "rlhf_sigmoid",
    "rloo_advantages",
    "satisfaction_rate",
    "satisfied_groups",
    "score_rewards",
    "soft_overlong_punishment",
    "to_groups",
    "weighted_rewards",
]
