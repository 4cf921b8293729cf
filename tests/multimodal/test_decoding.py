"""Decoding through the decoder seam on multimodal modules: the structure LM (``inputs_embeds`` prefill) and VaLR
(latent decoding on a vision-language backbone), each pinned against an independent uncached greedy re-forward,
plus processors and hooks composing with both."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from transformers import SuppressTokensLogitsProcessor

from zoo.backbones import TinyBackbone
from zoo.backbones.vlm import TinyVLMBackbone
from zoo.data.structures import STRUCTURE_TOKEN, make_structure_samples
from zoo.data.visual import VisualCounting, VisualSource
from zoo.datamodules.structures import structure_batch_from_samples
from zoo.datamodules.visual import VisualReasoningDataModule
from zoo.errors import ConfigError
from zoo.generation import ModuleHook, SampleDecoder, StepwiseDecoder
from zoo.modules.structure_lm import StructureLMModule
from zoo.modules.valr import VaLRModule
from zoo.multimodal.cuttlefish import CuttlefishConnector
from zoo.multimodal.valr import LatentDecoder

torch.set_num_threads(1)
K = 3


# -- structure LM ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def structure_lm():
    torch.manual_seed(0)
    module = StructureLMModule(
        TinyBackbone(hidden_size=64, intermediate_size=128, num_hidden_layers=2, extra_tokens=[STRUCTURE_TOKEN]),
        connector=functools.partial(CuttlefishConnector, rho=0.2, k_max=16, num_fusion_blocks=1, num_heads=4),
        encoder={"hidden": 32, "num_layers": 2, "num_rbf": 16, "rbf_cutoff": 8.0},
        encoder_init="random",
        stage="llm_adaptation",
        generation={"max_new_tokens": 10},
    )
    module.configure_model()
    for name, p in module.model.named_parameters():  # non-zero LoRA B: the adapted model differs from the base
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    module.eval()
    batch = structure_batch_from_samples(make_structure_samples(6, seed=11), module.tokenizer)
    return module, batch


@torch.no_grad()
def reference_structure_greedy(module, batch, max_new_tokens):
    """Per row, no padding, no cache: re-forward [prompt embeddings with structure tokens; generated embeddings]."""
    _, ins = module.embed_inputs(
        batch["prompt_ids"], batch["prompt_attention_mask"], batch["structures"], padding_side="left"
    )
    embed = module.model.get_input_embeddings()
    eos = module.tokenizer.eos_token_id
    rows = []
    for r in range(ins.inputs_embeds.shape[0]):
        seq = ins.inputs_embeds[r][ins.attention_mask[r].bool()][None]
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(module.model(inputs_embeds=seq).logits[0, -1].argmax())
            out.append(token)
            if token == eos:
                break
            seq = torch.cat([seq, embed(torch.tensor([[token]]))], 1)
        rows.append(out)
    return rows


def test_structure_lm_greedy_equals_the_uncached_reference(structure_lm):
    module, batch = structure_lm
    assert isinstance(module.decoder, SampleDecoder)
    result, out = module.generate_with_structures(
        batch["prompt_ids"], batch["prompt_attention_mask"], batch["structures"]
    )
    expected = reference_structure_greedy(module, batch, 10)
    got = [row[: int(n)].tolist() for row, n in zip(result.completion_ids, result.lengths)]
    assert got == expected
    assert torch.equal(result.prompt_ids, batch["prompt_ids"])
    assert len(set(map(tuple, got))) > 1, "rows must differ (structures reach the LLM)"


def test_structure_lm_decodes_with_the_processors_and_decoder_it_is_given(structure_lm):
    module, batch = structure_lm
    args = (batch["prompt_ids"], batch["prompt_attention_mask"], batch["structures"])
    free, _ = module.generate_with_structures(*args)
    banned = int(torch.mode(free.completion_ids[free.completion_mask.bool()]).values)
    module.decoder.processors.append(SuppressTokensLogitsProcessor([banned]))
    try:
        banned_out, _ = module.generate_with_structures(*args)
    finally:
        module.decoder.processors.clear()
    assert not bool((banned_out.completion_ids[banned_out.completion_mask.bool()] == banned).any())
    stepwise = StepwiseDecoder(warn_no_delimiter=False)
    module.decoder, original = stepwise, module.decoder
    try:
        again, _ = module.generate_with_structures(*args)
    finally:
        module.decoder = original
    assert torch.equal(again.completion_ids, free.completion_ids)


# -- VaLR --------------------------------------------------------------------------------------------------------------
SMALL_VLM = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "vision_hidden_size": 16}


class BiasToken(nn.Module):
    """Wraps an LM head and adds ``bias`` to one token's logit (makes latent segments happen on a random model)."""

    def __init__(self, inner: nn.Module, token: int, bias: float) -> None:
        super().__init__()
        self.inner, self.token, self.bias = inner, token, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.inner(x).clone()
        logits[..., self.token] += self.bias
        return logits


@pytest.fixture(scope="module")
def vlm_batch():
    backbone = TinyVLMBackbone(**SMALL_VLM, vision_layers=1)
    dm = VisualReasoningDataModule(backbone.tokenizer, VisualSource(VisualCounting(), 12, 4, 4, seed=3), batch_size=3)
    dm.setup("fit")
    return backbone, next(iter(dm.train_dataloader()))


