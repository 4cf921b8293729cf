"""Reliability of a run (docs/reliability.md): nothing lost on interruption or resume, a NaN guard that keeps a good
checkpoint, one clear message (exit status 2, nothing written) for every bad input, and the warnings of surprising
defaults."""

from __future__ import annotations

import csv
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from zoo.checkpoints import all_finite, nonfinite_tensors
from zoo.cli.train import build, run
from zoo.data.sources import read_jsonl
from zoo.errors import CheckpointError, CheckpointNotFoundError, ConfigError, DataError, NaNLossError

from conftest import REPO_ROOT, SMALL_BASE_POLICY

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


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def steps_of(rows: list[dict[str, str]], column: str) -> list[int]:
    return [int(r["step"]) for r in rows if r.get(column)]


def written_dirs(root: Path) -> list[Path]:
    """Every run directory under ``root`` (a folder holding Hydra's ``.hydra``)."""
    return sorted(p.parent for p in root.rglob(".hydra"))


# -- 1. the NaN guard keeps a good checkpoint -------------------------------------------------------------------------
class PoisonWeights(pl.Callback):
    """Sets one weight to NaN after the optimizer step that makes ``global_step == at``, before that step's
    checkpoint is written (``ModelCheckpoint`` runs after every other callback)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if trainer.global_step == self.at:
            with torch.no_grad():
                next(pl_module.model.parameters()).view(-1)[0] = float("nan")


def test_a_checkpoint_with_nonfinite_weights_is_not_written(train_cfg, tmp_path):
    cfg = train_cfg([*SMALL, "callbacks.model_checkpoint.every_n_train_steps=2"])
    module, datamodule, trainer = build(cfg)
    trainer.callbacks.insert(0, PoisonWeights(at=4))  # step 4's checkpoint would hold the NaN
    with pytest.raises(NaNLossError, match=r"non-finite values at global step 4 .* it was not written") as err:
        trainer.fit(module, datamodule)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert f"the last good checkpoint is {last} (global step 2, train/loss " in str(err.value)
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())


class PoisonGradient(pl.Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.at:
            next(pl_module.model.parameters()).grad.view(-1)[0] = float("inf")


def test_nonfinite_gradients_stop_before_the_optimizer_step(train_cfg):
    module, datamodule, trainer = build(train_cfg(SMALL))
    trainer.callbacks.insert(0, PoisonGradient(at=2))
    before = {}

    class Snapshot(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, *args) -> None:
            before.update({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()})

    trainer.callbacks.insert(0, Snapshot())
    with pytest.raises(NaNLossError, match=r"non-finite gradients at global step 2 in 1 parameter tensors"):
        trainer.fit(module, datamodule)
    for key, value in module.model.state_dict().items():  # the step that would have used the gradient did not run
        torch.testing.assert_close(value, before[key], msg=key)


def gradient_like_tensors() -> list[torch.Tensor]:
    """Tensors shaped like a tiny model's gradients, of the dtypes a run trains in."""
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(64, 32, generator=generator),
        torch.randn(32, generator=generator).to(torch.float16),
        torch.randn(8, 8, generator=generator).to(torch.bfloat16),
        torch.randn(5, generator=generator),
    ]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [0, 1, 2, 3])
def test_the_gradient_check_finds_one_nonfinite_value_in_any_tensor(where, bad):
    """The guard's fused check (one reduction over all gradients) misses no tensor, dtype or kind of bad value."""
    tensors = gradient_like_tensors()
    assert all_finite(tensors)
    tensors[where].view(-1)[-1] = bad
    assert not all_finite(tensors)
    assert all_finite([t for i, t in enumerate(tensors) if i != where])


def test_the_gradient_check_accepts_large_finite_half_precision_values():
    """Norms accumulate in float32: half-precision gradients near their dtype's maximum are finite, not overflowed."""
    large = torch.full((1024,), 6.0e4, dtype=torch.float16)
    assert torch.isinf(torch.linalg.vector_norm(large))  # a float16 norm would overflow
    assert all_finite([large])
    assert all_finite([])


def test_the_gradient_check_reads_sparse_gradients():
    sparse = torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (5,))
    assert all_finite([sparse])
    assert not all_finite([torch.sparse_coo_tensor([[0, 3]], [1.0, float("nan")], (5,))])


