"""The UltraHorizon demo's CRNR arms and results page: CRNR off, at the released window and at a small window compose
as separate arms; the page's verdict pairs arms by seed and names each arm's window from its runs; how long the
contexts grew and what an LLM arm replied are read from the trajectories (demos/ultrahorizon.py,
demos/_agent_pages.py)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import yaml
from hydra.utils import instantiate

from zoo.agents import CRNR, run_episode
from zoo.agents.runner import UNUSABLE_TAG
from zoo.report import Run

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "demos"))

import ultrahorizon as page
from _agent_pages import replies_measured, run_seconds


def test_crnr_arms_compose_off_released_and_small(train_cfg):
    windows = {
        arm: train_cfg(["+demo=ultrahorizon", f"demo/ultrahorizon/arm={arm}"]).module.crnr_window
        for arm in ("he_no_crnr", "hypothesis_elimination", "he_crnr")
    }
    assert windows == {"he_no_crnr": None, "hypothesis_elimination": 200, "he_crnr": 16}


def episode(cfg, window):
    env = instantiate(cfg.env, _convert_="all")(seed=0)
    agent = instantiate(cfg.agent, _convert_="all")(seed=0)
    return asdict(run_episode(env, CRNR(agent, window) if window else agent, max_steps=cfg.module.max_steps))


def test_longest_context_is_what_the_window_allows(train_cfg):
    cfg = train_cfg(["+demo=ultrahorizon", "demo/ultrahorizon/arm=he_no_crnr", "env.required_steps=12"])
    free, windowed = episode(cfg, None), episode(cfg, 6)
    longest = page.longest_context([free, windowed])
    assert longest[0] == max(s["context_messages"] for s in free["steps"]) > 6  # two messages per call, never cut
    assert longest[1] <= 6 + 1 and windowed["refreshes"] > 0  # cut back to one message past the window


def write_run(root: Path, arm: str, seed: int, score: float, window: int | None) -> Run:
    path = root / f"{arm}-{seed}"
    (path / "csv").mkdir(parents=True)
    (path / "csv" / "metrics.csv").write_text(f"step,test/score\n0,{score}\n")
    (path / "resolved_config.yaml").write_text(yaml.safe_dump({"module": {"crnr_window": window}}))
    run = Run(path=path, overrides=[f"seed={seed}"], seed=seed)
    run.arm = {page.ENV_KEY: "ultrahorizon/grid", page.DIFFICULTY_KEY: "hard", page.ARM_KEY: arm}
    return run


def test_verdict_pairs_the_crnr_arms_with_crnr_off_by_seed(tmp_path):
    # CRNR off scores 0.9 + seed / 100; the small window loses exactly 0.5 on every seed; the released window ties
    windows = {"he_no_crnr": None, "hypothesis_elimination": 200, "he_crnr": 16}
    shift = {"he_no_crnr": 0.0, "hypothesis_elimination": 0.0, "he_crnr": -0.5}
    runs = [write_run(tmp_path, a, s, 0.9 + s / 100 + shift[a], w) for a, w in windows.items() for s in range(3)]

    def runs_of(env, difficulty, arm):
        return [r for r in runs if arm is None or r.arm[page.ARM_KEY] == arm]

    claims = page.claims(["ultrahorizon/grid"], ["hard"], list(windows), list(windows), runs_of, str)
    by_window = {c.claim.split("(window ")[1].split(" ")[0]: c for c in claims}
    assert set(by_window) == {"200", "16"}
    assert (by_window["200"].estimate, by_window["200"].interval) == (0.0, (0.0, 0.0))  # a tie, seed by seed
    assert by_window["200"].verdict == "not shown (within noise)"
    assert abs(by_window["16"].estimate + 0.5) < 1e-9 and by_window["16"].verdict == "contradicted"


def test_replies_measured_counts_parsed_replies_and_whole_budgets():
    garbage = {"tool": None, "text": "a\n b `c|", "completion_tokens": 8}
    call = {"tool": "move", "text": '<tool_call>{"name": "move"}</tool_call>', "completion_tokens": 5}
    text = replies_measured([{"steps": [garbage, garbage]}, {"steps": [call]}], budget=8)
    assert "Replies: 3, of which 1 (33.3%) parsed as a tool call" in text
    assert "2 replies used the whole budget of 8 tokens" in text and "largest 8" in text
    assert "starts with `a b 'c/` (2 of 3 replies" in text  # whitespace collapsed, code span kept intact


def test_run_seconds_leaves_out_runs_that_trained_their_model(tmp_path):
    runs = []
    for name, seconds, built in (("a", 100.0, False), ("b", 300.0, False), ("c", 900.0, True)):
        (tmp_path / name).mkdir()
        info = {"wall_seconds": seconds, "artifacts": [{"kind": "demo_policy", "built_now": built}]}
        (tmp_path / name / "run_info.json").write_text(json.dumps(info))
        runs.append(Run(path=tmp_path / name, overrides=[]))
    seconds, left = run_seconds(runs)
    assert (seconds.mean, seconds.n, left) == (200.0, 2, 1)


def sft_run(root: Path, seed: int, steps: list[dict], tags: list[str], artifact: Path) -> Run:
    run = write_run(root, page.SFT_ARM, seed, 0.0, 16)
    record = {"steps": steps, "tags": tags, "committed": False}
    (run.path / page.TRAJECTORIES).write_text(json.dumps(record) + "\n")
    info = {"artifacts": [{"kind": "demo_policy", "path": str(artifact), "built_now": False}]}
    (run.path / "run_info.json").write_text(json.dumps(info))
    return run


def test_the_behaviour_cloned_arm_that_cannot_act_gets_no_score_claim_and_its_stops_are_counted(tmp_path):
    model = tmp_path / "model"
    (model / "csv").mkdir(parents=True)
    (model / "csv" / "metrics.csv").write_text(
        "lr-AdamW,step,train/loss,val/loss\n0.002,9,,\n,9,3.22,\n1e-08,29,,\n,29,3.35,\n,29,,2.88\n"
    )
    garbage = {"tool": None, "text": "e e", "completion_tokens": 8}
    runs = [sft_run(tmp_path, s, [garbage] * 3, [UNUSABLE_TAG], model) for s in range(3)]
    runs += [write_run(tmp_path, "random", s, 0.1, 200) for s in range(3)]

    def runs_of(env, difficulty, arm):
        return [r for r in runs if arm is None or r.arm[page.ARM_KEY] == arm]

    claims = page.claims(["ultrahorizon/grid"], ["hard"], ["random"], ["random", page.SFT_ARM], runs_of, str)
    assert [c.claim for c in claims] == [f"{page.SFT_ARM} acts: its replies parse as tool calls"]
    eps = [e for r in runs_of(None, None, page.SFT_ARM) for e in page.episodes(r)]
    assert (
        page.stopped_early(eps)
        == "3 of 3 episodes were ended by the stop for unusable replies (after 3 steps on average)."
    )
    training = page.sft_training(runs_of(None, None, page.SFT_ARM))
    assert "1 validation(s), no plateau reading" in training and "**not met**" in training  # one validation only
    acting = sft_run(tmp_path / "b", 0, [{"tool": "move", "text": "", "completion_tokens": 5}], [], model)
    runs[:3] = [acting]
    assert len(page.claims(["ultrahorizon/grid"], ["hard"], ["random"], ["random"], runs_of, str)) == 2


def model_log(path: Path, losses: dict[int, float]) -> Path:
    """A behaviour-cloned model's CSV log: training-loss rows between its validations, as the CSV logger writes."""
    (path / "csv").mkdir(parents=True)
    rows = [f",{step - 1},2.5," for step in losses] + [f",{step},,{loss}" for step, loss in losses.items()]
    (path / "csv" / "metrics.csv").write_text("lr-AdamW,step,train/loss,val/loss\n" + "\n".join(rows) + "\n")
    return path


