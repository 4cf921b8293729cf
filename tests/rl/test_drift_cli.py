"""DRIFT from the command line: the method configs (defaults of the released scripts), collection then weighted
training through train.py, the default pipeline (reference policy and rollouts built once through the artifact cache,
shared by DRIFT and its baselines), online multi-turn GRPO, and bad settings as one message."""

import logging

import pytest
from hydra.utils import instantiate

from zoo.artifacts import artifacts_mark, artifacts_used
from zoo.cli.train import run, user_message
from zoo.data.rollouts import read_rollouts

from conftest import SMALL_BASE_POLICY

TINY = [
    "backbone.hidden_size=32",
    "backbone.intermediate_size=64",
    "backbone.num_hidden_layers=1",
    "backbone.num_attention_heads=2",
    "backbone.num_key_value_heads=2",
]
FAST_EVAL = ["datamodule.source.held_out.num_val=4", "callbacks.multiturn_eval.max_new_tokens=12"]


def test_method_configs_carry_the_released_defaults(train_cfg):
    cfg = train_cfg(["+method=drift"])
    weighting = cfg.datamodule.source.weighting
    assert (weighting.beta, weighting.gamma) == (0.1, 0.9)  # scripts/run_weight_sft.sh
    assert (cfg.module.sample_reduction, cfg.module.normalizer) == ("token_mean", "sequences")
    assert cfg.module.optimizer.weight_decay == 0.1 and cfg.trainer.max_epochs == 1
    assert cfg.multiturn.format_penalty == -0.1 and cfg.multiturn.repeat_penalty == 0.5
    assert cfg.base_policy.datamodule == "retry_feedback" and cfg.backbone.init_from == "base"
    assert cfg.optimized_metric == "val/multi@3"
    assert instantiate(cfg.datamodule.source.weighting).describe() == {"kind": "drift", "beta": 0.1, "gamma": 0.9}
    uniform = train_cfg(["+method=drift_uniform_sft"]).datamodule.source.weighting
    assert instantiate(uniform).describe()["kind"] == "uniform"
    assert instantiate(train_cfg(["+method=drift_rft"]).datamodule.source.weighting).describe()["kind"] == "successes"
    grpo = train_cfg(["+method=drift_grpo"])
    assert grpo.module.rollout._target_ == "zoo.modules.MultiTurnRollout" and grpo.module.rollout.gamma == 0.9
    collect = train_cfg(["+method=drift_rollouts"])
    assert collect.stage == "predict" and collect.datamodule.predict_split == "train"
    assert (collect.module.generation.temperature, collect.module.generation.top_p) == (1.0, 1.0)


def test_collect_then_train_drift_from_the_command_line(train_cfg, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    cfg = train_cfg(
        [
            "+method=drift_rollouts",
            *TINY,
            "backbone.init_from=null",
            "datamodule.source.num_train=4",
            "datamodule.eval_batch_size=2",
            "module.n_traj=2",
            "module.generation.max_new_tokens=12",
            f"module.output={out}",
        ]
    )
    run(cfg)
    rows = read_rollouts(out)
    assert len(rows) == 8 and {r["prompt_id"] for r in rows} == {"train-0", "train-1", "train-2", "train-3"}
    cfg = train_cfg(
        [
            "+method=drift",
            *TINY,
            *FAST_EVAL,
            "backbone.init_from=null",
            f"datamodule.source.path={out}",
            "datamodule.batch_size=4",
            "module.generation.max_new_tokens=12",
            "trainer.max_steps=2",
        ]
    )
    metrics = run(cfg)
    assert {"val/multi@1", "val/multi@3", "val/mean_turns_to_solve", "val/exact_match"} <= set(metrics)
    assert metrics["val/multi@1"] == pytest.approx(metrics["val/exact_match"])


def test_default_pipeline_builds_the_reference_and_its_rollouts_once_for_drift_and_baselines(
    train_cfg, tmp_path, caplog
):
    small = [
        *TINY,
        *FAST_EVAL,
        *SMALL_BASE_POLICY,
        "base_policy.num_train=64",
        "datamodule.source.collect.num_prompts=3",
        "datamodule.source.collect.n_traj=2",
        "datamodule.source.collect.generation={max_new_tokens: 12}",
        "datamodule.batch_size=2",
        "module.generation.max_new_tokens=12",
        "trainer.max_steps=1",
    ]
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(train_cfg(["+method=drift", *small]))
    built = sorted((tmp_path / "cache" / "drift_rollouts").glob("addition-*/rollouts.jsonl"))
    assert len(built) == 1 and len(read_rollouts(built[0])) == 6
    assert len(list((tmp_path / "cache" / "base_policy").glob("addition-*/export"))) == 1
    caplog.clear()
    mark = artifacts_mark()
    with caplog.at_level(logging.INFO, logger="zoo"):
        metrics = run(train_cfg(["+method=drift_uniform_sft", *small]))
    assert "using the cached drift_rollouts artifact" in caplog.text
    assert sorted((tmp_path / "cache" / "drift_rollouts").glob("addition-*/rollouts.jsonl")) == built
    assert "val/multi@3" in metrics
    # the run records the collection it trained on (its cost is read from there by the demo page)
    used = [a for a in artifacts_used(mark) if a["kind"] == "drift_rollouts"]
    assert len(used) == 1 and used[0]["path"] == str(built[0].parent)
    assert used[0]["metrics"]["rollouts/new_trajectories"] == 6 and used[0]["metrics"]["rollouts/seconds"] > 0


def test_online_multi_turn_grpo_step(train_cfg):
    cfg = train_cfg(
        [
            "+method=drift_grpo",
            *TINY,
            "backbone.init_from=null",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            "module.group_size=2",
            "module.generation.max_new_tokens=12",
            "datamodule.batch_size=2",
            "datamodule.source.num_val=2",
            "callbacks.multiturn_eval.max_new_tokens=12",
            "callbacks.log_generations.every_n_steps=1",
        ]
    )
    metrics = run(cfg)
    assert {"train/reward", "train/accuracy", "train/completion_length", "val/multi@3"} <= set(metrics)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # a rollout file is named, so the check does not wait for the default rollouts to be collected first
        ("datamodule.source.weighting.beta=0,datamodule.source.path=/nonexistent/rollouts.jsonl", "beta must be > 0"),
        ("multiturn.max_turns=0", "multiturn.max_turns must be >= 1"),
        ("datamodule.source.path=/nonexistent/rollouts.jsonl", "rollout file not found"),
    ],
)
def test_bad_settings_are_one_message(train_cfg, override, message):
    cfg = train_cfg(["+method=drift", *TINY, "backbone.init_from=null", *override.split(",")])
    with pytest.raises(Exception) as info:
        run(cfg)
    text = user_message(info.value)
    assert text is not None and message in text
