"""Backbones: the tiny default and Hugging Face checkpoints, one ``from_pretrained`` code path."""

from zoo.backbones.base import Backbone
from zoo.backbones.hf import HFBackbone
from zoo.backbones.tiny import TinyBackbone
from zoo.backbones.tokenizer import add_special_tokens, build_char_tokenizer, train_bpe_tokenizer
from zoo.backbones.vlm import HFVLMBackbone, TinyVLMBackbone

__all__ = [
    "Backbone",
    "HFBackbone",
    "HFVLMBackbone",
    "TinyBackbone",
    "TinyVLMBackbone",
    "add_special_tokens",
    "build_char_tokenizer",
    "train_bpe_tokenizer",
]
