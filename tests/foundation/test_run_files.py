"""Reliability of a run's files and launches (docs/reliability.md): checkpoints replaced whole or not at all (also
across filesystems and on a full disk), a run directory never shared by two runs, follow-up commands that reproduce
the run, resumable sweeps, and no network at run time."""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path

import pytest
import torch

from zoo.checkpoints import atomic_save, read_checkpoint
from zoo.cli.train import run

# small, fast runs: 8 batches of 32 per epoch, no generation during validation
SMALL = [
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=16",
    "datamodule.source.num_test=16",
    "datamodule.batch_size=32",
    "module.generate_on_eval=false",
    "trainer.max_epochs=1",
    "trainer.log_every_n_steps=1",
    "export=false",
]


def temp_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".tmp"))


# -- 3. last.ckpt is replaced whole or not at all ---------------------------------------------------------------------
class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception, so no handler of the code under test sees it)."""


def test_checkpoints_are_written_next_to_their_target_when_tmpdir_is_another_filesystem(
    train_cfg, tmp_path, monkeypatch
):
    """$TMPDIR on another filesystem (the usual cluster set-up): a rename from it fails with EXDEV. Lightning's write
    then truncates last.ckpt and copies into it, and a kill during that copy left a partial last.ckpt and no previous
    one. The zoo writes the temporary file in the checkpoint's own directory, so the rename never crosses
    filesystems and no copy happens: here every cross-directory rename fails with EXDEV, and a copy into a checkpoint
    is killed half-way."""
    other_fs = tmp_path / "other_fs_tmp"
    other_fs.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(other_fs))
    renames: list[tuple[Path, Path]] = []

    def no_cross_device(original):
        def rename(src, dst, *args, **kwargs):
            renames.append((Path(src), Path(dst)))
            if Path(src).resolve().parent != Path(dst).resolve().parent:
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))
            return original(src, dst, *args, **kwargs)

        return rename

    monkeypatch.setattr(os, "rename", no_cross_device(os.rename))
    monkeypatch.setattr(os, "replace", no_cross_device(os.replace))
    copies = []

    def killed_copy(src, dst, *args, **kwargs):  # shutil.move's fallback: truncate dst, copy; killed half-way
        copies.append(dst)
        data = Path(src).read_bytes()
        Path(dst).write_bytes(data[: len(data) // 2])
        if len(copies) > 1:
            raise Killed

    monkeypatch.setattr(shutil, "copyfile", killed_copy)
    run(train_cfg([*SMALL, "callbacks.model_checkpoint.every_n_train_steps=2", "trainer.max_steps=6"]))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert copies == []
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 6
    written = [(s, d) for s, d in renames if d.name == "last.ckpt"]
    assert written and all(s.parent == checkpoints and s.name.startswith(".last.ckpt.") for s, d in written)
    assert temp_files(checkpoints) == [] and list(other_fs.iterdir()) == []


def test_a_write_killed_midway_keeps_the_previous_file_and_the_next_save_clears_its_leftover(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    atomic_save({"global_step": 1, "w": torch.ones(3)}, target)
    real_save = torch.save

    def killed_save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[:100])
        f.flush()
        raise Killed

    monkeypatch.setattr(torch, "save", killed_save)
    with pytest.raises(Killed):
        atomic_save({"global_step": 2, "w": torch.zeros(3)}, target)
    monkeypatch.setattr(torch, "save", real_save)
    assert read_checkpoint(target)["global_step"] == 1 and temp_files(tmp_path) == []
    leftover = tmp_path / ".last.ckpt.999999999.abc.tmp"  # as a SIGKILL leaves it: its process is gone
    leftover.write_bytes(b"partial")
    atomic_save({"global_step": 3}, target)
    assert read_checkpoint(target)["global_step"] == 3 and temp_files(tmp_path) == []


def full_disk_at(step: int):
    """A ``torch.save`` that, for a checkpoint of global step ``step`` or later, writes half of it and then fails as a
    full disk does (``OSError(ENOSPC)``)."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if not (isinstance(obj, dict) and obj.get("global_step", -1) >= step):
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    return save


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so_once(zoo_main, tmp_path, monkeypatch):
    """The checkpoint of step 4 meets a full disk half-way: exit status 2, one message naming the directory and
    saying that the previous last.ckpt (step 2) is kept, which it is; no temporary file is left."""
    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    monkeypatch.setattr(torch, "save", full_disk_at(4))
    code, out, err = zoo_main(
        [*SMALL, "callbacks.model_checkpoint.every_n_train_steps=2", "trainer.max_steps=6", "run_id=full"], tmp_path
    )
    checkpoints = tmp_path / "logs" / "train" / "runs" / "full" / "checkpoints"
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err + out, err[-3000:]
    assert f"error: no space left on the device of {checkpoints} (No space left on device)" in errors[0]
    assert "so it was not written and the previous last.ckpt is kept as it was" in errors[0]
    assert "Resume with: python train.py " in errors[0] and errors[0].endswith("run_id=full ckpt_path=last")
    monkeypatch.undo()
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 2
    assert temp_files(checkpoints) == []


