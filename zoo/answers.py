"""The zoo's completion format and its exact answer verifier (ground floor, ``docs/architecture.md``).

Completions share one format::

    <think>step 1\nstep 2\n...</think>ANSWER

Steps are separated by ``STEP_DELIMITER`` (a newline); the answer is the text after ``</think>``. Every synthetic
task (:mod:`zoo.data.tasks`) is an :class:`AnswerVerifier`; decoders, rewards and callbacks receive a verifier object
and never import a task.
"""

from __future__ import annotations

from typing import Any

from zoo.tokens import EOS, THINK_CLOSE, THINK_OPEN

STEP_DELIMITER = "\n"


def format_reasoning(steps: list[str], answer: str) -> str:
    """``<think>`` + steps joined by the delimiter + ``</think>`` + answer."""
    return f"{THINK_OPEN}{STEP_DELIMITER.join(steps)}{THINK_CLOSE}{answer}"


def extract_answer(text: str) -> str | None:
    """The answer of a completion: the text after the last ``</think>`` up to ``<eos>``, stripped.

    Returns ``None`` when the completion has no closed reasoning block.

    >>> extract_answer("<think>1+2=3</think>3<eos>")
    '3'
    >>> extract_answer("<think>unfinished") is None
    True
    """
    if THINK_CLOSE not in text:
        return None
    answer = text.rsplit(THINK_CLOSE, 1)[1]
    return answer.split(EOS, 1)[0].strip()


def split_steps(completion: str) -> list[str]:
    """The reasoning steps of a completion (the lines inside ``<think>...</think>``)."""
    body = completion.split(THINK_OPEN, 1)[-1].split(THINK_CLOSE, 1)[0]
    return [s for s in body.split(STEP_DELIMITER) if s]


class AnswerVerifier:
    """The exact verifier of a completion format: extract the answer, compare it with the reference.

    The base reads the zoo's shared format (the text after the last ``</think>``, :func:`extract_answer`) and
    compares it exactly with the stripped reference. Every :class:`~zoo.data.tasks.Task` is one (``task.verify``), so
    the verifier of a run is its task's: modules and callbacks take ``verifier: ${task}`` in their configs. An instance
    is a plain callable ``(completion, answer) -> bool`` too, the signature modules and callbacks accept.
    """

    def extract_answer(self, completion: str) -> str | None:
        """The answer of a completion (``None`` when it has none); see :func:`extract_answer`."""
        return extract_answer(completion)

    def normalize_reference(self, answer: Any) -> str:
        """The reference answer in the form extracted answers are compared with."""
        return str(answer).strip()

    def verify(self, completion: str, answer: Any) -> bool:
        """Exact verification of a completion against the reference answer."""
        predicted = self.extract_answer(completion)
        return predicted is not None and predicted == self.normalize_reference(answer)

    def __call__(self, completion: str, answer: Any) -> bool:
        return self.verify(completion, answer)


# The verifier of the shared completion format (what every synthetic task here uses); the default of modules and
# callbacks built without a task.
EXACT_ANSWER = AnswerVerifier()


class PlainAnswerVerifier(AnswerVerifier):
    """The verifier of completions that are the answer itself (no reasoning block): the text up to ``<eos>``,
    stripped (``None`` when empty). Tasks with such completions inherit it before :class:`~zoo.data.tasks.Task`."""

    def extract_answer(self, completion: str) -> str | None:
        answer = completion.split(EOS, 1)[0].strip()
        return answer or None
