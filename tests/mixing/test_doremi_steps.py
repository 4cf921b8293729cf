"""DoReMi (arXiv 2305.10429): eta in the update (hand values), the official absent-domain rule (last score kept),
and one weight update per optimizer step from the step's pooled excess losses -- gradient accumulation and two DDP
processes give the weights of one batch twice as large. Real tiny Llama proxy and reference, real Trainer."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo.mixing import DoReMiWeights, doremi_update

sys.path.insert(0, str(Path(__file__).parent))
import doremi_ddp_worker as worker

sys.path.remove(str(Path(__file__).parent))


def test_eta_scales_the_exponentiated_gradient_step():
    # a' = softmax(log [0.5, 0.5] + 0.5 * [1, 0]) = [e^0.5, 1] / (1 + e^0.5); a = 0.9 a' + 0.1 / 2
    new = doremi_update(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), eta=0.5, smoothing=0.1)
    e = math.exp(0.5)
    assert new.tolist() == pytest.approx([0.9 * e / (1 + e) + 0.05, 0.9 / (1 + e) + 0.05], rel=1e-12)
    assert new[0].item() == pytest.approx(0.6102134, abs=1e-7)


@pytest.mark.parametrize("rule", ["keep_last", "zero"])
def test_absent_domains_keep_their_last_score_or_score_zero(rule):
    state = DoReMiWeights(2, eta=1.0, smoothing=0.0, absent_domains=rule, initial_score=0.3)
    first = state.step(torch.tensor([math.nan, 0.2])).clone()
    second = state.step(torch.tensor([0.4, math.nan])).clone()
    # keep_last: scores [0.3 (initial), 0.2] then [0.4, 0.2 (kept)]; zero: [0, 0.2] then [0.4, 0]
    scores = ([0.3, 0.2], [0.4, 0.2]) if rule == "keep_last" else ([0.0, 0.2], [0.4, 0.0])
    expected_first = torch.softmax(torch.tensor(scores[0], dtype=torch.float64), 0)
    expected_second = torch.softmax(torch.tensor(scores[0], dtype=torch.float64) + torch.tensor(scores[1]), 0)
    torch.testing.assert_close(first, expected_first)
    torch.testing.assert_close(second, expected_second)
    restored = DoReMiWeights(2, absent_domains=rule)
    restored.load_state_dict(state.state_dict())
    torch.testing.assert_close(restored.scores, state.scores)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("doremi") / "reference"
    worker.save_reference(directory)
    return directory


def one_batch_run(tmp_path, reference):
    """The reference trajectory: each step's two micro-batches as one batch."""
    tokenizer = worker.backbone(0).tokenizer
    steps = worker.micro_batches(tokenizer)
    return worker.fit(tmp_path, reference, [worker.collate(tokenizer, mb[0] + mb[1]) for mb in steps])


def test_accumulated_micro_batches_give_the_weights_of_one_batch_twice_as_large(tmp_path, reference):
    tokenizer = worker.backbone(0).tokenizer
    steps = worker.micro_batches(tokenizer)
    whole = one_batch_run(tmp_path, reference)
    accumulated = worker.fit(tmp_path, reference, [worker.collate(tokenizer, m) for mb in steps for m in mb], 2)
    assert whole.state.steps == accumulated.state.steps == len(worker.STEPS)  # one update per optimizer step
    torch.testing.assert_close(accumulated.state.current, whole.state.current, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(accumulated.state.average, whole.state.average, rtol=1e-6, atol=1e-9)
    assert (whole.state.current - 1 / 3).abs().max() > 1e-3  # the excess losses moved the weights


@pytest.mark.distributed
def test_two_ddp_processes_hold_the_weights_of_the_pooled_batch(tmp_path, reference):
    out = tmp_path / "ddp"
    out.mkdir()
    (out / "reference").symlink_to(reference)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(Path(worker.__file__)), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=out,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rank0, rank1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1
    whole = one_batch_run(tmp_path, reference)
    assert rank0["current"] == pytest.approx(whole.state.current.tolist(), rel=1e-6)