def test_the_nan_message_gives_advice_that_is_true_for_the_run(train_cfg, tmp_path):
    """lr=1e3 with clipping on (the default): the message says clipping is already on, proposes a new run at a lower
    learning rate, and names the last checkpoint with finite values (with its train/loss) and how to start from its
    weights -- not ckpt_path=last, because a resumed run keeps its saved learning rate (checked too)."""
    overrides = [*SMALL, "module.optimizer.lr=1e3", "callbacks.model_checkpoint.every_n_train_steps=1"]
    with pytest.raises(NaNLossError) as err:
        run(train_cfg(overrides))
    message = str(err.value)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "Gradient clipping is already on (trainer.gradient_clip_val=1.0)" in message
    assert "enable gradient clipping" not in message
    assert "Start again with a lower learning rate: python train.py " in message
    restart = message.split("Start again with a lower learning rate: ", 1)[1].split(". The last", 1)[0]
    assert restart.endswith(" module.optimizer.lr=100") and "init_from" not in restart
    assert f"backbone.init_from={last} module.optimizer.lr=100" in message
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert nonfinite_tensors({"state_dict": saved["state_dict"], "optimizer": saved["optimizer_states"]}) == []
    loss = saved["zoo_log_rows"]["train_loss"]
    assert f"{last} (global step {saved['global_step']}, train/loss {loss:.4g})" in message

    # the claim: resuming with ckpt_path=last and a lower lr keeps the checkpoint's learning rate
    step = saved["global_step"]
    resumed = train_cfg([*SMALL, "module.optimizer.lr=1e-5", "ckpt_path=last", f"trainer.max_steps={step + 1}"])
    module, datamodule, trainer = build(resumed)
    lrs = []

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, *args) -> None:
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer.callbacks.insert(0, Spy())
    with pytest.raises(NaNLossError):
        trainer.fit(module, datamodule, ckpt_path=str(last))
    assert lrs and lrs[0] > 1.0  # the saved schedule's lr, not 1e-5

    # the advice: a new run from the checkpoint's weights starts from exactly those weights
    module, _, _ = build(train_cfg([*SMALL, f"backbone.init_from={last}", "module.optimizer.lr=100"]))
    module.configure_model()
    for key, value in module.model.state_dict().items():
        torch.testing.assert_close(value, saved["state_dict"][f"model.{key}"], msg=key)


# -- 2, 3. resume keeps history; interruption keeps state -------------------------------------------------------------
@pytest.mark.parametrize("limit", ["max_epochs", "max_steps"])
def test_resuming_an_end_of_epoch_checkpoint_trains_the_next_epoch_and_keeps_the_history(limit, train_cfg, tmp_path):
    """The last.ckpt written when training ends with an epoch (after 1 epoch, or at max_steps=8 = one epoch) records
    the epoch counter already moved on; a run resumed from it for one more epoch must train that whole epoch (it
    trained nothing before), append to metrics.csv and keep the first launch's run_info. A constant learning rate
    (module.scheduler=null): the default one-cycle schedule ends with the run it was planned for (next test)."""
    constant = [*SMALL, "module.scheduler=null"]
    first_limit, second_limit = (
        (["trainer.max_epochs=1"], ["trainer.max_epochs=2"])
        if limit == "max_epochs"
        else (["trainer.max_epochs=3", "trainer.max_steps=8"], ["trainer.max_epochs=3", "trainer.max_steps=16"])
    )
    run(train_cfg([*constant, *first_limit]))
    run_dir = tmp_path / "run"
    first = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert first["global_step"] == 8
    assert first["SFTDataModule"]["epoch"] == 1 and first["SFTDataModule"]["items_done"] == 0
    run(train_cfg([*constant, *second_limit, "ckpt_path=last"]))
    second = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert second["global_step"] == 16
    rows = metric_rows(run_dir)
    assert steps_of(rows, "train/loss") == list(range(16))
    assert Counter(steps_of(rows, "val/loss")) == {7: 1, 15: 1}
    assert json.loads((run_dir / "run_info.1.json").read_text())["launch"] == 1
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["launch"] == 2 and info["ckpt_path"] == "last"
    assert (run_dir / "resolved_config.1.yaml").is_file() and (run_dir / "resolved_config.yaml").is_file()


