"""Multi-turn retry-with-feedback episodes over any task with a verifier (the environment of DRIFT, arXiv 2605.31455).

An episode: the policy answers a problem; the verifier scores the answer; on a wrong answer the environment replies
with feedback and the policy answers again, up to ``max_turns`` turns, stopping at the first success. Following the
released code (``src/prompting.py``, ``src/generate_weighted_data_vllm_metamathqa.py``):

* turn reward ``r_t = 1`` for a verified answer, else 0;
* feedback, ``simple`` mode: the user message ``"Incorrect. Please think again."``; ``rich`` mode (the released
  script's default ``--prompt_mode full``): a block stating the reward, the turn and the attempts left (see
  :data:`RICH_FEEDBACK`; the released block also restates the output format, which here is the task's own);
* a *malformed* turn (the verifier extracts no answer) adds ``format_penalty`` (``-0.1``, ``FORMAT_PENALTY`` of
  ``scripts/run_generate_data.sh``) to the episode;
* ``repeat_penalty = lambda (1 - #unique answers / #answers)`` over the normalised answers of the well-formed turns
  (``lambda = 0.5``, ``TRAJECTORY_PENALTY_LAMBDA`` of ``src/weight_sft.py``); see :func:`zoo.rl.drift.repeat_penalty`;
* an episode whose next turn would not fit in the model's positions ends there, unsolved (``out_of_context``).

The episode loop :func:`run_episodes` is batched: every turn, the conversations still running are rendered with the
environment's :class:`~zoo.data.chat.ChatFormat` and decoded in one call of a :class:`ChatPolicy` (any generating
module's ``generate`` or a decoder of :mod:`zoo.generation`). The episodes work for any verifier ``(completion,
answer) -> bool``, so for every synthetic task (addition, multisum, reverse) and for JSONL prompts with an ``answer``
column.

:class:`RetryFeedbackSource` writes supervised data of a *synthetic reference policy* for these episodes (solves a
set fraction of problems at turn 1 and, after negative feedback, proposes a different candidate): the training data
of the reference policy of the DRIFT demo (``python train.py +method=sft datamodule=retry_feedback``).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from zoo.answers import EXACT_ANSWER
from zoo.data.chat import ChatFormat, Message, check_messages
from zoo.data.sources import GeneratedSource, Row
from zoo.data.tasks import Task
from zoo.encoding import encode_prompt, pad_sequences
from zoo.errors import ConfigError, DataError
from zoo.generation.sampling import context_length
from zoo.protocols import GenerationResult, SamplingParams, Verifier
from zoo.rl.drift import repeat_penalty
from zoo.tokens import THINK_CLOSE

FEEDBACK_MODES: tuple[str, ...] = ("simple", "rich")
#: ``DEFAULT_INCORRECT_OBS`` of the released ``src/prompting.py``.
INCORRECT = "Incorrect. Please think again."
#: The ``rich`` first user message and feedback (``build_turn_block`` / ``build_reward_message`` of the released
#: ``src/prompting.py`` without the output-format sentence). Fields: ``problem``, ``reward``, ``turn``, ``remaining``
#: (turns left), ``max_turns``, ``incorrect``.
RICH_INITIAL = "Turn 1:\nState:\n{problem}\nYou have {remaining} actions left."
RICH_FEEDBACK = "Reward:\n{reward}\nTurn {turn}:\nState:\n{incorrect}\nYou have {remaining} actions left."

Generate = Callable[..., GenerationResult]


def normalize_answer(text: str) -> str:
    """Lower-case, whitespace removed (``normalize_answer`` of the released code): how repeats are detected."""
    return re.sub(r"\s+", "", text.strip().lower())


@dataclass
class Episode:
    """One multi-turn trajectory.

    Attributes:
        prompt_id: id of the prompt (the trajectories of one prompt form a group).
        index: index of the trajectory within its group.
        answer: the reference answer.
        messages: the conversation so far (the initial messages, then assistant turns and feedback).
        turn_rewards: ``r_t`` of every assistant turn taken.
        answers: normalised extracted answer of every turn (``None``: malformed).
        t_star: first successful turn (1-based), ``None`` while unsolved.
        format_penalty: sum of the format penalties of the malformed turns (``<= 0``).
        done: solved, or out of turns.
        finished: whether the last turn ended by EOS/stop (False: it ran out of tokens).
        out_of_context: the episode ended because its next turn would not fit in the model's positions.
        completion_tokens: tokens generated over all turns.
    """

    prompt_id: str
    index: int
    answer: Any
    messages: list[Message]
    turn_rewards: list[float] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    t_star: int | None = None
    format_penalty: float = 0.0
    done: bool = False
    finished: bool = True
    out_of_context: bool = False
    completion_tokens: int = 0

    @property
    def turns(self) -> int:
        """Number of assistant turns taken."""
        return len(self.turn_rewards)


class FeedbackEnvironment:
    """Retry-with-feedback episodes (see the module docstring).

    Args:
        verifier: ``(completion, answer) -> bool``, normally the task (``verifier: ${task}``); an
            :class:`~zoo.answers.AnswerVerifier` also tells malformed turns (no extractable answer) apart.
        max_turns: assistant turns per episode at most.
        feedback: ``simple`` | ``rich``.
        incorrect_message: the feedback text of ``simple`` mode (also the ``incorrect`` field of ``rich``).
        instruction: text put before the problem in the first user message (the released
            ``DEFAULT_ENV_INSTRUCTION`` for instruct models; empty for the synthetic tasks).
        system_prompt: a system message opening every conversation, or ``None``.
        format_penalty: added once per malformed turn (``<= 0``).
        repeat_penalty: ``lambda`` of the repeat penalty (``>= 0``).
        chat_format: how conversations become text (:class:`~zoo.data.chat.ChatFormat`; default ``auto``).
    """

    def __init__(
        self,
        verifier: Verifier | None = None,
        max_turns: int = 3,
        feedback: str = "simple",
        incorrect_message: str = INCORRECT,
        instruction: str = "",
        system_prompt: str | None = None,
        format_penalty: float = -0.1,
        repeat_penalty: float = 0.5,
        chat_format: ChatFormat | None = None,
    ) -> None:
        if max_turns < 1:
            raise ConfigError(f"multiturn.max_turns must be >= 1, got {max_turns}")
        if feedback not in FEEDBACK_MODES:
            raise ConfigError(f"multiturn.feedback must be one of {list(FEEDBACK_MODES)}, got {feedback!r}")
        if not math.isfinite(format_penalty) or format_penalty > 0:
            raise ConfigError(f"multiturn.format_penalty must be a finite number <= 0, got {format_penalty}")
        if not math.isfinite(repeat_penalty) or repeat_penalty < 0:
            raise ConfigError(f"multiturn.repeat_penalty must be a finite number >= 0, got {repeat_penalty}")
        self.verifier: Verifier = verifier if verifier is not None else EXACT_ANSWER
        self.max_turns = max_turns
        self.feedback = feedback
        self.incorrect_message = incorrect_message
        self.instruction = instruction
        self.system_prompt = system_prompt
        self.format_penalty = float(format_penalty)
        self.repeat_penalty = float(repeat_penalty)
        self.chat_format = chat_format if chat_format is not None else ChatFormat()

    # -- messages --------------------------------------------------------------------------------------------------
    def initial_messages(self, problem: str) -> list[Message]:
        """The conversation an episode starts from: optional system message, then the problem as the user turn."""
        if self.feedback == "rich":
            content = RICH_INITIAL.format(problem=problem, remaining=self.max_turns, max_turns=self.max_turns)
            content = f"{self.instruction}\n{content}" if self.instruction else content
        else:
            content = f"{self.instruction}\n\n{problem}" if self.instruction else problem
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": content}]

    def feedback_message(self, reward: float, next_turn: int) -> Message:
        """The user message after a wrong turn (``next_turn``: the turn it asks for)."""
        if self.feedback == "simple":
            return {"role": "user", "content": self.incorrect_message}
        remaining = self.max_turns - next_turn + 1
        content = RICH_FEEDBACK.format(
            reward=float(reward),
            turn=next_turn,
            remaining=remaining,
            max_turns=self.max_turns,
            incorrect=self.incorrect_message,
        )
        return {"role": "user", "content": content}

    def render(self, messages: Sequence[Message], tokenizer: PreTrainedTokenizerBase) -> str:
        """Text of a conversation ending where the next assistant turn starts."""
        return self.chat_format.render(messages, tokenizer, add_generation_prompt=True)

    # -- episodes --------------------------------------------------------------------------------------------------
    def reset(self, problem: str | Sequence[Message], answer: Any, prompt_id: str = "0", index: int = 0) -> Episode:
        """A new episode for a problem (text, or the initial conversation as messages ending with a user turn)."""
        if isinstance(problem, str):
            messages = self.initial_messages(problem)
        else:
            messages = check_messages(list(problem), f"prompt {prompt_id}")
            if messages[-1]["role"] != "user":
                raise DataError(f"prompt {prompt_id}: the initial conversation must end with a user message")
        return Episode(prompt_id=str(prompt_id), index=int(index), answer=answer, messages=messages)

    def extract(self, completion: str) -> str | None:
        """The normalised answer of a completion, ``None`` when it is malformed (for a plain verifier function,
        which cannot tell, the normalised completion)."""
        extractor = getattr(self.verifier, "extract_answer", None)
        answer = extractor(completion) if extractor is not None else completion
        return None if answer is None else normalize_answer(answer)

    def step(self, episode: Episode, completion: str, finished: bool = True, num_tokens: int = 0) -> None:
        """Add the assistant turn ``completion``: score it, then end the episode or append the feedback."""
        if episode.done:
            raise ValueError(f"episode {episode.prompt_id}/{episode.index} is over; reset a new one")
        turn = episode.turns + 1
        correct = bool(self.verifier(completion, episode.answer))
        reward = 1.0 if correct else 0.0
        answer = self.extract(completion)
        episode.messages.append({"role": "assistant", "content": completion})
        episode.turn_rewards.append(reward)
        episode.answers.append(answer)
        episode.finished = finished
        episode.completion_tokens += int(num_tokens)
        if answer is None:
            episode.format_penalty += self.format_penalty
        if correct:
            episode.t_star = turn
        episode.done = correct or turn >= self.max_turns
        if not episode.done:
            episode.messages.append(self.feedback_message(reward, turn + 1))

    def stop(self, episode: Episode) -> None:
        """End an episode before its next turn (it does not fit in the model's context): unsolved, no new turn; the
        feedback that asked for the turn is removed, so the conversation ends with its last assistant turn."""
        if episode.messages and episode.messages[-1]["role"] == "user" and episode.turns:
            episode.messages.pop()
        episode.done = True
        episode.out_of_context = True

    def episode_repeat_penalty(self, episode: Episode) -> float:
        """:func:`repeat_penalty` of an episode's well-formed answers with this environment's ``lambda``."""
        return repeat_penalty([a for a in episode.answers if a is not None], self.repeat_penalty)

    def describe(self) -> dict[str, Any]:
        """JSON-able description (rollout files record it)."""
        verifier = self.verifier.describe() if hasattr(self.verifier, "describe") else repr(self.verifier)
        return {
            "verifier": verifier,
            "max_turns": self.max_turns,
            "feedback": self.feedback,
            "incorrect_message": self.incorrect_message,
            "instruction": self.instruction,
            "system_prompt": self.system_prompt,
            "format_penalty": self.format_penalty,
            "repeat_penalty": self.repeat_penalty,
            "chat_format": self.chat_format.describe(),
        }


# -- policies and the batched loop -------------------------------------------------------------------------------------
class ChatPolicy:
    """Answers a batch of conversations in one decode.

    Args:
        generate: ``generate(prompt_ids, attention_mask, params, generator) -> GenerationResult`` -- a generating
            module's ``generate`` (its decoder seam) or ``functools.partial(decoder, model, tokenizer)``-style
            callables accepting those arguments.
        tokenizer: the model's tokenizer.
        chat_format: renders the conversations.
        params: decoding options of every turn.
        generator: seeded generator (sampling).
        device: where prompt ids go (default: CPU).
        max_context: the model's positions (``None``: unknown); a conversation whose next turn does not fit
            (prompt + ``params.max_new_tokens``) is not sent (see :func:`run_episodes`).

    :attr:`tokens_generated` and :attr:`calls` count what was decoded (benchmarks).
    """

    def __init__(
        self,
        generate: Generate,
        tokenizer: PreTrainedTokenizerBase,
        chat_format: ChatFormat,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        device: torch.device | str = "cpu",
        max_context: int | None = None,
    ) -> None:
        self.generate = generate
        self.tokenizer = tokenizer
        self.chat_format = chat_format
        self.params = params
        self.generator = generator
        self.device = device
        self.max_context = max_context
        self.tokens_generated = 0
        self.calls = 0

    @classmethod
    def for_module(
        cls, module: Any, chat_format: ChatFormat, params: SamplingParams, generator: torch.Generator | None = None
    ) -> ChatPolicy:
        """The policy of a generating module (``generate``, ``tokenizer``, ``model``, ``device``)."""
        if getattr(module, "model", None) is None and hasattr(module, "configure_model"):
            module.configure_model()
        model = getattr(module, "model", None)
        limit = context_length(model) if hasattr(model, "config") else None
        return cls(module.generate, module.tokenizer, chat_format, params, generator, module.device, limit)

    def encode(self, conversations: Sequence[Sequence[Message]]) -> list[list[int]]:
        """Prompt ids of each conversation (rendered up to the next assistant turn; BOS first)."""
        texts = [self.chat_format.render(c, self.tokenizer, add_generation_prompt=True) for c in conversations]
        return [encode_prompt(self.tokenizer, t) for t in texts]

    def fits(self, prompt_ids: Sequence[int]) -> bool:
        """Whether a prompt leaves room for a whole turn (``max_new_tokens``) in the model's positions."""
        return self.max_context is None or len(prompt_ids) + self.params.max_new_tokens <= self.max_context

    def decode(self, encoded: Sequence[Sequence[int]], turn: int = 1) -> GenerationResult:
        """One turn of the encoded conversations (left-padded into one batch)."""
        ids = pad_sequences(encoded, self.tokenizer.pad_token_id, "left").to(self.device)
        mask = pad_sequences([[1] * len(e) for e in encoded], 0, "left").to(self.device)
        try:
            result = self.generate(ids, mask, self.params, self.generator)
        except ConfigError as err:
            raise ConfigError(
                f"turn {turn}: {err}. Multi-turn contexts grow with every turn: lower multiturn.max_turns or the "
                "generation's max_new_tokens, or use a backbone with more positions"
            ) from None
        self.tokens_generated += int(result.lengths.sum())
        self.calls += 1
        return result

    def __call__(self, conversations: Sequence[Sequence[Message]], turn: int = 1) -> GenerationResult:
        return self.decode(self.encode(conversations), turn)


def run_episodes(environment: FeedbackEnvironment, episodes: Sequence[Episode], policy: ChatPolicy) -> list[Episode]:
    """Play the episodes to the end, one batched decode per turn over the episodes still running.

    An episode whose next turn would not fit in the model's positions (``policy.max_context``) ends there, unsolved,
    with ``out_of_context`` set (a policy that writes very long turns runs out of context before it runs out of turns).
    """
    episodes = list(episodes)
    for turn in range(1, environment.max_turns + 1):
        active = [e for e in episodes if not e.done]
        encoded = policy.encode([e.messages for e in active])
        running = []
        for episode, ids in zip(active, encoded):
            if policy.fits(ids) or episode.turns == 0:  # a first turn that does not fit is a configuration error
                running.append((episode, ids))
            else:
                environment.stop(episode)
        if not running:
            break
        result = policy.decode([ids for _, ids in running], turn=turn)
        lengths = result.lengths.tolist()
        for row, (episode, _) in enumerate(running):
            environment.step(episode, result.texts[row], bool(result.finished[row]), lengths[row])
    return episodes


# -- the synthetic reference policy's data -----------------------------------------------------------------------------
def wrong_candidates(answer: str) -> list[str]:
    """Plausible wrong answers: ``answer +- 1, 2, 10`` (non-negative) for integers, else one adjacent swap or one
    changed character per position."""
    answer = str(answer).strip()
    if re.fullmatch(r"-?\d+", answer):
        value = int(answer)
        return [str(value + d) for d in (-10, -2, -1, 1, 2, 10) if value + d >= 0 or value < 0]
    out = []
    for i in range(len(answer) - 1):
        swapped = answer[:i] + answer[i + 1] + answer[i] + answer[i + 2 :]
        if swapped != answer:
            out.append(swapped)
    out += [answer[:i] + ("a" if c != "a" else "b") + answer[i + 1 :] for i, c in enumerate(answer)]
    return list(dict.fromkeys(out))


class RetryFeedbackSource(GeneratedSource):
    """Conversations of a synthetic reference policy on retry-with-feedback episodes, as SFT rows.

    For each problem of ``task``, one episode is simulated: each turn answers correctly with probability
    ``first_turn_accuracy`` (turn 1) or ``retry_accuracy`` (later turns), otherwise with a wrong candidate
    (:func:`wrong_candidates`) never proposed before in the episode; the reasoning is the task's (only the final
    answer changes). A policy fine-tuned on the rows (``datamodule=retry_feedback``,
    :class:`~zoo.datamodules.MultiTurnSFTDataModule` with ``train_turns=all``) solves about ``first_turn_accuracy``
    at turn 1 and proposes a new candidate after each wrong one.

    Rows ``{"messages", "answer", "turn", "prompt"}``: ``rows="episodes"`` gives one row per episode (the whole
    conversation; train every assistant turn), ``rows="turns"`` one row per assistant turn (the conversation up to it;
    its earlier turns and feedback are context; train the last turn).

    Args:
        task: the synthetic task (its completions must be ``<think>...</think>ANSWER``).
        environment: the episodes' feedback and length (its verifier is not used).
        first_turn_accuracy, retry_accuracy: probability of a correct answer at turn 1 and at later turns.
        rows: ``episodes`` | ``turns``.
        num_train, num_val, num_test: rows per split.
        seed: base seed (splits draw disjoint problems: validation/test problems never appear in training).
    """

    def __init__(
        self,
        task: Task,
        environment: FeedbackEnvironment,
        first_turn_accuracy: float = 0.4,
        retry_accuracy: float = 0.4,
        rows: str = "episodes",
        num_train: int = 16000,
        num_val: int = 256,
        num_test: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(num_train, num_val, num_test, seed)
        for name, value in (("first_turn_accuracy", first_turn_accuracy), ("retry_accuracy", retry_accuracy)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"datamodule.source.{name} must be in [0, 1], got {value}")
        if rows not in ("episodes", "turns"):
            raise ConfigError(f"datamodule.source.rows must be 'episodes' or 'turns', got {rows!r}")
        self.rows_per = rows
        self.task = task
        self.environment = environment
        self.first_turn_accuracy = first_turn_accuracy
        self.retry_accuracy = retry_accuracy

    def episode_rows(self, problem: Row, rng: random.Random) -> list[Row]:
        """The rows of one simulated episode (the whole episode, or one per assistant turn)."""
        completion, answer = problem["completion"], str(problem["answer"])
        if THINK_CLOSE not in completion:
            raise DataError(
                f"task {self.task.name}: completion {completion[:40]!r} has no {THINK_CLOSE!r}; RetryFeedbackSource "
                "needs the <think>...</think>ANSWER format"
            )
        reasoning = completion[: completion.rindex(THINK_CLOSE) + len(THINK_CLOSE)]
        messages = self.environment.initial_messages(problem["prompt"])
        unused = wrong_candidates(answer)
        rows = []
        for turn in range(1, self.environment.max_turns + 1):
            accuracy = self.first_turn_accuracy if turn == 1 else self.retry_accuracy
            correct = rng.random() < accuracy or not unused
            reply = answer if correct else unused.pop(rng.randrange(len(unused)))
            messages = [*messages, {"role": "assistant", "content": reasoning + reply}]
            rows.append({"messages": messages, "answer": answer, "turn": turn, "prompt": problem["prompt"]})
            if correct:
                break
            messages = [*messages, self.environment.feedback_message(0.0, turn + 1)]
        return rows if self.rows_per == "turns" else rows[-1:]

    def generate(self, split: str, size: int) -> list[Row]:
        exclude = self.held_out_prompts() if split == "train" else None
        rng = random.Random(f"retry-{self.split_seed(split)}")
        rows: list[Row] = []
        problems = self.task.examples(size, self.split_seed(split), exclude_prompts=exclude)
        for example in problems:
            rows += self.episode_rows(example.as_row(), rng)
            if len(rows) >= size:
                break
        return rows[:size]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "retry_feedback",
            "task": self.task.describe(),
            "environment": self.environment.describe(),
            "first_turn_accuracy": self.first_turn_accuracy,
            "retry_accuracy": self.retry_accuracy,
            "rows": self.rows_per,
            "sizes": self.sizes,
            "seed": self.seed,
        }


__all__ = [
    "FEEDBACK_MODES",
    "INCORRECT",
    "RICH_FEEDBACK",
    "RICH_INITIAL",
    "ChatPolicy",
    "Episode",
    "FeedbackEnvironment",
    "RetryFeedbackSource",
    "normalize_answer",
    "repeat_penalty",
    "run_episodes",
    "wrong_candidates",
]
