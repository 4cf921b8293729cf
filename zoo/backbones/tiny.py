"""The embedded default backbone: a ~1M-parameter ``LlamaForCausalLM`` with the character tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone
from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.quant.base import Quantizer


class TinyBackbone(Backbone):
    """Random-init Llama from a small ``LlamaConfig`` (defaults: 4 layers, width 128, ~0.85M parameters).

    With ``init_from`` set it loads that export instead, through the same ``from_pretrained`` path as
    :class:`~zoo.backbones.hf.HFBackbone`.
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

    def _fresh_tokenizer(self) -> PreTrainedTokenizerBase:
        return build_char_tokenizer()

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
        return {"kind": "tiny_llama", **self.arch, "seed": self.seed, "init_from": self.init_from}
