"""A random sparse Markov chain over old tokens, and new tokens whose transitions mix dictionary rows.

The synthetic setting of "Memory as a Markov Matrix" (arXiv 2605.04308; notes ``inference.md`` section 5(d)):
``T`` old states, each row of the transition matrix ``P`` a Dirichlet draw over ``support`` random successors; a
tiny model trained on chain samples learns ``P``. New token ``j`` maps to a dictionary ``D_j`` of ``s`` old states
with weights ``w_j`` on the simplex and transitions with ``P'_j = sum_i w_ji P_{D_j,i}`` (:attr:`NewTokens.rows`).

Each state is one character (:data:`STATE_ALPHABET`), so with the zoo's character tokenizer a state is one token;
new tokens are strings such as ``<v0>`` that the vocabulary extension adds.

- :class:`MarkovChainTask` (``task=markov``): old-chain sequences (``prompt`` = the first ``prompt_length``
  states, ``completion`` = the rest), the base policy's training data; it also defines the new tokens and their
  dictionaries (``new_tokens``, ``dictionaries``: what ``+method=vocab_extend`` reads).
- :class:`NewTokenSource`: rows holding one transition out of a new token each (the data of the extension).
- :func:`transition_tv` (with :func:`state_token_ids` and :meth:`MarkovChainTask.successor_context`): the total
  variation between a model's next-token distribution and a true row (``P'_j`` or ``P_i``), the demo's measure of
  how well the new rows learned their transitions (:class:`zoo.callbacks.TransitionTV`).
"""

from __future__ import annotations

import bisect
import random
import string
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from zoo.data.sources import GeneratedSource, Row
from zoo.data.tasks import Example, Task
from zoo.errors import ConfigError

# 64 base64 characters first, then more printable characters (no space, no angle brackets).
STATE_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase + "+/!#$%&()*,-.:;=?@[]^_{|}~"
DICTIONARY_WEIGHTS = ("dirichlet", "uniform")


def _dirichlet(rng: random.Random, size: int, concentration: float) -> list[float]:
    draws = [rng.gammavariate(concentration, 1.0) for _ in range(size)]
    total = sum(draws)
    return [d / total for d in draws]


class _Categorical:
    """Sampling from a sparse categorical distribution with Python's ``random`` (deterministic per seed)."""

    def __init__(self, outcomes: list[int], probs: list[float]) -> None:
        self.outcomes = outcomes
        self.cumulative = [sum(probs[: k + 1]) for k in range(len(probs))]

    def draw(self, rng: random.Random) -> int:
        u = rng.random() * self.cumulative[-1]
        return self.outcomes[min(bisect.bisect_right(self.cumulative, u), len(self.outcomes) - 1)]


class MarkovChain:
    """A random sparse first-order Markov chain.

    Args:
        num_states: ``T``.
        support: successors per state (``T`` for a dense chain).
        concentration: Dirichlet concentration of each row's weights over its successors.
        seed: seed of the chain itself (not of the samples).

    Attributes:
        transition: ``[T, T]`` float64 row-stochastic matrix ``P``.
    """

    def __init__(self, num_states: int = 64, support: int = 8, concentration: float = 1.0, seed: int = 0) -> None:
        if num_states < 2:
            raise ConfigError(f"a Markov chain needs num_states >= 2, got {num_states}")
        if not 1 <= support <= num_states:
            raise ConfigError(f"support must be in [1, num_states={num_states}], got {support}")
        if concentration <= 0:
            raise ConfigError(f"concentration must be > 0, got {concentration}")
        rng = random.Random(seed)
        self.num_states = num_states
        self.transition = torch.zeros(num_states, num_states, dtype=torch.float64)
        self._rows: list[_Categorical] = []
        for i in range(num_states):
            successors = sorted(rng.sample(range(num_states), support))
            probs = _dirichlet(rng, support, concentration)
            self.transition[i, successors] = torch.tensor(probs, dtype=torch.float64)
            self._rows.append(_Categorical(successors, probs))

    def step(self, rng: random.Random, state: int) -> int:
        """Draw the successor of ``state``."""
        return self._rows[state].draw(rng)

    def sample(self, rng: random.Random, length: int, start: int | None = None) -> list[int]:
        """``length`` states; the first is ``start`` (uniform when ``None``)."""
        states = [rng.randrange(self.num_states) if start is None else start]
        while len(states) < length:
            states.append(self.step(rng, states[-1]))
        return states[:length]

    def stationary(self) -> Tensor:
        """``[T]`` a stationary distribution ``pi = pi P`` (left eigenvector for eigenvalue 1)."""
        values, vectors = torch.linalg.eig(self.transition.T)
        pi = vectors[:, torch.argmin((values - 1).abs())].real
        return (pi / pi.sum()).abs()

    def entropy_rate(self) -> float:
        """``sum_i pi_i H(P_i)`` in nats: the loss of a model that has learned the chain exactly."""
        p = self.transition
        row_entropy = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
        return float((self.stationary() * row_entropy).sum())


