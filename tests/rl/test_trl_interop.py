"""The zoo's reward functions inside TRL's ``GRPOTrainer``: TRL decodes completions with ``skip_special_tokens=True``,
and the char tokenizer's reasoning tags survive it, so a correct ``<think>...</think>18`` scores 1 there as in the zoo.

The policy is a real ``LlamaForCausalLM`` whose weights make it a deterministic bigram chain (attention and MLP outputs
zeroed, one-hot embeddings, an ``lm_head`` that maps each token to its successor with a margin of 100 logits): it
writes ``<think>w</think>18<eos>`` after ``=``, whatever TRL samples with, so the test needs no trained policy."""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from zoo.backbones.tokenizer import build_char_tokenizer  # noqa: E402
from zoo.rl import ExactMatchReward, FormatReward  # noqa: E402

CHAIN = ["=", "<think>", "w", "</think>", "1", "8", "<eos>"]


def bigram_policy(tokenizer) -> LlamaForCausalLM:
    vocab = len(tokenizer)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    assert vocab <= config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, config.hidden_size))
        head = torch.zeros(vocab, config.hidden_size)
        ids = tokenizer.convert_tokens_to_ids(CHAIN)
        for current, following in zip(ids, ids[1:]):
            head[following, current] = 100.0 / config.hidden_size**0.5  # RMSNorm scales a one-hot row by sqrt(H)
        model.lm_head.weight.copy_(head)
    return model


def test_zoo_rewards_score_a_correct_completion_1_inside_trl_grpo(tmp_path):
    tokenizer = build_char_tokenizer()
    seen: list[str] = []

    def spy(prompts, completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-6,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    data = datasets.Dataset.from_dict({"prompt": ["9+9="] * 4, "answer": ["18"] * 4})
    trainer = trl.GRPOTrainer(
        model=bigram_policy(tokenizer),
        reward_funcs=[ExactMatchReward(), FormatReward(), spy],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.train()
    assert seen and set(seen) == {"<think>w</think>18"}
    logged = [row for row in trainer.state.log_history if "rewards/exact_match/mean" in row]
    assert len(logged) == 2
    for row in logged:
        assert row["rewards/exact_match/mean"] == 1.0 and row["rewards/format/mean"] == 1.0
