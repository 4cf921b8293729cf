"""The shared module base: backbone-free modules (sequence classifier, structure encoder pretraining, VaLR teacher)
get the optimizer/scheduler factories, the NaN stop and the run config in checkpoints from ``ZooBaseModule``."""

from __future__ import annotations

import functools

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.data.structures import make_structure_samples
from zoo.errors import NaNLossError
from zoo.modules import SequenceClassifierModule, ZooBaseModule, ZooModule
from zoo.modules.cuttlefish_encoder import StructureEncoderPretrainModule
from zoo.modules.valr_teacher import VaLRTeacherModule
from zoo.optim import one_cycle

SMALL_LM = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
SMALL_LM["num_key_value_heads"] = 2


def _modules(optimizer, scheduler):
    return {
        "sequence_classifier": SequenceClassifierModule(
            TinyBackbone(**SMALL_LM), optimizer=optimizer, scheduler=scheduler
        ),
        "cuttlefish_encoder": StructureEncoderPretrainModule(
            encoder={"hidden": 16, "num_layers": 1, "num_rbf": 8}, optimizer=optimizer, scheduler=scheduler
        ),
        "valr_teacher": VaLRTeacherModule(dim=16, optimizer=optimizer, scheduler=scheduler),
    }


@pytest.mark.parametrize("name", ["sequence_classifier", "cuttlefish_encoder", "valr_teacher"])
def test_backbone_free_modules_use_the_shared_base(name):
    optimizer = functools.partial(torch.optim.SGD, lr=0.123)
    module = _modules(optimizer, functools.partial(one_cycle, pct_start=0.5))[name]
    assert isinstance(module, ZooBaseModule) and not isinstance(module, ZooModule)
    module.configure_model()  # the classifier builds its model here (a no-op for the others)
    config = module.configure_optimizers()
    opt = config["optimizer"]
    assert isinstance(opt, torch.optim.SGD)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(
        p.numel() for p in module.parameters() if p.requires_grad
    )
    assert config["lr_scheduler"]["interval"] == "step"
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.LRScheduler)
    without = _modules(optimizer, None)[name]
    without.configure_model()
    assert isinstance(without.configure_optimizers(), torch.optim.SGD)
    module.run_config = {"seed": 7}
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["zoo_config"] == {"seed": 7}
    with pytest.raises(NaNLossError, match="global step 0"):
        module.check_finite(torch.tensor(float("nan")))


def test_cuttlefish_encoder_pretraining_stops_on_a_non_finite_loss():
    from zoo.data.structures import collate_structures

    module = StructureEncoderPretrainModule(encoder={"hidden": 16, "num_layers": 1, "num_rbf": 8})
    batch = collate_structures(make_structure_samples(2, seed=3))
    assert torch.isfinite(module.training_step({"structures": batch}, 0))
    batch.pos[0, 0] = float("nan")
    with pytest.raises(NaNLossError, match="non-finite loss"):
        module.training_step({"structures": batch}, 0)


def test_export_hook_of_the_base_names_the_module(tmp_path):
    class Bare(ZooBaseModule):
        pass

    with pytest.raises(NotImplementedError, match="Bare does not define export_pretrained"):
        Bare().export_pretrained(tmp_path)