class NewTokens:
    """``m`` new tokens; token ``j`` maps to ``s`` distinct old states ``D_j`` with weights ``w_j``.

    Args:
        chain: the old chain.
        num_new_tokens: ``m``.
        dictionary_size: ``s``.
        weights: ``dirichlet`` (``w_j ~ Dir(1)``) or ``uniform`` (``w_ji = 1/s``) [reconstruction].
        seed: seed of the dictionaries and weights.

    Attributes:
        dictionaries: ``m`` lists of ``s`` old states.
        weights: ``[m, s]`` float64.
        rows: ``[m, T]`` float64 true successor distributions ``P'_j = sum_i w_ji P_{D_j,i}``.
    """

    def __init__(
        self, chain: MarkovChain, num_new_tokens: int, dictionary_size: int, weights: str = "dirichlet", seed: int = 0
    ) -> None:
        if num_new_tokens < 1:
            raise ConfigError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        if not 1 <= dictionary_size <= chain.num_states:
            raise ConfigError(f"dictionary_size must be in [1, num_states={chain.num_states}], got {dictionary_size}")
        if weights not in DICTIONARY_WEIGHTS:
            raise ConfigError(f"dictionary weights must be one of {DICTIONARY_WEIGHTS}, got {weights!r}")
        rng = random.Random(seed)
        self.chain = chain
        self.dictionaries = [
            sorted(rng.sample(range(chain.num_states), dictionary_size)) for _ in range(num_new_tokens)
        ]
        self.weights = torch.tensor(
            [
                _dirichlet(rng, dictionary_size, 1.0)
                if weights == "dirichlet"
                else [1.0 / dictionary_size] * dictionary_size
                for _ in range(num_new_tokens)
            ],
            dtype=torch.float64,
        )
        self.rows = torch.stack([w @ chain.transition[d] for w, d in zip(self.weights, self.dictionaries)])
        self._pick = [_Categorical(list(range(dictionary_size)), w.tolist()) for w in self.weights]

    def step(self, rng: random.Random, token: int) -> int:
        """Draw the successor of new token ``token``: ``i ~ w_j``, then a successor of ``D_j,i``."""
        return self.chain.step(rng, self.dictionaries[token][self._pick[token].draw(rng)])


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """``TV(p, q) = 1/2 sum_k |p_k - q_k|`` over the last dimension."""
    return 0.5 * (p - q).abs().sum(-1)


def state_token_ids(tokenizer: Any, num_states: int) -> list[int]:
    """The token id of each of the first ``num_states`` states (one character each) in ``tokenizer``.

    Raises:
        ConfigError: a state character is not a single token of the tokenizer (e.g. a BPE tokenizer that merges
            or splits characters).
    """
    ids = []
    for state, char in enumerate(STATE_ALPHABET[:num_states]):
        encoded = list(tokenizer(char, add_special_tokens=False)["input_ids"])
        if len(encoded) != 1:
            raise ConfigError(
                f"state {state} ({char!r}) is {len(encoded)} tokens of this tokenizer, not one: the Markov task "
                "needs a tokenizer with one token per character (the tiny backbone's)"
            )
        ids.append(int(encoded[0]))
    return ids


