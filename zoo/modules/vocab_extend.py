"""Continual vocabulary extension as an SFT-family module (``+method=vocab_extend``).

Paper: "Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping"
(arXiv 2605.04308, ICML 2026). The backbone is frozen, the vocabulary is extended from the config (new token
strings, dictionaries by token strings) and only the new rows are trained on rows that use the new tokens, so the
model's outputs on old-only contexts stay bit-identical (checked by :class:`zoo.callbacks.ForgettingMonitor`).
The baselines train more on the same data with the same metrics: ``tuning=full`` (every weight + the new rows)
and ``tuning=lora`` (LoRA adapters through ``peft`` + the new rows).

Equation -> function:

- token-to-dictionary mapping, ``free`` / ``dictionary`` rows -> :func:`zoo.vocab.extend_vocabulary`
  (called in :meth:`VocabExtendModule.configure_model`)
- training only the new rows (embedding tuning) -> :meth:`VocabExtendModule.trainable_parameters`
- loss on the transitions out of the new tokens -> :meth:`zoo.modules.CausalLMModule.loss` (masked NLL)
- forgetting (``max |delta logit|``, KL) on old-only contexts -> :class:`zoo.callbacks.ForgettingMonitor`
- reversibility: the delta alone -> :meth:`VocabExtendModule.export_pretrained` (``vocab_delta.safetensors``)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from zoo.backbones.base import Backbone
from zoo.errors import ConfigError
from zoo.lora import DEFAULT_LORA, has_lora, inject_lora, merged_copy
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.causal_lm import CausalLMModule
from zoo.quant.base import Quantizer
from zoo.vocab import (
    MODES,
    VocabularyExtension,
    check_delta_base,
    dictionary_token_ids,
    extend_vocabulary,
    read_delta,
    register_new_tokens,
    save_delta,
)
from zoo.vocab.delta import Delta

TUNINGS = ("new_rows", "full", "lora")


class VocabularySpec(Protocol):
    """What defines new tokens: their strings and, per token, a dictionary of old token strings."""

    new_tokens: list[str]
    dictionaries: list[list[str]]


class VocabExtendModule(CausalLMModule):
    """Extend the vocabulary of a frozen causal LM and train the new rows (or a baseline) on new-token rows.

    Args:
        backbone, quantizer, optimizer, scheduler, generation: as :class:`~zoo.modules.CausalLMModule`.
        new_tokens: the new token strings (added to the tokenizer with contiguous ids after the model's rows).
        dictionaries: per new token, the old token strings of its dictionary ``D_j`` (``None``: no dictionaries;
            ``free`` rows then start at the mean of all old rows).
        vocabulary: instead of ``new_tokens``/``dictionaries``, an object carrying both (e.g. the Markov task,
            ``module.vocabulary: ${task}``).
        mode: ``free`` | ``dictionary`` (see :func:`zoo.vocab.extend_vocabulary`).
        output_rows: also add output rows (the model can then emit the new tokens).
        tie_output_rows: new output rows = new input rows (``None``: follow the model's tying) [reconstruction].
        tuning: ``new_rows`` (the method), ``full`` or ``lora`` (baselines).
        lora: LoRA settings for ``tuning=lora`` (``r``, ``alpha``, ``dropout``, ``target_modules``).
        pad_tokenizer: when the model's embedding has more rows than its tokenizer has tokens (padded
            vocabularies), reserve the gap with placeholder tokens so the new ids follow the model's rows.
        delta_init: a delta file (or a directory holding ``vocab_delta.safetensors``) to start the new rows from.
        export_merged: :meth:`export_pretrained` writes one plain checkpoint whose vocabulary includes the new tokens
            (:meth:`~zoo.vocab.VocabularyExtension.merge_into`; needs ``output_rows``), loadable by any later stage
            with ``backbone.init_from``, instead of the base model + delta.
        seed: seed of the LoRA initialisation.
        **causal_lm: further :class:`~zoo.modules.CausalLMModule` arguments (``normalizer``, ``generate_on_eval``,
            ``verifier``, ...).

    Attributes:
        vocab_extension: the :class:`~zoo.vocab.VocabularyExtension` (after :meth:`configure_model`).
        new_token_ids: ids of the new tokens in the tokenizer (equal to ``vocab_extension.new_token_ids``).
        base_tokenizer: the tokenizer before the new tokens were added (written by :meth:`export_pretrained`).
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        new_tokens: Sequence[str] = (),
        dictionaries: Sequence[Sequence[str]] | None = None,
        vocabulary: VocabularySpec | None = None,
        mode: str = "free",
        output_rows: bool = False,
        tie_output_rows: bool | None = None,
        tuning: str = "new_rows",
        lora: dict[str, Any] | None = None,
        pad_tokenizer: bool = True,
        delta_init: str | None = None,
        export_merged: bool = False,
        seed: int = 0,
        **causal_lm: Any,
    ) -> None:
        super().__init__(backbone, quantizer, optimizer, scheduler, generation, **causal_lm)
        if mode not in MODES:
            raise ConfigError(f"module.mode must be one of {MODES}, got {mode!r}")
        if tuning not in TUNINGS:
            raise ConfigError(f"module.tuning must be one of {TUNINGS}, got {tuning!r}")
        if vocabulary is not None and (new_tokens or dictionaries):
            raise ConfigError(
                "give the new tokens either through module.vocabulary or through module.new_tokens/dictionaries, "
                "not both (set module.vocabulary=null to use your own tokens)"
            )
        if vocabulary is not None:
            if not hasattr(vocabulary, "new_tokens") or not hasattr(vocabulary, "dictionaries"):
                raise ConfigError(
                    f"module.vocabulary ({type(vocabulary).__name__}) defines no new_tokens/dictionaries; use a task "
                    "that does (task=markov) or set module.vocabulary=null and module.new_tokens=[...]"
                )
            new_tokens, dictionaries = vocabulary.new_tokens, vocabulary.dictionaries
        self.delta = read_delta(delta_init) if delta_init else None
        if not new_tokens and self.delta is not None and self.delta.new_tokens:
            new_tokens, mode, output_rows = self.delta.new_tokens, self.delta.mode, self.delta.output_rows
        if not new_tokens:
            raise ConfigError("module.new_tokens is empty: name the tokens to add (or set module.vocabulary)")
        self.new_tokens = [str(t) for t in new_tokens]
        self.mode = mode
        self.output_rows = bool(output_rows)
        if export_merged and not self.output_rows:
            raise ConfigError(
                "module.export_merged=true writes the new tokens as ordinary rows, which needs output rows "
                "(module.output_rows=true)"
            )
        self.export_merged = bool(export_merged)
        self.tie_output_rows = tie_output_rows
        self.tuning = tuning
        self.lora = {**DEFAULT_LORA, **dict(lora or {})}
        self.delta_init = delta_init
        self.seed = seed

        tokenizer = self.tokenizer
        self.base_tokenizer = copy.deepcopy(tokenizer)
        rows = backbone.num_embedding_rows()
        self.dictionary_ids = (
            None if dictionaries is None else dictionary_token_ids(tokenizer, dictionaries, num_old_tokens=rows)
        )
        if self.delta is None and self.dictionary_ids is None and self.mode == "dictionary":
            raise ConfigError("module.mode=dictionary needs module.dictionaries (one list of old tokens per new token)")
        if self.delta is not None:
            self.dictionary_ids = self._check_delta(self.delta, self.dictionary_ids)
        self.new_token_ids = register_new_tokens(
            tokenizer, self.new_tokens, first_id=rows, pad_to_first_id=pad_tokenizer
        )
        self.vocab_extension: VocabularyExtension | None = None
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler", "verifier", "vocabulary"])
        self.hparams.update({"new_tokens": self.new_tokens, "dictionary_ids": self.dictionary_ids})

    def _check_delta(self, delta: Delta, dictionary_ids: list[list[int]] | None) -> list[list[int]] | None:
        """The configured extension must be the delta's; returns the dictionaries to build it with."""
        expected = {"mode": self.mode, "output_rows": self.output_rows, "num_new_tokens": len(self.new_tokens)}
        for field, value in expected.items():
            if getattr(delta, field) != value:
                raise ConfigError(
                    f"module.delta_init={delta.path}: its {field} is {getattr(delta, field)!r}, "
                    f"the config says {value!r}"
                )
        if delta.new_tokens is not None and delta.new_tokens != self.new_tokens:
            raise ConfigError(
                f"module.delta_init={delta.path}: its tokens {delta.new_tokens} differ from module.new_tokens "
                f"{self.new_tokens}"
            )
        if self.mode == "dictionary" and dictionary_ids is not None and dictionary_ids != delta.dictionaries:
            raise ConfigError(f"module.delta_init={delta.path}: its dictionaries differ from module.dictionaries")
        return delta.dictionaries if dictionary_ids is None else dictionary_ids

    # -- model ------------------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Build the backbone, extend its vocabulary, load ``delta_init`` and set what trains (``tuning``)."""
        if self.model is not None:
            return
        super().configure_model()
        if self.delta is not None:
            check_delta_base(self.delta, self.model)
        extension = extend_vocabulary(
            self.model,
            len(self.new_tokens),
            self.dictionary_ids,
            mode=self.mode,
            output_rows=self.output_rows,
            tie_output_rows=self.tie_output_rows,
        )
        if extension.new_token_ids != self.new_token_ids:
            extension.remove()
            raise ConfigError(
                f"the tokenizer gave the new tokens ids {self.new_token_ids} but the model's new rows are "
                f"{extension.new_token_ids}; the backbone's tokenizer and model disagree on the vocabulary size"
            )
        if self.delta is not None:
            extension.load_state_dict(self.delta.tensors)
        self.vocab_extension = extension
        if self.tuning == "new_rows":
            extension.freeze_base()
        elif self.tuning == "full" and has_lora(self.model):
            # backbone.lora (QLoRA, +preset=qlora): the backbone made its adapters the trainable weights of the
            # (quantized) base, as TRL + peft do; the new rows train with them
            for p in extension.parameters():
                p.requires_grad_(True)
        elif self.tuning == "full":
            if self.quantizer.name != "none":
                raise ConfigError(
                    f"module/vocab_extend/tuning=full cannot train the quantized weights of quant={self.quantizer.name}"
                    "; train LoRA adapters on them with +preset=qlora (or backbone.lora), or use quant=none"
                )
            self.model.requires_grad_(True)
        else:
            self.model = inject_lora(self.model, self.lora, seed=self.seed)
            for p in extension.parameters():
                p.requires_grad_(True)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """``new_rows``: the new rows only (never an old row, whatever ``requires_grad`` says); else every
        parameter that requires a gradient."""
        if self.tuning == "new_rows":
            return self.vocab_extension.parameters()
        return super().trainable_parameters()

    # -- export -----------------------------------------------------------------------------------------------------
    def export_pretrained(self, directory: str | Path) -> Path:
        """Write the base model (``save_pretrained``; LoRA merged) with the tokenizer *before* the new tokens, and
        the delta ``vocab_delta.safetensors`` (new rows + token strings). Reload with
        ``backbone.init_from=<directory> module.delta_init=<directory>``, or in Python with
        :func:`zoo.vocab.apply_delta`. With ``tuning=new_rows`` the base written is bit-identical to the original.

        With ``export_merged``: one plain checkpoint of ``V + m`` tokens and the tokenizer *with* the new tokens
        (reload with ``backbone.init_from=<directory>`` alone)."""
        self.configure_model()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.vocab_extension.remove()
        try:
            if has_lora(self.model):  # tuning=lora, or backbone.lora (QLoRA) with tuning=full
                model = merged_copy(self.model)
            else:
                model = copy.deepcopy(self.model) if self.export_merged else self.model
            if not self.export_merged:
                model.save_pretrained(directory, safe_serialization=True)
        finally:
            self.vocab_extension.attach()
        if self.export_merged:
            self.vocab_extension.merge_into(model).save_pretrained(directory, safe_serialization=True)
            self.tokenizer.save_pretrained(directory)
            return directory
        self.base_tokenizer.save_pretrained(directory)
        save_delta(self.vocab_extension, directory, new_tokens=self.new_tokens)
        return directory


__all__ = ["TUNINGS", "VocabExtendModule", "VocabularySpec"]
