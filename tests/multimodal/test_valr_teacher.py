"""VaLR's synthetic teacher (arXiv 2602.04476): the cell-attribute objective, ``+method=valr_teacher`` through the
Hydra app, its export, and ``synthetic_teacher`` building it once through the artifact cache."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from zoo.errors import ConfigError, DataError
from zoo.modules.valr_teacher import VaLRTeacherModule, synthetic_teacher
from zoo.multimodal.teacher import CellAttributeHeads, FrozenTeacher, cell_attribute_loss, cell_targets, load_teacher

SMALL_TEACHER = [
    "datamodule.source.num_train=64",
    "datamodule.source.num_val=32",
    "datamodule.source.num_test=8",
    "datamodule.batch_size=16",
    "datamodule.eval_batch_size=32",
    "module.dim=16",
]


def test_cell_targets_map_empty_cells_to_class_zero():
    cells = torch.tensor([[[-1, -1], [0, 2], [2, 0]]])
    colour, shape = cell_targets(cells)
    assert colour.tolist() == [[0, 1, 3]]
    assert shape.tolist() == [[0, 3, 1]]


def test_cell_attribute_loss_is_low_and_accurate_for_the_right_logits():
    cells = torch.tensor([[[-1, -1], [0, 2], [2, 0], [1, 1]]])
    heads = CellAttributeHeads(dim=8, num_colors=3, num_shapes=3)
    colour, shape = cell_targets(cells)
    with torch.no_grad():  # features = one-hot of (colour, shape) and heads reading them off exactly
        heads.colour.weight.zero_()
        heads.shape.weight.zero_()
        heads.colour.bias.zero_()
        heads.shape.bias.zero_()
        heads.colour.weight[:, :4] = 20 * torch.eye(4)
        heads.shape.weight[:, 4:] = 20 * torch.eye(4)
    features = torch.cat([torch.nn.functional.one_hot(colour, 4), torch.nn.functional.one_hot(shape, 4)], -1).float()
    right = cell_attribute_loss(features, heads, cells)
    assert right["cell_accuracy"] == 1.0 and right["loss"] < 1e-3
    wrong = cell_attribute_loss(features.roll(1, dims=1), heads, cells)
    assert wrong["cell_accuracy"] < 1.0 and wrong["loss"] > 1.0


def test_valr_teacher_method_trains_and_exports_a_loadable_teacher(train_cfg, tmp_path):
    from zoo.cli.train import build, run

    cfg = train_cfg(["+method=valr_teacher", *SMALL_TEACHER, "trainer.max_steps=40"])
    assert cfg.methods.valr_teacher.kind == "module"
    module, datamodule, _ = build(cfg)
    datamodule.setup("fit")
    val = next(iter(datamodule.val_dataloader()))
    with torch.no_grad():
        before = float(
            cell_attribute_loss(module.encoder(val["pixel_values"]), module.heads, module._cells(val))["loss"]
        )
    metrics = run(cfg)
    assert {"val/loss", "val/cell_accuracy", "val/colour_accuracy", "val/shape_accuracy"} <= set(metrics)
    assert metrics["val/loss"] < 0.5 * before  # it learned the cells
    teacher = load_teacher(tmp_path / "run" / "export")
    assert isinstance(teacher, FrozenTeacher)
    assert teacher.pretrain_accuracy == pytest.approx(metrics["val/cell_accuracy"])
    assert teacher.feature_dim == 16 and teacher.num_patches == 16
    assert all(not p.requires_grad for p in teacher.parameters())
    assert teacher(val["pixel_values"]).shape == (val["pixel_values"].shape[0], 16, 16)


def test_valr_teacher_module_refuses_batches_without_cells():
    module = VaLRTeacherModule(dim=16)
    batch = {"pixel_values": torch.zeros(2, 3, 32, 32), "meta": {}}
    with pytest.raises(DataError, match="cells"):
        module.training_step(batch, 0)


def test_synthetic_teacher_is_built_once_through_the_cache(tmp_path, caplog):
    from zoo.cli.prerequisites import obtain

    small = {"num_images": 32, "batch_size": 16, "steps": 3, "dim": 16, "cache_dir": tmp_path}
    with caplog.at_level(logging.INFO, logger="zoo"):
        first = obtain(synthetic_teacher(**small))
    assert "building the valr_teacher artifact" in caplog.text
    built = [p for p in (tmp_path / "valr_teacher").iterdir() if p.name.startswith("patch16-")]
    assert len(built) == 1 and (built[0] / "export" / "teacher.safetensors").is_file()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        again = obtain(synthetic_teacher(**small))
    assert "using the cached valr_teacher artifact" in caplog.text and "building" not in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    other = obtain(synthetic_teacher(**{**small, "seed": 7}))  # another recipe, another artifact
    assert len([p for p in (tmp_path / "valr_teacher").iterdir() if p.name.startswith("patch16-")]) == 2
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values()))
    with pytest.raises(ConfigError, match="num_images"):
        obtain(synthetic_teacher(**{**small, "num_images": 8}))


def test_valr_module_builds_its_teacher_in_setup_before_the_model(tmp_path):
    """The teacher factory runs in ``setup`` (outside the strategy's init context), before ``configure_model``."""
    from zoo.backbones.vlm import TinyVLMBackbone
    from zoo.cli.prerequisites import obtain
    from zoo.modules.valr import VaLRModule

    plan = functools.partial(synthetic_teacher, num_images=32, batch_size=16, steps=2, dim=16, cache_dir=tmp_path)

    def factory():
        return obtain(plan())

    module = VaLRModule(TinyVLMBackbone(hidden_size=32, intermediate_size=64, num_hidden_layers=2), teacher=factory)
    assert module.teacher is None
    module.setup("fit")
    assert isinstance(module.teacher, FrozenTeacher) and module.model is None
    module.configure_model()
    assert module.projector(torch.zeros(1, 32)).shape == (1, 16)  # psi maps the LLM width to the teacher's D
