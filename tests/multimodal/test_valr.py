"""VaLR invariants (notes s.3(e)): recurrent latents, K slots labelled -100, alignment loss range, frozen
teacher unused at inference, K->P block upsampling, lambda=0, and the Hydra fast_dev_run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from zoo.backbones.vlm import LATENT_END, LATENT_SLOT, LATENT_START, TinyVLMBackbone
from zoo.data.visual import VisualCounting, VisualSource
from zoo.datamodules.visual import VisualReasoningDataModule
from zoo.losses import masked_nll
from zoo.modules.valr import VaLRModule
from zoo.modules.valr_teacher import synthetic_teacher
from zoo.multimodal.valr import (
    LatentDecoder,
    LatentFeedback,
    latent_forward,
    packed_nll,
    rewrite_with_latents,
    step_row_targets,
    upsample_latents,
    valr_alignment_loss,
)
from zoo.protocols import SamplingParams

torch.set_num_threads(1)
SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "vision_hidden_size": 16,
    "vision_layers": 1,
}
K = 3
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backbone() -> TinyVLMBackbone:
    return TinyVLMBackbone(**SMALL)


@pytest.fixture(scope="module")
def batch(backbone):
    dm = VisualReasoningDataModule(backbone.tokenizer, VisualSource(VisualCounting(), 12, 4, 4, seed=3), batch_size=3)
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from zoo.cli.prerequisites import obtain

    cache = tmp_path_factory.mktemp("cache")
    return obtain(synthetic_teacher(num_images=32, steps=5, batch_size=16, dim=16, cache_dir=cache))


def _ids(tok) -> dict[str, int]:
    a, b, c = tok.convert_tokens_to_ids([LATENT_START, LATENT_END, LATENT_SLOT])
    return {"latent_start_id": a, "latent_end_id": b, "latent_slot_id": c}


def _rewrite(tok, batch, k=K):
    return rewrite_with_latents(batch["segments"], k, pad_id=tok.pad_token_id, **_ids(tok))


# -- data rewrite ---------------------------------------------------------------------------------------------------
def test_rewrite_has_exactly_k_latents_per_segment_labelled_ignore(backbone, batch) -> None:
    tok = backbone.tokenizer
    ids = _ids(tok)
    lb = _rewrite(tok, batch)
    assert lb.latent_columns.shape == (int(batch["num_steps"].max()), K)
    for r, seg in enumerate(batch["segments"]):
        row = lb.input_ids[r][lb.attention_mask[r].bool()].tolist()
        labels = lb.labels[r][lb.attention_mask[r].bool()].tolist()
        starts = [i for i, t in enumerate(row) if t == ids["latent_start_id"]]
        assert len(starts) == len(seg["steps"])
        for s in starts:
            assert row[s + 1 : s + 1 + K] == [ids["latent_slot_id"]] * K
            assert row[s + 1 + K] == ids["latent_end_id"]
            assert labels[s + 1 : s + 2 + K] == [-100] * (K + 1)
        assert row.count(ids["latent_slot_id"]) == K * len(seg["steps"])
        # removing the latent segments gives back the plain CoT sequence
        plain = [t for t in row if t not in ids.values()]
        n = int(batch["attention_mask"][r].sum())
        assert plain == batch["input_ids"][r, :n].tolist()
        # image positions carry no loss; latent columns are real exactly where the row has that step
        assert all(lab == -100 for t, lab in zip(row, labels) if t == backbone.image_token_id)
        for i in range(lb.num_segments):
            cols = lb.latent_columns[i]
            assert bool(lb.segment_mask[r, i]) == (i < len(seg["steps"]))
            assert bool((lb.input_ids[r, cols] == ids["latent_slot_id"]).all()) == (i < len(seg["steps"]))


# -- recurrent latent forward ---------------------------------------------------------------------------------------
def test_latent_input_is_previous_hidden_state_and_cache_is_exact(backbone, batch) -> None:
    model = backbone.build_model()
    lb = _rewrite(backbone.tokenizer, batch)
    out = latent_forward(model, lb, batch["pixel_values"], hidden_layer=1)
    b, n = lb.segment_mask.shape
    assert out.num_passes == n * K + 1
    cols = lb.latent_columns.reshape(-1)
    fed = out.latent_inputs.reshape(b, n * K, -1)
    previous = out.last_hidden[:, cols - 1]
    real = lb.segment_mask[:, :, None].expand(-1, -1, K).reshape(b, -1)
    assert torch.equal(fed[real], previous[real])
    # one full (uncached) forward on the same input embeddings reproduces the chunked cached pass
    embeds = model.get_input_embeddings()(lb.input_ids).detach().clone()
    embeds[:, cols] = fed.detach()
    full = model(
        inputs_embeds=embeds,
        pixel_values=batch["pixel_values"],
        attention_mask=lb.attention_mask,
        position_ids=lb.position_ids,
        output_hidden_states=True,
    )
    mask = lb.attention_mask.bool()
    torch.testing.assert_close(full.logits[mask], out.logits[mask], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        full.hidden_states[1][:, cols], out.latent_states.reshape(b, n * K, -1), atol=1e-4, rtol=1e-4
    )
    # gradients reach the fed-back states
    packed_nll(out.logits, lb.labels, lb.attention_mask)[0].backward()
    assert model.get_input_embeddings().weight.grad is not None


def test_interior_padding_is_neutral(backbone, batch) -> None:
    """Each row's loss in the aligned batch equals its loss alone (no interior padding)."""
    model = backbone.build_model()
    tok = backbone.tokenizer
    lb = _rewrite(tok, batch)
    with torch.no_grad():
        out = latent_forward(model, lb, batch["pixel_values"])
        for r in range(lb.input_ids.shape[0]):
            single = {k: (v[r : r + 1] if k == "segments" else v) for k, v in batch.items() if k == "segments"}
            one = _rewrite(tok, single)
            alone = latent_forward(model, one, batch["pixel_values"][r : r + 1])
            expected, _ = masked_nll(alone.logits, one.labels)
            got, _ = packed_nll(out.logits[r : r + 1], lb.labels[r : r + 1], lb.attention_mask[r : r + 1])
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_latent_generate_emits_k_slots_then_forced_end(backbone, batch) -> None:
    model = backbone.build_model()
    tok = backbone.tokenizer
    ids = _ids(tok)
    head = model.lm_head

    class Biased(nn.Module):  # make <latent> the argmax in language mode
        def __init__(self) -> None:
            super().__init__()
            self.inner = head

        def forward(self, x):
            logits = self.inner(x)
            logits[..., ids["latent_start_id"]] += 1e4
            return logits

    model.lm_head = Biased()
    gen = LatentDecoder(K, max_segments=2, hidden_layer=1)(
        model,
        tok,
        batch["prompt_ids"],
        batch["prompt_attention_mask"],
        params=SamplingParams(max_new_tokens=20),
        pixel_values=batch["pixel_values"],
    )
    for r, row in enumerate(gen.completion_ids.tolist()):
        expected = ([ids["latent_start_id"]] + [ids["latent_slot_id"]] * K + [ids["latent_end_id"]]) * 2
        assert row[: len(expected)] == expected
        assert ids["latent_start_id"] not in row[len(expected) :]
        assert len(gen.latent_states[r]) == 2
        assert gen.latent_states[r][0].shape[0] == K
    assert gen.num_latent_segments.tolist() == [2] * len(gen.texts)


