"""N-MARS stages that need Lightning: the offline data stage and the cached artifacts that chain the stages.

Paper: "N-MARS: Non-Monotonic AutoRegressive Sequence modeling" (ICML 2026 poster 61349; no arXiv release). The
cores and the equation -> function map are in :mod:`zoo.generation.undo`; this file holds

- :class:`UndoAugmentationModule` -- the data stage (``+method=nmars_data``, ``stage=predict``): sample deviations
  from the current policy at a configurable temperature (or inject random errors, the baseline), align, augment,
  and return the rows that :class:`zoo.callbacks.OfflineRowWriter` writes (resumable, progress bar);
- :func:`undo_data` -- the data stage's output as a :class:`~zoo.data.sources.JsonlSource` (the default training
  data of ``+method=nmars_sft``) and :func:`undo_policy` -- the export of a ``+method=nmars_sft`` run (the default
  starting policy of ``+method=nmars_grpo``): prerequisite plans (:func:`zoo.artifacts.prerequisite`) that the CLI
  builds through the artifact cache before the job.

Masked SFT itself is the vocabulary-extension family module (:class:`zoo.modules.VocabExtendModule`, which adds
``<UNDO>`` with output rows) over pre-tokenized rows whose loss mask becomes ``-100`` labels in
:class:`zoo.datamodules.SFTDataModule`; GRPO is :class:`zoo.modules.GRPOModule` with the reward of
:mod:`zoo.rl.nmars` and undo-aware decoding.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from zoo.artifacts import Plan, Prerequisite, prerequisite
from zoo.backbones.base import Backbone
from zoo.data.sources import JsonlSource
from zoo.data.undo import DEVIATIONS, UndoVocabulary, augmented_row, error_token_pool, undo_vocabulary
from zoo.errors import ConfigError, DataError
from zoo.generation.decoders import Decoder
from zoo.generation.undo import UNDO_TOKEN, resolve_undo
from zoo.modules.generating import GeneratingModule
from zoo.protocols import Verifier
from zoo.quant.base import Quantizer

# [source: the demo] "sample at temperature 1.2"
DEFAULT_DATA_GENERATION = {"do_sample": True, "temperature": 1.2, "max_new_tokens": 64}


class UndoAugmentationModule(GeneratingModule):
    """The N-MARS data stage: per prompt, deviations -> alignment -> augmented rows (run with ``stage=predict``).

    Args:
        backbone, quantizer: the current policy (``backbone.init_from``: the SFT-on-references policy, or an N-MARS
            policy for a further round).
        generation: sampling of the deviations (default: ``do_sample`` at temperature 1.2, 64 new tokens).
        decoder: the decoder of the samples (default plain sampling; a policy with ``<UNDO>`` may use
            ``module/decoder=undo``; samples are resolved before alignment either way).
        verifier: unused by the stage itself (kept for the generating family's signature).
        deviation: ``sample`` (the policy's own samples, the method) or ``random`` (random error injection into the
            reference, the baseline; no generation).
        num_samples: samples (or random corruptions) per prompt.
        keep_identical: keep rows whose sample equals the reference (``y* = y``, no UNDO) [assumed: the WIP notes
            let augmentation fade as samples approach the reference].
        max_undos_per_row: drop rows with more UNDOs than this (``None``: keep all) [assumed: bounds the row
            length of badly wrong samples].
        num_errors, max_error_length: the random baseline's insertion points per row and longest error span.
        undo_token: the UNDO token string.
        reference_column: the batch column holding the reference completion (``datamodule.completion_column``).
        seed: sampling seed; batch ``b`` samples with seed ``(seed, b)``, so a resumed stage regenerates an
            interrupted batch exactly.

    Predict-step output: ``{"rows": [row, ...]}`` (rows of :mod:`zoo.data.undo`). ``skip_batches`` (filled by
    :class:`~zoo.callbacks.OfflineRowWriter`) lists batches already written; they are not generated again.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        generation: dict[str, Any] | None = None,
        *,
        decoder: Decoder | None = None,
        verifier: Verifier | None = None,
        deviation: str = "sample",
        num_samples: int = 1,
        keep_identical: bool = True,
        max_undos_per_row: int | None = None,
        num_errors: int = 1,
        max_error_length: int = 3,
        undo_token: str = UNDO_TOKEN,
        reference_column: str = "reference",
        seed: int = 0,
    ) -> None:
        super().__init__(
            backbone,
            quantizer,
            None,
            None,
            {**DEFAULT_DATA_GENERATION, **(generation or {})},
            decoder=decoder,
            verifier=verifier,
            generate_on_eval=False,
        )
        if deviation not in DEVIATIONS:
            raise ConfigError(f"module.deviation must be one of {DEVIATIONS}, got {deviation!r}")
        if num_samples < 1:
            raise ConfigError(f"module.num_samples must be >= 1, got {num_samples}")
        if max_undos_per_row is not None and max_undos_per_row < 0:
            raise ConfigError(f"module.max_undos_per_row must be >= 0 or null, got {max_undos_per_row}")
        if num_errors < 1 or max_error_length < 1:
            raise ConfigError("module.num_errors and module.max_error_length must be >= 1")
        self.deviation = deviation
        self.num_samples = num_samples
        self.keep_identical = keep_identical
        self.max_undos_per_row = max_undos_per_row
        self.num_errors = num_errors
        self.max_error_length = max_error_length
        self.undo_token = undo_token
        self.reference_column = reference_column
        self.seed = seed
        self.skip_batches: set[int] = set()
        self._vocabulary: UndoVocabulary | None = None
        self._error_ids: list[int] | None = None
        self.save_hyperparameters(ignore=["backbone", "quantizer", "verifier", "decoder"])

    @property
    def vocabulary(self) -> UndoVocabulary:
        """Id of ``<UNDO>`` in the rows and the fingerprint of the tokenizer that has it there."""
        if self._vocabulary is None:
            self._vocabulary = undo_vocabulary(self.tokenizer, self.backbone.num_embedding_rows(), self.undo_token)
        return self._vocabulary

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        raise ConfigError("the N-MARS data stage trains nothing: run it with stage=predict (+method=nmars_data does)")

    def _references(self, batch: dict[str, Any]) -> tuple[list[str], list[str]]:
        columns = batch.get("columns", {})
        if self.reference_column not in columns:
            raise DataError(
                f"the data stage needs each prompt's reference completion in the batch column "
                f"{self.reference_column!r} (set datamodule.completion_column={self.reference_column}); "
                f"the batch has {sorted(columns)}"
            )
        references = [str(r) for r in columns[self.reference_column]]
        answers = columns.get("answer") or references
        return references, [str(a) for a in answers]

    def _samples(self, batch: dict[str, Any], batch_idx: int) -> list[list[int]]:
        """Resolved sampled completions, ``num_samples`` per prompt (contiguous), EOS and padding removed."""
        k = self.num_samples
        ids = batch["prompt_ids"].repeat_interleave(k, dim=0)
        mask = batch["prompt_attention_mask"].repeat_interleave(k, dim=0)
        generator = torch.Generator(device=ids.device).manual_seed(self.seed * 1_000_003 + batch_idx)
        result = self.generate(ids, mask, self.sampling, generator)
        eos, undo_id = self.tokenizer.eos_token_id, self.tokenizer.get_vocab().get(self.undo_token)
        samples = []
        for row, row_mask in zip(result.completion_ids.tolist(), result.completion_mask.tolist()):
            tokens = [t for t, m in zip(row, row_mask) if m]
            tokens = tokens[: tokens.index(eos)] if eos in tokens else tokens
            samples.append(resolve_undo(tokens, undo_id) if undo_id is not None else tokens)
        return samples

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        if batch_idx in self.skip_batches:
            return {"rows": []}
        references, answers = self._references(batch)
        samples = self._samples(batch, batch_idx) if self.deviation == "sample" else None
        if self.deviation == "random" and self._error_ids is None:
            self._error_ids = error_token_pool(self.tokenizer, exclude=[self.vocabulary.undo_id])
        rows = []
        for i, (prompt, reference, answer) in enumerate(zip(batch["prompts"], references, answers)):
            for s in range(self.num_samples):
                key = f"{batch_idx}:{i}:{s}"
                row = augmented_row(
                    self.tokenizer,
                    self.vocabulary,
                    key=key,
                    prompt=prompt,
                    answer=answer,
                    reference=reference,
                    deviation=self.deviation,
                    sample_ids=None if samples is None else samples[i * self.num_samples + s],
                    rng=random.Random(f"{self.seed}:{key}"),
                    error_ids=self._error_ids or (),
                    num_errors=self.num_errors,
                    max_error_length=self.max_error_length,
                )
                if row["num_undos"] == 0 and not self.keep_identical:
                    continue
                if self.max_undos_per_row is not None and row["num_undos"] > self.max_undos_per_row:
                    continue
                rows.append(row)
        return {"rows": rows}


