"""DRIFT's offline rollout files: collection through the decoder seam in the documented format, resumption after a
kill (no duplicate, no loss, the uninterrupted rows), the reader's and the training source's errors on bad files, and
the weighted training rows."""

import json
import shutil

import lightning.pytorch as pl
import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.data.feedback import FeedbackEnvironment
from zoo.data.rollouts import REQUIRED_FIELDS, RolloutSource, RolloutWriter, meta_path, read_rollouts
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import MultiTurnPromptDataModule, MultiTurnSFTDataModule
from zoo.errors import ConfigError, DataError
from zoo.modules import MultiTurnRolloutModule
from zoo.rl.drift import DriftWeighting, SuccessWeighting, UniformWeighting, discounted_return, drift_weights

N_TRAJ = 3


def backbone():
    return TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, seed=5
    )


def collect(output, num_prompts=6, callbacks=(), n_traj=N_TRAJ):
    """``stage=predict`` of the collection module over ``num_prompts`` training prompts, 2 per batch."""
    env = FeedbackEnvironment(Addition(), max_turns=3)
    bb = backbone()
    dm = MultiTurnPromptDataModule(
        bb.tokenizer,
        TaskSource(Addition(), num_train=num_prompts, num_val=4, num_test=4, seed=0),
        eval_batch_size=2,
        environment=env,
        predict_split="train",
    )
    module = MultiTurnRolloutModule(
        bb, env, str(output), n_traj=n_traj, gamma=0.9, seed=7, generation={"max_new_tokens": 12}, progress=False
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=list(callbacks),
    )
    trainer.predict(module, dm, return_predictions=False)
    return module


def rows_of(path):
    return sorted(
        (json.loads(line) for line in path.read_text().splitlines()), key=lambda r: (r["prompt_id"], r["index"])
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollouts") / "full.jsonl"
    module = collect(path)
    return path, module


def test_collected_rows_follow_the_documented_format(uninterrupted):
    path, module = uninterrupted
    rows = read_rollouts(path)
    assert len(rows) == 6 * N_TRAJ and meta_path(path).is_file()
    assert module.stats["trajectories"] == 6 * N_TRAJ
    groups = {}
    for row in rows:
        assert set(REQUIRED_FIELDS) <= set(row)
        groups.setdefault(row["prompt_id"], []).append(row["index"])
        turns = len(row["turn_rewards"])
        assert 1 <= turns <= 3 and len(row["answers"]) == turns
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * turns
        assert row["messages"][0]["content"].endswith("=")
        assert row["t_star"] == (turns if row["turn_rewards"][-1] == 1.0 else None)
        assert row["format_penalty"] == pytest.approx(-0.1 * row["answers"].count(None))
        expected = discounted_return(row["turn_rewards"], 0.9, row["format_penalty"], row["repeat_penalty"])
        assert row["return"] == pytest.approx(expected) and row["gamma"] == 0.9
    assert all(sorted(v) == list(range(N_TRAJ)) for v in groups.values()) and len(groups) == 6
    # the trajectories of a prompt are distinct samples (sampling, not copies)
    texts = {tuple(m["content"] for m in r["messages"]) for r in rows}
    assert len(texts) > len(groups)


def test_the_collection_summary_counts_the_generated_tokens_and_its_time(uninterrupted):
    path, module = uninterrupted
    summary = module.summary()
    rows = read_rollouts(path)
    # every token of an assistant turn was generated (plus an EOS where the turn ended before its budget)
    tokenizer = module.tokenizer
    texts = [m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"]
    encoded = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert encoded <= summary["rollouts/tokens"] <= encoded + len(texts)
    assert summary["rollouts/tokens"] == pytest.approx(summary["rollouts/tokens_per_trajectory"] * len(rows))
    assert summary["rollouts/seconds"] > 0


def test_a_killed_collection_resumes_without_duplicates_or_losses(uninterrupted, tmp_path):
    full, _ = uninterrupted
    data = full.read_bytes()
    lines = data.split(b"\n")
    # killed while writing the second batch: its first trajectory complete, the next one half written
    cut = len(b"\n".join(lines[: 2 * N_TRAJ + 1])) + 1 + len(lines[2 * N_TRAJ + 1]) // 2
    path = tmp_path / "killed.jsonl"
    path.write_bytes(data[:cut])
    shutil.copy(meta_path(full), meta_path(path))
    with pytest.raises(DataError, match="truncated last line"):
        read_rollouts(path)  # never read silently
    module = collect(path)
    assert rows_of(path) == rows_of(full)
    assert module.stats["trajectories"] == 4 * N_TRAJ  # the incomplete prompt was collected again, the first kept
    assert path.read_bytes().endswith(b"\n")
    collect(path)  # a finished collection rerun adds nothing
    assert rows_of(path) == rows_of(full)


def test_an_exception_mid_collection_then_a_rerun_gives_the_uninterrupted_rows(uninterrupted, tmp_path):
    class Crash(pl.Callback):
        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 1:
                raise RuntimeError("killed")

    path = tmp_path / "crashed.jsonl"
    with pytest.raises(RuntimeError, match="killed"):
        collect(path, callbacks=[Crash()])
    assert len(read_rollouts(path)) == 4 * N_TRAJ
    collect(path)
    assert rows_of(path) == rows_of(uninterrupted[0])


def test_resuming_with_other_settings_or_a_foreign_file_is_refused(uninterrupted, tmp_path):
    full, _ = uninterrupted
    path = tmp_path / "other.jsonl"
    shutil.copy(full, path)
    shutil.copy(meta_path(full), meta_path(path))
    with pytest.raises(ConfigError, match="other settings.*n_traj"):
        collect(path, n_traj=2)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"a": 1}\n')
    with pytest.raises(ConfigError, match="not a resumable rollout file"):
        RolloutWriter(foreign, 2, {"x": 1}).open()
    writer = RolloutWriter(tmp_path / "w.jsonl", 2, {"x": 1}).open()
    with pytest.raises(ValueError, match="whole groups"):
        writer.write([{"prompt_id": "a"}])
    writer.close()


# -- bad files ---------------------------------------------------------------------------------------------------------
def good_row(prompt_id="p", index=0, t_star=1, ret=1.0):
    return {
        "prompt_id": prompt_id,
        "index": index,
        "messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "<think></think>2"}],
        "answer": "2",
        "turn_rewards": [1.0 if t_star else 0.0],
        "t_star": t_star,
        "format_penalty": 0.0,
        "repeat_penalty": 0.0,
        "return": ret,
    }


def write(path, rows, raw_tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + raw_tail)
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("turn_rewards"), r":2: missing field\(s\) \['turn_rewards'\]"),
        (lambda r: r.update({"return": float("nan")}), r":2: field 'return' must be a finite number, got nan"),
        (lambda r: r.update({"repeat_penalty": float("inf")}), r":2: field 'repeat_penalty' must be a finite"),
        (lambda r: r.update({"turn_rewards": [0.0, float("nan")]}), r":2: field 'turn_rewards'"),
        (lambda r: r.update({"t_star": 0}), r":2: field 't_star'"),
        (lambda r: r["messages"].pop(), r":2: field 'messages' must end with an assistant turn"),
        (lambda r: r["messages"].append({"role": "tool", "content": "x"}), r":2: messages\[2\].role"),
        (lambda r: r.update({"index": 0}), r":2: trajectory \('p', 0\) already at line 1"),
    ],
)
def test_bad_rows_are_errors_naming_the_file_line_and_field(tmp_path, change, message):
    bad = good_row(index=1)
    change(bad)
    path = write(tmp_path / "bad.jsonl", [good_row(), bad])
    with pytest.raises(DataError, match=str(path).replace(".", r"\.") + message):
        read_rollouts(path)