# -- alignment loss ---------------------------------------------------------------------------------------------------
def test_alignment_loss_is_minus_one_at_target_and_bounded() -> None:
    torch.manual_seed(0)
    target = torch.randn(2, 16, 8)
    states = target.reshape(2, 1, 16, 8).expand(2, 3, 16, 8)  # P == K: upsampling is the identity
    identity = nn.Identity()
    assert valr_alignment_loss(states, target, identity).item() == pytest.approx(-1.0, abs=1e-6)
    assert valr_alignment_loss(-states, target, identity).item() == pytest.approx(1.0, abs=1e-6)
    proj = nn.Linear(5, 8)
    for _ in range(5):
        value = valr_alignment_loss(torch.randn(2, 3, 4, 5), torch.randn(2, 16, 8), proj).item()
        assert -1.0 <= value <= 1.0
    # masked steps do not count; per-step targets are accepted
    mixed = torch.stack([target, -target], 1)[:, :, None].expand(2, 2, 1, 16, 8).reshape(2, 2, 16, 8)
    mask = torch.tensor([[True, False], [True, False]])
    assert valr_alignment_loss(mixed, target, identity, mask=mask).item() == pytest.approx(-1.0, abs=1e-6)
    per_step = target[:, None].expand(2, 2, 16, 8)
    assert valr_alignment_loss(mixed, per_step, identity).item() == pytest.approx(0.0, abs=1e-6)