def test_sft_plateau_is_read_per_model_from_its_validations(tmp_path):
    # grid: flat at its end (-1.0%); bio: still falling by 20% over its last interval -> not met for the page
    grid = model_log(tmp_path / "grid", {50: 1.2, 100: 0.70, 150: 0.693})
    bio = model_log(tmp_path / "bio", {50: 2.0, 100: 1.5, 150: 1.2})
    runs = [sft_run(tmp_path / "g", s, [], [], grid) for s in range(2)]
    runs += [sft_run(tmp_path / "b", s, [], [], bio) for s in range(2)]
    for run in runs[2:]:
        run.arm[page.ENV_KEY] = "ultrahorizon/bio"
    training = page.sft_training(runs)
    assert training.count("validation loss at steps 50, 100, 150") == 2  # one curve per model, not per run
    assert "ultrahorizon/grid (hard): validation loss at steps 50, 100, 150: 1.200, 0.700, 0.693 (-1.0%" in training
    assert "ultrahorizon/bio (hard)" in training and "(-20.0%, -0.3000 nats over the last interval)" in training
    assert "**not met**" in training
    assert "**met**" in page.sft_training(runs[:2])  # the flat model alone
    # at the loss floor a large relative change is a few ten-thousandths of a nat: met
    floor = model_log(tmp_path / "floor", {50: 0.2, 100: 0.0014, 150: 0.0005})
    training = page.sft_training([sft_run(tmp_path / "f", 0, [], [], floor)])
    assert "0.2000, 0.0014, 0.0005 (-64.3%, -0.0009 nats" in training and "**met**" in training
    steep = model_log(tmp_path / "steep", {50: 0.2, 100: 0.01, 150: 0.005})  # -50%, -0.005 nats: not met
    assert "**not met**" in page.sft_training([sft_run(tmp_path / "s", 0, [], [], steep)])
    # a model trained under a one-cycle schedule (its own config) gets the caveat; a constant rate does not
    assert "one-cycle" not in page.sft_training(runs[:2])
    (grid / "resolved_config.yaml").write_text(
        yaml.safe_dump({"module": {"scheduler": {"_target_": "zoo.optim.one_cycle"}}})
    )
    assert "a flat last validation interval does not show" in page.sft_training(runs[:2])
    (grid / "resolved_config.yaml").write_text(
        yaml.safe_dump({"module": {"scheduler": {"_target_": "torch.optim.lr_scheduler.ConstantLR"}}})
    )
    assert "one-cycle" not in page.sft_training(runs[:2])


