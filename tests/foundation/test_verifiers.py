"""One verifier per task: ``Task.verify`` (zoo.answers.AnswerVerifier) is what modules and callbacks use, wired
from the task through the config."""

from __future__ import annotations

import random

import pytest
import torch
from hydra.utils import instantiate

from zoo.answers import EXACT_ANSWER, AnswerVerifier
from zoo.backbones import TinyBackbone
from zoo.callbacks import SafeThinkMonitor
from zoo.data.jailbreak import JailbreakTask
from zoo.data.sources import TaskSource
from zoo.data.structures import StructureAnswerVerifier
from zoo.data.tasks import Addition, MultiSum
from zoo.data.visual import VisualCounting
from zoo.datamodules import SFTDataModule
from zoo.modules import CausalLMModule


def test_a_task_is_its_verifier():
    task = Addition()
    example = task.sample(random.Random(0))
    assert task(example.completion, example.answer) and task.verify(example.completion, example.answer)
    assert not task(example.completion, example.answer + "1")
    assert task("<think>1+1=2</think> 2 <eos>", 2)  # references are compared as stripped strings
    assert not task("<think>no closing tag", "2")
    assert EXACT_ANSWER("<think>x</think>12", "12") and not EXACT_ANSWER("12", "12")
    structure = StructureAnswerVerifier()
    assert isinstance(structure, AnswerVerifier)
    assert structure("<think>look</think> Yes.", "yes") and not structure("no", "yes")


class AcceptEverything(AnswerVerifier):
    def verify(self, completion: str, answer: object) -> bool:
        return True


@pytest.mark.parametrize(("verifier", "expected"), [(AcceptEverything(), 1.0), (None, 0.0)])
def test_a_generating_module_scores_with_its_verifier(verifier, expected):
    backbone = TinyBackbone(seed=1)  # random: its completions never verify exactly
    dm = SFTDataModule(backbone.tokenizer, TaskSource(Addition(), 8, 8, 8, seed=0), batch_size=8, eval_batch_size=8)
    dm.setup("validate")
    module = CausalLMModule(backbone, verifier=verifier, generation={"max_new_tokens": 6})
    module.configure_model()
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        output = module.validation_step(batch, 0)
    assert output["meta"]["correct"] == [expected == 1.0] * 8
    assert float(module.exact_match["val"].compute()) == expected


@pytest.mark.parametrize(
    ("overrides", "node", "cls"),
    [
        (["+method=sft", "task=multisum"], "module", MultiSum),
        (["+method=grpo", "task=multisum"], "module", MultiSum),
        (["+method=valr"], "module", VisualCounting),
        (["+method=cuttlefish"], "module", StructureAnswerVerifier),
        (["+method=[sft,safethink]", "task=jailbreak"], "callbacks.safethink", JailbreakTask),
    ],
)
def test_configs_wire_the_tasks_verifier(train_cfg, overrides, node, cls):
    cfg = train_cfg(overrides)
    parent = cfg
    for key in node.split("."):
        parent = parent[key]
    assert isinstance(instantiate(parent.verifier, _convert_="all"), cls)


def test_safethink_monitor_without_hydra_defaults_to_the_shared_format_verifier():
    monitor = SafeThinkMonitor(scorer=lambda prompts, traces: [1.0] * len(prompts))
    assert monitor.verifier is EXACT_ANSWER
