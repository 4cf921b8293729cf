"""The harness: commit once, CRNR, failed steps instead of crashes, replay determinism, the public evaluate(), the
LLM-judge path (local test server) and the sandboxed code tool."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fake_openai import serve

from zoo.agents import (
    CRNR,
    Context,
    HypothesisEliminationAgent,
    LLMToolAgent,
    MysteryGrid,
    NoteBook,
    OpenAICompatBackend,
    PythonSandbox,
    ScriptedBackend,
    SequenceExploration,
    evaluate,
    run_episode,
)
from zoo.agents.context import REFRESH_MESSAGE
from zoo.agents.errors import BackendError, UnreachableEndpointError
from zoo.agents.evaluate import derive_seed, run_episodes
from zoo.agents.metrics import summarize, windowed_entropy
from zoo.agents.runner import StepRecord, build_registry
from zoo.errors import ConfigError

ENVS = ["ultrahorizon/grid", "ultrahorizon/sequence", "ultrahorizon/bio"]


def test_crnr_leaves_exactly_one_message_and_the_notes_survive():
    notes = NoteBook()
    refreshed = []
    context = Context(window=4, on_refresh=lambda: refreshed.append(True))
    notes.note_tool("write_note", "A: +1 score")
    for i in range(4):
        context.add({"role": "user", "content": str(i)})
    assert len(context) == 4 and not refreshed
    context.add({"role": "user", "content": "overflow"})
    assert context.messages == [{"role": "user", "content": REFRESH_MESSAGE}] and refreshed == [True]
    assert notes.note_tool("check_notes") == {"success": True, "notes": ["A: +1 score"]}
    assert not notes.note_tool("write_note")["success"]


def test_crnr_wrapper_refreshes_a_scripted_agent_which_recalls_its_notes():
    env = SequenceExploration(seed=0, required_steps=20)
    agent = CRNR(HypothesisEliminationAgent(seed=0, note_every=3), window=12)
    trajectory = run_episode(env, agent)
    assert trajectory.refreshes >= 2
    assert max(step.context_messages for step in trajectory.steps) <= 12
    recalls = [s for s in trajectory.steps if s.tool == "note_tool" and s.arguments["action"] == "check_notes"]
    assert len(recalls) == trajectory.refreshes
    assert any(s.observation["notes"] for s in recalls)  # notes written before a refresh are read back after it
    assert trajectory.committed


def test_the_episode_ends_at_the_first_accepted_commit():
    env = SequenceExploration(seed=0, required_steps=5)
    trajectory = run_episode(env, HypothesisEliminationAgent(seed=0))
    commits = [s for s in trajectory.steps if s.tool == "commit_final_result"]
    assert trajectory.committed and len(commits) == 1 and commits[0].ok
    assert trajectory.steps[-1] is commits[0]


REPLIES = [
    '<tool_call>{"name": "get_full_map", "arguments": {}}</tool_call>',
    '{"name": "move", "arguments": {"direction": ',  # truncated JSON
    "I will think about it first.",  # no call
    '<tool_call>{"name": "teleport", "arguments": {"x": 1}}</tool_call>',  # unknown tool
    '<tool_call>{"name": "move", "arguments": {"direction": "up", "speed": 2}}</tool_call>',  # bad arguments
    '<tool_call>{"name": "commit_final_result", "arguments": {"content": "{\\"A\\": \\"score_plus_1\\"}"}}</tool_call>',
    'move(direction="left")',
]


def test_malformed_model_output_is_recorded_as_failed_steps_never_a_crash():
    env = MysteryGrid(seed=0, required_steps=3, free=True)
    agent = LLMToolAgent(ScriptedBackend(REPLIES), seed=0)
    trajectory = run_episode(env, agent, max_steps=len(REPLIES))
    steps = trajectory.steps
    assert [s.ok for s in steps] == [True, False, False, False, False, False, True]
    assert steps[1].tool is None and "malformed tool call" in steps[1].error
    assert steps[2].tool is None and "no tool" in steps[2].error
    assert steps[3].tool == "teleport" and "unknown tool" in steps[3].error and "move" in steps[3].error
    assert steps[4].tool == "move" and "speed" in steps[4].error
    assert steps[5].tool == "commit_final_result" and "Commit rejected" in steps[5].observation["message"]
    assert steps[6].observation["success"] is True  # call syntax recovered
    assert not env.committed and "invalid_commit" in trajectory.tags and "tool_misuse" in trajectory.tags
    assert trajectory.usage.calls == len(REPLIES) and trajectory.usage.total_tokens > 0


def test_scripted_backend_replay_is_deterministic(tmp_path):
    path = tmp_path / "replies.jsonl"
    record = ScriptedBackend(REPLIES, cycle=True, cache={"path": path, "mode": "record"})
    first = evaluate("ultrahorizon/grid", "llm", episodes=2, seed=4, backend=record, max_steps=9, required_steps=3)
    replay = ScriptedBackend(["never used"], cache={"path": path, "mode": "replay"})
    second = evaluate("ultrahorizon/grid", "llm", episodes=2, seed=4, backend=replay, max_steps=9, required_steps=3)
    assert first == second and first["tokens"] > 0
    assert replay.usage == record.usage


def test_evaluate_is_deterministic_and_seed_dependent():
    a = evaluate("ultrahorizon/grid", "random", episodes=3, seed=1, required_steps=10)
    b = evaluate("ultrahorizon/grid", "random", episodes=3, seed=1, required_steps=10)
    c = evaluate("ultrahorizon/grid", "random", episodes=3, seed=2, required_steps=10)
    assert a == b and a != c
    assert {"score", "scores", "tool_calls", "score_ci95", "tokens", "entropy_curve", "error_tags"} <= set(a)
    assert 0.0 <= a["score"] <= 1.0 and len(a["scores"]) == 3
    assert a["score"] == pytest.approx(sum(a["scores"]) / 3)


@pytest.mark.parametrize("env", ENVS)
def test_hypothesis_elimination_beats_random_and_early_commit_at_fixed_seeds(env):
    scores = {
        agent: evaluate(env, agent, episodes=3, seed=0)["score"]
        for agent in ("random", "early_commit", "hypothesis_elimination")
    }
    assert scores["hypothesis_elimination"] > scores["random"]
    assert scores["hypothesis_elimination"] > scores["early_commit"]


def test_unknown_names_and_options_list_the_available_ones():
    with pytest.raises(
        ConfigError, match=r"unknown environment 'ultrahorizon/maze'.*ultrahorizon/bio.*ultrahorizon/grid"
    ):
        evaluate("ultrahorizon/maze", "random", episodes=1, seed=0)
    with pytest.raises(ConfigError, match=r"unknown agent 'genius'.*early_commit.*hypothesis_elimination.*random"):
        evaluate("ultrahorizon/grid", "genius", episodes=1, seed=0)
    with pytest.raises(ConfigError, match=r"unknown option 'difficulity'.*difficulty"):
        evaluate("ultrahorizon/grid", "random", episodes=1, seed=0, difficulity="easy")
    with pytest.raises(ConfigError, match="needs a model backend"):
        evaluate("ultrahorizon/grid", "llm", episodes=1, seed=0)
    with pytest.raises(ConfigError, match="episodes"):
        evaluate("ultrahorizon/grid", "random", episodes=0, seed=0)


def test_llm_judge_grades_free_text_with_the_rubric_and_ground_truth():
    verdict = {
        "final_score": 40,
        "score_breakdown": [
            {"criterion": k, "max_score": 20, "awarded_score": 20 if k in "AD" else 0, "comment": ""} for k in "ABCDE"
        ],
    }
    with serve() as server:
        server.replies.append((200, server.reply("<think>weighing</think>```json\n" + json.dumps(verdict) + "\n```")))
        judge = OpenAICompatBackend(server.base_url, "judge-model")
        env = MysteryGrid(seed=0, free=True, judge=judge)
        out = env.commit_final_result("A gives +2 when steps % 3 == 0 else -1; D refills energy below 10.")
    assert out["success"] and env.report.source == "llm_judge" and env.report.score == pytest.approx(0.4)
    prompt = server.requests[0]["messages"][1]["content"]
    assert "A gives +2 when steps" in prompt  # the commit
    assert "x or y in {0,1,8,9}" in prompt  # the ground truth (B, code corner mode)
    assert "(20 points)" in prompt and server.requests[0]["temperature"] == 0.0


def test_unreadable_judge_answer_scores_zero_and_keeps_the_text():
    with serve() as server:
        server.replies.append((200, server.reply("I think it is pretty good")))
        env = SequenceExploration(seed=0, free=True, judge=OpenAICompatBackend(server.base_url, "j"))
        assert env.commit_final_result("rule_1 interleaves")["success"]
    assert env.report.total == 0 and env.report.raw == {"unreadable": "I think it is pretty good"}


def test_code_tool_is_off_by_default_and_sandboxed_when_on():
    assert "python_execute" not in build_registry(MysteryGrid(seed=0), NoteBook()).names
    registry = build_registry(MysteryGrid(seed=0), NoteBook(), code_tool=True)
    assert registry.call("python_execute", {"code": "print(6 * 7)"}).content["output"].strip() == "42"
    blocked = PythonSandbox(timeout=5).python_execute("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert not blocked["success"] and "network access is disabled" in blocked["output"]
    slow = PythonSandbox(timeout=1).python_execute("while True:\n    pass")
    assert not slow["success"] and "stopped" in slow["message"]


def test_windowed_entropy_falls_when_actions_lock_in():
    def step(i, tool, direction):
        return StepRecord(i, tool, {"direction": direction}, True)

    varied = [step(i, "move", d) for i, d in enumerate(["up", "down", "left", "right"] * 5)]
    locked = [step(i, "move", "up") for i in range(20)]
    assert windowed_entropy(varied + locked, window=20) == [2.0, 0.0]


def test_the_agent_substrate_imports_neither_lightning_nor_hydra():
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('lightning', 'pytorch_lightning', 'hydra'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from zoo.agents import evaluate\n"
        "result = evaluate('ultrahorizon/sequence', 'hypothesis_elimination', episodes=1, seed=0, required_steps=3)\n"
        "print(result['score'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 0.0 <= float(proc.stdout.strip()) <= 1.0


def test_after_a_refresh_no_request_holds_an_orphaned_tool_message():
    call = '<tool_call>{"name": "input_sequences", "arguments": {"main_sequence": "ABCDE", "vice_sequence": "EDCBA"}}'
    requests = []

    def policy(messages, tools):
        requests.append(messages)
        return call

    agent = CRNR(LLMToolAgent(ScriptedBackend(policy=policy), seed=0), window=3)
    run_episode(SequenceExploration(seed=0, required_steps=8), agent, max_steps=8)
    assert agent.context.refreshes >= 2
    assert any(
        m["content"].startswith("[input_sequences returned]") for r in requests for m in r if m["role"] == "user"
    )
    for messages in requests:
        for previous, message in zip(messages, messages[1:]):
            if message["role"] == "tool":
                assert previous.get("tool_calls"), [m["role"] for m in messages]


ANSWER = json.dumps(dict.fromkeys("ABCDE", "0"))


def test_a_reply_cut_off_by_max_tokens_is_never_executed():
    """A length-cut reply whose (repairable) commit call would use up the single commit is a truncated step."""
    cut = '<tool_call>{"name": "commit_final_result", "arguments": {"content": "{\\"A\\": \\"1\\", \\"B'
    replies = [
        {"content": cut, "finish_reason": "length"},
        {"content": "", "tool_calls": [{"name": "commit_final_result", "arguments": {"content": ANSWER}}]},
    ]
    env = MysteryGrid(seed=0, required_steps=3, free=True)
    agent = LLMToolAgent(ScriptedBackend(replies), seed=0)
    trajectory = run_episode(env, agent, max_steps=2)
    first, second = trajectory.steps
    assert first.tool is None and not first.ok and "finish_reason=length" in first.error
    assert "cut off at the token limit" in agent.context.messages[2]["content"]  # the agent is told
    assert second.tool == "commit_final_result" and second.ok and env.commit_content == ANSWER


class FailingBackend(ScriptedBackend):
    """A backend whose server answers HTTP 400 (context length) on the second request of episode 1."""

    def __init__(self) -> None:
        super().__init__(
            policy=lambda messages, tools: '<tool_call>{"name": "get_full_map", "arguments": {}}</tool_call>'
        )
        self.calls = 0

    def _complete(self, request):
        self.calls += self.seed_of(request) == "fail"
        if self.seed_of(request) == "fail" and self.calls == 2:
            raise BackendError("http://x/v1/chat/completions answered HTTP 400: maximum context length exceeded")
        return super()._complete(request)

    @staticmethod
    def seed_of(request):
        return "fail" if request["seed"] == derive_seed(0, 1, "agent") else "ok"


def test_a_model_error_fails_its_episode_only_and_is_counted():
    backend = FailingBackend()
    trajectories = run_episodes(
        lambda seed: MysteryGrid(seed=seed, required_steps=3, free=True),
        lambda seed: LLMToolAgent(backend, seed=seed),
        [0, 1, 2],
        0,
        max_steps=3,
    )
    assert [t.failed for t in trajectories] == [False, True, False]
    assert "HTTP 400" in trajectories[1].error and len(trajectories[1].steps) == 1  # the step before the error
    assert len(trajectories[2].steps) == 3  # the run went on
    assert summarize(trajectories)["failed_episodes"] == 1 and trajectories[1].score == 0.0
    unreachable = ScriptedBackend(["x"])
    unreachable._complete = lambda request: (_ for _ in ()).throw(UnreachableEndpointError("could not reach"))
    with pytest.raises(UnreachableEndpointError):  # a wrong endpoint is the run's configuration: it stops the run
        run_episodes(lambda seed: MysteryGrid(seed=seed), lambda seed: LLMToolAgent(unreachable, seed=seed), [0], 0)