def _valr(backbone, stage: str, **kw) -> VaLRModule:
    module = VaLRModule(
        backbone,
        stage=stage,
        num_latents=K,
        align_weight=0.0,
        align_layer=1,
        max_latent_segments=2,
        generation={"max_new_tokens": 24},
        **kw,
    )
    module.configure_model()
    module.model.lm_head = BiasToken(module.model.lm_head, module.token_ids["latent_start_id"], 0.7)
    module.eval()
    return module


@torch.no_grad()
def reference_latent_greedy(module, batch, max_new_tokens, num_latents, max_segments):
    """Per row, no padding, no cache: re-forward [prompt embeddings; fed vectors] with the image every step; a
    latent slot feeds the previous position's last hidden state through the module's latent feedback ``f``,
    ``</latent>`` follows K slots. Returns per row the
    tokens and their log-probs (0 on forced tokens), and the segment counts."""
    model, tok = module.model, module.tokenizer
    ids = module.token_ids
    start, end, slot = ids["latent_start_id"], ids["latent_end_id"], ids["latent_slot_id"]
    embed = model.get_input_embeddings()
    rows, logprobs, segments = [], [], []
    for r in range(batch["prompt_ids"].shape[0]):
        prompt = batch["prompt_ids"][r][batch["prompt_attention_mask"][r].bool()]
        seq = embed(prompt[None])
        out: list[int] = []
        lps: list[float] = []
        remaining, force_end, count = 0, False, 0
        for _ in range(max_new_tokens):
            res = model(inputs_embeds=seq, pixel_values=batch["pixel_values"][r : r + 1], output_hidden_states=True)
            logits, last = res.logits[0, -1].float(), res.hidden_states[-1][0, -1]
            if remaining:
                token, vec, lp = slot, module.feedback(last, embed) if module.feedback is not None else last, 0.0
                remaining -= 1
                force_end = remaining == 0
            elif force_end:
                token, force_end, lp = end, False, 0.0
                vec = embed(torch.tensor(token))
            else:
                logits[slot] = float("-inf")
                if num_latents:
                    logits[end] = float("-inf")
                    if count >= max_segments:
                        logits[start] = float("-inf")
                token = int(logits.argmax())
                lp = float(torch.log_softmax(logits, -1)[token])
                vec = embed(torch.tensor(token))
                if token == start and num_latents:
                    remaining, count = num_latents, count + 1
            out.append(token)
            lps.append(lp)
            if token == tok.eos_token_id:
                break
            seq = torch.cat([seq, vec[None, None]], 1)
        rows.append(out)
        logprobs.append(lps)
        segments.append(count)
    return rows, logprobs, segments


@pytest.mark.parametrize("stage", ["latent", "cot"])
def test_valr_decoding_equals_the_uncached_reference(vlm_batch, stage):
    backbone, batch = vlm_batch
    module = _valr(backbone, stage)
    assert isinstance(module.decoder, LatentDecoder)
    result = module.generate_latent(batch)
    k = K if stage == "latent" else 0
    expected, expected_lp, segments = reference_latent_greedy(module, batch, 24, k, 2)
    got = [row[: int(n)].tolist() for row, n in zip(result.completion_ids, result.lengths)]
    assert got == expected
    for row, n, lps in zip(result.logprobs, result.lengths, expected_lp):
        torch.testing.assert_close(row[: int(n)], torch.tensor(lps), atol=1e-4, rtol=0)
    assert result.num_latent_segments.tolist() == segments
    if stage == "latent":
        assert all(s == 2 for s in segments), "the test must exercise latent segments (and the segment cap)"
        assert any(len(r) > 2 * (K + 2) for r in got), "and language tokens after them"


def test_valr_latent_decoding_composes_with_processors_and_hooks(vlm_batch):
    backbone, batch = vlm_batch
    module = _valr(backbone, "latent")
    free = module.generate_latent(batch)
    text_tokens = free.completion_ids[free.completion_mask.bool()]
    special = set(module.token_ids.values())
    banned = int(torch.mode(text_tokens[[int(t) not in special for t in text_tokens]]).values)
    calls: list[int] = []
    module.decoder.processors.append(SuppressTokensLogitsProcessor([banned]))
    module.decoder.hooks.append(ModuleHook("lm_head", lambda m, args, out: calls.append(1)))
    out = module.validation_step(batch, 0)
    assert calls and not module.model.lm_head._forward_hooks
    assert not bool((out["completion_ids"] == banned).any())
    assert out["meta"]["correct"] and len(out["texts"]) == batch["prompt_ids"].shape[0]


def test_valr_rejects_a_decoder_without_a_latent_loop(vlm_batch):
    backbone, _ = vlm_batch
    with pytest.raises(ConfigError, match="module/decoder=sample"):
        VaLRModule(backbone, stage="latent", num_latents=K, align_weight=0.0, decoder=StepwiseDecoder())

    def unchanged(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores

    module = VaLRModule(backbone, stage="cot", align_weight=0.0, decoder=SampleDecoder(processors=[unchanged]))
    assert isinstance(module.decoder, LatentDecoder) and module.decoder.processors == [unchanged]
    assert module.decoder.num_latents == 0