def test_upsampling_reproduces_block_pattern() -> None:
    x = torch.arange(16.0).reshape(1, 16, 1)  # a 4x4 grid of latents
    up = upsample_latents(x, 64).reshape(8, 8)
    expected = torch.arange(16.0).reshape(4, 4).repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.equal(up, expected)
    y = torch.arange(4.0).reshape(1, 4, 1)  # 2x2 -> 4x4 (the demo's K=4, P=16)
    assert torch.equal(upsample_latents(y, 16).reshape(4, 4), torch.tensor([[0.0, 0, 1, 1]] * 2 + [[2.0, 2, 3, 3]] * 2))
    assert torch.equal(
        upsample_latents(torch.arange(3.0).reshape(1, 3, 1), 6, "nearest1d").flatten(),
        torch.tensor([0, 0, 1, 1, 2, 2.0]),
    )
    z = torch.randn(2, 5, 7)
    for mode in ("nearest", "nearest1d", "linear"):
        assert torch.equal(upsample_latents(z, 5, mode), z)


# -- module ---------------------------------------------------------------------------------------------------------
def _module(backbone, align_weight, teacher=None, stage="latent") -> VaLRModule:
    module = VaLRModule(
        backbone,
        stage=stage,
        num_latents=K,
        align_weight=align_weight,
        teacher=teacher,
        align_layer=1,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        generation={"max_new_tokens": 6},
    )
    module.configure_model()
    return module


def test_lambda_zero_is_the_plain_language_loss(backbone, batch, teacher) -> None:
    plain = _module(backbone, 0.0)
    aligned = _module(backbone, 0.5, teacher)
    aligned.model.load_state_dict(plain.model.state_dict())
    lb = plain.latent_batch(batch)
    out = latent_forward(plain.model, lb, batch["pixel_values"], feedback=plain.feedback)
    expected, _ = packed_nll(out.logits, lb.labels, lb.attention_mask)
    got = plain.losses(batch, with_alignment=True)
    assert plain.projector is None
    assert "align_loss" not in got
    torch.testing.assert_close(got["loss"], expected)
    both = aligned.losses(batch, with_alignment=True)
    torch.testing.assert_close(both["lm_loss"], expected)
    torch.testing.assert_close(both["loss"], expected + 0.5 * both["align_loss"])
    assert -1.0 <= float(both["align_loss"]) <= 1.0


def test_teacher_gets_no_gradient_and_is_unchanged_after_a_step(backbone, batch, teacher) -> None:
    module = _module(backbone, 0.5, teacher)
    module.train()
    assert not module.teacher.training
    before = {k: v.clone() for k, v in module.teacher.state_dict().items()}
    model_before = module.model.get_input_embeddings().weight.detach().clone()
    optimizer = module.configure_optimizers()
    loss = module.losses(batch, with_alignment=True)["loss"]
    loss.backward()
    assert all(p.grad is None for p in module.teacher.parameters())
    assert all(p.grad is not None for p in module.projector.parameters())
    optimizer.step()
    after = module.teacher.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(model_before, module.model.get_input_embeddings().weight)
    assert not any(p.requires_grad for p in module.model.model.vision_tower.parameters())


