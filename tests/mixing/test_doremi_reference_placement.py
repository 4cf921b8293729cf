"""DoReMi's reference model runs where the proxy runs and in its compute dtype (DESIGN "Scale": auxiliary models sit
next to the policy), unless ``reference_device`` / ``reference_dtype`` say otherwise. Real tiny Llama proxy and
reference (saved in float32), real Trainer (``tests/mixing/doremi_ddp_worker.py``'s builders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from zoo.callbacks import DoReMiReweighting
from zoo.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent))
import doremi_ddp_worker as worker

sys.path.remove(str(Path(__file__).parent))


def test_the_reference_follows_the_proxys_dtype_and_device(tmp_path):
    reference = tmp_path / "reference"
    worker.save_reference(reference)
    tokenizer = worker.backbone(0).tokenizer
    batches = [worker.collate(tokenizer, step[0]) for step in worker.micro_batches(tokenizer)]
    # a float64 proxy (Lightning's 64-true converts the module) against a reference exported in float32
    doremi = worker.fit(tmp_path, reference, batches, precision="64-true")
    weights = list(doremi.reference.parameters())
    assert {p.dtype for p in weights} == {torch.float64}
    assert {p.device for p in weights} == {torch.device("cpu")}
    assert doremi.state.steps == len(worker.STEPS)  # the excess losses of both models in float64 drove the steps


def test_a_reference_dtype_that_is_not_a_float_dtype_is_one_message(tmp_path):
    with pytest.raises(ConfigError, match="reference_dtype='int8'"):
        DoReMiReweighting(tmp_path, tmp_path / "w.json", reference_dtype="int8")