def transition_tv(probs: Tensor, rows: Tensor, state_ids: Sequence[int]) -> Tensor:
    """Total variation between a model's next-token distributions and true successor rows of the chain.

    ``TV(p_hat(. | context), P_row) = 1/2 sum_k |p_hat_k - q_k|`` where ``q`` is the true row placed on the
    states' token ids (0 on every other token, so mass on non-state tokens counts as error). In the reading of
    arXiv 2605.04308 this is the distance of the learned transition row from ``P'_j`` (new token ``j``) or
    ``P_i`` (old state ``i``).

    Args:
        probs: ``[N, V]`` next-token probabilities (any vocabulary ``V`` holding the state ids).
        rows: ``[N, T]`` true successor distributions over the ``T`` states.
        state_ids: ``T`` token ids of the states.

    Returns:
        ``[N]`` float64 total variations in ``[0, 1]``.
    """
    if probs.dim() != 2 or rows.dim() != 2 or probs.shape[0] != rows.shape[0] or rows.shape[1] != len(state_ids):
        raise ValueError(
            f"probs {tuple(probs.shape)} and rows {tuple(rows.shape)} do not match {len(state_ids)} state ids"
        )
    target = torch.zeros(probs.shape, dtype=torch.float64, device=probs.device)
    target[:, torch.as_tensor(list(state_ids), device=probs.device)] = rows.to(probs.device, torch.float64)
    return total_variation(probs.double(), target)


class MarkovChainTask(Task):
    """Sequences of a random sparse Markov chain, plus new tokens defined by dictionaries of old states.

    Old rows: ``prompt`` = the first ``prompt_length`` states, ``completion`` = the next ``length -
    prompt_length`` (``answer`` = the completion; the chain is random, so exact match means nothing here: read
    the loss). New-token rows (:meth:`new_token_example`) have the same length with one state replaced by a new
    token, whose successor follows ``P'_j``.

    Args:
        num_states, support, concentration: the chain (:class:`MarkovChain`); at most ``len(STATE_ALPHABET)`` (88).
        length: states per sequence.
        prompt_length: states in the prompt (>= 1).
        chain_seed: seed of the chain and of the new tokens' dictionaries (fixed across data seeds).
        num_new_tokens, dictionary_size, dictionary_weights: the new tokens (:class:`NewTokens`).
        new_token_format: the new tokens' strings (``{}`` is the index).
    """

    name = "markov"

    def __init__(
        self,
        num_states: int = 64,
        support: int = 8,
        concentration: float = 1.0,
        length: int = 32,
        prompt_length: int = 4,
        chain_seed: int = 0,
        num_new_tokens: int = 8,
        dictionary_size: int = 4,
        dictionary_weights: str = "dirichlet",
        new_token_format: str = "<v{}>",
    ) -> None:
        if num_states > len(STATE_ALPHABET):
            raise ConfigError(f"num_states={num_states}: at most {len(STATE_ALPHABET)} states (one character each)")
        if not 1 <= prompt_length <= length - 2:
            raise ConfigError(
                f"need 1 <= prompt_length <= length - 2, got prompt_length={prompt_length}, length={length}"
            )
        if "{}" not in new_token_format:
            raise ConfigError(f"new_token_format={new_token_format!r} must contain '{{}}' (the token index)")
        self.num_states = num_states
        self.support = support
        self.concentration = concentration
        self.length = length
        self.prompt_length = prompt_length
        self.chain_seed = chain_seed
        self.num_new_tokens = num_new_tokens
        self.dictionary_size = dictionary_size
        self.dictionary_weights = dictionary_weights
        self.new_token_format = new_token_format
        self._chain = MarkovChain(num_states, support, concentration, chain_seed)
        self._new = NewTokens(self._chain, num_new_tokens, dictionary_size, dictionary_weights, chain_seed + 1)

    # -- what the vocabulary extension reads ----------------------------------------------------------------------
    @property
    def chain(self) -> MarkovChain:
        return self._chain

    @property
    def new(self) -> NewTokens:
        """The new tokens' dictionaries, weights and true successor rows."""
        return self._new

    @property
    def new_tokens(self) -> list[str]:
        """The new tokens' strings."""
        return [self.new_token_format.format(j) for j in range(self.num_new_tokens)]

    @property
    def dictionaries(self) -> list[list[str]]:
        """Each new token's dictionary as old token strings (characters)."""
        return [[STATE_ALPHABET[i] for i in d] for d in self._new.dictionaries]

    def text(self, states: list[int]) -> str:
        """The characters of a state sequence."""
        return "".join(STATE_ALPHABET[s] for s in states)

    # -- rows -----------------------------------------------------------------------------------------------------
    def sample(self, rng: random.Random) -> Example:
        text = self.text(self._chain.sample(rng, self.length))
        completion = text[self.prompt_length :]
        return Example(text[: self.prompt_length], completion, completion)

    def new_token_example(self, rng: random.Random, token: int | None = None) -> Example:
        """A sequence of ``length`` tokens with new token ``token`` (uniform when ``None``) at a uniform position
        ``k`` in ``[prompt_length, length - 2]``: ``prompt`` = ``k`` old states + the new token, ``completion`` =
        its successor (``~ P'_j``) and the chain onwards. Meta: ``new_token`` (string), ``new_token_index``."""
        j = rng.randrange(self.num_new_tokens) if token is None else int(token)
        k = rng.randint(self.prompt_length, self.length - 2)
        prefix = self._chain.sample(rng, k)
        rest = self._chain.sample(rng, self.length - k - 1, start=self._new.step(rng, j))
        completion = self.text(rest)
        prompt = self.text(prefix) + self.new_tokens[j]
        return Example(prompt, completion, completion, {"new_token": self.new_tokens[j], "new_token_index": j})

    def successor_context(self, rng: random.Random, token: int | None = None) -> tuple[str, Tensor]:
        """A context and the true distribution of what follows it: ``k`` chain states (``k`` uniform in
        ``[prompt_length, length - 2]``, as in :meth:`new_token_example`), then new token ``token`` (row
        ``P'_token``), or, with ``token=None``, nothing more (row ``P_i`` of the last state ``i``).

        Returns:
            the context text and its ``[T]`` float64 successor row.
        """
        prefix = self._chain.sample(rng, rng.randint(self.prompt_length, self.length - 2))
        if token is None:
            return self.text(prefix), self._chain.transition[prefix[-1]]
        return self.text(prefix) + self.new_tokens[int(token)], self._new.rows[int(token)]