def test_truncated_last_line_and_invalid_json_are_refused(tmp_path):
    path = write(tmp_path / "t.jsonl", [good_row()], raw_tail='{"prompt_id": "q", "mess')
    with pytest.raises(DataError, match=r"t\.jsonl:2: truncated last line"):
        read_rollouts(path)
    path = write(tmp_path / "j.jsonl", [good_row()], raw_tail="{not json}\n")
    with pytest.raises(DataError, match=r"j\.jsonl:2: not valid JSON"):
        read_rollouts(path)
    with pytest.raises(DataError, match="not found"):
        read_rollouts(tmp_path / "missing.jsonl")


def test_a_prompt_with_a_single_trajectory_trains_with_weight_one(tmp_path):
    """One trajectory per prompt (or a prompt left with one row) works, as in the released code: weight 1."""
    rows = [good_row("a", 0), good_row("a", 1, None, 0.0), good_row("b", 0, None, 0.0)]
    path = write(tmp_path / "single.jsonl", rows)
    drift = RolloutSource(str(path), DriftWeighting()).rows("train")
    assert [r["loss_weight"] for r in drift][2] == pytest.approx(1.0)
    assert len(drift) == len(RolloutSource(str(path), UniformWeighting()).rows("train")) == 3


def test_training_rows_carry_the_weights_and_rft_leaves_the_failures_out(tmp_path):
    rows = [good_row("a", 0), good_row("a", 1, None, 0.0), good_row("b", 0, None, 0.0), good_row("b", 1)]
    rows[1]["turn_rewards"] = [0.0]
    rows[2]["turn_rewards"] = [0.0]
    path = write(tmp_path / "w.jsonl", rows)
    drift = RolloutSource(str(path), DriftWeighting(beta=0.5, gamma=0.9)).rows("train")
    expected = drift_weights(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]), 0.5)
    assert [r["loss_weight"] for r in drift] == pytest.approx(expected.tolist())
    rft = RolloutSource(str(path), SuccessWeighting()).rows("train")
    assert [(r["prompt_id"], r["index"]) for r in rft] == [("a", 0), ("b", 1)]
    failed = write(tmp_path / "f.jsonl", [rows[1], rows[2]])
    with pytest.raises(DataError, match="no trajectory left after weighting"):
        RolloutSource(str(failed), SuccessWeighting()).rows("train")
    with pytest.raises(DataError, match="held_out"):
        RolloutSource(str(path)).rows("val")
    with pytest.raises(ConfigError, match="datamodule.source.path"):
        RolloutSource(None)


def test_the_training_datamodule_reads_a_collected_file(uninterrupted):
    path, _ = uninterrupted
    bb = backbone()
    env = FeedbackEnvironment(Addition(), max_turns=3)
    source = RolloutSource(str(path), DriftWeighting(), held_out=TaskSource(Addition(), num_train=0, num_val=4))
    dm = MultiTurnSFTDataModule(
        bb.tokenizer, source, batch_size=N_TRAJ, eval_batch_size=8, environment=env, shuffle=False
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["loss_weight"].mean().item() == pytest.approx(1.0)  # one whole group, in file order
    val = next(iter(dm.val_dataloader()))
    assert all(len(c) == 1 and c[0]["role"] == "user" for c in val["conversations"])
    with pytest.raises(DataError, match=r"18 training rows are fewer than datamodule.batch_size=32"):
        MultiTurnSFTDataModule(bb.tokenizer, source, batch_size=32, environment=env).setup("fit")
    held_out = {c[0]["content"] for c in val["conversations"]}
    assert held_out == {r["prompt"] for r in source.rows("val")}
    assert not held_out & {r["messages"][0]["content"] for r in source.rows("train")}
