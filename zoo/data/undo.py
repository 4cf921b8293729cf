"""N-MARS training rows: augmented sequences (:mod:`zoo.generation.undo`) as pre-tokenized SFT rows.

A row (one JSON object per line of the data stage's output, read by :class:`zoo.datamodules.SFTDataModule`):

============== ============================================================================================
``key``         ``<batch>:<row>:<sample>`` within the stage that wrote it
``prompt``      the prompt text
``answer``      the reference answer (what exact match compares with)
``reference``   the reference completion text
``completion``  the augmented sequence as readable text (``<UNDO>`` shown as the token string)
``completion_ids`` / ``loss_mask``  ``y*`` + EOS and its mask (False on error tokens; EOS True)
``tokenizer``   :func:`~zoo.encoding.tokenizer_fingerprint` of the tokenizer the ids belong to: the policy's
                tokenizer with ``<UNDO>`` at ``undo_id`` (registered as the vocabulary extension will register it)
``undo_id``     the id of ``<UNDO>``
``deviation``   ``sample`` (the policy's own sample) or ``random`` (random error injection)
``sample``      the sample's text (``sample`` rows; the resolved sample when it used UNDO)
``num_undos``   UNDO tokens in ``completion_ids`` (= error tokens)
============== ============================================================================================
"""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from zoo.encoding import tokenizer_fingerprint
from zoo.errors import DataError
from zoo.generation.undo import UNDO_TOKEN, augment_with_undo, inject_random_errors
from zoo.vocab import register_new_tokens

DEVIATIONS = ("sample", "random")


@dataclass(frozen=True)
class UndoVocabulary:
    """The ``<UNDO>`` token of the rows: its id and the fingerprint of the tokenizer that has it at that id."""

    undo_id: int
    fingerprint: str
    token: str = UNDO_TOKEN


def undo_vocabulary(
    tokenizer: PreTrainedTokenizerBase, num_embedding_rows: int, token: str = UNDO_TOKEN
) -> UndoVocabulary:
    """Where ``token`` is (or will be) in the vocabulary of a policy.

    When the tokenizer already has it (a policy trained with N-MARS), its id. Otherwise the id the vocabulary
    extension gives it when the policy is fine-tuned (:func:`zoo.vocab.register_new_tokens` after the model's
    ``num_embedding_rows`` rows, padding a shorter tokenizer), computed on a copy: the fingerprint is that of the
    extended tokenizer, so the SFT stage (which registers the token the same way) accepts the rows.
    """
    if token in tokenizer.get_vocab():
        return UndoVocabulary(int(tokenizer.get_vocab()[token]), tokenizer_fingerprint(tokenizer), token)
    extended = copy.deepcopy(tokenizer)
    (undo_id,) = register_new_tokens(extended, [token], first_id=num_embedding_rows, pad_to_first_id=True)
    return UndoVocabulary(undo_id, tokenizer_fingerprint(extended), token)


def error_token_pool(tokenizer: PreTrainedTokenizerBase, exclude: Sequence[int] = ()) -> list[int]:
    """Ids random errors are drawn from: every token of the tokenizer except special and added tokens (``<UNDO>``,
    reasoning tags, ...) and ``exclude`` [assumed: the WIP notes draw from "the vocabulary"]."""
    skip = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values()) | set(exclude)
    pool = sorted(i for i in tokenizer.get_vocab().values() if i not in skip)
    if not pool:
        raise DataError("the tokenizer has no ordinary token to draw random errors from")
    return pool


def undo_text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], undo_id: int, token: str = UNDO_TOKEN) -> str:
    """Readable text of a sequence with UNDOs: runs of ordinary tokens decoded, each UNDO written as ``token``
    (works while the tokenizer does not know the token yet)."""
    parts: list[str] = []
    run: list[int] = []
    for t in ids:
        if t == undo_id:
            parts.append(tokenizer.decode(run, skip_special_tokens=False) + token)
            run = []
        else:
            run.append(t)
    parts.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts)


def augmented_row(
    tokenizer: PreTrainedTokenizerBase,
    vocabulary: UndoVocabulary,
    *,
    key: str,
    prompt: str,
    answer: str,
    reference: str,
    deviation: str,
    sample_ids: Sequence[int] | None = None,
    rng: random.Random | None = None,
    error_ids: Sequence[int] = (),
    num_errors: int = 1,
    max_error_length: int = 3,
) -> dict[str, Any]:
    """One row (module docstring) from a reference and either a resolved policy sample (``deviation="sample"``:
    :func:`~zoo.generation.undo.augment_with_undo`) or random errors (``deviation="random"``:
    :func:`~zoo.generation.undo.inject_random_errors` with ``rng``, ``error_ids``, ``num_errors``,
    ``max_error_length``)."""
    reference_ids = list(tokenizer(reference, add_special_tokens=False)["input_ids"])
    undo_id = vocabulary.undo_id
    if deviation == "sample":
        if sample_ids is None:
            raise ValueError("deviation='sample' needs sample_ids")
        ids, mask = augment_with_undo(reference_ids, sample_ids, undo_id)
        sample_text = tokenizer.decode(list(sample_ids), skip_special_tokens=False)
    elif deviation == "random":
        if rng is None:
            raise ValueError("deviation='random' needs rng")
        ids, mask = inject_random_errors(reference_ids, undo_id, error_ids, rng, num_errors, max_error_length)
        sample_text = None
    else:
        raise ValueError(f"deviation must be one of {DEVIATIONS}, got {deviation!r}")
    return {
        "key": key,
        "prompt": prompt,
        "answer": answer,
        "reference": reference,
        "completion": undo_text(tokenizer, ids, undo_id, vocabulary.token),
        "completion_ids": [*ids, tokenizer.eos_token_id],
        "loss_mask": [*mask, True],
        "tokenizer": vocabulary.fingerprint,
        "undo_id": undo_id,
        "deviation": deviation,
        "sample": sample_text,
        "num_undos": ids.count(undo_id),
    }


__all__ = [
    "DEVIATIONS",
    "UndoVocabulary",
    "augmented_row",
    "error_token_pool",
    "undo_text",
    "undo_vocabulary",
]
