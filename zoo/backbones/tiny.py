"""The embedded default backbone: a ~1M-parameter ``LlamaForCausalLM`` with the character tokenizer (or a tokenizer
saved in a directory, e.g. a BPE trained on the run's data)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone
from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.errors import ConfigError
from zoo.quant.base import Quantizer


class TinyBackbone(Backbone):
    """Random-init Llama from a small ``LlamaConfig`` (defaults: 4 layers, width 128, ~0.85M parameters).

    With ``init_from`` set it loads that export instead, through the same ``from_pretrained`` path as
    :class:`~zoo.backbones.hf.HFBackbone`.

    ``tokenizer``: the fresh model's tokenizer -- ``None``, the zoo's character tokenizer; or a directory holding a
    tokenizer saved by ``save_pretrained`` (e.g. :func:`zoo.backbones.tokenizer.train_bpe_tokenizer`'s, or the path
    :func:`zoo.datamodules.demonstration_tokenizer` returns); the embedding has one row per token of it.
    """

    def __init__(
        self,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 4,
        max_position_embeddings: int = 256,
        tie_word_embeddings: bool = True,
        seed: int = 0,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
        lora: Mapping[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__(
            init_from=init_from,
            extra_tokens=extra_tokens,
            dtype=dtype,
            lora=lora,
            gradient_checkpointing=gradient_checkpointing,
        )
        self.arch = {
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": max_position_embeddings,
            "tie_word_embeddings": tie_word_embeddings,
        }
        self.seed = seed
        self.tokenizer_dir = None if tokenizer is None else str(tokenizer)

    def _fresh_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer_dir is None:
            return build_char_tokenizer()
        if not (Path(self.tokenizer_dir) / "tokenizer_config.json").is_file():
            raise ConfigError(
                f"backbone.tokenizer={self.tokenizer_dir}: no tokenizer saved there (expected tokenizer_config.json "
                "from save_pretrained); set it to such a directory, or null for the character tokenizer"
            )
        return AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def fresh_context_length(self) -> int:
        return int(self.arch["max_position_embeddings"])

    def model_config(self) -> LlamaConfig:
        """The ``LlamaConfig`` of the fresh model (vocabulary: :attr:`base_vocab_size`)."""
        tok = self.tokenizer
        return LlamaConfig(
            vocab_size=self.base_vocab_size,
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            **self.arch,
        )

    def _fresh_model(self, quantizer: Quantizer) -> PreTrainedModel:
        config = self.model_config()
        if quantizer.needs_pretrained_load:
            # Load-time quantizers (bitsandbytes) act inside from_pretrained: save the random init first.
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                with torch.random.fork_rng():
                    torch.manual_seed(self.seed)
                    LlamaForCausalLM(config).save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
                return self._from_pretrained(tmp, quantizer)
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            model = LlamaForCausalLM(config)
        if self.dtype is not None:
            model = model.to(self.dtype)
        return model

    def describe(self) -> dict[str, Any]:
        described = {"kind": "tiny_llama", **self.arch, "seed": self.seed, "init_from": self.init_from}
        if self.tokenizer_dir is not None:  # absent for the character tokenizer: its cache keys stay as they were
            described["tokenizer"] = self.tokenizer_dir
        return described
