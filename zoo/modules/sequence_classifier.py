"""Sequence-classification family module: a causal-LM backbone with a classification head.

Used by the SafeThink safety reward model (``+method=safety_rm``, arXiv 2602.11096: the "lightweight safety
reward model" R_safe) and reusable by probes. The classifier is ``AutoModelForSequenceClassification``
built from the backbone's config (last-token pooling for decoder models) with the backbone's base weights
copied in, so the tiny default, a local Hugging Face checkpoint and ``init_from`` all work the same way.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAUROC
from transformers import AutoModelForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from zoo.backbones.base import Backbone
from zoo.modules.base import OptimizerFactory, SchedulerFactory, ZooBaseModule
from zoo.quant.base import NoQuantizer, Quantizer
from zoo.safety.scorers import SCORER_CONFIG, SequenceClassifierScorer


def build_sequence_classifier(
    backbone: Backbone, num_labels: int, quantizer: Quantizer | None = None, seed: int = 0
) -> PreTrainedModel:
    """``AutoModelForSequenceClassification`` with the backbone's architecture and base weights (new head)."""
    causal = backbone.build_model(quantizer or NoQuantizer())
    config = copy.deepcopy(causal.config)
    config.num_labels = num_labels
    config.pad_token_id = backbone.tokenizer.pad_token_id
    config.problem_type = "single_label_classification"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config)
    missing, unexpected = model.base_model.load_state_dict(causal.base_model.state_dict(), strict=False)
    if unexpected or missing:
        raise ValueError(
            f"backbone weights do not fit the classifier (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.to(next(causal.parameters()).dtype)


class SequenceClassifierModule(ZooBaseModule):
    """Train a sequence classifier (cross-entropy) on ``input_ids``/``attention_mask``/``labels`` batches.

    Logs ``{train,val,test}/loss``, ``{val,test}/accuracy`` and, for two classes, ``{val,test}/auroc`` of the
    ``positive_label`` class. The export (``export_pretrained``) is a Hugging Face classifier (safetensors)
    plus ``zoo_scorer.json``, loadable as a SafeThink scorer with :func:`zoo.safety.load_safety_rm`.

    Args:
        backbone: architecture and tokenizer (the base weights are copied into the classifier).
        quantizer: passed to the backbone build.
        num_labels: classes.
        label_names: names of the classes in index order.
        positive_label: the class whose probability is the score (the *safe* class for a safety RM).
        template: how scorer inputs are built from ``{prompt}`` and ``{trace}`` (stored in the export).
        max_length: longest input the scorer keeps (last tokens).
        optimizer, scheduler: partials as in the other family modules.
        seed: head initialisation seed.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        num_labels: int = 2,
        label_names: list[str] | tuple[str, ...] = ("unsafe", "safe"),
        positive_label: int = 1,
        template: str = "{prompt}{trace}",
        max_length: int = 256,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(optimizer, scheduler)
        if len(label_names) != num_labels:
            raise ValueError(f"label_names {list(label_names)} must name all {num_labels} classes")
        if not 0 <= positive_label < num_labels:
            raise ValueError(f"positive_label={positive_label} is not a class index of {num_labels} classes")
        self.backbone = backbone
        self.quantizer = quantizer or NoQuantizer()
        self.num_labels = num_labels
        self.label_names = list(label_names)
        self.positive_label = positive_label
        self.template = template
        self.max_length = max_length
        self.seed = seed
        self.model: PreTrainedModel | None = None
        self.save_hyperparameters(ignore=["backbone", "quantizer", "optimizer", "scheduler"])
        metrics: dict[str, Any] = {}
        for split in ("val", "test"):
            metrics[f"{split}_loss"] = MeanMetric()
            metrics[f"{split}_accuracy"] = MeanMetric()
            if num_labels == 2:
                metrics[f"{split}_auroc"] = BinaryAUROC()
        self.metrics = torch.nn.ModuleDict(metrics)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.backbone.tokenizer

    def configure_model(self) -> None:
        if self.model is None:
            self.model = build_sequence_classifier(self.backbone, self.num_labels, self.quantizer, self.seed)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, num_labels]``."""
        self.configure_model()
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self(batch["input_ids"], batch["attention_mask"])
        loss = torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["labels"].shape[0])
        return loss

    def _eval_step(self, batch: dict[str, Any], split: str) -> None:
        logits = self(batch["input_ids"], batch["attention_mask"]).float()
        labels = batch["labels"]
        size = labels.shape[0]
        self.metrics[f"{split}_loss"].update(torch.nn.functional.cross_entropy(logits, labels))
        self.metrics[f"{split}_accuracy"].update((logits.argmax(-1) == labels).float())
        self.log(f"{split}/loss", self.metrics[f"{split}_loss"], batch_size=size)
        self.log(f"{split}/accuracy", self.metrics[f"{split}_accuracy"], prog_bar=True, batch_size=size)
        if self.num_labels == 2:
            probs = torch.softmax(logits, -1)[:, self.positive_label]
            self.metrics[f"{split}_auroc"].update(probs, (labels == self.positive_label).long())
            self.log(f"{split}/auroc", self.metrics[f"{split}_auroc"], batch_size=size)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    # -- scorer ---------------------------------------------------------------------------------------------
    def scorer_config(self) -> dict[str, Any]:
        """What :func:`zoo.safety.load_safety_rm` needs besides the weights."""
        return {
            "safe_label": self.positive_label,
            "label_names": self.label_names,
            "template": self.template,
            "max_length": self.max_length,
        }

    def as_scorer(self, name: str = "safety_rm") -> SequenceClassifierScorer:
        """The in-memory classifier as a SafeThink scorer (P(positive_label))."""
        self.configure_model()
        return SequenceClassifierScorer(
            self.model, self.tokenizer, self.positive_label, self.template, max_length=self.max_length, name=name
        )

    def export_pretrained(self, directory: str | Path) -> Path:
        """Write the classifier (safetensors), the tokenizer and ``zoo_scorer.json``."""
        self.configure_model()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        (directory / SCORER_CONFIG).write_text(json.dumps(self.scorer_config(), indent=2))
        return directory
