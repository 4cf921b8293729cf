"""Backends: scripted determinism, the record/replay cache, the OpenAI-compatible backend against a local test
server (native calls, text fallback, seeds, retries, unreachable endpoint), and a real local HF causal LM."""

from __future__ import annotations

import json

import pytest
from fake_openai import closed_port_url, serve

from zoo.agents import HFLocalBackend, OpenAICompatBackend, ReplayCache, ScriptedBackend
from zoo.agents.errors import BackendError, ReplayMissError, UnreachableEndpointError
from zoo.backbones import TinyBackbone
from zoo.errors import CheckpointNotFoundError, ConfigError

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]},
    },
}
CHAT = [{"role": "system", "content": "Explore."}, {"role": "user", "content": "Next step."}]


def no_sleep(seconds: float) -> None:
    pass


def test_scripted_backend_replies_in_order_and_parses_text_and_native_calls():
    backend = ScriptedBackend(
        [
            '<tool_call>{"name": "move", "arguments": {"direction": "up"}}</tool_call>',
            {"content": "", "tool_calls": [{"name": "move", "arguments": {"direction": "left"}}]},
            "no call at all",
        ]
    )
    first, second, third = (backend.complete(CHAT, [MOVE]) for _ in range(3))
    assert first.tool_calls[0].arguments == {"direction": "up"}
    assert second.tool_calls[0].arguments == {"direction": "left"}
    assert third.tool_calls == [] and third.parse_errors == []
    assert backend.usage.calls == 3 and backend.usage.prompt_tokens > 0
    with pytest.raises(BackendError, match="ran out"):
        backend.complete(CHAT, [MOVE])


def test_record_then_replay_gives_identical_completions(tmp_path):
    path = tmp_path / "cache.jsonl"
    recorder = ScriptedBackend(
        ["a", '{"name": "move", "arguments": {"direction": "up"}}'], cache={"path": path, "mode": "record"}
    )
    recorded = [recorder.complete(CHAT + [{"role": "user", "content": str(i)}], [MOVE], seed=3) for i in range(2)]
    assert len(path.read_text().splitlines()) == 2
    replayer = ScriptedBackend(["something else"], cache=ReplayCache(path, "replay"))
    replayed = [replayer.complete(CHAT + [{"role": "user", "content": str(i)}], [MOVE], seed=3) for i in range(2)]
    assert [r.to_dict() for r in replayed] == [r.to_dict() for r in recorded]
    assert replayer.usage == recorder.usage
    with pytest.raises(ReplayMissError, match="no recorded reply"):
        replayer.complete(CHAT, [MOVE], seed=4)  # another seed is another request


def test_cache_rejects_bad_settings(tmp_path):
    with pytest.raises(ConfigError, match="mode"):
        ReplayCache(tmp_path / "c.jsonl", "sometimes")
    with pytest.raises(ConfigError, match="does not exist"):
        ReplayCache(tmp_path / "missing.jsonl", "replay")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "k", "response": {}}\nnot json\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        ReplayCache(bad, "auto")


def test_openai_compatible_native_tool_calls_seed_and_usage():
    with serve() as server:
        call = {"id": "call_9", "type": "function", "function": {"name": "move", "arguments": '{"direction": "down"}'}}
        server.replies.append((200, server.reply("", [call])))
        backend = OpenAICompatBackend(server.base_url, "tiny-model", api_key="sk-test", max_tokens=33)
        completion = backend.complete(CHAT, [MOVE], seed=7, temperature=0.5)
    body = server.requests[0]
    assert body["model"] == "tiny-model" and body["seed"] == 7 and body["temperature"] == 0.5
    assert body["max_tokens"] == 33 and body["tools"] == [MOVE] and body["messages"] == CHAT
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert [(c.id, c.name, c.arguments) for c in completion.tool_calls] == [("call_9", "move", {"direction": "down"})]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (11, 7)


def test_openai_compatible_falls_back_to_calls_written_in_text():
    with serve() as server:
        server.replies.append((200, server.reply('Going up.\n{"name": "move", "arguments": {"direction": "up"}}')))
        server.replies.append((200, server.reply('{"name": "move", "arguments": {"direction": ', usage=False)))
        backend = OpenAICompatBackend(server.base_url, "m")
        parsed = backend.complete(CHAT, [MOVE])
        broken = backend.complete(CHAT + [{"role": "user", "content": "again"}], [MOVE])
    assert parsed.tool_calls[0].arguments == {"direction": "up"}
    assert broken.tool_calls == [] and broken.parse_errors
    assert broken.usage.prompt_tokens > 0  # estimated when the server reports no usage


def test_flattened_messages_for_servers_without_tool_roles():
    history = [
        *CHAT,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "move", "arguments": '{"direction": "up"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "name": "move", "content": '{"success": true}'},
    ]
    with serve() as server:
        OpenAICompatBackend(server.base_url, "m", native_tools=False).complete(history, [MOVE])
    body = server.requests[0]
    assert "tools" not in body
    assert {m["role"] for m in body["messages"]} == {"system", "user", "assistant"}
    assert "move" in body["messages"][0]["content"]  # the tools are described in the system prompt
    assert "<tool_call>" in body["messages"][2]["content"]


