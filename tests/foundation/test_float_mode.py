"""The run's floating-point mode (``flush_denormal``, zoo.cli.train.float_mode): a job runs with denormal floats
flushed to zero by default, the process's earlier mode comes back after it, and the setting keys no artifact."""

from __future__ import annotations

import pytest
import torch

import zoo.cli.train as cli
from zoo.cli.artifacts import plan_artifact
from zoo.errors import ConfigError

TINY = torch.finfo(torch.float32).tiny


@pytest.fixture(autouse=True)
def keep_mode():
    before = cli.flushing_denormals()
    yield
    torch.set_flush_denormal(before)


@pytest.mark.parametrize("before", [False, True])
def test_float_mode_flushes_inside_and_restores_the_earlier_mode(train_cfg, before):
    torch.set_flush_denormal(before)
    for flush in (True, False):
        cfg = train_cfg([f"flush_denormal={str(flush).lower()}"])
        with cli.float_mode(cfg):
            assert cli.flushing_denormals() is flush
            # a product below the smallest normal float is 0 when flushing, a denormal otherwise
            product = (torch.tensor([TINY]) * 0.5).item()
            assert (product == 0.0) is flush and (flush or 0 < product < TINY)
        assert cli.flushing_denormals() is before


def test_a_job_runs_flushing_denormals_by_default(train_cfg, monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_run_stage", lambda cfg, start, mark: seen.append(cli.flushing_denormals()) or {})
    torch.set_flush_denormal(False)
    cli.run_job(train_cfg())
    cli.run_job(train_cfg(["flush_denormal=false"]))
    assert seen == [True, False] and not cli.flushing_denormals()


def test_flush_denormal_keys_no_artifact_and_refuses_a_non_boolean(train_cfg, tmp_path):
    def path(*overrides):
        return plan_artifact("probe", list(overrides), cache_dir=tmp_path, root_dir=tmp_path).path

    assert path("flush_denormal=true") == path("flush_denormal=false") == path()
    assert path("seed=1") != path()  # the key does read the config
    with pytest.raises(ConfigError, match=r"flush_denormal='maybe' must be true or false"):
        cli.check_config(train_cfg(["flush_denormal=maybe"]))
