"""Backbones: the tiny default and Hugging Face checkpoints, one ``from_pretrained`` code path."""

from zoo.backbones.base import Backbone
from zoo.backbones.hf import HFBackbone
from zoo.backbones.tiny import TinyBackbone
from zoo.backbones.tokenizer import add_special_tokens, build_char_tokenizer

__all__ = ["Backbone", "HFBackbone", "TinyBackbone", "add_special_tokens", "build_char_tokenizer"]
