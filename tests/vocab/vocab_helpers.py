"""Helpers of the vocabulary-extension tests: the tiny Llama (tied and untied), a tiny GPT-2 with a byte-level
BPE fast tokenizer saved locally with ``save_pretrained`` (tied input/output embeddings), and a training loop.

(Plain functions: a second ``conftest.py`` would clash with ``tests/conftest.py`` under the same module name.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from zoo.backbones import TinyBackbone

SMALL_LLAMA = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}
CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park and the cat slept",
    "models read tokens and predict the next token",
    "new words need new rows in the embedding matrix",
] * 4


def tiny_llama(tie: bool = True) -> tuple[TinyBackbone, torch.nn.Module]:
    """``(backbone, model in eval mode)`` of a small tiny Llama (deterministic weights)."""
    backbone = TinyBackbone(**SMALL_LLAMA, tie_word_embeddings=tie)
    return backbone, backbone.build_model().eval()


def save_tiny_gpt2(directory: Path) -> Path:
    """Write a tiny GPT-2 (tied embeddings) and a byte-level BPE fast tokenizer with ``save_pretrained``."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]
    )
    backend.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tokenizer.save_pretrained(directory)
    eos = tokenizer.eos_token_id
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=eos, eos_token_id=eos
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def load_tiny_gpt2(directory: Path) -> tuple[PreTrainedTokenizerFast, torch.nn.Module]:
    """``(tokenizer, model in eval mode)`` loaded from a directory written by :func:`save_tiny_gpt2`."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    return tokenizer, model


def train_steps(
    model: torch.nn.Module,
    parameters: Sequence[torch.nn.Parameter],
    input_ids: torch.Tensor,
    steps: int = 5,
    lr: float = 0.05,
    weight_decay: float = 0.1,
    **forward_kwargs: torch.Tensor,
) -> None:
    """A few AdamW steps (weight decay > 0) of next-token loss on ``input_ids`` (dropout on, then eval mode)."""
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=input_ids, **forward_kwargs).logits[:, :-1]
        targets = input_ids[:, 1:]
        targets = targets.masked_fill(targets >= logits.shape[-1], -100)  # tokens the model cannot emit
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
