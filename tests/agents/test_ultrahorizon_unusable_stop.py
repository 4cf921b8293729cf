"""The harness's stop after consecutive unusable replies (``max_unusable_replies``): off by default, as in the
official harness (an episode runs to its step cap); on, an episode of a model that cannot act ends after N replies
that are not executable tool calls, recorded as failed with the reason and an error tag."""

from __future__ import annotations

import json
from pathlib import Path

from zoo.agents import LLMToolAgent, MysteryGrid, ScriptedBackend
from zoo.agents.evaluate import run_episodes
from zoo.agents.runner import UNUSABLE_TAG
from zoo.cli.train import run

CALL = '<tool_call>{"name": "get_current_state", "arguments": {}}</tool_call>'
GARBAGE = "e e e the t <tool_call>{name: "


def episode(replies, max_unusable_replies, max_steps=8):
    (trajectory,) = run_episodes(
        lambda seed: MysteryGrid(seed=seed, required_steps=3, free=True),
        lambda seed: LLMToolAgent(ScriptedBackend(list(replies)), seed=seed),
        [0],
        0,
        max_steps=max_steps,
        max_unusable_replies=max_unusable_replies,
    )
    return trajectory


def test_garbage_replies_end_the_episode_after_n_steps_with_the_reason():
    trajectory = episode([GARBAGE] * 8, max_unusable_replies=3)
    assert len(trajectory.steps) == 3 and trajectory.failed and trajectory.score == 0.0
    assert trajectory.error.startswith("3 consecutive replies without an executable tool call")
    assert "malformed tool call" in trajectory.error and UNUSABLE_TAG in trajectory.tags
    assert trajectory.to_dict()["failed"] is True


def test_off_by_default_the_episode_runs_to_its_step_cap():
    trajectory = episode([GARBAGE] * 8, max_unusable_replies=None)
    assert len(trajectory.steps) == 8 and not trajectory.failed and UNUSABLE_TAG not in trajectory.tags


def test_the_count_is_of_consecutive_replies_and_a_cut_reply_counts():
    cut = {"content": CALL[:20], "finish_reason": "length"}
    replies = [GARBAGE, "no call here", CALL, GARBAGE, cut, "plain text"]
    trajectory = episode(replies, max_unusable_replies=3)
    assert len(trajectory.steps) == 6 and trajectory.steps[2].ok  # the executable call reset the count
    assert "finish_reason=length" in trajectory.steps[4].error and trajectory.error.endswith(
        "(last: the reply called no tool)"
    )


def test_the_demo_llm_arms_set_it_and_the_module_default_is_off(train_cfg, zoo_main, tmp_path):
    assert train_cfg(["+method=ultrahorizon"]).module.max_unusable_replies is None
    for arm in ("llm_tiny", "llm_sft"):
        cfg = train_cfg(["+demo=ultrahorizon", f"demo/ultrahorizon/arm={arm}"])
        assert cfg.module.max_unusable_replies == cfg.demo.max_unusable_replies == 3
    assert train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=random"]).module.max_unusable_replies is None
    args = ["+method=ultrahorizon", "module.max_unusable_replies=0", f"paths.log_dir={tmp_path}"]
    status, _, err = zoo_main(args, tmp_path)
    assert status == 2 and "module.max_unusable_replies=0" in err and "Traceback" not in err


def test_the_reason_reaches_trajectories_jsonl(train_cfg, tmp_path):
    """Through the composed run: a backend that replies text without a tool call; the run's trajectories.jsonl holds
    the failed episode with its reason and tag."""
    cfg = train_cfg(
        [
            "+method=ultrahorizon",
            "agent=llm",
            "backend=scripted",
            "backend.responses=['e e e the t']",
            "module.max_unusable_replies=2",
            "module.max_steps=8",
            "datamodule.episodes=1",
            "env.required_steps=3",
        ]
    )
    run(cfg)
    (line,) = (Path(cfg.module.trajectory_dir) / "trajectories.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["failed"] and len(record["steps"]) == 2 and UNUSABLE_TAG in record["tags"]
