"""Where the interpretability hooks attach: a registry ``architecture -> (layers path, attention output projection)``.

Every hook of :mod:`zoo.interp` needs two things of a causal LM: the list of its decoder layers (the residual
stream is the output of each layer) and, inside a layer, the attention output projection (``o_proj`` /
``c_proj``), whose *input* is the concatenation of the per-head attention outputs, ``[..., n_heads * d_head]``.
transformers 5 has no ``head_mask``, so per-head interventions are pre-hooks on that projection; the layout is
``n_heads * d_head`` query heads even under grouped-query attention, so one hook serves every architecture.

The registry is keyed by ``model.config.model_type``. Built in: ``llama`` (also the zoo's tiny backbone, a
``LlamaForCausalLM``), ``qwen2``, ``mistral``, ``gpt2``. Add another with :func:`register_architecture`::

    register_architecture("phi3", layers="model.layers", attn_out_proj="self_attn.o_proj")
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.errors import ConfigError


@dataclass(frozen=True)
class ArchitectureSpec:
    """Attribute paths of one architecture.

    Attributes:
        layers: dotted path from the model to the ``nn.ModuleList`` of decoder layers.
        attn_out_proj: dotted path from one decoder layer to its attention output projection.
    """

    layers: str
    attn_out_proj: str


_REGISTRY: dict[str, ArchitectureSpec] = {
    "llama": ArchitectureSpec("model.layers", "self_attn.o_proj"),
    "qwen2": ArchitectureSpec("model.layers", "self_attn.o_proj"),
    "mistral": ArchitectureSpec("model.layers", "self_attn.o_proj"),
    "gpt2": ArchitectureSpec("transformer.h", "attn.c_proj"),
}


def register_architecture(model_type: str, layers: str, attn_out_proj: str, overwrite: bool = False) -> None:
    """Register the attribute paths of an architecture (``model.config.model_type``).

    Args:
        model_type: the ``config.model_type`` string (``"phi3"``, ``"gemma2"``, ...).
        layers: dotted path from the model to its decoder layers (``"model.layers"``).
        attn_out_proj: dotted path from one layer to the attention output projection (``"self_attn.o_proj"``).
        overwrite: replace an existing entry (otherwise registering a known type is an error).
    """
    if model_type in _REGISTRY and not overwrite:
        raise ConfigError(f"architecture '{model_type}' is already registered; pass overwrite=True to replace it")
    _REGISTRY[model_type] = ArchitectureSpec(layers, attn_out_proj)


def supported_architectures() -> list[str]:
    """The registered ``model_type`` names, sorted."""
    return sorted(_REGISTRY)


def _get_path(root: nn.Module, path: str, what: str, model_type: str) -> nn.Module:
    obj: object = root
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"architecture '{model_type}': {what} path '{path}' does not exist on {type(root).__name__} "
                f"(no attribute '{part}'); fix it with zoo.interp.register_architecture('{model_type}', ..., "
                "overwrite=True)"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise ConfigError(f"architecture '{model_type}': {what} path '{path}' is a {type(obj).__name__}, not a module")
    return obj


def unwrap_model(model: nn.Module) -> nn.Module:
    """The underlying Hugging Face model of a PEFT wrapper (the model itself otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@dataclass
class ModelLayout:
    """The resolved hook sites and sizes of one model.

    Attributes:
        model_type: ``config.model_type``.
        layers: the decoder layers (the residual stream after layer ``l`` is ``layers[l]``'s output).
        attn_out_projs: per layer, the attention output projection (its input is ``[B, T, num_heads * head_dim]``).
        num_heads: query heads per layer.
        head_dim: width of one head's slice of the projection input.
        hidden_size: width of the residual stream.
    """

    model_type: str
    layers: nn.ModuleList
    attn_out_projs: list[nn.Module]
    num_heads: int
    head_dim: int
    hidden_size: int

    @property
    def num_layers(self) -> int:
        """Number of decoder layers."""
        return len(self.layers)

    def check_layer(self, layer: int, what: str = "layer") -> int:
        """Return ``layer`` if it is a valid decoder-layer index, else raise naming the valid range."""
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ConfigError(
                f"{what}={layer!r} is out of range: this {self.model_type} model has {self.num_layers} decoder "
                f"layers (valid: 0..{self.num_layers - 1})"
            )
        return layer

    def check_head(self, layer: int, head: int, what: str = "head") -> tuple[int, int]:
        """Return ``(layer, head)`` if both are valid, else raise naming the valid ranges."""
        self.check_layer(layer, f"{what} ({layer}, {head}): layer")
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < self.num_heads:
            raise ConfigError(
                f"{what} ({layer}, {head}): head index out of range: this {self.model_type} model has "
                f"{self.num_heads} attention (query) heads per layer (valid: 0..{self.num_heads - 1})"
            )
        return layer, head

    def check_vector(self, vector: torch.Tensor, what: str = "vector") -> torch.Tensor:
        """Return ``vector`` if it is a ``[hidden_size]`` tensor, else raise naming the expected width."""
        if not isinstance(vector, torch.Tensor):
            raise ConfigError(
                f"{what} must be a torch.Tensor of shape [{self.hidden_size}], got {type(vector).__name__}"
            )
        if vector.shape != (self.hidden_size,):
            raise ConfigError(
                f"{what} has shape {list(vector.shape)}, but the residual stream of this {self.model_type} model is "
                f"{self.hidden_size} wide: pass a 1-D tensor of shape [{self.hidden_size}]"
            )
        return vector


def model_layout(model: nn.Module) -> ModelLayout:
    """Resolve the hook sites of ``model`` through the registry.

    Raises:
        ConfigError: the architecture is not registered (the message lists the supported ones and how to register
            one), or a registered path does not exist on this model.
    """
    model = unwrap_model(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _REGISTRY:
        raise ConfigError(
            f"architecture '{model_type}' ({type(model).__name__}) is not in the interpretability registry; "
            f"supported: {', '.join(supported_architectures())}. Register it with "
            "zoo.interp.register_architecture('<model_type>', layers='<path to the decoder layers, e.g. "
            "model.layers>', attn_out_proj='<path inside a layer, e.g. self_attn.o_proj>')"
        )
    spec = _REGISTRY[model_type]
    layers = _get_path(model, spec.layers, "layers", model_type)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"architecture '{model_type}': layers path '{spec.layers}' is not an nn.ModuleList")
    projs = [_get_path(layer, spec.attn_out_proj, "attention output projection", model_type) for layer in layers]
    num_heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    head_dim = getattr(config, "head_dim", None) or hidden // num_heads
    return ModelLayout(model_type, layers, projs, num_heads, int(head_dim), hidden)
