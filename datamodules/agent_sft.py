"""Behaviour-cloning SFT rows of the ``agent_sft`` method: a scripted agent's actions in the LLM agent's own chat.

:class:`AgentDemonstrationSource` plays episodes of a scripted teacher through the LLM tool-calling agent's chat
(:func:`zoo.agents.cloning.collect_demonstrations`) and yields one row per model request: ``chat`` (system prompt
first), ``tools``, ``completion`` (the teacher's call as reply text). :class:`AgentSFTDataModule` encodes the prompt
with :class:`~zoo.agents.backends.hf_local.HFLocalBackend`'s own rendering (:class:`zoo.agents.cloning.ChatRendering`),
so the tokens trained on are the tokens the model is given at evaluation in the same state; the loss covers the reply
and its EOS only (:class:`~zoo.datamodules.sft.SFTDataModule`).

By default only rows the evaluation would show the model unchanged are trained on: a prompt of at most ``context -
reply_tokens`` tokens (``reply_tokens``: the evaluation's reply budget, ``backend.max_tokens``, capped at half the
context as the backend caps it) and a reply of at most ``reply_tokens`` tokens (EOS included). A longer chat is cut
by the backend at evaluation (oldest turns dropped, then, with ``backend.overflow=keep_recent``, the oldest tokens),
a longer reply is cut at the budget and never executed; such rows are left out and counted in the log. With
``overflow`` set to the evaluation backend's setting, a longer chat is trained on as the backend cuts it instead
(:meth:`~zoo.agents.backends.hf_local.HFLocalBackend.fit_context`), so the model also learns the prompts it is
given once an episode's chat outgrows its context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from zoo.agents.cloning import ChatRendering, collect_demonstrations, demonstration_text
from zoo.agents.envs.base import Environment
from zoo.agents.errors import BackendError
from zoo.agents.policies.base import Agent
from zoo.artifacts import ensure
from zoo.backbones.tokenizer import train_bpe_tokenizer
from zoo.data.sources import GeneratedSource, Row
from zoo.datamodules.base import ListDataset, encode_completion
from zoo.datamodules.sft import SFTDataModule
from zoo.errors import ConfigError, DataError

log = logging.getLogger(__name__)

META_FIELDS = ("episode", "step", "request", "tool", "env", "teacher")


class AgentDemonstrationSource(GeneratedSource):
    """Rows of a scripted teacher's episodes through the LLM agent's chat; ``num_train``/``num_val``/``num_test``
    count **episodes** (each gives one row per step).

    Args:
        env: ``env(seed=...) -> Environment`` (a Hydra ``_partial_``, e.g. ``conf/env/ultrahorizon/grid.yaml``).
        agent: ``agent(seed=...) -> Agent``: the scripted teacher.
        num_train, num_val, num_test: episodes per split; each split's worlds come from its own derived seed
            (``derive_seed(seed + split offset, 0, "demonstrations/<split>")``), none shared with an evaluation run.
        seed: base seed.
        max_steps, crnr_window, code_tool: the harness options of the evaluation run (step cap, CRNR window in
            messages, the Python tool), so the demonstrated chats are the chats the evaluated agent sees.
    """

    def __init__(
        self,
        env: Callable[..., Environment],
        agent: Callable[..., Agent],
        num_train: int = 16,
        num_val: int = 1,
        num_test: int = 0,
        seed: int = 0,
        max_steps: int | None = None,
        crnr_window: int | None = None,
        code_tool: bool = False,
    ) -> None:
        super().__init__(num_train, num_val, num_test, seed)
        self.env = env
        self.agent = agent
        self.harness = {"max_steps": max_steps, "crnr_window": crnr_window, "code_tool": code_tool}
        #: the teacher's mean score per generated split (through the LLM agent's chat)
        self.teacher_scores: dict[str, float] = {}

    def generate(self, split: str, size: int) -> list[Row]:
        if size < 1:
            return []
        rows, trajectories = collect_demonstrations(
            self.env, self.agent, size, self.split_seed(split), role=f"demonstrations/{split}", **self.harness
        )
        self.teacher_scores[split] = sum(t.score for t in trajectories) / len(trajectories)
        log.info(
            "%s split: %d demonstrations from %d episodes of %s (teacher score %.3f through the LLM agent's chat)",
            split,
            len(rows),
            size,
            rows[0]["teacher"] if rows else "?",
            self.teacher_scores[split],
        )
        return rows

    def describe(self) -> dict[str, Any]:
        return {"kind": "agent_demonstrations", **self.harness, "teacher_scores": dict(self.teacher_scores)}


class AgentSFTDataModule(SFTDataModule):
    """SFT on demonstration rows (``chat``, ``tools``, ``completion``), prompts rendered as the HF local backend
    renders them; rows the evaluation would not show the model unchanged are left out (see the module docstring).

    Args:
        reply_tokens: the evaluation's reply budget (``backend.max_tokens``).
        overflow: ``None`` (default): leave out the requests longer than the context beside the reply budget;
            ``error`` / ``keep_recent`` (the evaluation's ``backend.overflow``): train on them cut as the backend
            cuts them (those the backend would refuse under ``error`` are left out).
        (other arguments: see :class:`~zoo.datamodules.sft.SFTDataModule`).
    """

    required_fields = ("chat", "tools", "completion")
    encoded_fields = ("chat", "tools", "completion")

    def __init__(self, *args: Any, reply_tokens: int = 1024, overflow: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(reply_tokens, bool) or not isinstance(reply_tokens, int) or reply_tokens < 1:
            raise ConfigError(f"datamodule.reply_tokens must be a positive whole number, got {reply_tokens!r}")
        self.reply_tokens = reply_tokens
        self.overflow = overflow
        self.rendering = ChatRendering(self.tokenizer, overflow or "error", key="datamodule.overflow")
        #: rows kept / offered per split
        self.kept: dict[str, tuple[int, int]] = {}

    def budgets(self) -> tuple[int, int]:
        """``(prompt, reply)`` token budgets of a row: the backend's reply budget is ``min(max_tokens, context // 2)``
        and the prompt must fit beside it."""
        context = self.token_limit
        reply = min(self.reply_tokens, max(1, context // 2))
        return context - reply, reply

    def prompt_ids(self, row: Row) -> list[int]:
        """The token ids the HF local backend gives its model for the row's chat: the whole chat, or with
        ``overflow`` set, the chat cut to the context as the backend cuts it."""
        if self.overflow is None:
            return self.rendering.encode(row["chat"], row["tools"])
        prompt, reply = self.budgets()
        return self.rendering.fit_context(row["chat"], row["tools"], prompt + reply, reply)[0]

    def fits(self, row: Row) -> bool:
        prompt, reply = self.budgets()
        if len(encode_completion(self.tokenizer, row["completion"])) > reply:
            return False
        try:
            return len(self.prompt_ids(row)) <= prompt
        except BackendError:  # overflow=error: the backend would refuse this chat
            return False

    def build_dataset(self, split: str, rows: Sequence[Row]) -> ListDataset:
        kept = [row for row in rows if self.fits(row)]
        self.kept[split] = (len(kept), len(rows))
        prompt, reply = self.budgets()
        log.info(
            "%s split: %d of %d demonstrations fit the evaluation's context (prompt <= %d tokens, reply <= %d)",
            split,
            len(kept),
            len(rows),
            prompt,
            reply,
        )
        if rows and not kept:
            raise DataError(
                f"{split}: none of the {len(rows)} demonstrations fits a {prompt}-token prompt beside a {reply}-token "
                "reply; raise backbone.max_position_embeddings, lower datamodule.source.crnr_window or "
                "datamodule.reply_tokens"
            )
        return super().build_dataset(split, kept)

    def encode(self, row: Row, index: int, split: str) -> dict[str, Any]:
        prompt_ids = self.prompt_ids(row)
        completion_ids = encode_completion(self.tokenizer, row["completion"])
        self.check_length(split, index, len(prompt_ids) + len(completion_ids))
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "completion_labels": list(completion_ids),
            "masked_out": None,
            "prompt": self.rendering.render(row["chat"], row["tools"])[0],
            "answer": row["completion"],
            "loss_weight": self.sample_weight(row, index, split),
            "columns": {k: row.get(k) for k in META_FIELDS},
        }


def demonstration_tokenizer(
    source: Mapping[str, Any], vocab_size: int = 1024, cache_dir: str | Path | None = None
) -> str:
    """The directory of a byte-level BPE tokenizer (:func:`zoo.backbones.tokenizer.train_bpe_tokenizer`) trained on
    the train-split demonstrations of ``source`` as the model reads them (:func:`zoo.agents.cloning.
    demonstration_text`), for ``backbone.tokenizer`` (``+preset=demonstration_bpe``): the character tokenizer spends a
    position per character of a 4-7k-character UltraHorizon system prompt, so most requests of an episode do not fit
    the context; this one spends about a third. Built once per source config and vocabulary size (artifact cache,
    kind ``tokenizer``); only the train split is read, so the validation and evaluation episodes stay unseen.

    Args:
        source: an :class:`AgentDemonstrationSource` config (``datamodule.source``; instantiated here).
        vocab_size: tokens in all (special tokens and the 256 bytes included).
        cache_dir: artifact cache root (``paths.cache_dir``).
    """
    plain = OmegaConf.to_container(source, resolve=True) if isinstance(source, DictConfig) else dict(source)
    demonstrations = instantiate(plain)
    if not isinstance(demonstrations, AgentDemonstrationSource):
        raise ConfigError(
            f"backbone.tokenizer: demonstration_tokenizer (+preset=demonstration_bpe) trains on agent demonstrations, "
            f"but datamodule.source is {type(demonstrations).__name__}; use it with +method=agent_sft"
        )
    spec = {"source": plain, "vocab_size": int(vocab_size)}

    def build(directory: Path) -> dict[str, Any]:
        rows = demonstrations.rows("train")
        texts = [demonstration_text(row) for row in rows]
        tokenizer = train_bpe_tokenizer(texts, int(vocab_size))
        tokenizer.save_pretrained(directory)
        tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
        return {"rows": len(rows), "characters": sum(map(len, texts)), "tokens": tokens}

    reason = "backbone.tokenizer: a BPE of the run's train-split demonstrations"
    return str(ensure("tokenizer", spec, build, cache_dir, name="agent_demonstrations", reason=reason))


__all__ = ["AgentDemonstrationSource", "AgentSFTDataModule", "demonstration_tokenizer"]