# -- 7. no network at run time ---------------------------------------------------------------------------------------
SOCKET_GUARD = """
import ipaddress, socket, sys, traceback
blocked = []
def loopback(host):
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return str(host) == "localhost"
def refuse(what, host):
    blocked.append(f"{what} {host}\\n" + "".join(traceback.format_stack(limit=12)))
    raise OSError(f"network blocked by the test: {what} {host}")
real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect
def getaddrinfo(host, *args, **kwargs):
    if host is not None and not loopback(host):
        refuse("getaddrinfo", host)
    return real_getaddrinfo(host, *args, **kwargs)
def connect(self, address):
    if isinstance(address, tuple) and not loopback(address[0]):
        refuse("connect", address[0])
    return real_connect(self, address)
socket.getaddrinfo, socket.socket.connect = getaddrinfo, connect
sys.argv = ["train.py", *sys.argv[1:]]
from zoo.cli.train import main
try:
    main()
finally:
    print("BLOCKED:" + repr(blocked), file=sys.stderr)
"""


def test_a_quantized_run_sends_nothing_to_the_network_without_hf_hub_offline(tmp_path):
    """``quant=bnb_nf4`` imports bitsandbytes, whose CPU backend asks ``kernels`` for a kernel repository on the Hub
    (a DNS query for huggingface.co). A ``python train.py`` whose environment sets none of the offline switches, with
    every non-loopback ``getaddrinfo``/``connect`` refused and recorded, must not try any."""
    import subprocess
    import sys

    from zoo.cli.offline import ALLOW_NETWORK, OFFLINE_SWITCHES

    guard = tmp_path / "guarded_train.py"
    guard.write_text(SOCKET_GUARD)
    env = {k: v for k, v in os.environ.items() if k not in (*OFFLINE_SWITCHES, ALLOW_NETWORK, "ZOO_LOG_DIR")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(guard), "quant=bnb_nf4", *SMALL, "trainer.max_steps=2", "datamodule.source.num_train=64"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("BLOCKED:")]
    assert line == "BLOCKED:[]", proc.stderr[-4000:]


def test_the_offline_switches_respect_the_user():
    from zoo.cli.offline import stay_offline

    environ = {"HF_HUB_OFFLINE": "0"}  # set by the user: kept; the others are set
    assert stay_offline(environ) == ["TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"]
    assert environ == {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    allowed = {"ZOO_ALLOW_NETWORK": "1"}  # the user asks for the network: nothing is set
    assert stay_offline(allowed) == [] and allowed == {"ZOO_ALLOW_NETWORK": "1"}


# -- 5. follow-up commands reproduce the run --------------------------------------------------------------------------
def printed_command(text: str, after: str) -> list[str]:
    """The arguments of the ``python train.py ...`` command printed after ``after`` (up to the closing parenthesis
    of the hint)."""
    import shlex

    (line,) = [x for x in text.splitlines() if after in x]
    args = shlex.split(line.split(after, 1)[1].rstrip(")"))
    assert args[:2] == ["python", "train.py"], line
    return args[2:]


def composed(run_dir: Path) -> dict:
    """A run's resolved config with what names its launch (stage, checkpoint, run id, directory) left out."""
    import yaml

    config = yaml.safe_load((run_dir / "resolved_config.yaml").read_text().replace(str(run_dir), "<run dir>"))
    for key in ("stage", "ckpt_path", "run_id"):
        config.pop(key)
    return config


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(["+preset=qlora"], id="qlora"),
        pytest.param(
            [
                "+method=xguard",
                "callbacks.watermark.decoder.scheme.encoder=hashing:64",
                "callbacks.watermark.decoder.scheme.partition.corpus_size=200",
                "callbacks.watermark.decoder.max_trials=4",
                "callbacks.watermark.decoder.max_sentences=2",
                "callbacks.watermark.decoder.sentence_max_tokens=40",
                "callbacks.watermark.max_rows=2",
                "module.generation.max_new_tokens=24",
            ],
            id="xguard",
        ),
    ],
)
def test_the_printed_validate_command_validates_the_same_run(method, zoo_main, tmp_path, monkeypatch):
    """A fit that ends before its first validation prints ``validate it with: <command>``; that command, run as
    printed, composes the same config as the run (its method, preset, callbacks and settings; only the stage, the
    checkpoint and the run id differ) and validates the checkpoint."""
    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    code, out, err = zoo_main([*method, *SMALL, "trainer.max_steps=2", "run_id=fit"], tmp_path)
    assert code == 0, err[-3000:]
    args = printed_command(out, "validate it with: ")
    runs = tmp_path / "logs" / "train" / "runs"
    assert f"ckpt_path={runs / 'fit' / 'checkpoints' / 'last.ckpt'}" in args and "stage=validate" in args
    code, out, err = zoo_main([*args, "run_id=validate"], tmp_path)
    assert code == 0, err[-3000:]
    assert "[zoo] validate done in" in out and "val/loss=" in out
    assert composed(runs / "validate") == composed(runs / "fit")


