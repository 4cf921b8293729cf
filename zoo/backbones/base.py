"""Backbones: a tokenizer available at once and a model built later (in ``configure_model``).

One code path serves every causal LM: whatever the source (the tiny random-init Llama or a Hugging Face
checkpoint), the model is a ``transformers`` ``PreTrainedModel`` and, when weights come from disk
(``init_from`` or ``name_or_path``), they are loaded with ``from_pretrained`` so that load-time quantization
and dtype/attention options apply the same way.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.tokenizer import add_special_tokens
from zoo.checkpoints import read_checkpoint
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.lora import inject_lora
from zoo.quant.base import NoQuantizer, Quantizer

BASE_POLICY = "base"
# config fields that hold a model's context length, by architecture (the first one present wins)
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """Map ``"float32" | "bfloat16" | "float16" | "auto" | None`` to a torch dtype (``None`` for auto)."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"backbone.dtype={dtype!r} is not a torch dtype (use float32, bfloat16, float16 or auto)")
    return value


def hub_offline() -> bool:
    """Whether Hugging Face Hub access is disabled (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(k, "0").lower() in {"1", "true", "yes"} for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def load_pretrained(loader: Any, source: str, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained(source, **kwargs)`` (a transformers Auto class), with a missing or unreadable model
    reported as one :class:`CheckpointNotFoundError` naming ``what`` (the option it came from) and the source,
    instead of transformers' chain of tracebacks."""
    try:
        return loader.from_pretrained(source, **kwargs)
    except OSError as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        offline = " (HF_HUB_OFFLINE is set: the Hub was not asked)" if hub_offline() else ""
        raise CheckpointNotFoundError(f"{what}={source}: cannot load it{offline}: {detail}") from None


