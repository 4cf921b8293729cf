"""Tiny VLM backbone: real transformers classes, latent/image tokens, save_pretrained round trip, hf_vlm."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.utils import instantiate

from zoo.backbones.vlm import IMAGE_TOKEN, LATENT_END, LATENT_SLOT, LATENT_START, HFVLMBackbone, TinyVLMBackbone
from zoo.errors import ConfigError

torch.set_num_threads(1)
SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "vision_hidden_size": 16,
    "vision_layers": 1,
}


def _inputs(backbone: TinyVLMBackbone) -> dict[str, torch.Tensor]:
    tok = backbone.tokenizer
    text = [tok.bos_token_id, *([backbone.image_token_id] * backbone.num_image_tokens), *tok("ab")["input_ids"]]
    return {"input_ids": torch.tensor([text]), "pixel_values": torch.randn(1, 3, 32, 32)}


def test_tiny_vlm_is_llava_with_tokens() -> None:
    backbone = TinyVLMBackbone(**SMALL)
    model = backbone.build_model()
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    vocab = backbone.tokenizer.get_vocab()
    assert all(t in vocab for t in (IMAGE_TOKEN, LATENT_START, LATENT_END, LATENT_SLOT))
    assert model.config.image_token_id == backbone.image_token_id
    assert model.get_input_embeddings().num_embeddings == len(backbone.tokenizer)
    logits = model(**_inputs(backbone)).logits
    assert logits.shape[-1] == len(backbone.tokenizer)
    assert torch.isfinite(logits).all()


def test_tiny_vlm_wrong_placeholder_count_is_rejected_by_the_model() -> None:
    backbone = TinyVLMBackbone(**SMALL)
    model = backbone.build_model()
    inputs = _inputs(backbone)
    inputs["input_ids"] = inputs["input_ids"][:, 2:]  # one image token too few
    with pytest.raises(ValueError, match="(?i)image"):
        model(**inputs)


def test_save_pretrained_round_trip_and_hf_vlm(tmp_path) -> None:
    backbone = TinyVLMBackbone(**SMALL)
    model = backbone.build_model()
    model.save_pretrained(tmp_path)
    backbone.save_processor(tmp_path)
    inputs = _inputs(backbone)
    with torch.no_grad():
        expected = model(**inputs).logits
    for loaded_backbone in (HFVLMBackbone(str(tmp_path)), TinyVLMBackbone(**SMALL, init_from=str(tmp_path))):
        loaded = loaded_backbone.build_model()
        assert loaded_backbone.tokenizer.get_vocab() == backbone.tokenizer.get_vocab()
        assert loaded_backbone.num_image_tokens == 16
        assert loaded_backbone.image_size == 32
        with torch.no_grad():
            torch.testing.assert_close(loaded(**inputs).logits, expected)
    hf = HFVLMBackbone(str(tmp_path))
    assert type(hf.processor).__name__ == "LlavaProcessor"
    assert hf.processor.tokenizer is hf.tokenizer


def test_hf_vlm_geometry_mismatch_is_a_config_error(tmp_path) -> None:
    backbone = TinyVLMBackbone(**SMALL)
    backbone.build_model().save_pretrained(tmp_path)
    backbone.save_processor(tmp_path)
    with pytest.raises(ConfigError, match="image_size"):
        HFVLMBackbone(str(tmp_path), image_size=64)


def test_backbone_configs_compose_and_instantiate(tmp_path) -> None:
    TinyVLMBackbone(**SMALL).build_model().save_pretrained(tmp_path)
    TinyVLMBackbone(**SMALL).save_processor(tmp_path)
    with initialize_config_module("zoo.conf", version_base="1.3"):
        tiny = compose("train", overrides=["+method=valr"])
        hf = compose("train", overrides=["+method=valr", "backbone=hf_vlm", f"backbone.name_or_path={tmp_path}"])
    assert isinstance(instantiate(tiny.backbone), TinyVLMBackbone)
    backbone = instantiate(hf.backbone)
    assert isinstance(backbone, HFVLMBackbone)
    assert backbone.tokenizer.convert_tokens_to_ids(LATENT_SLOT) is not None
    assert type(backbone.build_model()).__name__ == "LlavaForConditionalGeneration"
