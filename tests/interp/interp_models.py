"""Small random models of every registered architecture for the interpretability tests.

Weights are re-drawn with a larger scale than the default init (std 0.2) so that greedy decoding does not
repeat one token and steering visibly changes the outputs; everything is seeded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from zoo.backbones import TinyBackbone
from zoo.backbones.tokenizer import build_char_tokenizer

ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")
WIDTH, LAYERS, HEADS, KV_HEADS = 32, 3, 4, 2


def liven(model: PreTrainedModel, seed: int = 0, std: float = 0.2) -> PreTrainedModel:
    """Re-draw every matrix (linear/embedding weights) from N(0, std^2) with a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, param in sorted(model.named_parameters()):
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model.eval()


def build_model(arch: str, seed: int = 0) -> PreTrainedModel:
    """A random ``arch`` model over the character tokenizer (``llama`` is the zoo's tiny backbone, with GQA)."""
    tok = build_char_tokenizer()
    common = {
        "vocab_size": len(tok),
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    sizes = {
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
    }
    if arch == "llama":
        model = TinyBackbone(**sizes, seed=seed).build_model()
    elif arch in ("qwen2", "mistral"):
        config_cls, model_cls = {
            "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM),
        }[arch]
        model = model_cls(config_cls(**sizes, max_position_embeddings=256, **common))
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=256, **common))
    else:
        raise ValueError(arch)
    return liven(model, seed)


def saved_and_loaded(arch: str, directory: Path, seed: int = 0) -> PreTrainedModel:
    """``build_model`` written with ``save_pretrained`` and read back through ``from_pretrained`` (the HF path)."""
    build_model(arch, seed).save_pretrained(directory)
    return AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()


def uncached_greedy_check(model, prompt_ids, prompt_mask, completion, step_logits, completion_mask=None) -> None:
    """Re-forward ``prompt + completion[:t]`` without a cache at every step ``t`` (the first generated token
    included); the cached decode's logits of that step must match and its token must be the greedy one."""
    from zoo.interp.hooks import forward_left_padded

    for t in range(completion.shape[1]):
        if completion_mask is None:
            active = torch.ones(completion.shape[0], dtype=torch.bool)
            done_mask = torch.ones_like(completion[:, :t])
        else:
            active, done_mask = completion_mask[:, t].bool(), completion_mask[:, :t]
        ids = torch.cat([prompt_ids, completion[:, :t]], 1)
        mask = torch.cat([prompt_mask, done_mask], 1)
        with torch.no_grad():
            ref = forward_left_padded(model, ids, mask)[:, -1]
        torch.testing.assert_close(step_logits[t][active], ref[active], atol=1e-4, rtol=0)
        assert torch.equal(ref.argmax(-1)[active], completion[active, t]), f"step {t}"


def record_step_logits(model) -> tuple[list, object]:
    """Collect the last-position logits of every forward call (one per decode step); returns (list, handle)."""
    logits: list = []
    handle = model.register_forward_hook(lambda m, a, out: logits.append(out.logits[:, -1].float()))
    return logits, handle


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """These tests run many tiny ops; one intra-op thread avoids thread-contention stalls on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def quiet_trainer(*callbacks, **kwargs):
    """A CPU ``lightning.pytorch.Trainer`` without logger, checkpoints, progress bar or summary (plain-Lightning
    tests of the callbacks)."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kwargs,
    )


def no_hooks_left(model) -> bool:
    """Whether no forward (pre-)hook is registered on any submodule."""
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