def test_a_fast_dev_run_saves_its_checkpoint_without_log_rows(train_cfg, tmp_path):
    """debug=fdr replaces the loggers by Lightning's DummyLogger, which answers any attribute: the run guard must not
    take it for a resumable logger (README: ``python train.py debug=fdr``)."""
    run(train_cfg(["debug=fdr"]))
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["zoo_log_rows"]["rows"] == {}


def test_resuming_past_the_end_of_the_saved_schedule_is_one_message(train_cfg):
    """The one-cycle schedule of a run stopped after 8 steps (one epoch of two) is planned for those 8 steps: a
    resumed run asked to train 16 cannot continue it."""
    run(train_cfg([*SMALL, "trainer.max_epochs=2", "trainer.max_steps=8"]))
    with pytest.raises(
        ConfigError, match=r"the learning-rate schedule restored from the checkpoint ends after 8 steps"
    ):
        run(train_cfg([*SMALL, "trainer.max_epochs=2", "trainer.max_steps=16", "ckpt_path=last"]))


def test_sigterm_mid_run_saves_a_checkpoint_and_the_printed_command_resumes_it(tmp_path, zoo_main):
    """A real ``python train.py`` gets SIGTERM mid-epoch: it writes last.ckpt at the end of its step, exits with 143 and
    prints the resume command; that command, run as printed, finishes the run, and metrics.csv then holds every
    training step and every validation exactly once. The killed run is a real process (the signal is the point); the
    printed command runs the same entry point in this process."""
    args = [
        *SMALL,
        "datamodule.source.num_train=2048",
        "datamodule.batch_size=16",
        "trainer.val_check_interval=40",
        "callbacks.progress.log_every_n_steps=5",
        "run_id=killed",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    train_log = tmp_path / "logs" / "train" / "runs" / "killed" / "train.log"
    proc = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "train.py"), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while "step 25/" not in (train_log.read_text() if train_log.is_file() else ""):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    run_dir = train_log.parent
    stopped_at = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 25 <= stopped_at < 128  # mid-epoch (128 steps per epoch)
    (line,) = [x for x in stderr.splitlines() if x.startswith("error: interrupted by SIGTERM")]
    assert f"at global step {stopped_at}: wrote {run_dir / 'checkpoints' / 'last.ckpt'}" in line
    resume = shlex.split(line.split("Resume with: ", 1)[1])
    assert resume[:2] == ["python", "train.py"] and resume[-2:] == ["run_id=killed", "ckpt_path=last"]

    code, _, err = zoo_main(resume[2:], tmp_path)
    assert code == 0, err[-3000:]
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 128
    rows = metric_rows(run_dir)
    assert steps_of(rows, "train/loss") == list(range(128))
    assert steps_of(rows, "lr-AdamW") == list(range(128))
    assert steps_of(rows, "val/loss") == [39, 79, 119]  # val_check_interval=40 (no validation at the epoch end)


# -- 4, 6, 7. bad inputs: one message, exit status 2, nothing written -------------------------------------------------
def jsonl(path: Path, text: bytes) -> Path:
    path.write_bytes(text)
    return path


