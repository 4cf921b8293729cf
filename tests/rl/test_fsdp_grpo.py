"""GRPO on a model sharded by FSDP (two gloo processes, CPU).

* Decoding: ranks whose rows finish at different steps stop together (:mod:`zoo.generation.lockstep`), and the wrap
  policy shards the model's own decoder layers. Before the agreement, rank 0 returned after one step and rank 1's
  next forward waited on an all-gather until the timeout.
* Training: rollout steps with gradient clipping and a KL reference, the policy the FSDP root
  (:func:`zoo.backbones.sharding.shard` in ``GRPOModule.configure_model``). Before, Lightning wrapped the
  LightningModule: the first ``manual_backward`` failed (the root unit was still in its forward state after the
  policy's forwards), and Lightning's FSDP precision plugin refuses norm-based gradient clipping.

The runs are ``tests/rl/fsdp_worker.py`` (a real Trainer with Lightning's ``FSDPStrategy``, tiny Llama, real
tokenizer).
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

WORKER = Path(__file__).with_name("fsdp_worker.py")


def run_worker(out: Path, modes: str) -> None:
    """Run the two-rank worker once through ``modes`` (``decode,fit``) on 8 prompts per rank; each mode's records
    land in ``out/<mode>/``."""
    for rank in (0, 1):
        prompts = [f"{i}+{rank}=" for i in range(8)]
        (out / f"train{rank}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out), modes], capture_output=True, text=True, env=env, timeout=300, cwd=out
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def records(out: Path) -> list[dict]:
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.fixture(scope="module")
def fsdp_out(tmp_path_factory) -> Path:
    """Decoding, then training, in one 2-process launch (the second Trainer reuses the first's process group)."""
    out = tmp_path_factory.mktemp("fsdp")
    run_worker(out, "decode,fit")
    return out


@pytest.fixture(scope="module")
def fsdp_run(fsdp_out):
    return records(fsdp_out / "decode")


@pytest.fixture(scope="module")
def fsdp_fit(fsdp_out):
    return records(fsdp_out / "fit"), torch.load(fsdp_out / "fit" / "last.ckpt", weights_only=True)


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


@pytest.mark.distributed
def test_grpo_trains_under_fsdp_with_clipping_and_a_reference_on_the_module_device(fsdp_fit):
    (rank0, rank1), checkpoint = fsdp_fit
    # the policy is the FSDP root (its root unit holds the embeddings and the head), each decoder layer a unit
    assert rank0["wrapped"] == ["LlamaForCausalLM", "LlamaDecoderLayer", "LlamaDecoderLayer"]
    assert rank0["steps"] == rank1["steps"] == 2
    for record in (rank0, rank1):
        # every update was clipped to max_grad_norm (the global norm over both ranks' shards, far above it before)
        assert len(record["clipped_norms"]) == 2
        assert record["clipped_norms"] == pytest.approx([record["max_grad_norm"]] * 2, rel=1e-3)
        assert record["reference_device"] == record["module_device"]
    assert rank0["initial"].keys() == rank0["final"].keys() == rank1["final"].keys()
    changed = [k for k in rank0["initial"] if not torch.equal(rank0["initial"][k], rank0["final"][k])]
    assert len(changed) > len(rank0["initial"]) // 2
    for key, value in rank0["final"].items():
        assert torch.equal(value, rank1["final"][key]), key
        assert torch.equal(checkpoint["state_dict"][f"model.{key}"], value), key  # the checkpoint gathers the shards


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