class NewTokenSource(GeneratedSource):
    """Rows with one transition out of a new token each, balanced over the new tokens (row ``r`` uses token
    ``r mod m``): ``n`` training rows = ``n`` new-token transitions.

    Args:
        task: a task with ``new_token_example(rng, token)`` and ``num_new_tokens`` (:class:`MarkovChainTask`).
        num_train, num_val, num_test: rows per split.
        seed: base seed (splits are disjoint draws, and differ from the task's old-chain draws of the same seed).
    """

    seed_offset = 7919

    def __init__(
        self, task: MarkovChainTask, num_train: int = 256, num_val: int = 64, num_test: int = 64, seed: int = 0
    ):
        super().__init__(num_train, num_val, num_test, seed)
        if not callable(getattr(task, "new_token_example", None)):
            raise ConfigError(f"task '{getattr(task, 'name', task)}' defines no new tokens (no new_token_example)")
        self.task = task

    def generate(self, split: str, size: int) -> list[Row]:
        rng = random.Random(self.split_seed(split))
        return [self.task.new_token_example(rng, r % self.task.num_new_tokens).as_row() for r in range(size)]

    def describe(self) -> dict[str, Any]:
        return {"kind": "new_tokens", "task": self.task.describe(), "sizes": self.sizes, "seed": self.seed}


__all__ = [
    "DICTIONARY_WEIGHTS",
    "STATE_ALPHABET",
    "MarkovChain",
    "MarkovChainTask",
    "NewTokenSource",
    "NewTokens",
    "state_token_ids",
    "total_variation",
    "transition_tv",
]
