"""A task whose completions fork right after the question: one short correct continuation, one long repetitive
loop, one medium wrong continuation, drawn with fixed probabilities (``task=forked``).

Built for tree decoding (DTS, :mod:`zoo.generation.dts`): a model trained on it meets exactly one *decision
token* -- the first reasoning token, where the three continuations compete -- and near-deterministic tokens
everywhere else (the rest of each continuation is a copy of the question's word), so one can see where branching
fires and what each decoder returns. With the default knobs and the character tokenizer::

    "cab="  ->  <think>say cab</think>cab                         short, correct         p = 0.5
            ->  <think>hmm cab\\nhmm cab\\n ... (12 lines)</think>?  long loop, no answer   p = 0.35
            ->  <think>guess cac\\ncheck cac\\nso cac</think>cac     medium, wrong          p = 0.15

The question is a word of ``min_length``..``max_length`` letters (thousands of distinct prompts, so validation and
test prompts stay out of the training rows); the answer is the word itself; the wrong answer shifts its last letter.
The loop (about 100-120 tokens) is longer than a typical evaluation budget (``max_new_tokens`` 48), so a model that
takes it does not emit EOS within the budget (the repetition failure); it still fits the SFT ``max_length`` (160),
so the training rows are complete. The fork token is the first character after ``<think>`` (``s`` / ``h`` / ``g``),
i.e. completion position 1 with the character tokenizer.
"""

from __future__ import annotations

import math
import random

from zoo.answers import STEP_DELIMITER, format_reasoning
from zoo.data.tasks import Example, Task
from zoo.errors import ConfigError
from zoo.tokens import THINK_OPEN

BRANCHES = ("short", "loop", "wrong")
# first reasoning word of each branch (the fork token is its first letter)
FIRST_WORDS = {"short": "say", "loop": "hmm", "wrong": "guess"}
LOOP_ANSWER = "?"


class ForkedTask(Task):
    """Copy a word, along one of three branches (see the module docstring).

    Args:
        p_short, p_loop, p_wrong: branch probabilities (non-negative, summing to 1).
        min_length, max_length: letters of the question's word.
        alphabet: letters to draw from (at least 2).
        loop_lines: lines of the repetitive loop (long enough to exceed the evaluation budget).
        wrong_lines: lines of the wrong continuation (its first line states the wrong answer).

    Each example's meta says which branch it took (``branch``) and its number of reasoning lines (``num_steps``).
    """

    name = "forked"

    def __init__(
        self,
        p_short: float = 0.5,
        p_loop: float = 0.35,
        p_wrong: float = 0.15,
        min_length: int = 3,
        max_length: int = 5,
        alphabet: str = "abcdefghij",
        loop_lines: int = 12,
        wrong_lines: int = 3,
    ) -> None:
        probs = {"task.p_short": p_short, "task.p_loop": p_loop, "task.p_wrong": p_wrong}
        bad = {k: v for k, v in probs.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0}
        if bad:
            raise ConfigError(f"branch probabilities must be numbers >= 0, got {bad}")
        if not math.isclose(sum(probs.values()), 1.0, abs_tol=1e-6):
            raise ConfigError(f"task.p_short + task.p_loop + task.p_wrong must be 1, got {sum(probs.values())}")
        if not 1 <= min_length <= max_length or len(set(alphabet)) < 2 or loop_lines < 1 or wrong_lines < 1:
            raise ConfigError(
                "need 1 <= task.min_length <= task.max_length, an alphabet of >= 2 letters, task.loop_lines >= 1 and "
                f"task.wrong_lines >= 1; got {min_length}, {max_length}, {alphabet!r}, {loop_lines}, {wrong_lines}"
            )
        self.p_short = float(p_short)
        self.p_loop = float(p_loop)
        self.p_wrong = float(p_wrong)
        self.min_length = int(min_length)
        self.max_length = int(max_length)
        self.alphabet = str(alphabet)
        self.loop_lines = int(loop_lines)
        self.wrong_lines = int(wrong_lines)

    def wrong_answer(self, word: str) -> str:
        """The word with its last letter replaced by the next one of the alphabet (cyclic)."""
        last = self.alphabet.index(word[-1])
        return word[:-1] + self.alphabet[(last + 1) % len(self.alphabet)]

    def branch_completion(self, word: str, branch: str) -> str:
        """The completion of ``word=`` along ``branch`` (``short``, ``loop`` or ``wrong``)."""
        if branch == "short":
            return format_reasoning([f"{FIRST_WORDS[branch]} {word}"], word)
        if branch == "loop":
            return format_reasoning([f"{FIRST_WORDS[branch]} {word}"] * self.loop_lines, LOOP_ANSWER)
        if branch == "wrong":
            wrong = self.wrong_answer(word)
            lines = [f"{FIRST_WORDS[branch]} {wrong}", *[f"check {wrong}"] * max(self.wrong_lines - 2, 0)]
            if self.wrong_lines > 1:
                lines.append(f"so {wrong}")
            return format_reasoning(lines, wrong)
        raise ValueError(f"branch must be one of {BRANCHES}, got {branch!r}")

    @staticmethod
    def branch_of(completion: str) -> str | None:
        """Which branch a (generated) completion took, read from its first reasoning word (``say`` / ``hmm`` /
        ``guess``); ``None`` when it starts otherwise."""
        body = completion.split(THINK_OPEN, 1)[1] if completion.startswith(THINK_OPEN) else ""
        word = body.split(" ", 1)[0]
        return next((branch for branch, first in FIRST_WORDS.items() if first == word), None)

    def sample(self, rng: random.Random) -> Example:
        word = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_length, self.max_length)))
        branch = rng.choices(BRANCHES, weights=(self.p_short, self.p_loop, self.p_wrong))[0]
        completion = self.branch_completion(word, branch)
        meta = {"branch": branch, "num_steps": len(completion.split(STEP_DELIMITER))}
        return Example(f"{word}=", completion, word, meta)


__all__ = ["BRANCHES", "FIRST_WORDS", "LOOP_ANSWER", "ForkedTask"]
