"""Measurement callbacks of the multimodal demos: RotationInvariance and EncoderMotifProbe (Cuttlefish),
StepStateProbe and VisionFeatureProbe (VaLR),
on real tiny modules in plain Lightning scripts; the structure LM's full_finetune stage."""

from __future__ import annotations

import pytest
import torch
from test_cuttlefish_module import _module
from torch.utils.data import DataLoader

from zoo.backbones import TinyBackbone
from zoo.backbones.vlm import TinyVLMBackbone
from zoo.callbacks import EncoderMotifProbe, RotationInvariance, StepStateProbe, VisionFeatureProbe
from zoo.callbacks.structure_checks import moved
from zoo.callbacks.valr_probe import cell_colour_classes, fit_cell_probes, row_colour_counts
from zoo.data.structures import STRUCTURE_TOKEN, make_structure_samples
from zoo.data.visual import VisualCounting, VisualSource
from zoo.datamodules.structures import structure_batch_from_samples
from zoo.datamodules.visual import VisualReasoningDataModule
from zoo.errors import ConfigError
from zoo.modules.structure_lm import StructureLMModule
from zoo.modules.valr import VaLRModule
from zoo.multimodal.teacher import FrozenTeacher, PatchEncoder

from conftest import plain_trainer

torch.set_num_threads(1)


def loader(batches):
    """Ready batches as a dataloader (no re-collation)."""
    return DataLoader(batches, batch_size=None, collate_fn=lambda b: b)


# -- structures -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def structure_batches():
    module = _module()
    samples = make_structure_samples(8, seed=5)
    return [structure_batch_from_samples(samples[i : i + 4], module.tokenizer) for i in (0, 4)]


def test_moved_structures_keep_their_distances_but_not_their_coordinates(structure_batches):
    s = structure_batches[0]["structures"]
    m = moved(s, torch.Generator().manual_seed(0))
    assert not torch.allclose(m.pos, s.pos, atol=1e-2)
    for g in range(s.num_graphs):
        a, b = s.pos[s.batch == g].double(), m.pos[m.batch == g].double()
        assert torch.allclose(torch.cdist(a, a), torch.cdist(b, b), atol=1e-3)
    assert torch.equal(m.edge_index, s.edge_index) and m.kinds == s.kinds


def test_rotation_invariance_of_the_structure_lm_in_a_plain_lightning_script(structure_batches):
    module = _module()
    cb = RotationInvariance(seed=3, stages=["validate"])
    metrics = plain_trainer([cb]).validate(module, loader(structure_batches), verbose=False)[0]
    # E(3)-invariant features: the rotated copies get the same answers, hence the same accuracy
    assert metrics["rotation/agreement"] == 1.0
    assert metrics["rotation/accuracy"] == pytest.approx(metrics["val/exact_match"])


def test_encoder_probe_scores_separable_and_constant_labels():
    cb = EncoderMotifProbe(kinds=["ring", "triad"])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    ring = (x[:, 0] > 0).long()
    x[:, 0] += 2 * ring - 1  # a margin around the rule x_0 = 0
    cb._data = {"ring": list(zip(x, ring.tolist())), "triad": [(v, 0) for v in x[:10]]}
    out = cb.measure()
    assert out["ring_accuracy"] == 1.0  # a linear rule of the features
    held = ring[20:].double().mean().item()
    assert out["ring_majority"] == pytest.approx(max(held, 1 - held))
    assert out["triad_accuracy"] == 1.0 and out["triad_majority"] == 1.0  # one class: the constant answer


def test_encoder_probe_handles_count_answers():
    cb = EncoderMotifProbe(kinds=["ring_count"])
    g = torch.Generator().manual_seed(1)
    y = torch.arange(60) % 3
    x = torch.nn.functional.one_hot(y, 3).double() * 4 + 0.3 * torch.randn(60, 3, generator=g, dtype=torch.float64)
    cb._data = {"ring_count": [(f, str(int(c))) for f, c in zip(x, y)]}
    out = cb.measure()
    assert out["ring_count_accuracy"] == 1.0  # three answers, each a linear region of the features
    assert out["ring_count_majority"] == pytest.approx(10 / 30)  # 30 held-out rows, 10 per answer
    shuffled = {"ring_count": [(f, str(int(c))) for f, c in zip(x, y[torch.randperm(60, generator=g)])]}
    cb._data = shuffled
    assert cb.measure()["ring_count_accuracy"] < 0.7  # answers unrelated to the features: no linear rule


def test_encoder_probe_runs_on_the_structure_lm(structure_batches):
    cb = EncoderMotifProbe(kinds=["ring", "triad", "count"], stages=["validate"])
    plain_trainer([cb]).validate(_module(), loader(structure_batches), verbose=False)
    kinds = [k for b in structure_batches for k in b["structures"].kinds]
    for kind in ("ring", "triad", "count"):
        assert (f"{kind}_accuracy" in cb.last) == (kinds.count(kind) >= 4)


def test_full_finetune_stage_trains_llm_and_connector_not_the_encoder(structure_batches):
    module = _module("full_finetune")
    trainable = {n.split(".", 1)[0] for n, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"model", "connector"}
    with pytest.raises(ConfigError, match="module.stage"):
        StructureLMModule(TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]), stage="lora_everything")


# -- VaLR -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def visual():
    backbone = TinyVLMBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, vision_hidden_size=16, vision_layers=1
    )
    dm = VisualReasoningDataModule(
        backbone.tokenizer, VisualSource(VisualCounting(), 8, 12, 4, seed=3), batch_size=4, eval_batch_size=6
    )
    dm.setup("validate")
    return backbone, list(dm.val_dataloader())