BAD_INPUTS = {
    "non_utf8_jsonl": (
        lambda d: [
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={d / 'latin1.jsonl'}",
            f"datamodule.source.val_path={d / 'latin1.jsonl'}",
        ],
        lambda d: jsonl(
            d / "latin1.jsonl", b'{"prompt": "1+1=", "completion": "2"}\n{"prompt": "caf\xe9", "completion": "x"}\n'
        ),
        "latin1.jsonl:2: not valid UTF-8 (byte 0xe9 at column 16); save the file as UTF-8",
    ),
    "json_error_at_the_end_of_a_line": (
        lambda d: [
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={d / 'cut.jsonl'}",
            f"datamodule.source.val_path={d / 'cut.jsonl'}",
        ],
        lambda d: jsonl(d / "cut.jsonl", b'{"prompt": "1+1=", "completion": "2"\n'),
        "cut.jsonl:1: not valid JSON (Expecting ',' delimiter at column 37)",
    ),
    "truncated_checkpoint": (
        lambda d: [f"ckpt_path={d / 'cut.ckpt'}"],
        lambda d: (d / "cut.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 64),
        "is not a valid checkpoint",
    ),
    "batch_size_zero": (lambda d: ["datamodule.batch_size=0"], None, "datamodule.batch_size must be a positive"),
    "lr_nan": (
        lambda d: ["module.optimizer.lr=nan"],
        None,
        "module.optimizer (torch.optim.AdamW): Invalid learning rate: nan",
    ),
    "unwritable_output_dir": (
        lambda d: [f"paths.log_dir={d / 'a_file' / 'logs'}"],
        lambda d: (d / "a_file").write_text("not a directory"),
        "cannot create the run directory",
    ),
    "relative_model_path_that_does_not_exist": (
        lambda d: ["backbone=hf", "backbone.name_or_path=models/my-llm"],
        None,
        "backbone.name_or_path=models/my-llm: no local directory",
    ),
    "null_arriving_as_the_string_None": (
        lambda d: ["+method=valr_cot", "backbone.image_pool=None"],
        None,
        "backbone.image_pool='None' must be an integer or null",
    ),
    "sliding_window_not_positive": (
        lambda d: ["+method=valr_cot", "backbone.sliding_window=0"],
        None,
        "backbone.sliding_window=0 must be a positive integer (positions each layer attends to) or null",
    ),
    "misspelled_key": (
        lambda d: ["trainer.max_step=5"],
        None,
        "trainer.max_step: no such key in the config; did you mean trainer.max_steps",
    ),
    "misspelled_key_added_with_plus": (
        lambda d: ["+trainer.max_step=5"],
        None,
        "trainer.max_step: lightning.pytorch.trainer.trainer.Trainer takes no argument 'max_step'; did you mean "
        "trainer.max_steps",
    ),
    # values of the wrong type or range (each was a traceback with exit status 1 and a run directory left behind)
    "learning_rate_that_is_not_a_number": (
        lambda d: ["module.optimizer.lr=abc"],
        None,
        "module.optimizer.lr='abc' must be a number (torch.optim.AdamW refused it",
    ),
    "seed_that_is_not_a_number": (
        lambda d: ["seed=abc"],
        None,
        "seed='abc' must be a whole number from 0 to 4294967295",
    ),
    "no_devices": (
        lambda d: ["trainer.devices=0"],
        None,
        "trainer.devices=0: `Trainer(devices=0)` value is not a valid input",
    ),
    "negative_max_steps": (
        lambda d: ["trainer.max_steps=-2"],
        None,
        "trainer.max_steps=-2: `max_steps` must be a non-negative integer or -1",
    ),
    "validation_interval_beyond_the_epoch": (
        lambda d: [*rows20(d), "datamodule.batch_size=4", "trainer.val_check_interval=25"],
        lambda d: write_rows20(d),
        "trainer.val_check_interval=25 is more than the 5 training batches of an epoch (20 training rows at "
        "datamodule.batch_size=4), so no validation would run",
    ),
    "no_training_batch": (  # was "Trainer.fit stopped: No training batches" and exit status 0
        lambda d: [*rows20(d), "datamodule.batch_size=32"],
        lambda d: write_rows20(d),
        "no training batch: 20 training rows at datamodule.batch_size=32 (an incomplete last batch is dropped)",
    ),
    "truncated_init_from_checkpoint": (  # was reported when the model was built, after the run directory was written
        lambda d: [f"backbone.init_from={d / 'init.ckpt'}"],
        lambda d: (d / "init.ckpt").write_bytes(b"PK\x03\x04" + b"\0" * 64),
        "init.ckpt is not a valid checkpoint",
    ),
}


def rows20(d: Path) -> list[str]:
    return [
        "datamodule=sft_jsonl",
        f"datamodule.source.train_path={d / 'rows20.jsonl'}",
        f"datamodule.source.val_path={d / 'rows20.jsonl'}",
    ]


def write_rows20(d: Path) -> Path:
    rows = "".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(20))
    return jsonl(d / "rows20.jsonl", rows.encode())


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_a_bad_input_gets_one_message_exit_status_2_and_leaves_nothing(case, zoo_main, tmp_path, monkeypatch):
    """``python train.py`` (in this process, Hydra included) from an empty directory, without ``paths.log_dir``."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    args, make, expected = BAD_INPUTS[case]
    data = tmp_path / "data"
    data.mkdir()
    if make is not None:
        make(data)
    work = tmp_path / "work"
    work.mkdir()
    # the small settings first, so that the case's own settings win; the generated data's sizes only where it is used
    small = [o for o in SMALL if not o.startswith("datamodule.source.") or "datamodule=" not in " ".join(args(data))]
    code, out, err = zoo_main([*small, *args(data)], work)
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], err[-3000:]
    assert "Traceback" not in err + out
    assert written_dirs(work) == [] and written_dirs(data) == []


# settings outside the default job (SMALL's keys do not exist there), same checks as above
OTHER_BAD_INPUTS = {
    "gem_more_clusters_than_rows": (
        ["+method=gem", "module.num_clusters=500", "datamodule.source.num_train=300", "module.encoder=hashing:32"],
        "module.num_clusters=500 > the 300 points to cluster; use fewer clusters (the corpus split 'train')",
    ),
    "gem_clusters_not_a_number": (
        ["+method=gem", "module.num_clusters=abc"],
        "module.num_clusters must be a whole number >= 1, got 'abc'",
    ),
    # was raised by the decoder at the first validation, after the training steps before it and no checkpoint
    "generation_budget_beyond_the_context": (
        ["module.generation.max_new_tokens=250", "datamodule.source.num_train=64", "datamodule.source.num_val=16"],
        "of 16 prompts do not fit the backbone's context of 256 positions with max_new_tokens 250 (the longest prompt "
        "has 7 tokens); this would stop the run at its first generation. Lower module.generation.max_new_tokens (or "
        "the module's eval_generation) to at most 249",
    ),
    # GRPO's rollouts sample from the training prompts with module.generation's budget (evaluation's is within it)
    "rollout_budget_beyond_the_context": (
        [
            "+method=grpo",
            "backbone.init_from=null",
            "module.generation.max_new_tokens=250",
            "+module.eval_generation.max_new_tokens=16",
            "datamodule.source.num_train=64",
            "datamodule.source.num_val=16",
        ],
        "train: 64 of 64 prompts do not fit the backbone's context of 256 positions with max_new_tokens 250",
    ),
    # the message named backend.overflow, a setting of the evaluation, not of this run
    "agent_sft_unknown_overflow": (
        ["+method=agent_sft", "datamodule.source.num_train=1", "env.required_steps=5", "datamodule.overflow=cut"],
        "datamodule.overflow='cut'; use one of ['error', 'keep_recent']",
    ),
    "demonstration_bpe_without_demonstrations": (
        ["+method=sft", "+preset=demonstration_bpe"],
        "demonstration_tokenizer (+preset=demonstration_bpe) trains on agent demonstrations, but datamodule.source is",
    ),
    "flush_denormal_not_a_boolean": (["flush_denormal=maybe"], "flush_denormal='maybe' must be true or false"),
    "tiny_backbone_tokenizer_not_saved": (
        ["+method=sft", "+backbone.tokenizer=/nonexistent/bpe"],
        "backbone.tokenizer=/nonexistent/bpe: no tokenizer saved there",
    ),
    # stacks: each message names the two methods and why (was Hydra's "Could not override 'datamodule/weighting'",
    # a complaint about backbone=none, and an SFT run silently skipped for 94 s of validation)
    "stack_of_two_training_modules": (
        ["+method=[drift,grpo]"],
        "methods ['drift', 'grpo'] each replace the training module (kind: module)",
    ),
    "stack_of_a_method_without_a_model_and_one_with": (
        ["+method=[gem,sft]"],
        "methods gem and sft conflict: gem runs without a language model (backbones: [none]) and sft needs one",
    ),
    "stack_of_training_and_post_training_quantization": (
        ["+method=[sft,nanoquant]"],
        "methods sft and nanoquant conflict: nanoquant quantizes a trained model after training (kind: quantizer) "
        "and sft trains one (kind: module) but does not declare quant=nanoquant",
    ),
    "stack_whose_stage_would_skip_training": (
        ["+method=[grpo,dts]"],
        "methods grpo and dts conflict: grpo trains a model (kind: module, stage=fit) but dts sets stage=test, so "
        "grpo would not train",
    ),
}


@pytest.mark.parametrize("case", sorted(OTHER_BAD_INPUTS))
def test_other_bad_inputs_get_one_message_exit_status_2_and_leave_nothing(case, zoo_main, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    args, expected = OTHER_BAD_INPUTS[case]
    code, out, err = zoo_main(args, tmp_path)
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0], err[-3000:]
    assert "Traceback" not in err + out
    assert written_dirs(tmp_path) == []


def test_documented_stacks_and_a_chosen_stage_pass_the_stack_check(train_cfg):
    """The stacks the docs show run; a stage chosen on the command line settles a method's stage."""
    from zoo.cli.train import check_methods

    for stack in (
        ["+method=[grpo,safethink]"],
        ["+method=[sft,xguard]"],
        ["+method=[grpo,af_eval]"],
        ["+method=[grpo,dts]", "stage=test"],
        ["+method=[sft,wet]", "stage=fit"],
    ):
        assert len(check_methods(train_cfg(stack))) == 2, stack


