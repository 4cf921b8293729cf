"""The GRPO family on two gloo processes (CPU): ranks that pack their rows into different numbers of micro-batches
neither deadlock nor diverge, and the first update is the single-process update on the union of the ranks' rollouts.

The run is ``tests/rl/grpo_ddp_worker.py`` (a real Trainer with ``DDPStrategy``, tiny Llama, real tokenizer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo.modules.grpo import concat_rollouts

WORKER = Path(__file__).with_name("grpo_ddp_worker.py")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo_ddp")
    # rank 0 reads short prompts, rank 1 long ones
    short = [f"{i}+1=" for i in range(16)]
    long = ["+".join(str((i + k) % 10) for k in range(30)) + "=" for i in range(16)]
    for rank, prompts in enumerate((short, long)):
        (out / f"train{rank}.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, env=env, timeout=300, cwd=out
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.distributed
def test_ranks_with_different_micro_batch_counts_train_in_step(ddp_run):
    rank0, rank1 = ddp_run
    assert rank0["steps"] == rank1["steps"] == 4
    # the case that deadlocked: the default token budget packed the ranks' rows into different counts
    assert rank0["packed"] != rank1["packed"]
    for name, value in rank0["final"].items():
        assert torch.equal(value, rank1["final"][name]), name
    assert any(not torch.equal(v, rank0["initial"][k]) for k, v in rank0["final"].items())
    # each rank samples its own completions (the rank is part of the rollout seed): with the same random stream the
    # first sampled tokens would mostly agree
    first0, first1 = (r["rollout"]["result"].completion_ids[:, 0] for r in ddp_run)
    assert (first0 != first1).float().mean() > 0.5


@pytest.mark.distributed
def test_first_update_is_the_single_process_update_on_the_union_of_rollouts(ddp_run):
    sys.path.insert(0, str(WORKER.parent))
    try:
        from grpo_ddp_worker import build_module
    finally:
        sys.path.remove(str(WORKER.parent))
    rank0, rank1 = ddp_run
    module = build_module()
    module.configure_model()
    module.model.load_state_dict(rank0["initial"])
    merged = concat_rollouts([rank0["rollout"], rank1["rollout"]], module.tokenizer.pad_token_id)
    rows = module.sequences(merged["result"], merged["prompt_mask"])
    module.policy_gradients(rows, merged["advantages"], None)
    for name, param in module.model.named_parameters():
        assert torch.equal(rank0["grads"][name], rank1["grads"][name]), name
        torch.testing.assert_close(rank0["grads"][name], param.grad, atol=1e-6, rtol=1e-4, msg=name)
