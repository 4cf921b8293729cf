"""Stop tokens and prompts of real instruct models (DESIGN "Scale"): a row stops at the tokenizer's EOS or at any id of
the model's ``generation_config.eos_token_id`` list (Llama-3-Instruct, Gemma) in every decoder; single-turn prompts
take the tokenizer's chat template on request and never get a second BOS. A tiny Llama saved with
``save_pretrained`` whose generation config lists two EOS ids, and a tokenizer with a chat template."""

from __future__ import annotations

import pytest
import torch

from zoo.backbones import HFBackbone, TinyBackbone
from zoo.data.sources import JsonlSource
from zoo.datamodules import PromptDataModule
from zoo.encoding import encode_prompt
from zoo.errors import ConfigError
from zoo.generation.decoders import SampleDecoder
from zoo.generation.dts import DTSDecoder
from zoo.generation.stepwise import StepwiseDecoder
from zoo.generation.undo import UNDO_TOKEN, UndoDecoder
from zoo.protocols import SamplingParams

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
# a chat template that writes BOS itself, as Llama-3's does
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def instruct_dir(tmp_path_factory):
    """A tiny instruct-style checkpoint: generation_config.eos_token_id = [<eos>, '#'], a chat template."""
    path = tmp_path_factory.mktemp("instruct")
    source = TinyBackbone(seed=0, num_key_value_heads=2, extra_tokens=[UNDO_TOKEN], **SMALL)
    model, tokenizer = source.build_model(), source.tokenizer
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("#")]
    model.save_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def instruct(instruct_dir):
    backbone = HFBackbone(str(instruct_dir))
    return backbone.build_model().eval(), backbone.tokenizer


def forcing(token: int):
    """A logits processor that leaves only ``token`` (the policy 'says' the second EOS id at once)."""

    def force(ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        out[:, token] = 0.0
        return out

    return force


@pytest.mark.parametrize("kind", ["sample", "stepwise", "dts", "undo"])
def test_every_decoder_stops_at_the_generation_configs_second_eos(instruct, kind):
    model, tokenizer = instruct
    second = tokenizer.convert_tokens_to_ids("#")
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, second]
    force = forcing(second)
    decoder = {
        "sample": lambda: SampleDecoder(processors=[force]),
        "stepwise": lambda: StepwiseDecoder(processors=[force], warn_no_delimiter=False),
        "dts": lambda: DTSDecoder(processors=[force], temperature=0.0),
        "undo": lambda: UndoDecoder(processors=[force]),
    }[kind]()
    ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer("1+2=", add_special_tokens=False)["input_ids"]]] * 2)
    result = decoder(model, tokenizer, ids, torch.ones_like(ids), params=SamplingParams(max_new_tokens=8))
    assert result.finished.all()
    assert result.completion_mask.sum(1).tolist() == [1, 1]  # the stop token itself, then nothing
    assert result.texts == ["", ""]


def test_a_prerendered_prompt_keeps_its_one_bos(instruct):
    _, tokenizer = instruct
    plain = encode_prompt(tokenizer, "1+2=")
    rendered = encode_prompt(tokenizer, tokenizer.bos_token + "1+2=")
    assert plain == rendered and plain[0] == tokenizer.bos_token_id and plain.count(tokenizer.bos_token_id) == 1


def test_prompt_datamodule_renders_single_turn_prompts_with_the_chat_template(instruct, tmp_path):
    _, tokenizer = instruct
    rows = tmp_path / "prompts.jsonl"
    rows.write_text('{"prompt": "1+2=", "answer": "3"}\n')
    templated = PromptDataModule(tokenizer, JsonlSource(rows, rows), chat_format="template")
    templated.setup("fit")
    item = templated.encode({"prompt": "1+2=", "answer": "3"}, 0, "train")
    text = tokenizer.decode(item["prompt_ids"], skip_special_tokens=False)
    assert text == tokenizer.bos_token + "[user]1+2=\n[assistant]"  # the template's BOS, once
    assert item["prompt"] == "1+2=" and item["columns"] == {"answer": "3"}
    raw = PromptDataModule(tokenizer, JsonlSource(rows, rows)).encode({"prompt": "1+2="}, 0, "train")
    assert tokenizer.decode(raw["prompt_ids"], skip_special_tokens=False) == tokenizer.bos_token + "1+2="
    with pytest.raises(ConfigError, match="chat_format"):
        PromptDataModule(tokenizer, JsonlSource(rows, rows), chat_format="chatml")
    plain_tokenizer = TinyBackbone(**SMALL).tokenizer
    with pytest.raises(ConfigError, match="no chat_template"):
        PromptDataModule(plain_tokenizer, JsonlSource(rows, rows), chat_format="template")