# -- artifacts that chain the stages ----------------------------------------------------------------------------------
def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


@prerequisite
def undo_data(
    task: Mapping[str, Any],
    backbone: Mapping[str, Any],
    seed: int,
    num_train: int = 2000,
    num_val: int = 256,
    num_test: int = 256,
    overrides: Sequence[str] = (),
    cache_dir: str | None = None,
    root_dir: str | None = None,
) -> Plan:
    """N-MARS rows of the ``train`` and ``val`` prompts of ``task``: two ``+method=nmars_data`` runs (built by the CLI
    through the artifact cache before the job), read as a :class:`~zoo.data.sources.JsonlSource` (the plan returns
    its config node; ``test`` falls back to ``val``). The ``val`` run keeps every row
    (``module.max_undos_per_row=null``), so the held-out prompts are the complete validation split whatever the policy
    wrote.

    Args:
        task, backbone, seed: the parent run's ``task``, ``backbone`` (whose policy samples the deviations: pass the
            node after ``init_from`` is resolved, as ``${backbone}`` is when the datamodule is built) and ``seed``.
        num_train, num_val, num_test: prompts per split of the data stage's task source (the same for both runs,
            so the training prompts exclude the validation and test ones).
        overrides: further command-line overrides of the data stage (``module.num_samples=2``,
            ``module.deviation=random`` for the random-error baseline, ...).
        cache_dir, root_dir: the parent run's ``paths.cache_dir`` / ``paths.root_dir``.
    """
    paths: dict[str, str] = {}
    for split in ("train", "val"):
        values = {
            "task": _plain(task),
            "backbone": _plain(backbone),
            "seed": seed,
            "datamodule.source.num_train": num_train,
            "datamodule.source.num_val": num_val,
            "datamodule.source.num_test": num_test,
        }
        # held-out rows are never filtered: every arm is evaluated on the same, complete set of prompts
        keep_all = ["module.max_undos_per_row=null"] if split == "val" else []
        directory = yield Prerequisite(
            "nmars_data",
            ("+method=nmars_data", f"datamodule.predict_split={split}", *keep_all, *overrides),
            values,
            name=split,
            reason=f"N-MARS {split} rows (+method=nmars_data) for masked SFT",
            cache_dir=cache_dir,
            root_dir=root_dir,
        )
        paths[split] = str(Path(directory) / "export" / f"undo_{split}.jsonl")
    return {"_target_": f"{JsonlSource.__module__}.JsonlSource", "train_path": paths["train"], "val_path": paths["val"]}


