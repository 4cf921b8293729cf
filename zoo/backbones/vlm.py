"""Vision-language backbones: a tiny ``LlavaForConditionalGeneration`` and local image-text checkpoints.

Both expose what the text backbones expose (``tokenizer``, ``build_model``) plus what a multimodal
datamodule/module needs: ``processor`` (a real ``LlavaProcessor`` for the tiny model, whatever
``AutoProcessor`` returns for a checkpoint), ``image_token``/``image_token_id``, ``image_size`` and
``num_image_tokens`` (placeholders per image). Weights on disk are loaded with
``AutoModelForImageTextToText.from_pretrained``, so a directory written by ``save_pretrained`` from the tiny
model loads through ``backbone=hf_vlm`` unchanged.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    AutoProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    MistralConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from zoo.backbones.base import Backbone, hub_offline
from zoo.backbones.hf import HFBackbone
from zoo.backbones.tokenizer import add_special_tokens, build_char_tokenizer
from zoo.errors import ConfigError
from zoo.quant.base import Quantizer

IMAGE_TOKEN = "<image>"
LATENT_START, LATENT_END, LATENT_SLOT = "<latent>", "</latent>", "<|latent|>"
VLM_TOKENS: tuple[str, ...] = (IMAGE_TOKEN, LATENT_START, LATENT_END, LATENT_SLOT)


def _image_processor(image_size: int, mean: Sequence[float], std: Sequence[float]) -> Any:
    try:  # transformers >= 5 without torchvision: the PIL backend, imported directly (no fallback warning)
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import CLIPImageProcessor as Processor
    return Processor(
        size={"shortest_edge": image_size},
        crop_size={"height": image_size, "width": image_size},
        image_mean=list(mean),
        image_std=list(std),
    )


class _VLMMixin:
    """Shared multimodal accessors; ``self._processor`` is set by the concrete class."""

    _processor: Any = None
    image_size: int
    num_image_tokens: int

    @property
    def processor(self) -> Any:
        """The processor (tokenizer + image processor); its tokenizer is :attr:`tokenizer`."""
        self.tokenizer  # noqa: B018 - builds the processor as a side effect
        return self._processor

    @property
    def image_token(self) -> str:
        return IMAGE_TOKEN if self._processor is None else getattr(self._processor, "image_token", IMAGE_TOKEN)

    @property
    def image_token_id(self) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(self.image_token))

    def _from_pretrained(self, path: str, quantizer: Quantizer) -> PreTrainedModel:
        kwargs: dict[str, Any] = {"local_files_only": True if Path(path).is_dir() else hub_offline()}
        if self.dtype is not None:  # type: ignore[attr-defined]
            kwargs["dtype"] = self.dtype  # type: ignore[attr-defined]
        kwargs.update(self.from_pretrained_options())  # type: ignore[attr-defined]
        kwargs.update(quantizer.from_pretrained_kwargs())
        check_image_text_checkpoint(path, kwargs["local_files_only"])
        model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        check_vision_geometry(model.config, self.image_size, self.num_image_tokens, path)
        return model

    def save_processor(self, directory: str | Path) -> None:
        """Write the processor (or the tokenizer when there is none) next to an exported model."""
        (self.processor or self.tokenizer).save_pretrained(directory)


def check_image_text_checkpoint(path: str, local_files_only: bool) -> None:
    """Raise :class:`ConfigError` when the checkpoint at ``path`` is not an image-text model (e.g. a text-only export
    given to a vision-language backbone), instead of transformers' list of every supported configuration class."""
    config = AutoConfig.from_pretrained(path, local_files_only=local_files_only)
    if getattr(config, "vision_config", None) is None:
        raise ConfigError(
            f"{path} holds a text-only {type(config).__name__} ({config.model_type}); this backbone needs an "
            "image-text checkpoint (AutoModelForImageTextToText), e.g. the export of a +method=valr_cot run or a "
            "local LLaVA-style model"
        )