def test_an_undeclared_backbone_or_quantizer_is_warned_once(train_cfg, caplog):
    """An undeclared pair (``+method=sft quant=sign``: sft trains, and a post-training quantizer acts on its export)
    is warned about once (``+method=wet quant=bnb_nf4``, undeclared when this was found, ran without a word)."""
    from zoo.catalogue import method_entries
    from zoo.cli.train import check_methods

    declared = method_entries()["sft"]["quantizers"]
    assert "sign" not in declared and "sign" not in (method_entries()["sft"].get("refuses") or {})
    cfg = train_cfg(["+method=sft", "quant=sign"])
    with caplog.at_level(logging.WARNING, logger="zoo"):
        check_methods(cfg)
        check_methods(cfg)  # run() and its job both check: one warning
    warned = [r.getMessage() for r in caplog.records if "does not declare" in r.getMessage()]
    assert warned == [
        f"method 'sft' does not declare quant=sign: methods.sft.quantizers lists {declared}, "
        "the pairs that tests/test_catalogue.py runs; this combination is untested"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        check_methods(train_cfg(["+method=sft", "quant=bnb_nf4"]))  # declared
    assert "does not declare" not in caplog.text


def test_the_rollout_collection_settings_are_named_as_typed():
    """``datamodule.source.collect.n_traj=0`` was reported as ``module.n_traj`` (the build run's key)."""
    from zoo.cli.rollouts import reference_rollouts_request

    nodes = {"task": {}, "multiturn": {}, "backbone": {}, "base_policy": {}, "seed": 0}
    with pytest.raises(ConfigError, match=r"^datamodule.source.collect.n_traj must be a whole number >= 1, got 0$"):
        reference_rollouts_request(**nodes, n_traj=0)
    with pytest.raises(ConfigError, match=r"^datamodule.source.collect.num_prompts must be a whole number >= 1"):
        reference_rollouts_request(**nodes, num_prompts=-1)


def test_a_failure_while_training_keeps_the_run_directory(zoo_main, tmp_path, monkeypatch):
    """Only a launch that wrote nothing but Hydra's files and its run info is removed; a run that failed while training
    keeps its logs and checkpoints (here: a NaN loss at the first step)."""
    monkeypatch.delenv("ZOO_LOG_DIR", raising=False)
    code, _, err = zoo_main([*SMALL, "module.optimizer.lr=1e12", "run_id=kept"], tmp_path)
    assert code == 2 and "error: non-finite" in err
    run_dir = tmp_path / "logs" / "train" / "runs" / "kept"
    assert (run_dir / "run_info.json").is_file() and (run_dir / "csv" / "metrics.csv").is_file()


def test_jsonl_errors_name_the_line_and_the_column(tmp_path):
    crlf = jsonl(
        tmp_path / "crlf.jsonl", b'{"prompt": "a", "completion": "b"}\r\n{"prompt": "a" "completion": "b"}\r\n'
    )
    with pytest.raises(DataError, match=r"crlf.jsonl:2: not valid JSON \(Expecting ',' delimiter at column 16\)"):
        read_jsonl(crlf, ["prompt", "completion"])
    bom = jsonl(tmp_path / "bom.jsonl", b'\xef\xbb\xbf{"prompt": "a", "completion": "b"}\n')
    assert read_jsonl(bom, ["prompt", "completion"]) == [{"prompt": "a", "completion": "b"}]


def test_a_refused_checkpoint_says_so(tmp_path):
    from zoo.checkpoints import read_checkpoint

    torch.save({"module": torch.nn.Linear(2, 2)}, tmp_path / "pickled.ckpt")
    with pytest.raises(CheckpointError, match="refused to load .*pickled.ckpt: it holds Python objects"):
        read_checkpoint(tmp_path / "pickled.ckpt")
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint file at"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_hub_ids_are_only_asked_of_the_cache_when_offline(tmp_path, monkeypatch):
    from zoo.backbones import HFBackbone

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, expected in [
        ("./models/llm", "no such directory"),
        ("a/b/c", "no such directory"),
        ("org/not-cached", "is not in the Hugging Face cache; HF_HUB_OFFLINE is set, so the Hub was not asked"),
    ]:
        with pytest.raises(CheckpointNotFoundError, match=expected):
            HFBackbone(name).tokenizer  # noqa: B018


# -- 8-12. surprising defaults --------------------------------------------------------------------------------------
def test_rows_longer_than_the_backbones_context_are_refused_with_a_count(train_cfg, tmp_path, caplog):
    rows = [{"prompt": "1+1=", "completion": "2"}] * 4 + [{"prompt": "x" * 300, "completion": "y"}] * 3
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = train_cfg(
        ["datamodule=sft_jsonl", f"datamodule.source.train_path={data}", f"datamodule.source.val_path={data}"]
    )
    assert cfg.datamodule.max_length == 512 and cfg.backbone.max_position_embeddings == 256
    with caplog.at_level(logging.WARNING, logger="zoo"):
        _, datamodule, _ = build(cfg)
    assert "datamodule.max_length=512 exceeds the backbone's context of 256 tokens" in caplog.text
    with pytest.raises(
        DataError, match=r"train: 3 of 7 rows are longer than 256 tokens \(the backbone's context length"
    ):
        datamodule.setup("fit")


def test_quantized_training_says_what_trains_and_qlora_trains_adapters(train_cfg, tmp_path, caplog):
    steps = [*SMALL, "trainer.max_steps=2", "export=true"]
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(train_cfg([*steps, "quant=bnb_nf4"]))
    assert "quant=bnb_nf4: the quantized layers are frozen, so only 14.2K of 440K parameters train" in caplog.text
    assert "+preset=qlora" in caplog.text

    caplog.clear()
    cfg = train_cfg([*steps, "+preset=qlora"])
    cfg.paths.output_dir = str(tmp_path / "qlora")
    cfg.callbacks.model_checkpoint.dirpath = str(tmp_path / "qlora" / "checkpoints")
    module, datamodule, trainer = build(cfg)
    with caplog.at_level(logging.INFO, logger="zoo"):
        trainer.fit(module, datamodule)
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert "the quantized layers are frozen" not in caplog.text
    from transformers import AutoModelForCausalLM

    from zoo.quant.bnb import is_bnb_quantized

    exported = AutoModelForCausalLM.from_pretrained(module.export_pretrained(tmp_path / "qlora_export"))
    assert is_bnb_quantized(exported) and not any("lora_" in n for n, _ in exported.named_parameters())


def test_what_a_run_builds_or_quantizes_is_said_loudly(train_cfg, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="zoo"):
        build(train_cfg(["+method=nanoquant"]))
    assert "stage=validate quantizes (quant=nanoquant) and evaluates a randomly initialised TinyBackbone" in caplog.text

    caplog.clear()
    recipe = [*SMALL_BASE_POLICY, "base_policy.num_train=128", "base_policy.batch_size=64"]
    with caplog.at_level(logging.WARNING, logger="zoo"):
        build(train_cfg(["backbone.init_from=base", *recipe], cache_dir=tmp_path / "fresh_cache"))
    assert (
        "building the base_policy artifact 'addition': backbone.init_from=base asks for the base SFT policy of task "
        "'addition', trained before this run starts: 1 epochs of 128 rows at batch 64 = 2 optimizer steps (the run's "
        "trainer.max_steps does not apply to it" in caplog.text
    )


def test_help_shows_the_quick_settings_of_the_run(zoo_main, tmp_path):
    code, out, _ = zoo_main(["+method=nanoquant", "--help"], tmp_path)
    assert code == 0
    assert "== Quick settings ==" in out and "+method=nanoquant: quant.admm.outer_iters=2" in out
    assert "quantizes and evaluates a randomly initialised model: add backbone.init_from=base" in out
    assert "\nquant: " in out and "nanoquant" in out.split("\nquant: ")[1].splitlines()[0]
    assert "\n== Config ==" in out and "\nquant:\n  _target_: zoo.quant" in out  # the composed config, no hydra node
    assert "\nhydra:" not in out.split("== Config ==")[1]
    code, out, _ = zoo_main(["+method=grpo", "--help"], tmp_path)
    assert code == 0
    assert "750 optimizer steps, which trainer.max_steps does not shorten" in out
    assert "base_policy.num_train=512 base_policy.max_epochs=1" in out


def test_help_lists_the_config_groups_hydra_lists_and_leaves_other_flags_to_hydra():
    """The app's help walks the config sources once (Hydra's own help builds a config repository per group): its
    groups and options are those Hydra's config loader reports (checked on the top level and nested groups)."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    from zoo.cli.help import config_groups, wants_help

    groups = config_groups()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        top = {g for g in loader.list_groups("") if g != "hydra" and loader.get_group_options(g, ObjectType.CONFIG)}
        assert top == {g for g in groups if "/" not in g}
        for group in ("method", "quant", "backbone", "demo/valr/arm", "demo/dts/setting"):
            assert groups[group] == loader.get_group_options(group, ObjectType.CONFIG), group
    assert not any(g == "hydra" or g.startswith("hydra/") for g in groups)
    assert wants_help(["+method=sft", "--help"]) and wants_help(["-h", "--resolve"])
    assert not wants_help(["--hydra-help"]) and not wants_help(["--help", "--config-name", "train"])
    assert not wants_help(["+method=sft"])


def test_characters_the_tokenizer_lacks_are_counted_once_per_split(train_cfg, tmp_path, caplog):
    data = tmp_path / "accents.jsonl"
    data.write_text(
        json.dumps({"prompt": "café=", "completion": "€5"})
        + "\n"
        + json.dumps({"prompt": "a", "completion": "b"})
        + "\n"
    )
    cfg = train_cfg(
        ["datamodule=sft_jsonl", f"datamodule.source.train_path={data}", f"datamodule.source.val_path={data}"]
    )
    _, datamodule, _ = build(cfg)
    with caplog.at_level(logging.WARNING, logger="zoo"):
        datamodule.setup("fit")
        datamodule.setup("fit")
    warnings = [r.getMessage() for r in caplog.records if "<unk>" in r.getMessage()]
    assert len(warnings) == 2  # train and val, once each
    assert warnings[0].startswith("train split: 2 tokens in 1 of 2 rows are <unk>") and "'é', '€'" in warnings[0]


def test_a_run_without_validation_prints_its_training_metrics(train_cfg, capsys):
    run(train_cfg([*SMALL, "trainer.max_steps=3"]))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[zoo] fit done")]
    assert "train/loss=" in line
    assert "(no validation ran: trainer.max_steps=3 ended training at step 3, before the first validation" in line
    # the run's own overrides, then the stage and its checkpoint (tests/foundation/test_run_files.py runs the command)
    assert "validate it with: python train.py " in line and " trainer.max_steps=3 stage=validate ckpt_path=" in line


def test_a_hugging_face_backbone_trains_in_train_mode(tmp_path):
    from zoo.backbones import HFBackbone, TinyBackbone

    tiny = TinyBackbone()
    tiny.build_model().save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    model = HFBackbone(str(tmp_path)).build_model()
    assert model.training and all(m.training for m in model.modules())


def test_an_oserror_of_the_run_itself_is_not_taken_for_the_run_directory(monkeypatch, tmp_path):
    """``cannot create the run directory`` is said of an OSError raised by Hydra's launch around the task, never of
    one the run raised itself (read off the error's traceback: no module-level flag)."""
    from omegaconf import OmegaConf

    import zoo.cli.train as train

    def disk_error(cfg):
        raise OSError(5, "Input/output error", "/data/shard-3")

    monkeypatch.setattr(train, "sweep_job", disk_error)
    monkeypatch.setattr(train, "user_message", lambda err: None)  # a bug of the run: its traceback is kept
    cfg = OmegaConf.create({"paths": {"output_dir": str(tmp_path / "run"), "log_dir": str(tmp_path)}})
    with pytest.raises(OSError) as inside:
        train.task_function(cfg)
    assert train.raised_in_task(inside.value)
    assert train.launch_message(inside.value) is None  # not "cannot create the run directory"
    with pytest.raises(OSError) as outside:
        disk_error(cfg)
    assert not train.raised_in_task(outside.value)
    assert "cannot create the run directory /data/shard-3" in train.launch_message(outside.value)
