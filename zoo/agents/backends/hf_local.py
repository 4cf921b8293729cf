"""A local Hugging Face causal LM (or any zoo generating module) as a chat backend.

The chat is rendered with the tokenizer's chat template (tools passed to the template when it accepts them);
a tokenizer without a template (the zoo's character-level tokenizer) gets a plain role-tagged transcript with
the tools listed in the system prompt. Tool calls are recovered from the generated text. Weights load from
local files only (``local_files_only=True``). Decoding is :func:`zoo.generation.decoders.generate` (greedy at
temperature 0, else seeded sampling); the reply budget is capped at half the model's context. A chat longer than
the rest loses its **oldest turns** (never the system prompt, which carries the task, nor the last message); the
first time this happens a warning is logged. When the system prompt and the last message alone do not fit, the
request fails with a :class:`~zoo.agents.errors.BackendError` naming the sizes (the harness records the episode as
failed). ``finish_reason`` is ``length`` when the reply used its whole budget without an end of sequence.

**The run's backbone as the LLM, in process.** A run that composes a backbone (``backbone=tiny``, or ``backbone=hf
backbone.name_or_path=<dir>``) gives it to the model role of an agent or text-optimisation method
(:func:`backbone_llm`: the ``agent=llm`` agent, TextResNet/TextGrad's calls, MemEvolve's designer): the role's backend
is left unset (selected automatically) or is ``backend=hf_local`` without ``backend.path`` (to tune its settings, e.g.
``backend.overflow=keep_recent``), and the model is built once from the backbone and the run's quantizer
(:meth:`~zoo.backbones.base.Backbone.build_model`, frozen, eval mode) on first use. One model per run: a backbone with
a backend that names another model (``backend.path``, ``openai_compat``, ``scripted``) is an error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from zoo.agents.backends.base import Backend, ReplayCache, flatten_messages
from zoo.agents.errors import BackendError
from zoo.agents.types import Completion, Message, Usage
from zoo.errors import CheckpointNotFoundError, ConfigError

log = logging.getLogger(__name__)


def plain_transcript(messages: list[Message]) -> str:
    """``<|role|>\\ncontent`` blocks followed by the assistant tag (for tokenizers without a chat template)."""
    blocks = [f"<|{m['role']}|>\n{m.get('content') or ''}" for m in messages]
    return "\n".join(blocks) + "\n<|assistant|>\n"


#: what :meth:`HFLocalBackend.fit_context` does when the system prompt and the last message alone exceed the context
OVERFLOWS = ("error", "keep_recent")


def checked_overflow(overflow: str, key: str = "backend.overflow") -> str:
    """``overflow`` when it is one of :data:`OVERFLOWS`, else a :class:`ConfigError` naming them and the setting
    ``key`` it came from."""
    if overflow not in OVERFLOWS:
        raise ConfigError(f"{key}={overflow!r}; use one of {list(OVERFLOWS)}")
    return overflow


class HFLocalBackend(Backend):
    """Generate replies with a local causal LM.

    Args:
        path: a directory written by ``save_pretrained`` (model + tokenizer). Loaded on first use.
        model, tokenizer: an already built model and tokenizer instead of ``path`` (see :meth:`from_module`).
            With neither, the backend waits for the run's backbone (:meth:`bind_backbone`, :func:`backbone_llm`).
        device: where the model runs when loaded from ``path`` or built from a backbone.
        top_p: nucleus sampling when ``temperature > 0``.
        overflow: what to do when the system prompt and the last message alone exceed the context: ``error``
            (default) or ``keep_recent`` (keep the most recent tokens, cutting the system prompt; for models whose
            context is shorter than the task description, such as the tiny test models).
    """

    def __init__(
        self,
        path: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
        device: str = "cpu",
        top_p: float = 1.0,
        temperature: float = 0.0,
        max_tokens: int = 256,
        cache: ReplayCache | dict[str, Any] | None = None,
        overflow: str = "error",
    ) -> None:
        super().__init__(temperature, max_tokens, cache)
        self.overflow = checked_overflow(overflow)
        if (model is None) != (tokenizer is None):
            raise ConfigError("HFLocalBackend takes a model and its tokenizer together")
        if path is not None and model is not None:
            raise ConfigError("HFLocalBackend takes path=<save_pretrained dir> or a built model, not both")
        if path is not None and not Path(path).expanduser().is_dir():
            raise CheckpointNotFoundError(
                f"backend.path={path}: no such directory (a local save_pretrained directory is required; nothing "
                "is downloaded)"
            )
        self.path = None if path is None else str(Path(path).expanduser())
        self.device = device
        self.top_p = top_p
        self._model = model
        self._tokenizer = tokenizer
        self._backbone: Any = None
        self._quantizer: Any = None
        self._warned_truncation = False

    @property
    def bound(self) -> bool:
        """Whether the backend names its model (``path``, a built model, or a bound backbone)."""
        return self.path is not None or self._model is not None or self._backbone is not None

    def bind_backbone(self, backbone: Any, quantizer: Any = None) -> HFLocalBackend:
        """Use the run's backbone as the model (built with ``quantizer`` on first use); the backend must name no
        other model (binding the same backbone again is a no-op)."""
        if self._backbone is backbone:
            return self
        if self.bound:
            raise ConfigError(
                f"backend=hf_local already names its model ({self.identity()['model']}); the run's backbone "
                f"({type(backbone).__name__}) is a second one: drop backend.path, or run with backbone=none"
            )
        self._backbone, self._quantizer = backbone, quantizer
        return self

    @classmethod
    def from_module(cls, module: Any, **kwargs: Any) -> HFLocalBackend:
        """Use a zoo generating module (anything with ``model`` and ``tokenizer``; ``configure_model`` is called)."""
        if getattr(module, "model", None) is None and hasattr(module, "configure_model"):
            module.configure_model()
        return cls(model=module.model, tokenizer=module.tokenizer, **kwargs)

    def identity(self) -> dict[str, Any]:
        if self._backbone is not None:
            backbone = self._backbone
            source = backbone.init_from or backbone.source_pretrained() or f"{type(backbone).__name__} (fresh)"
            return {"kind": "hf_local", "model": str(source)}
        name = self.path or getattr(getattr(self._model, "config", None), "_name_or_path", "") or "in-memory"
        return {"kind": "hf_local", "model": name}

    def _load(self) -> None:
        if self._model is not None:
            return
        if self._backbone is not None:
            model = self._backbone.build_model(self._quantizer)
            model.requires_grad_(False).eval()
            if getattr(self._quantizer, "name", "none") == "none":
                model.to(self.device)
            self._model, self._tokenizer = model, self._backbone.tokenizer
            return
        if self.path is None:
            raise ConfigError(
                "backend=hf_local has no model: set backend.path=<save_pretrained dir>, or compose a backbone "
                "(backbone=tiny, or backbone=hf backbone.name_or_path=<dir>), which is then the LLM in process"
            )
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            self._model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True).to(self.device)
        except OSError as err:
            raise CheckpointNotFoundError(
                f"backend.path={self.path}: cannot load a causal LM from it ({err})"
            ) from None
        if self._tokenizer.pad_token is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token

    def render(self, messages: list[Message], tools: list[dict[str, Any]]) -> tuple[str, bool]:
        """The prompt text and whether it came from a chat template (which then carries BOS itself)."""
        tokenizer = self._tokenizer
        if getattr(tokenizer, "chat_template", None):
            try:
                text = tokenizer.apply_chat_template(
                    messages, tools=tools or None, add_generation_prompt=True, tokenize=False
                )
                return str(text), True
            except Exception:  # templates that reject tool messages or tools: flatten and retry without tools
                flat = flatten_messages(messages, tools)
                return str(tokenizer.apply_chat_template(flat, add_generation_prompt=True, tokenize=False)), True
        return plain_transcript(flatten_messages(messages, tools)), False

    def _complete(self, request: dict[str, Any]) -> Completion:
        from zoo.generation.decoders import generate
        from zoo.protocols import SamplingParams

        self._load()
        model, tokenizer = self._model, self._tokenizer
        max_new = int(request["max_tokens"])
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None:
            max_new = min(max_new, max(1, limit // 2))
        ids, dropped = self.fit_context(list(request["messages"]), request["tools"], limit, max_new)
        if dropped and not self._warned_truncation:
            self._warned_truncation = True
            log.warning(
                "HFLocalBackend: the chat exceeds the model's context (%s tokens); the oldest turns are dropped "
                "(the system prompt is kept). Logged once.",
                limit,
            )
        device = next(model.parameters()).device
        prompt = torch.tensor([ids], dtype=torch.long, device=device)
        temperature = float(request["temperature"])
        params = SamplingParams(
            max_new_tokens=max_new, do_sample=temperature > 0, temperature=temperature or 1.0, top_p=self.top_p
        )
        generator = None
        if request["seed"] is not None:
            generator = torch.Generator(device=device).manual_seed(int(request["seed"]))
        result = generate(model, tokenizer, prompt, torch.ones_like(prompt), params, generator)
        content = result.texts[0]
        parsed = self.parse_reply(content, None, request["tools"])
        usage = Usage(len(ids), int(result.lengths[0]), 1)
        finish = "stop" if bool(result.finished[0]) else "length"
        return Completion(content, parsed.calls, parsed.errors, usage, finish)

    def fit_context(
        self, messages: list[Message], tools: list[dict[str, Any]], limit: int | None, max_new: int
    ) -> tuple[list[int], int]:
        """The prompt token ids the model is given for a chat beside a ``max_new``-token reply in a ``limit``-token
        context, and how many turns were dropped to fit: the oldest turns after the system prompt go first (a tool
        result with its call); when the system prompt and the last message alone do not fit, ``overflow``
        decides (``keep_recent``: the most recent tokens; ``error``: :class:`BackendError`). ``limit=None``: no
        limit."""
        messages = list(messages)
        ids = self.encode(messages, tools)
        dropped = 0
        while limit is not None and len(ids) > limit - max_new:
            first = 1 if messages and messages[0]["role"] == "system" else 0
            if len(messages) - first <= 1 and self.overflow == "keep_recent":
                return ids[-(limit - max_new) :], dropped
            if len(messages) - first <= 1:
                raise BackendError(
                    f"the system prompt and the last message take {len(ids)} tokens, more than the "
                    f"{limit - max_new} the model's context ({limit}) leaves beside a {max_new}-token reply; lower "
                    "backend.max_tokens, use a model with a longer context, or keep the most recent tokens "
                    "(backend=hf_local backend.overflow=keep_recent, which cuts the system prompt)"
                )
            del messages[first]
            while len(messages) - first > 1 and messages[first]["role"] == "tool":  # its call was just dropped
                del messages[first]
            dropped += 1
            ids = self.encode(messages, tools)
        return ids, dropped

    def encode(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """The prompt token ids of a chat (BOS added when no chat template supplies it)."""
        text, templated = self.render(messages, tools)
        ids = list(self._tokenizer(text, add_special_tokens=False)["input_ids"])
        if not templated and self._tokenizer.bos_token_id is not None:
            ids = [self._tokenizer.bos_token_id, *ids]
        return ids


def backbone_llm(backend: Backend | None, backbone: Any, quantizer: Any = None) -> Backend | None:
    """The model of a method's LLM role (the ``agent=llm`` agent, a text optimiser's calls, MemEvolve's designer)
    in a run whose composed backbone is ``backbone`` (``None``: ``backbone=none``).

    Without a backbone the role keeps ``backend`` (an ``hf_local`` backend without ``path`` then has no model: an
    error naming both ways to give it one). With one, the backbone is the LLM, in process: an unset backend becomes
    an :class:`HFLocalBackend` with its defaults (selected automatically), ``backend=hf_local`` without ``path`` is
    bound to it (its settings apply); a backend that names another model is an error (one model per run).
    """
    if backbone is None:
        if isinstance(backend, HFLocalBackend) and not backend.bound:
            backend._load()  # raises: no path and no backbone
        return backend
    if backend is None:
        backend = HFLocalBackend()
    if not isinstance(backend, HFLocalBackend):
        kind = backend.identity().get("kind", type(backend).__name__)
        raise ConfigError(
            f"the run composes a backbone ({type(backbone).__name__}), which is the LLM in process, and "
            f"backend={kind} names another model; use one: backbone=none with the backend, or the backbone without "
            "a backend (backend=none, or backend=hf_local without backend.path to tune its settings)"
        )
    return backend.bind_backbone(backbone, quantizer)
