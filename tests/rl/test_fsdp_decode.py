"""Decoding on a model sharded by FSDP (two gloo processes, CPU): ranks whose rows finish at different steps stop
together (:mod:`zoo.generation.lockstep`), and the wrap policy shards the model's own decoder layers.

The run is ``tests/rl/fsdp_decode_worker.py`` (a real Trainer with Lightning's ``FSDPStrategy``, tiny Llama, real
tokenizer). Before the agreement, rank 0 returned after one step and rank 1's next forward waited on an all-gather
until the timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from zoo.backbones.sharding import DecoderLayerWrapPolicy

WORKER = Path(__file__).with_name("fsdp_decode_worker.py")


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_decode")
    for rank in (0, 1):
        prompts = [f"{i}+{rank}=" for i in range(8)]
        (out / f"train{rank}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, env=env, timeout=300, cwd=out
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.distributed
def test_ranks_whose_rows_finish_at_different_steps_decode_in_step(fsdp_run):
    rank0, rank1 = fsdp_run
    assert "LlamaDecoderLayer" in rank0["wrapped"]  # every forward all-gathers each layer
    for b0, b1 in zip(rank0["batches"], rank1["batches"]):
        # rank 0 stopped after its first token, rank 1 ran the whole budget
        assert b0["width"] == 1 and b1["width"] == 24
        assert all(t == "=" for t in b0["texts"])
        # the finished rank ran as many forwards as the other (its own plus dummy ones), and both returned
        assert b0["forwards"] == b1["forwards"] >= 24


def test_wrap_policy_reads_the_decoder_layer_class_of_the_model():
    config = Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    policy = DecoderLayerWrapPolicy()
    wrapped = []

    def visit(module: torch.nn.Module) -> None:  # FSDP's order: a parent (recurse=True) before its children
        policy(module, recurse=True, nonwrapped_numel=0)
        for child in module.children():
            visit(child)
            if policy(child, recurse=False, nonwrapped_numel=0):
                wrapped.append(type(child).__name__)

    visit(model)
    assert wrapped == ["Qwen2DecoderLayer", "Qwen2DecoderLayer"]
    override = DecoderLayerWrapPolicy(layers="Qwen2MLP")
    assert override(model.model.layers[0].mlp, recurse=False, nonwrapped_numel=0)
    assert not override(model.model.layers[0], recurse=False, nonwrapped_numel=0)
