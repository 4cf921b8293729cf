"""Model backends: one protocol (:class:`Backend`), three implementations, one record/replay cache."""

from zoo.agents.backends.base import CACHE_MODES, Backend, ReplayCache, approx_tokens, flatten_messages, request_key
from zoo.agents.backends.hf_local import HFLocalBackend, backbone_llm
from zoo.agents.backends.openai_compat import OpenAICompatBackend
from zoo.agents.backends.scripted import ScriptedBackend

__all__ = [
    "CACHE_MODES",
    "Backend",
    "HFLocalBackend",
    "OpenAICompatBackend",
    "ReplayCache",
    "ScriptedBackend",
    "approx_tokens",
    "backbone_llm",
    "flatten_messages",
    "request_key",
]
