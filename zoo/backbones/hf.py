"""Hugging Face causal LMs: ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(name_or_path)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone, hub_offline
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.quant.base import Quantizer


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` can be a Hugging Face Hub repository id (``name`` or ``org/name``) rather than a path: no
    leading ``.``, ``/`` or ``~``, at most one ``/``, no backslash, and a valid repo id for ``huggingface_hub``."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1:
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    """Whether the Hugging Face cache holds ``config.json`` of ``repo_id`` (what an offline load needs first)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)


def relative_to_cwd(path: Path) -> str:
    """``' (relative paths start from <cwd>)'`` for a relative ``path``, else ``''`` (for messages)."""
    return "" if path.is_absolute() else f" (relative paths start from {Path.cwd()})"


class HFBackbone(Backbone):
    """A local directory or hub id; honours ``HF_HUB_OFFLINE``; ``trust_remote_code`` stays off unless asked.

    ``name_or_path`` is a local directory when it exists or cannot be a hub id (it starts with ``.``, ``/`` or ``~``
    or has more than one ``/``): a missing one is an error naming the absolute path, and the Hub is never asked.
    A name that can be a hub id (``org/name``) and is no local directory is loaded from the Hub, or with
    ``HF_HUB_OFFLINE`` set from the Hugging Face cache only (an error when it is not there).

    Args:
        name_or_path: local directory (written by ``save_pretrained``) or hub id.
        attn_implementation: ``None`` (transformers' default), ``"eager"``, ``"sdpa"``, ``"flash_attention_2"``.
        trust_remote_code: run code shipped with the checkpoint (off by default).
    """

    pretrained = True

    def __init__(
        self,
        name_or_path: str,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        revision: str | None = None,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
        lora: Mapping[str, Any] | None = None,
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__(
            init_from=init_from,
            extra_tokens=extra_tokens,
            dtype=dtype,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
        )
        if not name_or_path:
            raise ConfigError("backbone=hf needs backbone.name_or_path=<local dir or hub id>")
        self.name_or_path = str(name_or_path)
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code
        self.revision = revision

    def source_pretrained(self) -> str:
        name = self.name_or_path
        path = Path(name).expanduser()
        if path.exists():
            if not (path / "config.json").is_file():
                raise CheckpointNotFoundError(
                    f"backbone.name_or_path={name}: no model at {path.resolve()} (no config.json; pass a directory "
                    "written by save_pretrained)"
                )
            return str(path)
        if not looks_like_hub_id(name):
            raise CheckpointNotFoundError(
                f"backbone.name_or_path={name}: no such directory {path.resolve()}{relative_to_cwd(path)}; pass the "
                "directory of a model written by save_pretrained"
            )
        if hub_offline() and not in_hub_cache(name, self.revision):
            raise CheckpointNotFoundError(
                f"backbone.name_or_path={name}: no local directory {path.resolve()}, and '{name}' is not in the "
                "Hugging Face cache; HF_HUB_OFFLINE is set, so the Hub was not asked. Pass the directory of a model "
                "written by save_pretrained, or download it first (ZOO_ALLOW_NETWORK=1 lets train.py download it: "
                "train.py sets HF_HUB_OFFLINE itself unless asked)"
            )
        return name

    def source_option(self) -> str:
        return "backbone.init_from" if self.init_from is not None else "backbone.name_or_path"

    def from_pretrained_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.attn_implementation:
            options["attn_implementation"] = self.attn_implementation
        if self.revision:
            options["revision"] = self.revision
        return options

    def _fresh_tokenizer(self) -> PreTrainedTokenizerBase:  # pragma: no cover - source is always pretrained
        return self._load_tokenizer(self.source_pretrained())

    def _fresh_model(self, quantizer: Quantizer) -> PreTrainedModel:  # pragma: no cover
        return self._from_pretrained(self.source_pretrained(), quantizer)

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "name_or_path": self.name_or_path, "revision": self.revision, "init_from": self.init_from}
