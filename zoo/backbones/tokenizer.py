"""The zoo's tokenizers, built in process as real ``PreTrainedTokenizerFast``: the character-level default and a
byte-level BPE trained on a corpus (:func:`train_bpe_tokenizer`).

Every printable ASCII character and the newline is one token; ``<pad> <bos> <eos>`` (and ``<unk>``, named in
:mod:`zoo.tokens`) are special tokens. The reasoning tags ``<think> </think>`` are single tokens too, added as
``AddedToken(special=False)`` -- as current reasoning models' tokenizers do (Qwen3, DeepSeek-R1) -- so that
``decode(..., skip_special_tokens=True)``, which TRL's trainers use on completions, keeps them and a reward function
reads the same text whichever trainer decoded it. Methods add their own tokens with
:func:`add_special_tokens` (the model's embeddings are resized by the backbone). The tokenizer round-trips through
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` because it is a plain ``tokenizers`` JSON underneath.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from zoo.tokens import BASE_SPECIAL_TOKENS, BOS, EOS, PAD, THINK_CLOSE, THINK_OPEN, UNK

CHARACTERS: tuple[str, ...] = (*(chr(i) for i in range(32, 127)), "\n")


def build_char_tokenizer(extra_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """Build the zoo's character-level tokenizer.

    Args:
        extra_tokens: method-specific special tokens (e.g. ``<UNDO>``, ``<latent>``), appended after the
            base vocabulary in the given order, so ids are stable for a given list.
    """
    vocab = {token: index for index, token in enumerate((*BASE_SPECIAL_TOKENS, *CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return _zoo_tokenizer(backend, extra_tokens)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, extra_tokens: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (Sennrich et al. 2016, as GPT-2 applies it to bytes) trained on ``texts``, with the
    character tokenizer's special tokens at the same ids and the same reasoning tags: any text encodes (every byte is
    in the initial alphabet), and a corpus's frequent strings become single tokens, so a long prompt takes a fraction
    of the character tokenizer's positions.

    Args:
        texts: the training corpus (e.g. a run's training rows as the model will read them).
        vocab_size: tokens in all, special tokens and the 256 bytes included.
        extra_tokens: method-specific special tokens, as for :func:`build_char_tokenizer`.
    """
    backend = Tokenizer(models.BPE(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        special_tokens=list(BASE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    return _zoo_tokenizer(backend, extra_tokens)


def _zoo_tokenizer(backend: Tokenizer, extra_tokens: Sequence[str]) -> PreTrainedTokenizerFast:
    """``backend`` as the zoo's ``PreTrainedTokenizerFast``: its special tokens, right padding, the reasoning tags."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="right",
        model_max_length=100_000,
    )
    # matched as one token each (before the pre-tokenizer's split), decoded by every decode call (not special)
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in (THINK_OPEN, THINK_CLOSE)])
    add_special_tokens(tokenizer, extra_tokens)
    return tokenizer


def add_special_tokens(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[str]) -> list[int]:
    """Add method-specific special tokens (idempotent) and return their ids.

    The caller must resize the model embeddings (``model.resize_token_embeddings(len(tokenizer))``); the
    backbones do it for the tokens they are configured with.
    """
    new = [t for t in tokens if t not in tokenizer.get_vocab()]
    if new:
        tokenizer.add_tokens(new, special_tokens=True)
    return tokenizer.convert_tokens_to_ids(list(tokens))
