"""Multimodal cores: structure encoders and connectors that insert non-text tokens into LLM inputs."""
