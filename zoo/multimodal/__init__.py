"""Multimodal cores: structure encoders and connectors that insert non-text tokens into LLM inputs."""

from zoo.multimodal.valr import valr_alignment_loss

__all__ = ["valr_alignment_loss"]
