"""Hugging Face causal LMs: ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(name_or_path)``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.quant.base import Quantizer


class HFBackbone(Backbone):
    """A local directory or hub id; honours ``HF_HUB_OFFLINE``; ``trust_remote_code`` stays off unless asked.

    Args:
        name_or_path: local directory (written by ``save_pretrained``) or hub id.
        attn_implementation: ``None`` (transformers' default), ``"eager"``, ``"sdpa"``, ``"flash_attention_2"``.
        trust_remote_code: run code shipped with the checkpoint (off by default).
    """

    def __init__(
        self,
        name_or_path: str,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        revision: str | None = None,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
    ) -> None:
        super().__init__(init_from=init_from, extra_tokens=extra_tokens, dtype=dtype)
        if not name_or_path:
            raise ConfigError("backbone=hf needs backbone.name_or_path=<local dir or hub id>")
        self.name_or_path = str(name_or_path)
        self.attn_implementation = attn_implementation
        self.trust_remote_code = trust_remote_code
        self.revision = revision

    def source_pretrained(self) -> str:
        path = Path(self.name_or_path).expanduser()
        looks_local = self.name_or_path.startswith((".", "/", "~")) or path.exists()
        if looks_local and not (path / "config.json").is_file():
            raise CheckpointNotFoundError(f"backbone.name_or_path: no model at {path.resolve()} (no config.json)")
        return str(path) if looks_local else self.name_or_path

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