@prerequisite
def undo_policy(
    backbone: Mapping[str, Any],
    task: Mapping[str, Any],
    seed: int,
    base_policy: Mapping[str, Any] | None = None,
    num_train: int | None = None,
    num_val: int | None = None,
    max_epochs: int | None = None,
    overrides: Sequence[str] = (),
    cache_dir: str | None = None,
    root_dir: str | None = None,
) -> Plan:
    """The export of a ``+method=nmars_sft`` run (a plain checkpoint whose vocabulary has ``<UNDO>``), built by the
    CLI through the artifact cache before the job: the ``backbone.init_from`` of later stages (``+method=nmars_grpo``).

    The run masked-fine-tunes the base SFT policy of ``task`` (``backbone.init_from: base`` with the ``base_policy``
    recipe) on rows of ``+method=nmars_data`` (built on the way). It is a full fine-tune whatever adapters the parent
    run trains (``backbone.lora`` is dropped, as for the base policy): a QLoRA ``+method=nmars_grpo`` trains its
    adapters on the quantized masked-SFT policy.

    Args:
        backbone: the backbone node without ``init_from`` (passed by the CLI to a plan at ``backbone.init_from``,
            :func:`zoo.cli.prerequisites.prepare`).
        task, seed, base_policy: the parent run's ``task``, ``seed`` and ``base_policy`` recipe.
        num_train, num_val, max_epochs: the run's data-stage prompts and epochs (``None``: the method's defaults).
        overrides: further overrides of the ``+method=nmars_sft`` run.
        cache_dir, root_dir: the parent run's ``paths.cache_dir`` / ``paths.root_dir``.
    """
    policy = {**_plain(backbone), "init_from": "base"}
    if "lora" in policy:  # the masked-SFT policy is a full fine-tune, whatever adapters the parent run trains
        policy["lora"] = None
    values: dict[str, Any] = {"task": _plain(task), "backbone": policy, "seed": seed}
    if base_policy is not None:
        values["base_policy"] = _plain(base_policy)
    settings = {
        "datamodule.source.num_train": num_train,
        "datamodule.source.num_val": num_val,
        "trainer.max_epochs": max_epochs,
    }
    values.update({key: value for key, value in settings.items() if value is not None})
    directory = yield Prerequisite(
        "nmars_policy",
        ("+method=nmars_sft", *overrides),
        values,
        name="msft",
        reason="backbone.init_from asks for the masked-SFT N-MARS policy (+method=nmars_sft)",
        cache_dir=cache_dir,
        root_dir=root_dir,
    )
    return str(Path(directory) / "export")


__all__ = ["DEFAULT_DATA_GENERATION", "UndoAugmentationModule", "undo_data", "undo_policy"]
