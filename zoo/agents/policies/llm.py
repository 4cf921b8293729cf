"""The LLM tool-calling agent: any :class:`~zoo.agents.backends.Backend` drives the environment's tools.

Mirrors UltraHorizon's OpenManus loop: the task description is the system prompt, the conversation starts with a
next-step instruction, each model reply may call tools and only the first call is executed; a reply without a
call gets the next-step instruction again, and a reply whose call cannot be parsed gets the parse error back. A
reply that stopped because it reached ``max_tokens`` (``finish_reason == "length"``) is never executed, even when
a tool call can be recovered from it, and the agent is told. All three are recorded as failed steps. The backend
receives the agent's seed with every request.
"""

from __future__ import annotations

from typing import ClassVar

from zoo.agents.backends.base import Backend
from zoo.agents.policies.base import Action, Agent, EpisodeInfo, call_message
from zoo.errors import ConfigError

NEXT_STEP_PROMPT = (
    "Pick the single most useful tool for the next step (one tool call per reply) and call it. Think first: state "
    "what you observed, your current hypotheses and your plan. Write notes of observations and conclusions with "
    "note_tool and review them often. Before committing, read your notes and check every conclusion."
)

TRUNCATED = (
    "your reply was cut off at the token limit (finish_reason=length), so no tool call in it was run; reply "
    "again, shorter"
)


class LLMToolAgent(Agent):
    """A chat model calling tools.

    Args:
        backend: the model (scripted, local HF, or OpenAI-compatible).
        seed: forwarded with every request.
        temperature, max_tokens: per-request overrides of the backend's defaults.
        next_step_prompt: the instruction that opens the conversation and answers a reply without a tool call.
    """

    name: ClassVar[str] = "llm"
    records_own_messages: ClassVar[bool] = True

    def __init__(
        self,
        backend: Backend | None = None,
        seed: int = 0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        next_step_prompt: str = NEXT_STEP_PROMPT,
    ) -> None:
        super().__init__(seed)
        if backend is None:
            raise ConfigError(
                "agent=llm needs a model backend, e.g. backend=openai_compat backend.base_url=http://localhost:8000/v1 "
                "backend.model=<name>, backend=hf_local backend.path=<save_pretrained dir>, or a backbone as the model "
                "in process (backbone=tiny, or backbone=hf backbone.name_or_path=<dir>)"
            )
        self.backend = backend
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.next_step_prompt = next_step_prompt

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        self.backend.reset_episode()
        self.context.add({"role": "user", "content": self.next_step_prompt})

    def decide(self) -> Action:
        messages = [{"role": "system", "content": self.info.prompt}, *self.context.messages]
        reply = self.backend.complete(
            messages, self.info.tools, seed=self.seed, temperature=self.temperature, max_tokens=self.max_tokens
        )
        if reply.truncated:
            # a reply cut off by max_tokens is never executed (a repaired, truncated commit would use up the one
            # commit); the agent is told, as OpenManus answers a call whose arguments are not valid JSON
            self.context.add({"role": "assistant", "content": reply.content})
            self.context.add({"role": "user", "content": f"Error: {TRUNCATED}. {self.next_step_prompt}"})
            return Action(None, error=TRUNCATED, text=reply.content, usage=reply.usage)
        if reply.tool_calls:
            call = reply.tool_calls[0]
            self.context.add(call_message(call, reply.content))
            return Action(call, text=reply.content, usage=reply.usage)
        self.context.add({"role": "assistant", "content": reply.content})
        if reply.parse_errors:
            error = "malformed tool call: " + "; ".join(reply.parse_errors)
            self.context.add(
                {"role": "user", "content": f"Your tool call could not be read ({error}). {self.next_step_prompt}"}
            )
        else:
            error = "the reply called no tool"
            self.context.add({"role": "user", "content": self.next_step_prompt})
        return Action(None, error=error, text=reply.content, usage=reply.usage)
