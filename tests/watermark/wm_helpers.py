"""Helpers of the sentence-watermark tests: data, the hashing encoder, fitted partitions (built once per session).

Kept out of a ``conftest.py`` so the ``from conftest import ...`` of the other test folders stays unambiguous.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from zoo.text.topics import TopicGrammar
from zoo.watermark import BalancedPartitioner, HashingEncoder, KMeansPartitioner, LSHPartitioner, Partitioner

# small tensors: one intra-op thread avoids thread spinning on a shared machine (tens of times faster here)
torch.set_num_threads(1)

GRAMMAR = TopicGrammar()
ENCODER = HashingEncoder(128)
NUM_REGIONS = 8


def occupancy_entropy(regions: torch.Tensor, num_regions: int) -> float:
    """Entropy of the region histogram divided by ``log R`` (1 = perfectly even)."""
    p = torch.bincount(regions, minlength=num_regions).double() / regions.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum() / math.log(num_regions))


def anisotropic_gaussian(n: int, seed: int, dim: int = 24) -> torch.Tensor:
    """Points in a narrow cone, like sentence embeddings: a large common mean, variances decaying 100x."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -2, dim, dtype=torch.float64)
    mean = torch.zeros(dim, dtype=torch.float64)
    mean[:3] = torch.tensor([1.0, 0.6, -0.4], dtype=torch.float64)
    return (mean + torch.randn(n, dim, generator=g, dtype=torch.float64) * scales).float()


@cache
def corpus_embeddings() -> torch.Tensor:
    """Hashing embeddings ``[1200, 128]`` of a grammar corpus (seed 0)."""
    return ENCODER.encode(GRAMMAR.corpus(1200, seed=0))


@cache
def fitted(kind: str) -> Partitioner:
    """A fitted 8-region partition of each kind (``lsh``, ``kmeans``, ``balanced``) on :func:`corpus_embeddings`."""
    builders = {"lsh": LSHPartitioner, "kmeans": KMeansPartitioner, "balanced": BalancedPartitioner}
    return builders[kind](NUM_REGIONS, seed=1).fit(corpus_embeddings())


# -- a real tiny language model whose text a real logits processor shapes into sentences ---------------------------
SMALL_LM = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
LETTERS = "abcdefgh"


def small_backbone(**overrides):
    """A randomly initialised tiny Llama + the char tokenizer (real model, real tokenizer, fast on CPU)."""
    from zoo.backbones import TinyBackbone

    return TinyBackbone(**{**SMALL_LM, **overrides}, seed=0)


class SentenceShaper:
    """A logits processor (the decoder seam's convention) that makes a random tiny model write sentences.

    Only the letters a-h, the space and the period are allowed; after a period comes a space, after a space a
    letter; the period is favoured once a word has two letters. The model's own logits still decide which letter,
    so different rows and candidates write different words ("ab cfh de."): real sampling, shaped text. Rows whose
    context starts with ``end_prefix`` get EOS as their only allowed token (a model that ends the text at once); with
    ``end_bias`` they write shaped text as the other rows, but EOS is allowed and ``end_bias`` nats above the best
    other token (a model that wants to end the text at once, and can be kept from it by masking EOS).
    """

    def __init__(
        self, tokenizer, period_bias: float = 2.5, end_prefix: str | None = None, end_bias: float | None = None
    ) -> None:
        vocab = tokenizer.get_vocab()
        self.tokenizer = tokenizer
        self.letters = torch.tensor([vocab[c] for c in LETTERS])
        self.space, self.period = vocab[" "], vocab["."]
        self.eos = tokenizer.eos_token_id
        self.period_bias = period_bias
        self.end_bias = end_bias
        self.end_ids = tokenizer(end_prefix, add_special_tokens=False)["input_ids"] if end_prefix else None

    def _ends(self, row: torch.Tensor) -> bool:
        if self.end_ids is None:
            return False
        ids = [i for i in row.tolist() if i not in (self.tokenizer.pad_token_id, self.tokenizer.bos_token_id)]
        return ids[: len(self.end_ids)] == self.end_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, -torch.inf)
        for b in range(scores.shape[0]):
            last = int(input_ids[b, -1]) if input_ids.shape[1] else self.space
            ends = self._ends(input_ids[b])
            if ends and self.end_bias is None:
                out[b, self.eos] = 0.0
                continue
            if last == self.period:
                out[b, self.space] = 0.0
            elif last == self.space or last not in self.letters:
                out[b, self.letters] = scores[b, self.letters]
            else:
                out[b, self.letters] = scores[b, self.letters]
                out[b, self.space] = scores[b, self.letters].max()
                second = input_ids.shape[1] > 1 and int(input_ids[b, -2]) in self.letters
                if second:
                    out[b, self.period] = scores[b, self.letters].max() + self.period_bias
            if ends:
                out[b, self.eos] = out[b].max() + self.end_bias
        return out