# -- 4. one run per run directory ------------------------------------------------------------------------------------
def test_reusing_a_run_id_is_refused_unless_it_resumes_or_overwrites(zoo_main, tmp_path, monkeypatch):
    """A second fit with the same run_id and no ckpt_path=last would append a second history to metrics.csv,
    overwrite export/ and write last-v1.ckpt: it is refused before Hydra writes anything (the earlier run's files,
    its .hydra included, are untouched); overwrite=true deletes the earlier run and starts afresh."""
    import csv

    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    args = [*SMALL, "trainer.max_steps=2", "run_id=same"]
    assert zoo_main(args, tmp_path)[0] == 0
    run_dir = tmp_path / "logs" / "train" / "runs" / "same"
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".log"}

    code, out, err = zoo_main([*args, "seed=1"], tmp_path)
    assert code == 2, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line.startswith(f"error: run_id=same: {run_dir} holds the run started ") and "Traceback" not in err
    assert "a new fit there would mix the two runs" in line and "or add overwrite=true" in line
    resume = line.split("Resume it with: ", 1)[1].split(";", 1)[0]
    assert (
        resume == "python train.py " + " ".join(o for o in args if o != "run_id=same") + " run_id=same ckpt_path=last"
    )
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix != ".log"} == before

    code, out, err = zoo_main([*args, "seed=1", "overwrite=true"], tmp_path)
    assert code == 0, err[-3000:]
    assert not (run_dir / "run_info.1.json").exists() and not (run_dir / "checkpoints" / "last-v1.ckpt").exists()
    with (run_dir / "csv" / "metrics.csv").open(newline="") as handle:
        steps = [int(r["step"]) for r in csv.DictReader(handle) if r.get("train/loss")]
    assert steps == [0, 1]
    assert "seed=1" in (run_dir / ".hydra" / "overrides.yaml").read_text()


# -- 6. a sweep resumes as a whole -----------------------------------------------------------------------------------
def test_an_interrupted_sweep_resumes_with_the_printed_command_skipping_finished_jobs(tmp_path, zoo_main, monkeypatch):
    """``-m seed=0,1,2`` gets SIGTERM during job 1: it prints the command that resumes the whole sweep. Run as printed,
    it skips job 0 (finished), resumes job 1 from its last.ckpt and runs job 2; every job then holds every step
    once. Starting the sweep again in its directory without ckpt_path=last is refused. The interrupted sweep is a real
    process (the signal is the point); the resume and the refused restart run the same entry point in this process."""
    import csv
    import json
    import shlex
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "seed=0,1,2",
        *SMALL,
        "datamodule.source.num_train=1024",
        "datamodule.batch_size=16",
        "trainer.max_steps=30",
        "callbacks.progress.log_every_n_steps=5",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ZOO_LOG_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, str(repo / "train.py"), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    job_log = sweep / "1" / "train.log"
    deadline = time.monotonic() + 600
    while "step 10/" not in (job_log.read_text() if job_log.is_file() else ""):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    (line,) = [x for x in stderr.splitlines() if x.startswith("error: interrupted by SIGTERM")]
    resume = shlex.split(
        line.split("Resume the whole sweep (finished jobs are skipped, the others resume or start): ")[1]
    )
    assert resume[:3] == ["python", "train.py", "-m"] and resume[-1] == "ckpt_path=last"
    assert not (sweep / "2").exists()

    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    code, out, err = zoo_main(resume[2:], tmp_path)
    assert code == 0, err[-3000:]
    assert f"[zoo] job 0 finished earlier in {sweep / '0'}: skipped" in out
    launches = {job: json.loads((sweep / job / "run_info.json").read_text())["launch"] for job in "012"}
    assert launches == {"0": 1, "1": 2, "2": 1}
    for job in "012":
        assert read_checkpoint(sweep / job / "checkpoints" / "last.ckpt")["global_step"] == 30
        with (sweep / job / "csv" / "metrics.csv").open(newline="") as handle:
            steps = [int(r["step"]) for r in csv.DictReader(handle) if r.get("train/loss")]
        assert steps == list(range(30)), job

    code, _, err = zoo_main(args, tmp_path)
    assert code == 2 and f"error: hydra.sweep.dir={sweep} holds an earlier sweep" in err