def context_length_of(config: Any) -> int | None:
    """The context length (positions) a ``transformers`` config declares for its text model, if it declares one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in CONTEXT_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class Backbone(ABC):
    """A causal-LM backbone specification.

    Args:
        init_from: ``None`` (fresh source weights), a directory written by ``save_pretrained``, a Lightning
            ``.ckpt`` of a zoo module, or ``"base"`` (the cached base SFT policy; ``train.py`` resolves it to a
            directory before the backbone is built).
        extra_tokens: special tokens a method needs (added to the tokenizer; embeddings are resized).
        dtype: dtype of the built model's frozen weights and of its compute: trainable weights stay float32
            (:func:`upcast_trainable`), and ``bfloat16``/``float16`` select ``trainer.precision=bf16-mixed`` /
            ``16-mixed`` (autocast) unless the trainer sets a precision of its own.
        lora: LoRA adapters to add to the built model (``r``, ``alpha``, ``dropout``, ``target_modules``; see
            :func:`zoo.lora.inject_lora`): they become its only trainable weights, after the quantizer acted, so
            ``quant=bnb_nf4`` + ``lora`` is QLoRA (``+preset=qlora``). ``None``: no adapters. Exports merge them.
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass instead of keeping
            them (transformers' ``gradient_checkpointing_enable``, non-reentrant ``torch.utils.checkpoint``): activation
            memory of the training forward drops from every layer's to about one layer's, for about one more forward
            of compute. Forwards without gradients (generation, reference log-probs) keep their KV cache.

    The base vocabulary is the tokenizer as built (``extra_tokens`` included): :attr:`base_vocab_size`. Tokens
    added to the tokenizer afterwards (a vocabulary extension, :mod:`zoo.vocab`) are not rows of the built model.

    Attributes:
        pretrained: whether the source weights are a trained model (a Hugging Face checkpoint) rather than a random
            init. ``init_from: base`` bootstraps a base SFT policy only for a random-init (synthetic) backbone; a
            pretrained one starts from its own weights unless ``base_policy.pretrained=sft`` (:mod:`zoo.cli.bootstrap`).
    """

    pretrained: ClassVar[bool] = False

    def __init__(
        self,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
        lora: Mapping[str, Any] | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.init_from = None if init_from in (None, "", "none") else str(init_from)
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.extra_tokens = tuple(extra_tokens)
        self.dtype = resolve_dtype(dtype)
        self.lora = dict(lora) if lora else None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._base_vocab_size: int | None = None

    # -- tokenizer -------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer (built once; cheap)."""
        if self._tokenizer is None:
            pretrained = self._pretrained_dir()
            tok = self._load_tokenizer(pretrained) if pretrained else self._fresh_tokenizer()
            add_special_tokens(tok, self.extra_tokens)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            self._tokenizer = tok
            self._base_vocab_size = len(tok)
        return self._tokenizer

    @property
    def base_vocab_size(self) -> int:
        """Tokens of the base model: the tokenizer's length when it was built (``extra_tokens`` included)."""
        self.tokenizer  # noqa: B018 - builds the tokenizer (and records its length) on first use
        return int(self._base_vocab_size if self._base_vocab_size is not None else len(self._tokenizer))

    def num_embedding_rows(self) -> int:
        """Rows of the built model's input embedding, read without building it: the checkpoint's vocabulary size
        (models may pad it beyond the tokenizer), or :attr:`base_vocab_size` when that is larger (the model is
        then resized) or the weights are fresh."""
        pretrained = self._pretrained_dir()
        if pretrained is None:
            return self.base_vocab_size
        vocab = getattr(self._pretrained_config(pretrained).get_text_config(), "vocab_size", None)
        return max(int(vocab or 0), self.base_vocab_size)

    def context_length(self) -> int | None:
        """Tokens the model can attend over (its config's ``max_position_embeddings`` or equivalent), read without
        building it; ``None`` when the architecture declares none. Datamodules limit their rows to it."""
        pretrained = self._pretrained_dir()
        if pretrained is None:
            return self.fresh_context_length()
        return context_length_of(self._pretrained_config(pretrained))

    def _pretrained_config(self, pretrained: str) -> Any:
        return load_pretrained(
            AutoConfig,
            pretrained,
            self.source_option(),
            local_files_only=True if Path(pretrained).is_dir() else hub_offline(),
            trust_remote_code=bool(self.from_pretrained_options().get("trust_remote_code", False)),
        )

    # -- model ------------------------------------------------------------------------------------------------
    def build_model(self, quantizer: Quantizer | None = None) -> PreTrainedModel:
        """Build the model: from ``init_from``/a checkpoint if set, else from the fresh source.

        The model is returned in train mode (``from_pretrained`` returns it in eval mode, which would keep dropout
        off during training); Lightning switches it to eval mode for validation, and frozen copies call ``eval()``.
        """
        quantizer = quantizer or NoQuantizer()
        pretrained = self._pretrained_dir()
        if pretrained is not None:
            model = self._from_pretrained(pretrained, quantizer)
        elif self.init_from is not None and self.init_from.endswith(".ckpt"):
            model = self._fresh_model(NoQuantizer())
            load_module_checkpoint_weights(model, self.init_from)
            if quantizer.needs_pretrained_load:  # load-time quantizers act inside from_pretrained
                with tempfile.TemporaryDirectory() as tmp:
                    model.save_pretrained(tmp)
                    self.tokenizer.save_pretrained(tmp)
                    model = self._from_pretrained(tmp, quantizer)
        else:
            model = self._fresh_model(quantizer)
        if self.base_vocab_size > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(self.base_vocab_size)
        model = quantizer.apply(model)
        if self.lora:
            model = inject_lora(model, self.lora)
        upcast_trainable(model)
        if self.gradient_checkpointing:
            # non-reentrant: gradients reach LoRA adapters behind frozen embeddings without enable_input_require_grads
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if model.generation_config is not None:
            model.generation_config.pad_token_id = self.tokenizer.pad_token_id
        return model.train()

    def _from_pretrained(self, path: str, quantizer: Quantizer) -> PreTrainedModel:
        kwargs: dict[str, Any] = {"local_files_only": True if Path(path).is_dir() else hub_offline()}
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        kwargs.update(self.from_pretrained_options())
        kwargs.update(quantizer.from_pretrained_kwargs())
        return load_pretrained(AutoModelForCausalLM, path, self.source_option(), **kwargs)

    def _pretrained_dir(self) -> str | None:
        """Where weights come from through ``from_pretrained`` (``init_from`` dir beats the source)."""
        if self.init_from is None:
            return self.source_pretrained()
        if self.init_from == BASE_POLICY:
            raise ConfigError(
                "backbone.init_from=base must be resolved before the backbone is built: train.py does it "
                "(it trains or reuses the cached base policy); in Python call zoo.cli.bootstrap.ensure_base_policy(cfg)"
            )
        path = Path(self.init_from).expanduser()
        if self.init_from.endswith(".ckpt"):
            if not path.is_file():
                raise CheckpointNotFoundError(f"backbone.init_from: no checkpoint file at {path.resolve()}")
            return self.source_pretrained()
        if not (path / "config.json").is_file():
            raise CheckpointNotFoundError(
                f"backbone.init_from: no exported model at {path.resolve()} "
                f"(looked for {path.resolve() / 'config.json'}); "
                "pass a directory written by save_pretrained, a Lightning .ckpt, or 'base'"
            )
        return str(path)

    def _load_tokenizer(self, path: str) -> PreTrainedTokenizerBase:
        local = Path(path).is_dir()
        return load_pretrained(
            AutoTokenizer, path, self.source_option(), local_files_only=True if local else hub_offline()
        )

    def source_option(self) -> str:
        """The option the weights come from, for messages (``backbone.init_from`` or the source's option)."""
        return "backbone.init_from" if self.init_from is not None else "backbone"

    # -- hooks of the concrete sources -------------------------------------------------------------------------
    def source_pretrained(self) -> str | None:
        """A ``from_pretrained`` source when the backbone itself is a checkpoint (``None`` for random init)."""
        return None

    def from_pretrained_options(self) -> dict[str, Any]:
        """Extra ``from_pretrained`` options (attention implementation, trust_remote_code, ...)."""
        return {}

    def fresh_context_length(self) -> int | None:
        """The context length of the freshly initialised model (``None``: unknown)."""
        return None

    @abstractmethod
    def _fresh_tokenizer(self) -> PreTrainedTokenizerBase: ...

    @abstractmethod
    def _fresh_model(self, quantizer: Quantizer) -> PreTrainedModel: ...

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """A JSON-able description of the architecture and source (used in cache keys)."""

    def fingerprint(self) -> str:
        """Short hash of :meth:`describe` (plus the extra tokens)."""
        blob = json.dumps({**self.describe(), "extra_tokens": list(self.extra_tokens)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def check_init_from(self) -> None:
        """Raise now when the weights ``init_from`` names are missing or unreadable (a ``.ckpt`` that is absent,
        truncated or corrupt; an export directory without ``config.json``), before anything is built or written: the
        model itself is built later (``configure_model``)."""
        if self.init_from is None:
            return
        if self.init_from.endswith(".ckpt"):
            read_checkpoint(self.init_from, what="backbone.init_from")
        self._pretrained_dir()

    def with_init_from(self, init_from: str) -> Backbone:
        """This backbone with its weights from ``init_from`` (an export directory or a zoo ``.ckpt``) and the same
        tokenizer, e.g. for a frozen reference model that is not the initial policy."""
        self.tokenizer  # noqa: B018 - built first, so that the copy shares it
        other = copy.copy(self)
        other.init_from = str(init_from)
        return other


def upcast_trainable(model: torch.nn.Module) -> int:
    """Keep trainable weights in float32 whatever ``backbone.dtype`` is: every half-precision parameter with
    ``requires_grad`` (the LoRA adapters, or every weight of a full fine-tune) is cast to float32 in place; frozen
    weights keep their dtype. Returns how many parameters were cast.

    This is mixed precision as Lightning's ``bf16-mixed`` / ``16-mixed`` and PEFT (``autocast_adapter_dtype``) do it:
    bf16/fp16 compute under autocast with float32 master weights, so the optimizer's updates and state are float32.
    Pure bf16 weights lose updates below their rounding step (AdamW at lr 1e-6 leaves bf16 weights unchanged).
    """
    cast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
            cast += 1
    return cast


def load_module_checkpoint_weights(model: torch.nn.Module, ckpt_path: str, prefix: str = "model.") -> None:
    """Load the backbone weights of a zoo Lightning checkpoint (``weights_only=True``)."""
    checkpoint = read_checkpoint(ckpt_path, what="backbone.init_from", mmap=False)
    state = {k[len(prefix) :]: v for k, v in checkpoint.get("state_dict", {}).items() if k.startswith(prefix)}
    if not state:
        raise CheckpointNotFoundError(f"{ckpt_path}: no weights under '{prefix}' in its state_dict")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ConfigError(
            f"{ckpt_path}: checkpoint does not match the backbone (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
