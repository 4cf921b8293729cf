"""Test-time adaptation family: one conversation at a time, adapting words and/or LoRA weights from user feedback.

The LightningModule of ROSA (arXiv:2509.23166) and ROSA2 (arXiv:2603.01375); the math is in :mod:`zoo.adapt.rosa`
(the one-step update toward ``pi* ~ pi exp(r / beta)``) and :mod:`zoo.adapt.rosa2` (the words/weights turn loop).
``automatic_optimization = False``: the only parameter updates are the ROSA steps inside a conversation, on the LoRA
adapters of ``backbone.lora``; the base weights never change (``test/base_unchanged`` checks their hash at the end).
Adapters are reset to their initial values before and after every conversation.

``test_step`` / ``predict_step`` play the conversations of a batch (conversation indices from
:class:`~zoo.datamodules.EpisodeDataModule`) and need ``trainer.inference_mode=false`` (the steps need autograd; the
module says so if it is on). Logged per run: ``test/acc@k`` (share of conversations answered right within ``k``
turns, ``k = 1 .. max_turns``), ``test/success``, ``test/turns`` (turns used), ``test/parameter_shift``
(``||theta_end - theta_start||_2`` of the adapters), ``test/adapt_seconds``, ``test/weight_steps``,
``test/words_updates``, ``test/rollbacks`` (non-finite steps undone). Every conversation is one JSON line of
``<records_dir>/conversations.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torchmetrics import MeanMetric

from zoo.adapt.rosa2 import AdaptationSettings, ConversationLike, ConversationRecord, WordsStream, run_conversation
from zoo.agents.evaluate import derive_seed
from zoo.backbones.base import Backbone
from zoo.errors import ConfigError
from zoo.modules.base import ZooModule
from zoo.quant.base import Quantizer

log = logging.getLogger("zoo")

SUMMARY = ("success", "turns", "parameter_shift", "adapt_seconds", "weight_steps", "words_updates", "rollbacks")


def is_adapter(name: str) -> bool:
    return "lora_" in name


class TestTimeAdaptationModule(ZooModule):
    """Play conversations with test-time adaptation (static, words-only, ROSA, ROSA2: see :class:`AdaptationSettings`).

    Args:
        backbone: the policy (with ``lora`` set: the adapters are what the weights stream moves).
        conversations: ``index -> conversation`` (e.g. :class:`~zoo.data.ambiguous_ops.AmbiguousOpsConversations`).
        words: the words stream (decomposition + revision), ``None`` when ``adapt.words`` is off.
        adapt: the fields of :class:`~zoo.adapt.rosa2.AdaptationSettings` (which streams, routing, ROSA's step).
        seed: base seed of the answer draws (``adapt.temperature > 0``); conversation ``i`` uses its own generator.
        records_dir: where ``conversations.jsonl`` goes (``None``: not written).
        quantizer: applied when the model is built.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        backbone: Backbone,
        conversations: Callable[[int], ConversationLike],
        words: WordsStream | None = None,
        adapt: Mapping[str, Any] | None = None,
        seed: int = 0,
        records_dir: str | None = None,
        quantizer: Quantizer | None = None,
    ) -> None:
        super().__init__(backbone, quantizer)
        self.automatic_optimization = False
        try:
            self.settings = AdaptationSettings(**dict(adapt or {}))
        except TypeError as err:
            raise ConfigError(
                f"module.adapt: {err} (fields: {list(AdaptationSettings.__dataclass_fields__)})"
            ) from None
        if self.settings.weights and not backbone.lora:
            raise ConfigError(
                "module.adapt.weights=true needs LoRA adapters to move: set backbone.lora (r, alpha, ...)"
            )
        if self.settings.words and words is None:
            raise ConfigError("module.adapt.words=true needs a words stream (module.words)")
        self.conversations = conversations
        self.words = words
        self.seed = seed
        self.records_dir = records_dir
        self.means = torch.nn.ModuleDict({name: MeanMetric() for name in SUMMARY})
        self.accuracy_at = torch.nn.ModuleList([MeanMetric() for _ in range(self.settings.max_turns)])
        self._initial_adapters: dict[str, torch.Tensor] | None = None
        self._base_hash: str | None = None
        self._records_file: Path | None = None

    # -- model and adapters ---------------------------------------------------------------------------------
    def configure_model(self) -> None:
        super().configure_model()
        self.model.eval()
        if self._initial_adapters is None:
            self._initial_adapters = {n: p.detach().clone() for n, p in self.adapters()}
            self._base_hash = self.base_hash()

    def configure_optimizers(self) -> None:
        return None

    def adapters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The LoRA adapter parameters (empty without ``backbone.lora``)."""
        return [(n, p) for n, p in self.model.named_parameters() if is_adapter(n)]

    def reset_adapters(self) -> None:
        """Put the adapters back to their initial values (every conversation starts from the same policy)."""
        with torch.no_grad():
            for name, p in self.adapters():
                p.copy_(self._initial_adapters[name])

    def base_hash(self) -> str:
        """SHA-256 of every non-adapter parameter and buffer (bit-level)."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            if not is_adapter(name):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    # -- conversations --------------------------------------------------------------------------------------
    def play(self, index: int) -> ConversationRecord:
        """Play conversation ``index`` from the initial adapters (reset before and after)."""
        if torch.is_inference_mode_enabled():
            raise ConfigError(
                "test-time adaptation needs autograd, but the loop runs under torch.inference_mode: set "
                "trainer.inference_mode=false"
            )
        self.configure_model()
        self.reset_adapters()
        generator = torch.Generator().manual_seed(derive_seed(self.seed, index, "answers"))
        try:
            record = run_conversation(
                self.model,
                self.tokenizer,
                [p for _, p in self.adapters()],
                self.conversations(index),
                self.settings,
                self.words,
                generator,
            )
        finally:
            self.reset_adapters()
        record.conversation["index"] = index
        for turn in record.turns:
            if turn.rolled_back:
                log.warning(
                    "conversation %d turn %d: the ROSA step gave non-finite adapters; rolled back", index, turn.turn
                )
        return record

    def _open_records(self) -> None:
        self._records_file = None
        if self.records_dir is not None:
            self._records_file = Path(self.records_dir) / "conversations.jsonl"
            self._records_file.parent.mkdir(parents=True, exist_ok=True)
            self._records_file.write_text("")

    def on_test_start(self) -> None:
        self._open_records()

    def on_predict_start(self) -> None:
        self._open_records()

    def play_batch(self, batch: list[int]) -> list[ConversationRecord]:
        records = [self.play(int(i)) for i in batch]
        if self._records_file is not None:
            with self._records_file.open("a") as handle:
                for record in records:
                    handle.write(json.dumps({"arm": self.settings.arm, **record.to_dict()}) + "\n")
        return records

    def test_step(self, batch: list[int], batch_idx: int) -> None:
        records = self.play_batch(batch)
        values = {
            "success": [float(r.success_turn is not None) for r in records],
            "turns": [float(len(r.turns)) for r in records],
            **{name: [float(getattr(r, name)) for r in records] for name in SUMMARY[2:]},
        }
        for name, metric in self.means.items():
            metric.update(torch.tensor(values[name]))
            self.log(f"test/{name}", metric, on_step=False, on_epoch=True, batch_size=len(records))
        for k, metric in enumerate(self.accuracy_at, start=1):
            metric.update(torch.tensor([float(r.solved_by(k)) for r in records]))
            self.log(f"test/acc@{k}", metric, on_step=False, on_epoch=True, batch_size=len(records))

    def on_test_end(self) -> None:
        unchanged = self.base_hash() == self._base_hash
        if not unchanged:
            log.error("the base weights changed during test-time adaptation (only LoRA adapters may move)")
        if self.logger is not None:
            self.logger.log_metrics({"test/base_unchanged": float(unchanged)}, step=self.global_step)

    def predict_step(self, batch: list[int], batch_idx: int) -> dict[str, Any]:
        records = self.play_batch(batch)
        return {
            "texts": [r.turns[-1].response if r.turns else "" for r in records],
            "meta": {
                "index": [r.conversation["index"] for r in records],
                "success_turn": [r.success_turn for r in records],
                "parameter_shift": [r.parameter_shift for r in records],
            },
        }


__all__ = ["TestTimeAdaptationModule"]
