"""The interpretability hooks through the decoder seam (``module.decoder.hooks``), and the core boundary.

Pins: a ``ResidualSteerer`` / ``HeadScaler`` given to a generating module's decoder as a hook factory
(``functools.partial(Hook, **settings)``: ``model -> context manager``) acts in the module's validation with the
sample and the step-wise decoder, giving exactly the completions of decoding inside the hook's context (and not the
unhooked ones); nothing stays attached after the run; a bad setting fails before any forward. (That ``zoo.interp``
imports neither Lightning nor Hydra is pinned for every core by ``tests/foundation/test_core_imports.py``.)
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from interp_models import liven, no_hooks_left, quiet_trainer, single_thread  # noqa: F401  (autouse fixture)

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError
from zoo.generation import SampleDecoder, StepwiseDecoder
from zoo.interp import HeadScaler, ResidualSteerer
from zoo.modules import CausalLMModule
from zoo.protocols import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"max_new_tokens": 10}


def hook_settings(model: torch.nn.Module) -> dict[str, tuple[type, dict]]:
    width = model.config.hidden_size
    vector = torch.randn(width, generator=torch.Generator().manual_seed(0))
    return {
        "steer": (ResidualSteerer, {"layer": 1, "vector": vector, "alpha": 6.0}),
        "scale": (HeadScaler, {"scales": {(1, 0): 4.0, (2, 3): 0.0, (3, 1): 3.0}}),
    }


class RecordOutputs(pl.Callback):
    """Keeps the completion ids of every validation batch."""

    def __init__(self) -> None:
        self.completions: list[torch.Tensor] = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.completions.append(outputs["completion_ids"].clone())


def validate(module: CausalLMModule, dm: SFTDataModule) -> torch.Tensor:
    recorder = RecordOutputs()
    quiet_trainer(recorder).validate(module, datamodule=dm, verbose=False)
    return torch.cat(recorder.completions)


@pytest.fixture(scope="module")
def data():
    backbone = TinyBackbone(seed=2, hidden_size=64, intermediate_size=128)
    source = TaskSource(Addition(), num_train=8, num_val=12, num_test=4, seed=0)
    dm = SFTDataModule(backbone.tokenizer, source, batch_size=4, eval_batch_size=6)
    dm.setup("validate")
    return backbone, dm


@pytest.mark.parametrize("kind", ["steer", "scale"])
@pytest.mark.parametrize("decoder_cls", [SampleDecoder, partial(StepwiseDecoder, warn_no_delimiter=False)])
def test_interp_hooks_act_in_module_validation_through_the_decoder_seam(data, kind, decoder_cls):
    backbone, dm = data
    module = CausalLMModule(backbone, generation=PARAMS, decoder=decoder_cls())
    module.configure_model()
    liven(module.model)  # larger weights: greedy decoding of a random model then varies with the input
    plain = validate(module, dm)

    hook_type, settings = hook_settings(module.model)[kind]
    module.decoder.hooks.append(partial(hook_type, **settings))
    hooked = validate(module, dm)

    # The reference: the same decoder without hooks, run inside the hook's context on every validation batch.
    reference = []
    bare = decoder_cls()
    with hook_type(module.model, **settings):
        for batch in dm.val_dataloader():
            out = bare(
                module.model,
                module.tokenizer,
                batch["prompt_ids"],
                batch["prompt_attention_mask"],
                params=SamplingParams(**PARAMS),
            )
            reference.append(out.completion_ids)
    reference = torch.cat(reference)
    assert torch.equal(hooked, reference)
    assert not torch.equal(hooked, plain), "the hook must change the validation completions"
    assert no_hooks_left(module.model)
    module.decoder.hooks.clear()
    assert torch.equal(validate(module, dm), plain)


def test_a_bad_hook_setting_fails_before_any_forward(data):
    backbone, dm = data
    module = CausalLMModule(backbone, generation=PARAMS)
    module.configure_model()
    calls = []
    module.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    module.decoder.hooks.append(partial(ResidualSteerer, layer=9, vector=torch.zeros(64), alpha=1.0))
    batch = next(iter(dm.val_dataloader()))
    with pytest.raises(ConfigError, match="layer=9 is out of range"):
        module.generate(batch["prompt_ids"], batch["prompt_attention_mask"])
    assert not calls
    module.decoder.hooks[:] = [partial(HeadScaler, scales={(0, 4): 2.0})]
    with pytest.raises(ConfigError, match="head index out of range"):
        module.generate(batch["prompt_ids"], batch["prompt_attention_mask"])
    assert not calls
