"""Paraphrase attack by a second generator: a local causal LM rewrites the text sentence by sentence.

:class:`ModelParaphraser` is the ``list[str] -> list[str]`` paraphraser of :class:`zoo.watermark.attacks.Paraphrase`
backed by a local language model: a generating module (the generation protocol: ``tokenizer``, ``model``), a
model and its tokenizer, or a directory written by ``save_pretrained`` (e.g. ``<run dir>/export`` of
``python train.py +method=sft task=topic_paraphrase``, a tiny model trained on
:class:`zoo.data.topic_sentences.TopicParaphrase` pairs). Each sentence is put into a prompt ``template``, the
prompts are decoded in batches through the decoder seam (greedy by default; the module's decoder when a module is
given), and the first sentence of each completion is the paraphrase (the input sentence itself when the model wrote
no words, or when its prompt and ``max_new_tokens`` do not fit the model's positions: such sentences are kept as
they are, with a warning saying how many). :func:`model_paraphrase` returns the attack.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from zoo.encoding import encode_prompt
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.generation.decoders import Decoder, generate_text
from zoo.generation.sampling import context_length
from zoo.protocols import SamplingParams
from zoo.watermark.attacks import Paraphrase
from zoo.watermark.sentences import first_sentence

# the prompt of the paraphrasing LM (the training prompt of ``task=topic_paraphrase``)
PARAPHRASE_PROMPT = "Paraphrase: {sentence}\n"


class ModelParaphraser:
    """A language model as a paraphraser: ``list[str] -> list[str]`` (one paraphrase per input sentence).

    Args:
        model: a Hugging Face causal LM.
        tokenizer: its tokenizer.
        template: the prompt of one sentence; ``{sentence}`` is replaced by it (default: the prompt of
            :class:`~zoo.data.topic_sentences.TopicParaphrase`).
        params: decoding options, or a mapping of :class:`~zoo.protocols.SamplingParams` fields
            (default: greedy, 120 new tokens).
        decoder: the decoder (default: plain sampling, :class:`~zoo.generation.decoders.SampleDecoder`).
        seed: seed of the sampling noise of each call (used when ``params.do_sample``).
        batch_size: sentences decoded together.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        template: str = PARAPHRASE_PROMPT,
        params: SamplingParams | Mapping[str, Any] | None = None,
        decoder: Decoder | None = None,
        seed: int = 0,
        batch_size: int = 32,
    ) -> None:
        if "{sentence}" not in template:
            raise ConfigError(f"paraphrase template {template!r} must contain '{{sentence}}'")
        if batch_size < 1:
            raise ConfigError(f"paraphrase batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        if params is None:
            params = SamplingParams(max_new_tokens=120, do_sample=False)
        self.params = params if isinstance(params, SamplingParams) else SamplingParams(**params)
        self.decoder = decoder
        self.seed = seed
        self.batch_size = batch_size

    @classmethod
    def from_module(cls, module: Any, **options: Any) -> ModelParaphraser:
        """From a generating module (its model, tokenizer and, when it has one, its decoder)."""
        if getattr(module, "model", None) is None and callable(getattr(module, "configure_model", None)):
            module.configure_model()
        if getattr(module, "model", None) is None or getattr(module, "tokenizer", None) is None:
            raise ConfigError(f"paraphraser: {type(module).__name__} has no model and tokenizer (generation protocol)")
        options.setdefault("decoder", getattr(module, "decoder", None))
        return cls(module.model, module.tokenizer, **options)

    @classmethod
    def from_pretrained(cls, path: str | Path, **options: Any) -> ModelParaphraser:
        """From a local directory written by ``save_pretrained`` (model + tokenizer; no hub access)."""
        from zoo.backbones import HFBackbone

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise CheckpointNotFoundError(
                f"paraphraser: no exported model at {folder.resolve()} (no config.json); pass a directory written "
                "by save_pretrained, e.g. <run dir>/export of python train.py +method=sft task=topic_paraphrase"
            )
        backbone = HFBackbone(str(folder))
        model = backbone.build_model()
        model.eval()
        return cls(model, backbone.tokenizer, **options)

    def __call__(self, sentences: list[str]) -> list[str]:
        """One paraphrase per sentence (the sentence itself where the model wrote no words or the sentence does not
        fit the model's context)."""
        out = list(sentences)
        device = next(self.model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self.seed) if self.params.do_sample else None
        prompts = [self.template.format(sentence=s) for s in sentences]
        fits = [i for i, prompt in enumerate(prompts) if self._fits(prompt)]
        if len(fits) < len(prompts):
            warnings.warn(
                f"paraphraser: {len(prompts) - len(fits)} of {len(prompts)} sentences are too long for the model's "
                f"{context_length(self.model)} positions with max_new_tokens {self.params.max_new_tokens}; they are "
                "kept unchanged",
                RuntimeWarning,
                stacklevel=2,
            )
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start : start + self.batch_size]
            result = generate_text(
                self.model, self.tokenizer, [prompts[i] for i in chunk], self.params, generator, self.decoder
            )
            for i, text in zip(chunk, result.texts):
                out[i] = first_sentence(text) or sentences[i]
        return out

    def _fits(self, prompt: str) -> bool:
        """The prompt as :func:`~zoo.generation.decoders.generate_text` encodes it, plus ``max_new_tokens``, fits
        the model's positions."""
        positions = context_length(self.model)
        if positions is None:
            return True
        return len(encode_prompt(self.tokenizer, prompt)) + self.params.max_new_tokens <= positions


def model_paraphrase(source: Any, *, per_sentence: bool = True, name: str = "paraphrase", **options: Any) -> Paraphrase:
    """The paraphrase attack with a second generator.

    Args:
        source: an export directory (``save_pretrained``), a generating module, or a :class:`ModelParaphraser`.
        per_sentence: paraphrase sentence by sentence (the text's sentences, re-joined with spaces).
        name: label in reports and metric names.
        **options: :class:`ModelParaphraser` options (template, params, seed, batch_size).
    """
    if isinstance(source, ModelParaphraser):
        paraphraser = source
    elif isinstance(source, (str, Path)):
        paraphraser = ModelParaphraser.from_pretrained(source, **options)
    else:
        paraphraser = ModelParaphraser.from_module(source, **options)
    return Paraphrase(paraphraser, per_sentence=per_sentence, name=name)


__all__ = ["ModelParaphraser", "model_paraphrase"]
