"""Checks that need a CUDA device (``pytest -m gpu``; skipped without one). ``benchmarks/gpu_check.sh`` runs them
with ``benchmarks/grpo_vs_trl.py`` and writes the figures into docs/benchmarks.md ("GPU check").

Covers what CPU tests cannot: a QLoRA bf16 GRPO step (4-bit CUDA kernels, beta > 0 through the adapters-disabled
reference) on a small HF model saved here with ``save_pretrained``; DTS and SafeThink decoding with the scorer placed
on the device; NanoQuant's forward on the device; the watermark decoder; a 2-GPU DDP GRPO step when two exist.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pytest -m gpu on a GPU machine)"),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A small Llama with the zoo's character tokenizer, written by save_pretrained (the backbone=hf path)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from zoo.backbones.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    path = tmp_path_factory.mktemp("hf_llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _trainer(**kwargs):
    import lightning.pytorch as pl

    options = {
        "accelerator": "gpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return pl.Trainer(**{**options, **kwargs})


def test_qlora_bf16_grpo_step_with_the_adapter_free_reference(hf_dir):
    from zoo.backbones import HFBackbone
    from zoo.data.sources import TaskSource
    from zoo.data.tasks import MultiSum
    from zoo.datamodules import PromptDataModule
    from zoo.lora import AdapterFreeReference
    from zoo.modules import GRPOModule
    from zoo.quant.bnb import BnbQuantizer, is_bnb_quantized
    from zoo.rl import ClippedPolicyLoss, ExactMatchReward

    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "gate_proj"]}
    module = GRPOModule(
        HFBackbone(str(hf_dir), dtype="bfloat16", lora=lora, gradient_checkpointing=True),
        rewards={"accuracy": ExactMatchReward()},
        quantizer=BnbQuantizer("nf4", compute_dtype="bf16-mixed"),
        policy_loss=ClippedPolicyLoss(beta=0.04),
        group_size=4,
        micro_batch_size=8,
        generation={"max_new_tokens": 24},
    )
    data = PromptDataModule(module.tokenizer, TaskSource(MultiSum(), num_train=16, num_val=4), batch_size=2)
    _trainer(max_steps=2, precision="bf16-mixed", limit_val_batches=0).fit(module, data)
    assert is_bnb_quantized(module.model) and isinstance(module.ref_model, AdapterFreeReference)
    assert next(module.model.parameters()).device.type == "cuda"
    lora_b = [p for n, p in module.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.dtype == torch.float32 for p in lora_b)
    assert any(p.abs().sum() > 0 for p in lora_b), "the adapters never moved"


def test_dts_and_safethink_decode_on_the_device_with_the_scorer_there(hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForSequenceClassification

    from zoo.backbones.tokenizer import build_char_tokenizer
    from zoo.encoding import encode_prompts
    from zoo.generation import DTSDecoder
    from zoo.protocols import SamplingParams
    from zoo.safety import SequenceClassifierScorer, safethink_generate

    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).cuda().eval()
    ids, mask = encode_prompts(tok, ["12+7=", "rev abc="], "cuda")
    out = DTSDecoder()(model, tok, ids, mask, params=SamplingParams(max_new_tokens=16))
    assert out.completion_ids.shape[0] == 2
    config = LlamaConfig(
        vocab_size=len(tok),
        num_labels=2,
        pad_token_id=tok.pad_token_id,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    scorer = SequenceClassifierScorer(LlamaForSequenceClassification(config), tok)
    from zoo.backbones.placement import place_auxiliary

    place_auxiliary(scorer.model, model)
    assert next(scorer.model.parameters()).device.type == "cuda" and scorer.model.dtype == torch.bfloat16
    result = safethink_generate(
        model,
        tok,
        ["12+7=", "rev abc="],
        scorer,
        tau=0.5,
        max_steps_monitored=2,
        params=SamplingParams(max_new_tokens=16),
        prompt_ids=ids,
        prompt_attention_mask=mask,
    )
    assert len(result.texts) == 2


def test_nanoquant_forward_on_the_device():
    import torch.nn.functional as F

    from zoo.quant.nanoquant import NanoQuantLinear

    g = torch.Generator().manual_seed(0)
    layer = NanoQuantLinear.from_factors(
        torch.randn(300, 64, generator=g),
        torch.randn(64, 260, generator=g),
        s_pre=torch.rand(260, generator=g) + 0.5,
        s_post=torch.rand(300, generator=g) + 0.5,
    ).cuda()
    assert layer.bit_shifts.device.type == "cuda"
    x = torch.randn(4, 260, device="cuda")
    with torch.no_grad():
        cached = layer(x)
        layer.set_forward("chunked", 32)
        chunked = layer(x)
    torch.testing.assert_close(chunked, cached, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(cached, F.linear(x, layer.dequantize()), rtol=1e-4, atol=1e-3)


def test_the_watermark_decoder_on_the_device(hf_dir):
    from transformers import AutoModelForCausalLM

    from zoo.backbones.tokenizer import build_char_tokenizer
    from zoo.encoding import encode_prompts
    from zoo.protocols import SamplingParams
    from zoo.watermark.decoder import SemanticWatermarkDecoder

    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(hf_dir).cuda().eval()
    ids, mask = encode_prompts(tok, ["Write: ", "Tell: "], "cuda")
    decoder = SemanticWatermarkDecoder(
        {"encoder": "hashing:64", "partition": {"kind": "lsh", "corpus_size": 100}}, max_trials=4, max_sentences=2
    )
    out = decoder(
        model,
        tok,
        ids,
        mask,
        params=SamplingParams(max_new_tokens=32, do_sample=True),
        generator=torch.Generator(device="cuda").manual_seed(0),
    )
    assert out.completion_ids.device.type == "cuda" and len(out.texts) == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_two_gpu_ddp_grpo_step(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        str(REPO / "train.py"),
        "+method=grpo",
        "trainer=ddp",
        "trainer.accelerator=gpu",
        "trainer.devices=2",
        "trainer.max_steps=2",
        "backbone.init_from=null",
        "module.group_size=4",
        "datamodule.batch_size=2",
        "module.generation.max_new_tokens=16",
        "trainer.val_check_interval=2",
        f"paths.log_dir={tmp_path}",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
