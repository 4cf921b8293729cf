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
from zoo.agents.memory_interface import MemoryProvider, MemoryRequest, MemoryResponse, MemoryStatus
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

# the released code's delimiters, with ASCII rules for its em dashes (a character tokenizer knows no em dash)
MEMORY_HEADER = "----Memory System Guidance----"
MEMORY_FOOTER = "----End Memory----"


def memory_guidance(response: MemoryResponse) -> str:
    """The items' text, one per line, between :data:`MEMORY_HEADER` and :data:`MEMORY_FOOTER` (empty when the
    provider returned nothing)."""
    contents = [str(item.content) for item in response.memories if str(item.content).strip()]
    return f"{MEMORY_HEADER}\n" + "\n".join(contents) + f"\n{MEMORY_FOOTER}" if contents else ""


class LLMToolAgent(Agent):
    """A chat model calling tools.

    Args:
        backend: the model (scripted, local HF, or OpenAI-compatible).
        seed: forwarded with every request.
        temperature, max_tokens: per-request overrides of the backend's defaults.
        next_step_prompt: the instruction that opens the conversation and answers a reply without a tool call.
        memory: an EvolveLab memory provider whose guidance the model reads (``None``: no memory).
        in_queries: ``IN`` requests per episode, one before each step after the first (``None``: every step, as
            the released code; ``0``: ``BEGIN`` only).
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
        memory: MemoryProvider | None = None,
        in_queries: int | None = None,
    ) -> None:
        super().__init__(seed)
        if in_queries is not None and in_queries < 0:
            raise ConfigError(f"agent.in_queries must be >= 0 or null (every step), got {in_queries}")
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
        self.memory = memory
        self.in_queries = in_queries
        if memory is not None:
            memory.initialize()
        #: the episode's BEGIN guidance (in the system prompt) and the memory requests made so far
        self.guidance = ""
        self.memory_requests = 0
        self.steps = 0
        self.in_left = in_queries

    def begin(self, info: EpisodeInfo) -> None:
        super().begin(info)
        self.backend.reset_episode()
        self.context.add({"role": "user", "content": self.next_step_prompt})
        self.memory_requests = 0
        self.steps = 0
        self.in_left = self.in_queries
        self.guidance = self.ask(MemoryStatus.BEGIN, "")

    def ask(self, status: MemoryStatus, context: str) -> str:
        """The provider's guidance for the task (the environment's task query, else its prompt) and ``context``."""
        if self.memory is None:
            return ""
        assert self.info is not None
        query = str(self.info.library.get("query") or self.info.prompt)
        self.memory_requests += 1
        return memory_guidance(self.memory.provide_memory(MemoryRequest(query, context, status)))

    def step_guidance(self) -> str:
        """The ``IN`` guidance before a step after the first (within :attr:`in_queries`)."""
        if self.memory is None or self.in_left == 0:
            return ""
        if self.in_left is not None:
            self.in_left -= 1
        messages = self.context.messages
        return self.ask(MemoryStatus.IN, str(messages[-1].get("content") or "") if messages else "")

    def decide(self) -> Action:
        assert self.info is not None
        system = f"{self.info.prompt}\n\n{self.guidance}" if self.guidance else self.info.prompt
        messages = [{"role": "system", "content": system}, *self.context.messages]
        if self.steps > 0:
            step_guidance = self.step_guidance()
            if step_guidance:  # this step's request only, never the kept context
                messages.append({"role": "user", "content": step_guidance})
        self.steps += 1
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