def check_vision_geometry(config: Any, image_size: int, num_image_tokens: int, where: str) -> None:
    """Raise :class:`ConfigError` when the configured image size / placeholder count disagree with ``config``."""
    vision = getattr(config, "vision_config", None)
    actual_size = getattr(vision, "image_size", None)
    actual_tokens = getattr(config, "image_seq_length", None)
    if actual_size is not None and int(actual_size) != int(image_size):
        raise ConfigError(
            f"{where}: the vision tower expects {actual_size}x{actual_size} images but backbone.image_size="
            f"{image_size}; set backbone.image_size={actual_size}"
        )
    if actual_tokens is not None and int(actual_tokens) != int(num_image_tokens):
        raise ConfigError(
            f"{where}: the model uses {actual_tokens} image tokens per image but backbone.num_image_tokens="
            f"{num_image_tokens}; set backbone.num_image_tokens={actual_tokens}"
        )


def pool_image_features(model: PreTrainedModel, side: int) -> Any:
    """Average-pool a LLaVA model's patch features to ``side x side`` image tokens before the projector.

    A forward pre-hook on ``multi_modal_projector``: ``[B, g*g, Hv] -> [B, side*side, Hv]`` by 2-D adaptive average
    pooling of the ``g x g`` patch grid (row-major). No parameters are added, so the weights (and
    ``save_pretrained`` files) are those of the unpooled model; the hook is re-applied each time the backbone builds
    the model. Returns the hook handle.
    """
    projector = model.model.multi_modal_projector

    def pool(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        b, p, h = x.shape
        g = math.isqrt(p)
        if g * g != p:
            raise ConfigError(f"backbone.image_pool needs a square patch grid, got {p} patches")
        grid = x.transpose(1, 2).reshape(b, h, g, g)
        pooled = F.adaptive_avg_pool2d(grid, side).reshape(b, h, side * side).transpose(1, 2)
        return (pooled, *args[1:])

    return projector.register_forward_pre_hook(pool)


def normalize_image_tokens(model: PreTrainedModel) -> Any:
    """Layer-normalise a LLaVA model's image tokens (the projector's output) to zero mean, unit RMS per token.

    A forward hook on ``multi_modal_projector``: ``[B, P, H] -> [B, P, H]``, ``LayerNorm`` without affine parameters
    (so no weights are added and ``save_pretrained`` files are those of the plain model; the hook is re-applied each
    time the backbone builds the model). The random-init projector's output has RMS ~0.02 (text-embedding scale), of
    which only about half varies with the image; at that scale the LM reads the image slowly (a plateau of
    thousands of steps on a one-row look-up), at unit RMS it reads it within hundreds [toy-scale choice, not in
    LLaVA]. Returns the hook handle.
    """
    projector = model.model.multi_modal_projector

    def normalize(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        # eps far below the features' variance (~3e-4 at init): the output has unit RMS, not RMS shrunk by eps
        return F.layer_norm(output, output.shape[-1:], eps=1e-8)

    return projector.register_forward_hook(normalize)


class TinyVLMBackbone(_VLMMixin, Backbone):
    """Random-init LLaVA: tiny ``CLIPVisionModel`` + 2-layer GELU projector + tiny ``LlamaForCausalLM``.

    The character tokenizer gains ``<image> <latent> </latent> <|latent|>``; a ``LlavaProcessor`` (PIL
    image processor) is built around it so that exports load with ``AutoProcessor``. With the defaults a
    32x32 image is cut into 4x4 patches of 8x8 pixels -> 16 image tokens (CLS dropped, LLaVA's ``default``
    feature strategy). ``image_pool=s`` average-pools the patch grid to ``s x s`` image tokens before the projector
    (:func:`pool_image_features`): a weaker vision path (fewer, mixed tokens) at the same tower.
    ``connector_norm=True`` layer-normalises the image tokens the LM receives (:func:`normalize_image_tokens`).
    Both are forward hooks (no weights): a model exported from such a backbone and loaded with ``backbone=hf_vlm``
    runs without them; reload it with ``backbone=tiny_vlm`` and the same settings (``backbone.init_from``).
    ``sliding_window=w`` makes the LM a ``MistralForCausalLM`` whose every layer attends to the last ``w`` positions
    only (the current one and ``w - 1`` earlier): a position more than ``num_hidden_layers * (w - 1)`` after the last
    image token cannot be influenced by the image (visual dilution in its extreme, hard form [toy-scale choice, not in
    LLaVA]). The window is part of the model's config, so it survives an export.
    """

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 8,
        vision_hidden_size: int = 64,
        vision_layers: int = 2,
        vision_heads: int = 4,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 4,
        max_position_embeddings: int = 512,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        seed: int = 0,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
        num_image_tokens: int | None = None,
        image_pool: int | None = None,
        connector_norm: bool = False,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__(init_from=init_from, extra_tokens=(*VLM_TOKENS, *extra_tokens), dtype=dtype)
        if sliding_window is not None and (
            isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
        ):
            raise ConfigError(
                f"backbone.sliding_window={sliding_window!r} must be a positive integer (positions each layer attends "
                "to) or null (full attention)"
            )
        self.sliding_window = sliding_window
        self.connector_norm = bool(connector_norm)
        if image_size % patch_size:
            raise ConfigError(f"backbone.image_size={image_size} must be a multiple of patch_size={patch_size}")
        self.image_size = image_size
        self.patch_size = patch_size
        side = image_size // patch_size
        if image_pool is not None and (isinstance(image_pool, bool) or not isinstance(image_pool, int)):
            raise ConfigError(
                f"backbone.image_pool={image_pool!r} must be an integer or null; a string such as 'None' comes from "
                "`backbone.image_pool=None` or from a null interpolated into an override string (an artifact's "
                "overrides): write null, or pass the value through the artifact's `values`"
            )
        if image_pool is not None and not 1 <= image_pool <= side:
            raise ConfigError(f"backbone.image_pool={image_pool} must lie in [1, {side}] (patches per side) or be null")
        self.image_pool = image_pool
        grid = (image_pool or side) ** 2
        if num_image_tokens not in (None, grid):
            why = f" with backbone.image_pool={image_pool}" if image_pool else ""
            raise ConfigError(
                f"backbone.num_image_tokens={num_image_tokens}; this tiny VLM uses {grid}{why}: set "
                f"backbone.num_image_tokens={grid}"
            )
        self.num_image_tokens = grid
        self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
        self.vision_arch = {
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": vision_heads,
            "image_size": image_size,
            "patch_size": patch_size,
            "num_channels": 3,
            "projection_dim": vision_hidden_size,
        }
        self.text_arch = {
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_hidden_layers,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "max_position_embeddings": max_position_embeddings,
        }
        self.seed = seed

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        tok = Backbone.tokenizer.fget(self)  # type: ignore[attr-defined]
        if self._processor is None:
            from transformers import LlavaProcessor

            self._processor = LlavaProcessor(
                image_processor=_image_processor(self.image_size, self.image_mean, self.image_std),
                tokenizer=tok,
                patch_size=self.patch_size,
                vision_feature_select_strategy="default",
                image_token=IMAGE_TOKEN,
                num_additional_image_tokens=1,
            )
        return tok

    def _fresh_tokenizer(self) -> PreTrainedTokenizerBase:
        return build_char_tokenizer()

    def model_config(self) -> LlavaConfig:
        """The ``LlavaConfig`` of the fresh model (vocabulary: :attr:`base_vocab_size`); its text model is Llama, or
        Mistral with ``sliding_window`` when that is set."""
        tok = self.tokenizer
        common = {
            "vocab_size": self.base_vocab_size,
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "tie_word_embeddings": True,
            **self.text_arch,
        }
        if self.sliding_window is None:
            text = LlamaConfig(**common)
        else:
            text = MistralConfig(sliding_window=self.sliding_window, **common)
        return LlavaConfig(
            vision_config=CLIPVisionConfig(**self.vision_arch),
            text_config=text,
            image_token_id=int(tok.convert_tokens_to_ids(IMAGE_TOKEN)),
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
            projector_hidden_act="gelu",
            image_seq_length=self.num_image_tokens,
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
        )

    def _fresh_model(self, quantizer: Quantizer) -> PreTrainedModel:
        config = self.model_config()
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            model = LlavaForConditionalGeneration(config)
        if quantizer.needs_pretrained_load:
            with tempfile.TemporaryDirectory() as tmp:
                model.save_pretrained(tmp)
                self.save_processor(tmp)
                return self._from_pretrained(tmp, quantizer)
        if self.dtype is not None:
            model = model.to(self.dtype)
        return model

    def build_model(self, quantizer: Quantizer | None = None) -> PreTrainedModel:
        """The model (fresh or from ``init_from``), its patch features pooled when ``image_pool`` is set and its image
        tokens layer-normalised when ``connector_norm`` is set."""
        model = super().build_model(quantizer)
        if self.image_pool is not None:
            pool_image_features(model, self.image_pool)
        if self.connector_norm:
            normalize_image_tokens(model)
        return model

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "tiny_llava",
            "vision": self.vision_arch,
            "image_pool": self.image_pool,
            "connector_norm": self.connector_norm,
            "sliding_window": self.sliding_window,
            "text": self.text_arch,
            "seed": self.seed,
            "init_from": self.init_from,
        }


class HFVLMBackbone(_VLMMixin, HFBackbone):
    """A local image-text checkpoint (``AutoModelForImageTextToText`` + ``AutoProcessor``).

    Args:
        name_or_path: directory written by ``save_pretrained`` (or a hub id when not offline).
        image_size, num_image_tokens: input geometry; ``None`` reads it from the checkpoint's config
            (``vision_config.image_size``, ``image_seq_length``); given values are checked against it.
        extra_tokens: e.g. the latent tokens of VaLR (embeddings are resized).
    """

    def __init__(
        self,
        name_or_path: str,
        image_size: int | None = None,
        num_image_tokens: int | None = None,
        attn_implementation: str | None = None,
        trust_remote_code: bool = False,
        revision: str | None = None,
        init_from: str | None = None,
        extra_tokens: Sequence[str] = (),
        dtype: str | None = "float32",
    ) -> None:
        super().__init__(
            name_or_path,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            revision=revision,
            init_from=init_from,
            extra_tokens=extra_tokens,
            dtype=dtype,
        )
        source = self._pretrained_dir() or self.name_or_path
        local = Path(source).is_dir()
        config = AutoConfig.from_pretrained(
            source, local_files_only=True if local else hub_offline(), trust_remote_code=trust_remote_code
        )
        vision = getattr(config, "vision_config", None)
        self.image_size = int(image_size or getattr(vision, "image_size", 0) or 0)
        self.num_image_tokens = int(num_image_tokens or getattr(config, "image_seq_length", 0) or 0)
        if not self.image_size or not self.num_image_tokens:
            raise ConfigError(
                f"backbone=hf_vlm: cannot read the image size / image tokens of {source}; "
                "set backbone.image_size and backbone.num_image_tokens"
            )
        check_vision_geometry(config, self.image_size, self.num_image_tokens, source)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            source = self._pretrained_dir() or self.name_or_path
            local = Path(source).is_dir()
            try:
                self._processor = AutoProcessor.from_pretrained(
                    source, local_files_only=True if local else hub_offline(), trust_remote_code=self.trust_remote_code
                )
                tok = getattr(self._processor, "tokenizer", None) or self._processor
            except (OSError, ValueError, TypeError):
                self._processor = None
                tok = self._load_tokenizer(source)
            add_special_tokens(tok, self.extra_tokens)
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            self._tokenizer = tok
            self._base_vocab_size = len(tok)
        return self._tokenizer

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kind": "hf_vlm"}


__all__ = [
    "IMAGE_TOKEN",
    "LATENT_END",
    "LATENT_SLOT",
    "LATENT_START",
    "VLM_TOKENS",
    "HFVLMBackbone",
    "TinyVLMBackbone",
    "normalize_image_tokens",
    "pool_image_features",
]
