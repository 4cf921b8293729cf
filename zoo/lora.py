"""LoRA through ``peft`` for any family module: inject adapters (the only trainable weights) and merge them back.

Used by the backbones (``backbone.lora``: adapters on any family module's model, e.g. QLoRA with ``quant=bnb_nf4``,
``+preset=qlora``), the Cuttlefish LLM-adaptation stage and the LoRA baseline of the vocabulary extension.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

DEFAULT_LORA: dict[str, Any] = {
    "r": 16,
    "alpha": 32,
    "dropout": 0.05,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def inject_lora(model: nn.Module, settings: Mapping[str, Any], seed: int = 0) -> nn.Module:
    """Add LoRA adapters in place and make them the only parameters with ``requires_grad``.

    Args:
        model: any torch module (a Hugging Face model).
        settings: ``r``, ``alpha``, ``dropout``, ``target_modules`` (missing keys: :data:`DEFAULT_LORA`).
        seed: seed of the adapters' initialisation (the global RNG is left untouched).
    """
    from peft import LoraConfig, inject_adapter_in_model

    lora = {**DEFAULT_LORA, **dict(settings)}
    config = LoraConfig(
        r=int(lora["r"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]),
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` holds ``peft`` LoRA layers (added by :func:`inject_lora`)."""
    return any("lora_" in name for name, _ in model.named_parameters())


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its LoRA adapters merged and the ``peft`` layers replaced by plain base layers
    (so ``save_pretrained`` writes ordinary weights); ``model`` itself is unchanged."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, BaseTunerLayer):
                setattr(module, child_name, child.get_base_layer())
    return model


__all__ = ["DEFAULT_LORA", "has_lora", "inject_lora", "merged_copy"]