def test_retries_with_backoff_then_succeeds():
    waits = []
    with serve() as server:
        server.replies += [(503, {"error": "busy"}), (429, {"error": "slow down"}), (200, server.reply("fine"))]
        backend = OpenAICompatBackend(server.base_url, "m", max_retries=3, backoff=0.5, sleep=waits.append)
        assert backend.complete(CHAT).content == "fine"
    assert len(server.requests) == 3
    assert waits == [0.5, 1.0]


def test_a_429_then_200_waits_the_retry_after_seconds_and_the_policy_is_configurable():
    waits = []
    with serve() as server:
        server.replies += [(429, {"error": "rate limited"}, {"Retry-After": "2"}), (200, server.reply("fine"))]
        backend = OpenAICompatBackend(server.base_url, "m", backoff=0.5, sleep=waits.append)
        assert backend.complete(CHAT).content == "fine"
        assert len(server.requests) == 2 and waits == [2.0]  # the server's Retry-After, not the 0.5 s backoff
        # the exponential wait is capped at max_backoff; a Retry-After above the cap falls back to the backoff
        server.replies += [(503, {}), (503, {}), (503, {}, {"Retry-After": "300"}), (200, server.reply("late"))]
        waits.clear()
        capped = OpenAICompatBackend(
            server.base_url, "m", max_retries=3, backoff=1.0, max_backoff=1.5, sleep=waits.append
        )
        assert capped.complete(CHAT).content == "late"
        assert waits == [1.0, 1.5, 1.5]
        # a status left out of retry_statuses is an error at once
        server.replies += [(429, {"error": "rate limited"}), (200, server.reply("never"))]
        strict = OpenAICompatBackend(server.base_url, "m", retry_statuses=[503], sleep=waits.append)
        before = len(server.requests)
        with pytest.raises(BackendError, match="HTTP 429"):
            strict.complete(CHAT)
        assert len(server.requests) == before + 1
    with pytest.raises(ConfigError, match="retry_statuses"):
        OpenAICompatBackend("http://localhost:8000/v1", "m", retry_statuses=[200])


def test_a_slow_server_hits_the_timeout_with_one_clear_error():
    waits = []
    with serve() as server:
        server.delay = 1.0
        backend = OpenAICompatBackend(
            server.base_url, "m", timeout=0.1, max_retries=1, backoff=0.25, sleep=waits.append
        )
        with pytest.raises(BackendError, match=r"no reply within backend\.timeout=0\.1 s on any of 2 attempts") as err:
            backend.complete(CHAT)
    assert not isinstance(err.value, UnreachableEndpointError)  # the server was reached: this episode fails only
    assert len(server.requests) == 2 and waits == [0.25]
    with pytest.raises(ConfigError, match="timeout"):
        OpenAICompatBackend("http://localhost:8000/v1", "m", timeout=0)


def test_a_server_that_rejects_the_seed_gets_requests_without_it_and_one_log_line(caplog):
    waits = []
    with serve() as server:
        server.reject_fields = {"seed"}
        backend = OpenAICompatBackend(server.base_url, "m", sleep=waits.append)
        with caplog.at_level("WARNING", logger="zoo.agents.backends.openai_compat"):
            first = backend.complete(CHAT, seed=3)
            second = backend.complete(CHAT + [{"role": "user", "content": "again"}], seed=4)
        assert len([r for r in caplog.records if "rejects the seed" in r.getMessage()]) == 1
        # a refusal after a 503 is sent again at once: one wait (for the 503), the refusal costs no attempt
        server.reject_fields = set()
        refusal = (422, {"error": {"message": "Extra inputs are not permitted: seed"}})
        server.replies += [(503, {}), refusal, (200, server.reply("third"))]
        later = OpenAICompatBackend(server.base_url, "m", max_retries=1, backoff=0.5, sleep=waits.append)
        assert later.complete(CHAT, seed=5).content == "third"
    assert first.content == second.content == "ok"
    assert ["seed" in body for body in server.requests] == [True, False, False, True, True, False]
    assert waits == [0.5]  # only the 503 waited


def test_client_errors_are_not_retried():
    with serve() as server:
        server.replies.append((400, {"error": {"message": "unknown model"}}))
        backend = OpenAICompatBackend(server.base_url, "m", max_retries=3, sleep=no_sleep)
        with pytest.raises(BackendError, match="HTTP 400.*unknown model"):
            backend.complete(CHAT)
    assert len(server.requests) == 1


def test_unreachable_endpoint_is_one_clear_error():
    url = closed_port_url()
    backend = OpenAICompatBackend(url, "m", max_retries=2, backoff=0.0, sleep=no_sleep, timeout=5)
    with pytest.raises(UnreachableEndpointError, match=r"could not reach .* after 3 attempts.*base_url"):
        backend.complete(CHAT)