def test_parsed_replies_are_counted_at_the_first_request_and_after_it():
    call, garbage = {"tool": "query_organisms"}, {"tool": None}
    eps = [{"steps": [call, garbage, garbage]}, {"steps": [call, call, garbage]}, {"steps": [garbage]}, {"steps": []}]
    text = page.parsed_by_position(eps)
    assert "first request 2 of 3, later requests 1 of 4" in text
    assert page.parsed_by_position([{"steps": []}]) == ""


def test_difficulty_note_reads_the_arms_that_ran_at_every_difficulty(tmp_path):
    runs = []
    for difficulty in ("easy", "hard"):
        for seed in range(2):
            run = write_run(tmp_path / difficulty, "random", seed, 0.1 * seed, 200)
            run.arm[page.DIFFICULTY_KEY] = difficulty
            runs.append(run)
    sft = write_run(tmp_path / "easy", page.SFT_ARM, 0, 0.0, 16)
    sft.arm[page.DIFFICULTY_KEY] = "easy"
    runs.append(sft)

    def runs_of(env, difficulty, arm):
        return [r for r in runs if r.arm[page.DIFFICULTY_KEY] == difficulty and r.arm[page.ARM_KEY] == arm]

    note = page.same_difficulty_note("ultrahorizon/grid", ["easy", "hard"], ["random", page.SFT_ARM], runs_of, str)
    assert note.startswith("Every agent scored the same on easy and hard")
    assert note.endswith(f"not run at every difficulty: {page.SFT_ARM}.")  # an easy-only arm does not void it
    assert page.same_difficulty_note("ultrahorizon/grid", ["easy", "hard"], ["random"], runs_of, str).endswith(
        "(as in the official code)."
    )
    runs[2].path.joinpath("csv", "metrics.csv").write_text("step,test/score\n0,0.9\n")  # hard seed 0 now differs
    runs_of_fresh = [Run(path=r.path, overrides=r.overrides, seed=r.seed) for r in runs]
    for fresh, old in zip(runs_of_fresh, runs, strict=True):
        fresh.arm = old.arm
    runs[:] = runs_of_fresh
    assert page.same_difficulty_note("ultrahorizon/grid", ["easy", "hard"], ["random"], runs_of, str) == ""


def test_long_chat_training_is_read_from_each_models_own_config(tmp_path):
    def model(name: str, overflow: str | None) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "resolved_config.yaml").write_text(yaml.safe_dump({"datamodule": {"overflow": overflow}}))
        return path

    left_out, cut = model("left_out", None), model("cut", "keep_recent")
    assert "keeps only the requests" in page.long_chat_training([sft_run(tmp_path / "a", 0, [], [], left_out)], 1024)
    text = page.long_chat_training([sft_run(tmp_path / "b", 0, [], [], cut)], 1024)
    assert "`datamodule.overflow=keep_recent`" in text and "keeps only" not in text
    both = [sft_run(tmp_path / "c", 0, [], [], left_out), sft_run(tmp_path / "d", 1, [], [], cut)]
    assert "differ" in page.long_chat_training(both, 1024)
    assert "not known" in page.long_chat_training([sft_run(tmp_path / "e", 0, [], [], tmp_path / "gone")], 1024)


