"""Multi-turn episodes for training and evaluation: token rows of whole trajectories and the multi-turn metrics.

* :func:`trajectory_rows` -- the padded token rows of finished episodes for policy-gradient training (online
  multi-turn GRPO): the whole conversation as one sequence, labels on the assistant turns (every turn, or the last),
  ``-100`` on the prompt, the feedback and padding;
* :func:`episode_row` -- the rollout-file row of a finished episode (the format of :mod:`zoo.data.rollouts`);
* :class:`MultiTurnAccuracy` -- a torchmetrics metric over episodes: ``multi@k`` (solved within ``k`` turns, i.e.
  the cumulative accuracy by turn ``k``, for every ``k <= max_turns``) and the mean turns to solve (over the solved
  episodes), as DRIFT's released evaluation (``src/eval_math_multiturn_vllm.py``: ``cumulative/by_turn_k``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric
from transformers import PreTrainedTokenizerBase

from zoo.data.chat import ChatFormat, encode_conversation
from zoo.data.feedback import Episode, FeedbackEnvironment
from zoo.data.sources import Row
from zoo.encoding import pad_sequences
from zoo.errors import ConfigError
from zoo.rl.drift import discounted_return


def episode_row(environment: FeedbackEnvironment, episode: Episode, gamma: float) -> Row:
    """The rollout-file row of a finished episode (fields: :mod:`zoo.data.rollouts`); ``return`` uses ``gamma``."""
    penalty = environment.episode_repeat_penalty(episode)
    return {
        "prompt_id": episode.prompt_id,
        "index": episode.index,
        "messages": episode.messages,
        "answer": str(episode.answer),
        "turn_rewards": episode.turn_rewards,
        "answers": episode.answers,
        "t_star": episode.t_star,
        "format_penalty": episode.format_penalty,
        "repeat_penalty": penalty,
        "return": discounted_return(episode.turn_rewards, gamma, episode.format_penalty, penalty),
        "gamma": gamma,
        "out_of_context": episode.out_of_context,
    }


def trajectory_rows(
    tokenizer: PreTrainedTokenizerBase, chat_format: ChatFormat, episodes: Sequence[Episode], train: str = "all"
) -> dict[str, Tensor]:
    """Right-padded rows of whole episodes.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``, ``labels``: ``[N, T]`` (labels: the assistant turns'
        tokens -- ``train="all"`` -- or the last turn's -- ``"last"`` --, each with the EOS that ends it).
    """
    encoded = [encode_conversation(tokenizer, chat_format, e.messages, train) for e in episodes]
    input_ids = pad_sequences([ids for ids, _ in encoded], tokenizer.pad_token_id, "right")
    attention_mask = pad_sequences([[1] * len(ids) for ids, _ in encoded], 0, "right")
    labels = pad_sequences([lab for _, lab in encoded], -100, "right")
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "labels": labels}


class MultiTurnAccuracy(Metric):
    """``multi@k`` for ``k = 1..max_turns`` and the mean number of turns to solve.

    ``update(t_stars)`` takes the first successful turn of each episode (``None``, or anything ``< 1``, for an
    unsolved one). ``compute()`` returns ``{"multi@1": ..., ..., "multi@K": ..., "mean_turns_to_solve": ...}``
    (``multi@k`` = fraction solved within ``k`` turns; the mean turns is over the solved episodes, NaN when none).
    Sums are synchronised across processes.

    Args:
        max_turns: ``K``.
    """

    full_state_update = False

    def __init__(self, max_turns: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        if max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.add_state("solved_at", default=torch.zeros(max_turns, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, t_stars: Sequence[int | None]) -> None:
        solved = [int(t) for t in t_stars if t is not None and t >= 1]
        if any(t > self.max_turns for t in solved):
            raise ValueError(f"t_star={max(solved)} exceeds max_turns={self.max_turns}")
        index = torch.tensor([t - 1 for t in solved], dtype=torch.long, device=self.solved_at.device)
        # out of place: the states may be inference tensors (reset inside Lightning's evaluation loop)
        self.solved_at = self.solved_at + torch.bincount(index, minlength=self.max_turns)
        self.total = self.total + len(t_stars)

    def compute(self) -> dict[str, Tensor]:
        total = self.total.clamp(min=1).float()
        cumulative = self.solved_at.cumsum(0).float() / total
        out = {f"multi@{k}": cumulative[k - 1] for k in range(1, self.max_turns + 1)}
        solved = self.solved_at.sum()
        turns = torch.arange(1, self.max_turns + 1, device=self.solved_at.device, dtype=torch.float)
        mean = (turns * self.solved_at.float()).sum() / solved.float() if solved > 0 else torch.tensor(float("nan"))
        out["mean_turns_to_solve"] = mean
        return out


__all__ = ["MultiTurnAccuracy", "episode_row", "trajectory_rows"]
