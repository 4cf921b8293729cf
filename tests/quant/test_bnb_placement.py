"""bitsandbytes under a real run: the 4-bit matmuls follow the run's precision (``quant.compute_dtype:
${trainer.precision}``) and the quantized model loads on this process's GPU (one replica per DDP rank), never spread
over every GPU by ``device_map="auto"``."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from zoo.errors import ConfigError
from zoo.quant.bnb import BnbQuantizer


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], torch.float32),
        (["backbone.dtype=bfloat16"], torch.bfloat16),  # trainer.precision follows: bf16-mixed
        (["trainer.precision=16-mixed"], torch.float16),
        (["trainer.precision=bf16-true"], torch.bfloat16),
    ],
)
def test_compute_dtype_follows_the_runs_precision(train_cfg, overrides, expected):
    cfg = train_cfg(["quant=bnb_nf4", *overrides])
    quantizer = instantiate(cfg.quant)
    assert quantizer.compute_dtype == expected
    assert quantizer.quantization_config().bnb_4bit_compute_dtype == expected


def test_a_compute_dtype_that_is_neither_dtype_nor_precision_is_one_message():
    with pytest.raises(ConfigError, match="quant.compute_dtype='int8'.*trainer.precision"):
        BnbQuantizer("nf4", compute_dtype="int8")


@pytest.mark.parametrize(("env", "device"), [({"LOCAL_RANK": "1"}, "cuda:1"), ({"SLURM_LOCALID": "3"}, "cuda:3")])
def test_device_map_is_the_local_ranks_gpu(monkeypatch, env, device):
    """CUDA availability is faked (no GPU here; tests/gpu loads for real): the map names the rank's own device."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert BnbQuantizer("nf4").resolved_device_map() == {"": device}
    assert BnbQuantizer("nf4", device_map="auto").resolved_device_map() == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert BnbQuantizer("nf4").resolved_device_map() == "cpu"
