"""Character-level tokenizer built in process as a real ``PreTrainedTokenizerFast``.

Every printable ASCII character and the newline is one token; ``<pad> <bos> <eos>`` (and ``<unk>``, named in
:mod:`zoo.tokens`) are special tokens. The reasoning tags ``<think> </think>`` are single tokens too, added as
``AddedToken(special=False)`` -- as current reasoning models' tokenizers do (Qwen3, DeepSeek-R1) -- so that
``decode(..., skip_special_tokens=True)``, which TRL's trainers use on completions, keeps them and a reward function
reads the same text whichever trainer decoded it. Methods add their own tokens with
:func:`add_special_tokens` (the model's embeddings are resized by the backbone). The tokenizer round-trips through
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` because it is a plain ``tokenizers`` JSON underneath.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
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
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="right",
        model_max_length=100_000,
    )
    # matched as one token each (before the character split), decoded by every decode call (not special)
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
