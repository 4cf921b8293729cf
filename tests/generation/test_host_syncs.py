"""Host synchronisations per generated token of each decoder, pinned (docs/scale.md, "Host synchronisations").

On an accelerator every tensor-to-Python conversion (``.item()``, ``.tolist()``, ``.cpu()``, ``bool``/``int``/
``float`` of a tensor, ``nonzero``) waits for the device, so their number per generated token bounds how well decoding
keeps the GPU busy. The test counts them (patched ``torch.Tensor`` methods; the model's own included) over two short
greedy decodes of the tiny backbone of 8 and 24 tokens, and pins the count per extra token: the per-token loop may
not gain a synchronisation without this number (and the docs) being raised on purpose.

The semantic watermark decoder runs with ``max_trials=1`` (greedy, one candidate per sentence: every sampled token is
kept), so its number is per *sampled* token; with rejection sampling each kept token costs that times the candidate
tokens sampled per kept one (``WatermarkGenerationResult.sampled_tokens``), plus one encoder call per round."""

from __future__ import annotations

import collections

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompts
from zoo.generation import DTSDecoder, GreedyDecoder, SampleDecoder, StepwiseDecoder, UndoDecoder
from zoo.protocols import SamplingParams
from zoo.watermark import HashingEncoder, LSHPartitioner, SemanticWatermarkDecoder, WatermarkScheme

#: tensor-to-host conversions per generated token (measured; docs/scale.md keeps the same table)
HOST_SYNCS_PER_TOKEN = {"sample": 3, "greedy": 3, "stepwise": 3, "dts": 7, "undo": 9, "watermark": 5}

CONVERSIONS = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero")

DECODERS = {
    "sample": lambda: SampleDecoder(),
    "greedy": lambda: GreedyDecoder(),
    "stepwise": lambda: StepwiseDecoder(warn_no_delimiter=False),
    "dts": lambda: DTSDecoder(),
    "undo": lambda: UndoDecoder(),
    "watermark": lambda: SemanticWatermarkDecoder(lsh_scheme(), max_trials=1),
}


def lsh_scheme() -> WatermarkScheme:
    """A semantic watermark scheme without a model: hashing sentence embeddings, 8 LSH regions."""
    encoder = HashingEncoder(64)
    directions = torch.randn(32, encoder.dim, generator=torch.Generator().manual_seed(0))
    return WatermarkScheme(encoder, LSHPartitioner(8, seed=3).fit(directions), key=11, gamma=0.25)


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    backbone = TinyBackbone(seed=0, extra_tokens=["<UNDO>"])
    model = backbone.build_model().eval()
    tokenizer = backbone.tokenizer
    return model, tokenizer, encode_prompts(tokenizer, ["12+7=", "rev abc=", "3*4=", "9-2="])


def conversions(monkeypatch, decoder, model, tokenizer, batch, tokens: int, sample: bool) -> int:
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def counting(name):
        original = originals[name]

        def call(self, *args, **kwargs):
            counts[name] += 1
            return original(self, *args, **kwargs)

        return call

    params = SamplingParams(max_new_tokens=tokens, do_sample=sample)
    with monkeypatch.context() as patch:
        for name in CONVERSIONS:
            patch.setattr(torch.Tensor, name, counting(name))
        with torch.no_grad():
            out = decoder(model, tokenizer, *batch, params=params, generator=torch.Generator().manual_seed(0))
    assert int(out.completion_mask.sum(-1).max()) == tokens  # the decode ran its whole budget
    return sum(counts.values())


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_host_synchronisations_per_generated_token_stay_pinned(monkeypatch, setup, name):
    model, tokenizer, batch = setup
    decoder = DECODERS[name]()
    short, long = (conversions(monkeypatch, decoder, model, tokenizer, batch, n, name == "sample") for n in (8, 24))
    per_token = (long - short) / 16
    assert per_token <= HOST_SYNCS_PER_TOKEN[name], (
        f"{name}: {per_token:g} host synchronisations per generated token, pinned at {HOST_SYNCS_PER_TOKEN[name]}"
    )