def test_teacher_is_never_called_at_inference(backbone, batch, teacher, monkeypatch) -> None:
    module = _module(backbone, 0.5, teacher)

    def boom(*args, **kwargs):
        raise AssertionError("teacher called at inference")

    monkeypatch.setattr(module.teacher, "forward", boom)  # the teacher fixture is shared: undone after the test
    module.eval()
    with torch.no_grad():
        out = module.validation_step(batch, 0)
        module.predict_step(batch, 0)
        module.generate_latent(batch)
    assert len(out["texts"]) == batch["input_ids"].shape[0]
    with pytest.raises(AssertionError, match="teacher called"):
        module.losses(batch, with_alignment=True)  # the mock is live: training does call it


def test_stage_cot_is_plain_sft(backbone, batch) -> None:
    module = _module(backbone, 0.0, stage="cot")
    logits = module.model(input_ids=batch["input_ids"], pixel_values=batch["pixel_values"]).logits
    expected, _ = masked_nll(logits, batch["labels"])
    torch.testing.assert_close(module.losses(batch, with_alignment=True)["loss"], expected)


def test_align_weight_without_teacher_is_a_config_error(backbone) -> None:
    from zoo.errors import ConfigError

    with pytest.raises(ConfigError, match="teacher"):
        VaLRModule(backbone, stage="latent", align_weight=0.5, teacher=None)


# -- Hydra app -------------------------------------------------------------------------------------------------------
SMALL_RUN = [
    "debug=fdr",
    "datamodule.source.num_train=8",
    "datamodule.source.num_val=2",
    "datamodule.source.num_test=2",
    "datamodule.batch_size=2",
    "datamodule.eval_batch_size=2",
    "module.generation.max_new_tokens=4",
    "backbone.hidden_size=32",
    "backbone.intermediate_size=64",
    "backbone.num_hidden_layers=2",
    "logger=none",
    "callbacks=none",
]


def test_method_valr_fast_dev_run(tmp_path, zoo_main, monkeypatch) -> None:
    extra = [
        "module.teacher.num_images=32",
        "+module.teacher.batch_size=16",
        "module.teacher.steps=3",
        "module.teacher.dim=16",
    ]
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ZOO_LOG_DIR", str(tmp_path / "logs"))
    code, stdout, stderr = zoo_main(["+method=valr", *SMALL_RUN, *extra], tmp_path)
    assert code == 0, stderr[-3000:]
    assert "fit done" in stdout


@pytest.mark.slow
def test_method_valr_cot_fast_dev_run_on_hf_vlm(tmp_path, zoo_main, monkeypatch) -> None:
    backbone = TinyVLMBackbone(**SMALL)
    backbone.build_model().save_pretrained(tmp_path / "vlm")
    backbone.save_processor(tmp_path / "vlm")
    overrides = [o for o in SMALL_RUN if not o.startswith("backbone.")]
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ZOO_LOG_DIR", str(tmp_path / "logs"))
    code, _, stderr = zoo_main(
        ["+method=valr_cot", "backbone=hf_vlm", f"backbone.name_or_path={tmp_path / 'vlm'}", *overrides], tmp_path
    )
    assert code == 0, stderr[-3000:]