def test_model_tokens_are_read_from_each_models_own_config(tmp_path):
    def model(name: str, backbone: dict) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "resolved_config.yaml").write_text(yaml.safe_dump({"backbone": backbone}))
        return path

    chars = model("chars", {"hidden_size": 128})
    bpe = model("bpe", {"tokenizer": {"_target_": "zoo.datamodules.demonstration_tokenizer", "vocab_size": 1024}})
    saved = model("saved", {"tokenizer": "/data/my_tokenizer"})
    assert page.model_tokens([sft_run(tmp_path / "a", 0, [], [], chars)]) == "character"
    text = page.model_tokens([sft_run(tmp_path / "b", 0, [], [], bpe)])
    assert text.startswith("byte-level BPE (1024 tokens)")
    assert "`/data/my_tokenizer`" in page.model_tokens([sft_run(tmp_path / "c", 0, [], [], saved)])
    mixed = page.model_tokens([sft_run(tmp_path / "d", 0, [], [], chars), sft_run(tmp_path / "e", 1, [], [], bpe)])
    assert mixed.startswith("mixed:") and "character" in mixed and "BPE" in mixed
    assert "unknown" in page.model_tokens([sft_run(tmp_path / "f", 0, [], [], tmp_path / "gone")])


def test_tool_use_counts_calls_by_tool_names_invented_tools_and_the_teachers_tools_never_called():
    def step(tool, ok=True, error=None):
        return {"tool": tool, "ok": ok, "error": error}

    model = [
        {
            "steps": [
                step("move"),
                step("move", ok=False),
                step("get_full_state", False, "unknown tool 'get_full_state'"),
            ]
        },
        {"steps": [step("move"), step(None, False, "malformed tool call"), step("note_tool")]},
    ]
    teacher = [{"steps": [step("move"), step("note_tool"), step("reset"), step("commit_final_result")]}]
    text = page.tool_use(model, teacher, "scripted teacher")
    assert "over 2 episodes (succeeded of made): `move` 2 of 3, `note_tool` 1 of 1" in text
    assert "tools that do not exist: `get_full_state` (1)" in text and "`get_full_state` 0 of" not in text
    assert text.endswith("it never called `commit_final_result`, `reset`.")
    assert page.tool_use(model, model, "scripted teacher").endswith(
        "it called every tool its teacher (scripted teacher, same setting) called."
    )
    assert (
        page.tool_use([{"steps": [step(None, False, "malformed")]}], teacher, "scripted teacher")
        == "no reply parsed as a tool call."
    )


def test_the_step_cap_reads_the_environments_own_when_none_is_set():
    """``module.max_steps`` unset is the environment's own cap (as the scripted arms'); a set cap is stated against the
    required steps and the environment's own."""
    own = page.step_cap(None, 50)
    assert own.startswith("at most the environment's own step cap per episode (4 × the 50 required steps")
    assert page.step_cap(100, 50).startswith("at most 100 steps per episode (2 × the 50 required steps;")


def test_round_ends_reads_where_the_model_spent_its_energy_and_whether_it_reset_like_its_teacher():
    def step(tool, over=False, ok=True):
        observation = {"game_over": over} if tool in ("move", "get_current_state") else {"success": ok}
        return {"tool": tool, "ok": ok, "observation": observation}

    stuck = {"steps": [step("move"), step("move", over=True), step("move", ok=False), step(None, ok=False)]}
    recovered = {"steps": [step("move", over=True), step("reset"), step("move")]}
    # a round's end is read once however many observations repeat it; the next round ends after the reset
    teacher = [
        {
            "steps": [
                step("move", over=True),
                step("get_current_state", over=True),
                step("note_tool"),
                step("reset"),
                step("move", over=True),
                step("note_tool"),
            ]
        }
    ]
    assert page.round_ends_of(teacher[0]["steps"]) == [(0, 3), (4, None)]
    text = page.round_ends([stuck], teacher, "scripted teacher")
    assert text.startswith("1 of 1 episodes reached the end of a round (energy spent: `game_over`), at step 2;")
    assert "none called `reset` afterwards: the remaining 2 steps went to calls the ended round refuses" in text
    assert text.endswith("called `reset` after 1 of the 2 round ends in its 1 episodes, within 3 calls.")
    both = page.round_ends([stuck, recovered, {"steps": [step("move")]}], [], "t")
    assert both.startswith("2 of 3 episodes reached the end of a round") and "at steps 2, 1;" in both
    assert both.endswith("1 called `reset` afterwards.") and "teacher" not in both
    # the model never ended a round (observations that are not dicts are skipped) while its teacher did: said
    never = page.round_ends([{"steps": [step("move"), {"tool": "x", "observation": "text"}]}], teacher, "t")
    assert never == (
        "none of its 1 episodes reached the end of a round (energy spent: `game_over`); its teacher (t, same setting) "
        "called `reset` after 1 of the 2 round ends in its 1 episodes, within 3 calls."
    )
    # neither ended a round (Alien Genetics Lab has no rounds): nothing to say
    assert page.round_ends([{"steps": [step("query")]}], [{"steps": [step("query")]}], "t") == ""
