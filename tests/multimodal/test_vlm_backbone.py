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


def test_a_text_only_checkpoint_is_a_config_error_naming_what_is_needed(tmp_path) -> None:
    from zoo.backbones import TinyBackbone

    text_only = TinyBackbone()
    text_only.build_model().save_pretrained(tmp_path)
    text_only.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="text-only LlamaConfig.*image-text checkpoint"):
        TinyVLMBackbone(**SMALL, init_from=str(tmp_path)).build_model()


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


def test_image_pool_averages_the_patch_grid_before_the_projector(tmp_path) -> None:
    full = TinyVLMBackbone(**SMALL).build_model().eval()
    backbone = TinyVLMBackbone(**SMALL, image_pool=2, num_image_tokens=4)
    pooled = backbone.build_model().eval()
    assert backbone.num_image_tokens == 4 and pooled.config.image_seq_length == 4
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        patches = full.model.vision_tower(pixels).last_hidden_state[:, 1:]  # [2, 16, Hv], CLS dropped
        grid = patches.reshape(2, 4, 4, -1)
        blocks = grid.reshape(2, 2, 2, 2, 2, -1).mean((2, 4)).reshape(2, 4, -1)  # 2x2 means of the 4x4 grid
        expected = full.model.multi_modal_projector(blocks)
        got = torch.stack(pooled.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output)
    torch.testing.assert_close(got, expected)  # same seed, same weights: only the pooling differs
    inputs = _inputs(backbone)  # 4 image tokens per image
    with torch.no_grad():
        expected_logits = pooled(**inputs).logits
    # the pooling has no weights: an export loads back into the pooled backbone and gives the same outputs
    pooled.save_pretrained(tmp_path)
    backbone.save_processor(tmp_path)
    loaded = TinyVLMBackbone(**SMALL, image_pool=2, init_from=str(tmp_path)).build_model().eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, expected_logits)


def test_image_pool_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="num_image_tokens=4"):
        TinyVLMBackbone(**SMALL, image_pool=2, num_image_tokens=16)
    with pytest.raises(ConfigError, match="image_pool"):
        TinyVLMBackbone(**SMALL, image_pool=5)


def test_connector_norm_feeds_the_lm_unit_rms_image_tokens_without_new_weights(tmp_path) -> None:
    plain = TinyVLMBackbone(**SMALL).build_model().eval()
    backbone = TinyVLMBackbone(**SMALL, connector_norm=True)
    normed = backbone.build_model().eval()
    assert normed.state_dict().keys() == plain.state_dict().keys()  # a hook, no weights
    inputs = _inputs(backbone)
    seen: dict[str, torch.Tensor] = {}

    def record(module, args, kwargs):
        seen["embeds"] = kwargs["inputs_embeds"]

    normed.model.language_model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        logits = normed(**inputs).logits
        patches = plain.model.vision_tower(inputs["pixel_values"]).last_hidden_state[:, 1:]
        raw = plain.model.multi_modal_projector(patches)[0]  # [16, H]: what the plain model feeds the LM
    image = inputs["input_ids"][0] == backbone.image_token_id
    received = seen["embeds"][0, image]
    torch.testing.assert_close(received, torch.nn.functional.layer_norm(raw, raw.shape[-1:], eps=1e-8))
    rms = received.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-3, rtol=0)
    assert float(raw.pow(2).mean().sqrt()) < 0.2  # the plain projector's output is at text-embedding scale
    # the image reaches the logits: another image changes the predictions after it
    other = dict(inputs, pixel_values=torch.randn(1, 3, 32, 32))
    with torch.no_grad():
        assert not torch.allclose(normed(**other).logits[0, ~image], logits[0, ~image])
    # no weights: an export loads back into a connector_norm backbone with the same outputs
    normed.save_pretrained(tmp_path)
    backbone.save_processor(tmp_path)
    loaded = TinyVLMBackbone(**SMALL, connector_norm=True, init_from=str(tmp_path)).build_model().eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, logits)


def _image_reach(backbone: TinyVLMBackbone, length: int) -> torch.Tensor:
    """Per text position: the largest logit change when only the image changes (same tokens)."""
    torch.manual_seed(1)
    model = backbone.build_model().eval()
    tok = backbone.tokenizer
    ids = [tok.bos_token_id, *([backbone.image_token_id] * backbone.num_image_tokens)]
    ids += tok("x" * length)["input_ids"][:length]
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        a = model(input_ids=input_ids, pixel_values=torch.randn(1, 3, 32, 32)).logits
        b = model(input_ids=input_ids, pixel_values=torch.randn(1, 3, 32, 32)).logits
    return (a - b).abs().amax(-1)[0]


def test_sliding_window_cuts_the_image_off_beyond_layers_times_window(tmp_path) -> None:
    window = 6
    backbone = TinyVLMBackbone(**SMALL, sliding_window=window)
    config = backbone.build_model().config.text_config
    assert (config.model_type, config.sliding_window) == ("mistral", window)
    change = _image_reach(backbone, 40)
    last_image = backbone.num_image_tokens  # index of the last image placeholder (after the BOS)
    reach = SMALL["num_hidden_layers"] * (window - 1)  # each layer sees the current and window-1 earlier positions
    assert change[last_image + 1 : last_image + 4].min() > 1e-4  # near the image: it matters
    assert change[last_image + reach + 1 :].max() == 0.0  # beyond the reach: exactly nothing
    assert change[last_image + reach] > 0.0  # the reach is exact, not smaller
    full = _image_reach(TinyVLMBackbone(**SMALL), 40)
    assert full[-1] > 1e-6  # full attention: the last position still sees the image
    # the window is in the exported config: a reload through hf_vlm keeps it
    model = backbone.build_model()
    model.save_pretrained(tmp_path)
    backbone.save_processor(tmp_path)
    assert HFVLMBackbone(str(tmp_path)).build_model().config.text_config.sliding_window == window


@pytest.mark.parametrize("bad", [0, -3, 2.5, "16", True])
def test_sliding_window_settings_are_checked(bad) -> None:
    with pytest.raises(ConfigError, match="sliding_window"):
        TinyVLMBackbone(**SMALL, sliding_window=bad)


@pytest.mark.parametrize(("pool", "window"), [(None, 48), (3, None)])
def test_the_valr_demo_stage1_build_carries_the_students_depth_pooling_and_window(tmp_path, pool, window) -> None:
    """The stage-2 arms continue from the stage-1 artifact: its build must use the same student, nulls included (an
    override string would carry 'None')."""
    from omegaconf import OmegaConf

    from zoo.cli.artifacts import compose_config, plan_request, train_artifact_plan

    tokens = (pool or 4) ** 2
    cfg = compose_config(
        [
            "+demo=valr",
            "demo/valr/arm=valr",
            f"backbone.image_pool={'null' if pool is None else pool}",
            f"backbone.num_image_tokens={tokens}",
            f"backbone.sliding_window={'null' if window is None else window}",
            "backbone.num_hidden_layers=3",
        ],
        cache_dir=tmp_path,
    )
    node = OmegaConf.to_container(cfg.backbone.init_from, resolve=True)
    node.pop("_target_")
    request = next(train_artifact_plan(**node))
    built = plan_request(request).config.backbone
    assert (built.image_pool, built.num_image_tokens, built.sliding_window) == (pool, tokens, window)
    assert built.num_hidden_layers == 3
    student = instantiate(built)
    assert (student.image_pool, student.sliding_window) == (pool, window)