# -- latent feedback, per-step targets, paper defaults ---------------------------------------------------------------
def _mean_pairwise_cos(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean cosine between the K latents of a segment (``x [B, N, K, H]``), over real segments."""
    xn = torch.nn.functional.normalize(x.float(), dim=-1)
    k = x.shape[2]
    cos = ((xn @ xn.transpose(-1, -2)).sum((-1, -2)) - k) / (k * (k - 1))
    return float(cos[mask].mean())


def test_rescaled_feedback_makes_the_k_latents_differ(backbone, batch) -> None:
    """Post-norm states (RMS ~ 1) fed back raw swamp the slot embeddings (RMS ~ 0.02): the K latents of a segment
    are the same vector (cosine ~ 1). Rescaled to the embeddings' RMS they are inputs of a token's scale and the K
    latent states differ."""
    model = backbone.build_model()
    lb = _rewrite(backbone.tokenizer, batch, k=4)
    embedding_rms = float(model.get_input_embeddings().weight.square().mean().sqrt())
    with torch.no_grad():
        raw = latent_forward(model, lb, batch["pixel_values"], hidden_layer=1)
        scaled = latent_forward(model, lb, batch["pixel_values"], hidden_layer=1, feedback=LatentFeedback())
    real = lb.segment_mask
    fed_rms = scaled.latent_inputs[real].square().mean(-1).sqrt()
    torch.testing.assert_close(fed_rms, torch.full_like(fed_rms, embedding_rms), rtol=1e-4, atol=1e-6)
    assert float(raw.latent_inputs[real].square().mean().sqrt()) > 10 * embedding_rms
    assert _mean_pairwise_cos(raw.latent_states, real) > 0.999
    assert _mean_pairwise_cos(scaled.latent_states, real) < 0.99
    # the projection mode starts as the rescaling (identity map) and is trainable
    projected = LatentFeedback("projection", hidden_size=model.config.text_config.hidden_size)
    h = torch.randn(2, model.config.text_config.hidden_size)
    torch.testing.assert_close(
        projected(h, model.get_input_embeddings()), LatentFeedback()(h, model.get_input_embeddings())
    )
    assert projected.proj.weight.requires_grad
    with pytest.raises(ValueError, match="feedback"):
        LatentFeedback("tanh")


def test_module_trains_and_decodes_with_the_same_feedback(backbone, batch) -> None:
    module = _module(backbone, 0.0)
    assert module.latent_feedback == "embedding_rms" and module.feedback.mode == "embedding_rms"
    assert module.decoder.feedback is module.feedback
    raw = LatentDecoder(K, hidden_layer=1)
    scaled = LatentDecoder(K, hidden_layer=1, feedback=module.feedback)
    params = SamplingParams(max_new_tokens=12, do_sample=False)
    args = (module.model, backbone.tokenizer, batch["prompt_ids"], batch["prompt_attention_mask"])
    with torch.no_grad():
        a = raw(*args, params=params, pixel_values=batch["pixel_values"])
        b = scaled(*args, params=params, pixel_values=batch["pixel_values"])
    rows = [r for r in range(len(a.latent_states)) if a.latent_states[r] and b.latent_states[r]]
    if rows:  # a random model may not open a segment; when it does, the fed-back vectors differ
        r = rows[0]
        assert not torch.allclose(a.latent_states[r][0], b.latent_states[r][0])


def test_step_row_targets_pick_the_row_each_step_looks_up() -> None:
    grid, d = 4, 3
    feats = torch.arange(2 * grid * grid * d, dtype=torch.float).reshape(2, grid * grid, d)
    rows = torch.tensor([[2, 0, -1], [3, 1, 1]])
    out = step_row_targets(feats, rows, grid)
    assert out.shape == (2, 3, grid, d)
    assert torch.equal(out[0, 0], feats[0, 2 * grid : 3 * grid])
    assert torch.equal(out[1, 2], feats[1, grid : 2 * grid])
    assert torch.equal(out[0, 2], torch.zeros(grid, d))  # padding step
    # latent k of step i aligned to patch k of its row: loss -1 when the projected latents equal those patches
    latents = out.clone()
    mask = rows >= 0
    loss = valr_alignment_loss(latents, out, nn.Identity(), mask=mask)
    torch.testing.assert_close(loss, torch.tensor(-1.0))
    with pytest.raises(ValueError, match="square"):
        step_row_targets(feats[:, :15], rows, grid)


def test_step_row_alignment_in_the_module(backbone, batch, teacher) -> None:
    """``align_targets=step_rows`` aligns each step to its looked-up row: a different loss from whole-image
    targets on the same model, and a clear error without the rows in the batch."""
    image = _module(backbone, 0.5, teacher)
    rows = VaLRModule(
        backbone,
        num_latents=4,
        align_weight=0.5,
        teacher=teacher,
        align_layer=1,
        align_targets="step_rows",
        generation={"max_new_tokens": 6},
    )
    rows.configure_model()
    rows.model.load_state_dict(image.model.state_dict())
    step_rows = rows.step_rows(batch, int(batch["num_steps"].max()))
    assert step_rows.tolist()[0][: len(batch["meta"]["query_rows"][0])] == list(batch["meta"]["query_rows"][0])
    rows.projector.load_state_dict(image.projector.state_dict())
    with torch.no_grad():
        loss = rows.losses(batch, with_alignment=True)["align_loss"]
        whole = image.losses(batch, with_alignment=True)["align_loss"]
    assert -1.0 <= float(loss) <= 1.0
    assert not torch.isclose(loss, whole)
    from zoo.errors import DataError

    with pytest.raises(DataError, match="query_rows"):
        rows.losses({**batch, "meta": {}}, with_alignment=True)


def test_paper_defaults_align_depth_and_projector_learning_rate(backbone, teacher) -> None:
    from zoo.modules.valr import paper_align_layer

    assert paper_align_layer(28) == 12 and paper_align_layer(4) == 2 and paper_align_layer(2) == 1
    module = VaLRModule(
        backbone,
        num_latents=K,
        teacher=teacher,
        optimizer=lambda params: torch.optim.AdamW(params, lr=2e-3),
        generation={"max_new_tokens": 6},
    )
    module.configure_model()
    assert module.align_layer == paper_align_layer(module._text_config().num_hidden_layers)
    optimizer = module.configure_optimizers()
    llm, projector = optimizer.param_groups
    assert llm["lr"] == pytest.approx(2e-3)
    assert projector["lr"] == pytest.approx(5 * 2e-3)  # paper: 1e-5 for psi vs 2e-6 for the LLM
    assert {id(p) for p in projector["params"]} == {id(p) for p in module.projector.parameters()}


def test_freeze_connector_keeps_the_projector_fixed_while_the_lm_trains(backbone, batch) -> None:
    def trained(freeze_connector: bool) -> tuple[VaLRModule, dict[str, torch.Tensor], torch.Tensor]:
        module = VaLRModule(
            backbone,
            stage="cot",
            align_weight=0.0,
            freeze_connector=freeze_connector,
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2),
            generation={"max_new_tokens": 6},
        )
        module.configure_model()
        connector = module.model.model.multi_modal_projector
        before = {k: v.clone() for k, v in connector.state_dict().items()}
        embeddings = module.model.get_input_embeddings().weight.detach().clone()
        optimizer = module.configure_optimizers()
        for _ in range(2):
            optimizer.zero_grad()
            module.losses(batch, with_alignment=False)["loss"].backward()
            optimizer.step()
        return module, before, embeddings

    frozen, before, embeddings = trained(True)
    connector = frozen.model.model.multi_modal_projector
    assert not any(p.requires_grad for p in connector.parameters())
    assert not {id(p) for p in connector.parameters()} & {id(p) for p in frozen.trainable_parameters()}
    assert all(torch.equal(before[k], v) for k, v in connector.state_dict().items())
    assert not torch.equal(embeddings, frozen.model.get_input_embeddings().weight)  # the LM does train
    paper, before, _ = trained(False)  # the paper's default: the connector trains
    after = paper.model.model.multi_modal_projector.state_dict()
    assert not all(torch.equal(before[k], v) for k, v in after.items())