def test_bad_backend_settings():
    with pytest.raises(ConfigError, match="base_url"):
        OpenAICompatBackend("localhost:8000", "m")
    with pytest.raises(ConfigError, match="model"):
        OpenAICompatBackend("http://localhost:8000/v1", "")


@pytest.fixture(scope="module")
def tiny_lm():
    backbone = TinyBackbone(seed=0)
    return backbone.build_model(), backbone.tokenizer


def test_hf_local_backend_generates_deterministically_with_a_seed(tiny_lm):
    model, tokenizer = tiny_lm
    backend = HFLocalBackend(model=model, tokenizer=tokenizer, temperature=1.0, max_tokens=12, overflow="keep_recent")
    a = backend.complete(CHAT, [MOVE], seed=5)
    b = backend.complete(CHAT, [MOVE], seed=5)
    c = backend.complete(CHAT, [MOVE], seed=6)
    assert a.content == b.content and a.content != c.content
    assert 0 < a.usage.completion_tokens <= 12 and a.usage.prompt_tokens > 50
    text, templated = backend.render(CHAT, [MOVE])
    assert not templated and "<|system|>" in text and '"name": "move"' in text  # no chat template: plain transcript


def test_hf_local_backend_uses_the_chat_template_and_loads_saved_directories(tiny_lm, tmp_path):
    model, tokenizer = tiny_lm
    tokenizer = type(tokenizer).from_pretrained(_save(model, tokenizer, tmp_path / "lm"))
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}[assistant]"
    backend = HFLocalBackend(model=model, tokenizer=tokenizer, max_tokens=4)
    text, templated = backend.render(CHAT, [MOVE])
    assert templated and text == "[system]Explore.[user]Next step.[assistant]"
    loaded = HFLocalBackend(path=str(tmp_path / "lm"), max_tokens=4, overflow="keep_recent")
    greedy = loaded.complete(CHAT, [MOVE], seed=0)
    again = HFLocalBackend(model=model, tokenizer=tiny_lm[1], max_tokens=4, overflow="keep_recent")
    again = again.complete(CHAT, [MOVE], seed=0)
    assert greedy.content == again.content  # same weights, same greedy reply


def test_hf_local_backend_drives_a_zoo_generating_module():
    from zoo.modules import CausalLMModule

    module = CausalLMModule(backbone=TinyBackbone(seed=1))
    assert module.model is None
    backend = HFLocalBackend.from_module(module, max_tokens=3, overflow="keep_recent")
    assert module.model is not None  # built on demand (configure_model)
    reply = backend.complete(CHAT, [MOVE], seed=0)
    assert 0 < reply.usage.completion_tokens <= 3 and backend.identity()["kind"] == "hf_local"


def test_hf_local_backend_drops_the_oldest_turns_never_the_system_prompt(tiny_lm, caplog):
    """The tiny model's context is 256 tokens: a long chat must lose its oldest turns, not the system prompt."""
    model, tokenizer = tiny_lm
    system = {"role": "system", "content": "TASK: explore the grid."}
    turns = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i:02d} " + "x" * 30} for i in range(12)]
    backend = HFLocalBackend(model=model, tokenizer=tokenizer, max_tokens=8)
    with caplog.at_level("WARNING", logger="zoo.agents.backends.hf_local"):
        reply = backend.complete([system, *turns], None, seed=0)
        backend.complete([system, *turns, {"role": "user", "content": "more"}], None, seed=0)
    kept = next(k for k in range(len(turns)) if len(backend.encode([system, *turns[k:]], [])) <= 256 - 8)
    assert kept > 0 and reply.usage.prompt_tokens == len(backend.encode([system, *turns[kept:]], []))
    assert sum("oldest turns are dropped" in r.message for r in caplog.records) == 1  # logged once
    with pytest.raises(BackendError, match="system prompt and the last message"):
        backend.complete([{"role": "system", "content": "y" * 400}, turns[-1]], None, seed=0)
    cut = HFLocalBackend(model=model, tokenizer=tokenizer, max_tokens=8, overflow="keep_recent")
    assert cut.complete([{"role": "system", "content": "y" * 400}, turns[-1]], None).usage.prompt_tokens == 248


def test_finish_reason_is_read_and_a_length_cut_reply_is_never_run():
    call = {"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"direction": "up"}'}}
    with serve() as server:
        body = server.reply("", [call])
        body["choices"][0]["finish_reason"] = "length"
        server.replies.append((200, body))
        reply = OpenAICompatBackend(server.base_url, "m").complete(CHAT, [MOVE])
    assert reply.finish_reason == "length" and reply.truncated and reply.tool_calls


def test_hf_local_backend_refuses_missing_directories(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        HFLocalBackend(path=str(tmp_path / "nowhere"))


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_record_replay_cache_file_holds_the_request(tmp_path):
    path = tmp_path / "c.jsonl"
    ScriptedBackend(["x"], cache={"path": path, "mode": "auto"}).complete(CHAT, [MOVE], seed=1)
    row = json.loads(path.read_text())
    assert row["request"]["seed"] == 1 and row["request"]["messages"] == CHAT
