"""Paraphrase attack by a second generator (zoo.watermark.paraphrase) on a real tiny Llama and the char tokenizer.

The random model cannot paraphrase, so what it writes is fixed by a real logits processor on the decoder seam
(``Script``: per call, the row writes a given text). That pins the plumbing: prompts built from the template, one
output per sentence, the first sentence of each completion kept, the input kept when nothing was written, batches,
loading from an export directory, and the :class:`~zoo.watermark.attacks.Paraphrase` attack around it.
"""

from __future__ import annotations

import pytest
import torch
from wm_helpers import small_backbone

from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.generation import SampleDecoder
from zoo.protocols import SamplingParams
from zoo.watermark import ModelParaphraser, Paraphrase, model_paraphrase, split_sentences


class Script:
    """Logits processor: every row writes ``texts[row]`` (row = its prompt's text, looked up), then EOS."""

    def __init__(self, tokenizer, outputs: dict[str, str]) -> None:
        self.tokenizer = tokenizer
        self.outputs = outputs
        self.start = 0
        self.previous: torch.Tensor | None = None
        self.prompts: list[str] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        width = input_ids.shape[1]
        previous, self.previous = self.previous, input_ids.clone()
        continued = previous is not None and previous.shape == (input_ids.shape[0], width - 1)
        if not (continued and torch.equal(input_ids[:, :-1], previous)):  # a new call: its first step sees prompts
            self.start = width
            skip = {self.tokenizer.pad_token_id, self.tokenizer.bos_token_id}
            self.prompts = [self.tokenizer.decode([i for i in row.tolist() if i not in skip]) for row in input_ids]
        out = torch.full_like(scores, -torch.inf)
        for b, prompt in enumerate(self.prompts):
            target = self.outputs.get(prompt, "")
            position = width - self.start
            token = (
                self.tokenizer.convert_tokens_to_ids(target[position])
                if position < len(target)
                else self.tokenizer.eos_token_id
            )
            out[b, token] = 0.0
        return out


@pytest.fixture(scope="module")
def lm():
    backbone = small_backbone()
    return backbone.build_model().eval(), backbone.tokenizer


SENTENCES = ["The storm crossed the big city.", "The chef baked bread.", "Prices rose."]


def test_each_sentence_is_paraphrased_through_the_template_and_the_first_sentence_kept(lm):
    model, tokenizer = lm
    template = "Paraphrase: {sentence}\n"
    outputs = {
        template.format(sentence=SENTENCES[0]): "A big storm hit the city. And more text.",
        template.format(sentence=SENTENCES[1]): "Bread was baked.",
        # the third sentence gets no words: the input is kept
    }
    script = Script(tokenizer, outputs)
    paraphraser = ModelParaphraser(model, tokenizer, decoder=SampleDecoder(processors=[script]), batch_size=2)
    assert paraphraser(SENTENCES) == ["A big storm hit the city.", "Bread was baked.", "Prices rose."]
    # as the attack: sentence by sentence, re-joined
    attack = model_paraphrase(paraphraser, name="tiny_lm")
    assert isinstance(attack, Paraphrase) and attack.name == "tiny_lm"
    attacked = attack(" ".join(SENTENCES))
    assert split_sentences(attacked) == ["A big storm hit the city.", "Bread was baked.", "Prices rose."]


def test_a_module_and_an_export_directory_are_second_generators(lm, tmp_path):
    from zoo.modules import CausalLMModule

    backbone = small_backbone()
    module = CausalLMModule(backbone)
    from_module = ModelParaphraser.from_module(module, params={"max_new_tokens": 12})
    assert from_module.model is module.model and from_module.decoder is module.decoder
    assert from_module.params == SamplingParams(max_new_tokens=12)
    module.model.save_pretrained(tmp_path / "export")
    backbone.tokenizer.save_pretrained(tmp_path / "export")
    loaded = ModelParaphraser.from_pretrained(tmp_path / "export", params={"max_new_tokens": 12})
    # greedy decoding of the same weights: the same paraphrases, whichever way the model came
    assert loaded(SENTENCES) == from_module(SENTENCES)
    assert model_paraphrase(str(tmp_path / "export"), params={"max_new_tokens": 12})("Prices rose.")


def test_bad_paraphraser_settings(lm, tmp_path):
    model, tokenizer = lm
    with pytest.raises(ConfigError, match="must contain"):
        ModelParaphraser(model, tokenizer, template="Rewrite: ")
    with pytest.raises(ConfigError, match="batch_size"):
        ModelParaphraser(model, tokenizer, batch_size=0)
    with pytest.raises(CheckpointNotFoundError, match="no exported model"):
        ModelParaphraser.from_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="no model and tokenizer"):
        ModelParaphraser.from_module(object())


def test_a_sentence_too_long_for_the_paraphraser_context_is_kept_with_a_warning(lm):
    """The small model has 256 positions: a 200-character sentence + 120 new tokens does not fit; it is kept as it
    is (and said), the others are paraphrased."""
    model, tokenizer = lm
    template = "Paraphrase: {sentence}\n"
    long = "The " + "very " * 39 + "long storm came."
    script = Script(tokenizer, {template.format(sentence=SENTENCES[1]): "Bread was baked."})
    paraphraser = ModelParaphraser(model, tokenizer, template=template, decoder=SampleDecoder(processors=[script]))
    with pytest.warns(RuntimeWarning, match="1 of 2 sentences are too long"):
        assert paraphraser([long, SENTENCES[1]]) == [long, "Bread was baked."]