def test_row_colour_counts_add_up_to_the_answer(visual):
    _, batches = visual
    for batch in batches:
        for r, answer in enumerate(batch["answers"]):
            counts = row_colour_counts(batch, r)
            assert len(counts) == int(batch["num_steps"][r])
            assert sum(counts) == int(answer)  # the task sums the queried colour over the looked-up rows


@pytest.mark.parametrize("stage", ["cot", "latent"])
def test_step_state_probe_takes_one_state_per_step(visual, stage):
    backbone, batches = visual
    module = VaLRModule(
        backbone, stage=stage, num_latents=2, align_weight=0.0, align_layer=1, generation={"max_new_tokens": 4}
    )
    module.configure_model()
    cb = StepStateProbe(stages=["validate"])
    states = cb.step_states(module, batches[0])
    assert [s.shape for s in states] == [(int(n), 32) for n in batches[0]["num_steps"]]
    if stage == "cot":  # the state before step i is the hidden state at the position before its first token
        seg = batches[0]["segments"][0]
        hidden = module.model(
            input_ids=batches[0]["input_ids"],
            attention_mask=batches[0]["attention_mask"],
            pixel_values=batches[0]["pixel_values"],
            output_hidden_states=True,
        ).hidden_states[1]
        first = len(seg["prompt"]) + len(seg["head"]) - 1
        assert torch.allclose(states[0][0], hidden[0, first].float())
    plain_trainer([cb]).validate(module, loader(batches), verbose=False)
    assert {"step_accuracy", "step_majority"} <= set(cb.last)
    assert 0.0 <= cb.last["step_accuracy"] <= 1.0
    late_steps = [p for b in batches for n in b["num_steps"] for p in range(1, int(n) + 1) if p >= cb.late]
    assert ("step_accuracy_late" in cb.last) == bool(late_steps[len(late_steps) // 2 :])


def test_step_state_probe_scores_late_steps_apart():
    """States that hold the target at the first two places of a chain and noise later: the probe reads the early
    steps, and the late metric shows that it cannot read the late ones (majority level), while the overall one is
    higher."""
    generator = torch.Generator().manual_seed(0)
    cb = StepStateProbe(stages=["validate"], late=3)
    for _ in range(400):
        targets = torch.randint(0, 3, (4,), generator=generator)
        states = torch.randn(4, 8, generator=generator) * 0.1
        states[:2, :3] += 3 * torch.nn.functional.one_hot(targets[:2], 3)  # places 1 and 2 know their target
        cb._x.extend(states)
        cb._y.extend(targets.tolist())
        cb._place.extend([1, 2, 3, 4])
    got = cb.measure()
    assert got["step_accuracy_late"] < got["step_majority_late"] + 0.1
    assert got["step_accuracy"] > got["step_accuracy_late"] + 0.25


def test_step_state_probe_settings_are_checked():
    with pytest.raises(ConfigError, match="layer"):
        StepStateProbe(layer=-1)
    with pytest.raises(ConfigError, match="stages"):
        StepStateProbe(stages=["fit"])
    for bad in (0, True, "3"):
        with pytest.raises(ConfigError, match="late"):
            StepStateProbe(late=bad)


def test_cell_probes_read_a_linear_code_and_not_noise():
    g = torch.Generator().manual_seed(0)
    classes = torch.randint(0, 4, (200, 6), generator=g)
    code = torch.nn.functional.one_hot(classes, 4).flatten(1).float() + 0.1 * torch.randn(200, 24, generator=g)
    assert fit_cell_probes(code, classes, 4) == 1.0  # every cell's class is a linear function of the features
    noise = torch.randn(200, 24, generator=g)
    assert fit_cell_probes(noise, classes, 4) < 0.45  # 4 balanced classes: chance is 0.25


def test_vision_probe_teacher_patches_beat_a_student_pooled_to_one_token():
    backbone = TinyVLMBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, vision_hidden_size=16, vision_layers=1, image_pool=1
    )
    dm = VisualReasoningDataModule(
        backbone.tokenizer,
        VisualSource(VisualCounting(), 8, 160, 4, seed=1),
        num_image_tokens=1,
        batch_size=4,
        eval_batch_size=40,
    )
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    module = VaLRModule(backbone, stage="cot", align_weight=0.0, teacher=None, generation={"max_new_tokens": 2})
    module.configure_model()
    with torch.random.fork_rng():
        torch.manual_seed(0)  # an untrained per-patch encoder: each cell's features come from its own pixels
        teacher = FrozenTeacher(PatchEncoder(patch=8, dim=16, image_size=32), 16, 16)
    cb = VisionFeatureProbe(teacher=lambda: teacher, stages=["validate"])
    plain_trainer([cb]).validate(module, loader(batches), verbose=False)
    assert cb.teacher is teacher
    classes = torch.cat([cell_colour_classes(b) for b in batches])
    held = classes[80:]
    majority = sum(float(torch.bincount(held[:, p]).max()) for p in range(16)) / held.numel()
    assert cb.last["cell_majority"] == pytest.approx(majority)
    # one token of 32 numbers cannot say which of 16 cells holds which colour; per-patch features can
    assert cb.last["teacher_cell_accuracy"] > 0.8
    assert cb.last["student_cell_accuracy"] < cb.last["teacher_cell_accuracy"] - 0.2


def test_vision_probe_without_a_teacher_probes_the_student_only(visual):
    backbone, batches = visual
    module = VaLRModule(backbone, stage="cot", align_weight=0.0, teacher=None, generation={"max_new_tokens": 2})
    module.configure_model()
    cb = VisionFeatureProbe(stages=["validate"])
    plain_trainer([cb]).validate(module, loader(batches), verbose=False)
    assert set(cb.last) == {"cell_majority", "student_cell_accuracy"}
    with pytest.raises(ConfigError, match="stages"):
        VisionFeatureProbe(stages=["fit"])
