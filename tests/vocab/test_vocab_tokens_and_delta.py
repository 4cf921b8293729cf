"""Tokenizer additions (char tokenizer and a BPE fast tokenizer: contiguous ids) and the delta file (small
safetensors; loading it onto a fresh base reproduces the extended model exactly; another base is refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vocab_helpers import SMALL_LLAMA, load_tiny_gpt2, save_tiny_gpt2, tiny_llama, train_steps

from zoo.backbones import TinyBackbone, build_char_tokenizer
from zoo.errors import CheckpointNotFoundError, ConfigError
from zoo.vocab import (
    DELTA_FILE,
    ExtendedEmbedding,
    apply_delta,
    dictionary_token_ids,
    extend_vocabulary,
    read_delta,
    register_new_tokens,
    save_delta,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory):
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


NEW = ["<zork>", "<blip>", "<quux>"]


def test_char_tokenizer_new_ids_are_contiguous_after_the_model_rows():
    backbone, model = tiny_llama(True)
    tokenizer = backbone.tokenizer
    ext = extend_vocabulary(model, len(NEW))
    ids = register_new_tokens(tokenizer, NEW, first_id=ext.first_new_id)
    assert ids == ext.new_token_ids == list(range(len(tokenizer) - 3, len(tokenizer)))
    encoded = tokenizer("a<blip>b<zork>", add_special_tokens=False)["input_ids"]
    assert encoded[1] == ids[1] and encoded[3] == ids[0] and len(encoded) == 4
    assert tokenizer.decode(encoded) == "a<blip>b<zork>"
    with torch.no_grad():
        assert model(torch.tensor([encoded])).logits.shape == (1, 4, ext.first_new_id)


def test_bpe_fast_tokenizer_new_ids_are_contiguous(tiny_gpt2_dir):
    tokenizer, model = load_tiny_gpt2(tiny_gpt2_dir)
    ext = extend_vocabulary(model, len(NEW))
    ids = register_new_tokens(tokenizer, NEW, first_id=ext.first_new_id)
    assert ids == ext.new_token_ids
    encoded = tokenizer("the cat <quux> sat", add_special_tokens=False)["input_ids"]
    assert ids[2] in encoded and all(i < ids[0] for i in encoded if i != ids[2])
    assert "<quux>" in tokenizer.decode(encoded)


def test_padded_model_vocabulary_needs_reserved_ids():
    tokenizer = build_char_tokenizer()
    size = len(tokenizer)
    with pytest.raises(ConfigError, match="padded vocabulary"):
        register_new_tokens(tokenizer, NEW, first_id=size + 5)
    assert len(tokenizer) == size  # nothing added
    ids = register_new_tokens(tokenizer, NEW, first_id=size + 5, pad_to_first_id=True)
    assert ids == [size + 5, size + 6, size + 7]
    with pytest.raises(ConfigError, match="102 tokens but the model 101 embedding rows"):
        register_new_tokens(build_char_tokenizer(), ["<x>"], first_id=size - 1)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [(["a"], "already in the vocabulary"), (["<x>", "<x>"], "more than once"), ([""], "non-empty"), ([], "no new")],
)
def test_bad_new_tokens_are_refused(tokens, message):
    with pytest.raises(ConfigError, match=message):
        register_new_tokens(build_char_tokenizer(), tokens)


def test_dictionaries_by_token_string():
    tokenizer = build_char_tokenizer()
    vocab = tokenizer.get_vocab()
    assert dictionary_token_ids(tokenizer, [["a", "b"], ["<think>"]]) == [[vocab["a"], vocab["b"]], [vocab["<think>"]]]
    with pytest.raises(ConfigError, match=r"dictionaries\[1\]\[0\] = 'cat' is not a token"):
        dictionary_token_ids(tokenizer, [["a"], ["cat"]])
    with pytest.raises(ConfigError, match="not a string"):
        dictionary_token_ids(tokenizer, ["ab"])
    register_new_tokens(tokenizer, ["<zork>"])
    with pytest.raises(ConfigError, match="is a new token"):
        dictionary_token_ids(tokenizer, [["<zork>"]], num_old_tokens=len(tokenizer) - 1)


@pytest.mark.parametrize(
    ("tie", "mode", "output_rows"),
    [(True, "free", False), (False, "dictionary", True), (False, "free", True), (True, "dictionary", True)],
)
def test_delta_round_trips_onto_a_fresh_base(tmp_path, tie, mode, output_rows):
    backbone, model = tiny_llama(tie)
    tokenizer = backbone.tokenizer
    ext = extend_vocabulary(model, 3, [[5, 6], [7, 8, 9], [10]], mode=mode, output_rows=output_rows)
    register_new_tokens(tokenizer, NEW, first_id=ext.first_new_id)
    ext.freeze_base()
    batch = torch.tensor([tokenizer("ab<zork>cd<blip>e<quux>f", add_special_tokens=False)["input_ids"]] * 2)
    train_steps(model, ext.parameters(), batch, steps=4)
    with torch.no_grad():
        expected = model(batch).logits
    path = save_delta(ext, tmp_path, new_tokens=NEW)
    assert path == tmp_path / DELTA_FILE
    base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert path.stat().st_size < base_bytes / 20  # the delta alone, not a model

    fresh_backbone = TinyBackbone(**SMALL_LLAMA, tie_word_embeddings=tie)
    fresh, fresh_tokenizer = fresh_backbone.build_model().eval(), fresh_backbone.tokenizer
    loaded = apply_delta(fresh, path, tokenizer=fresh_tokenizer)
    assert loaded.new_token_ids == ext.new_token_ids and loaded.mode == mode
    assert fresh_tokenizer.get_vocab() == tokenizer.get_vocab()
    with torch.no_grad():
        assert torch.equal(fresh(batch).logits, expected)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), ext.state_dict().values()))


def test_delta_round_trips_on_a_saved_hf_model(tiny_gpt2_dir, tmp_path):
    tokenizer, model = load_tiny_gpt2(tiny_gpt2_dir)
    ext = extend_vocabulary(model, 2, [[5, 6], [7]], output_rows=True)
    register_new_tokens(tokenizer, NEW[:2], first_id=ext.first_new_id)
    batch = torch.tensor([tokenizer("the <zork> cat <blip>")["input_ids"]])
    train_steps(model, ext.parameters(), batch, steps=3)
    with torch.no_grad():
        expected = model(batch).logits
    path = save_delta(ext, tmp_path / "zork.safetensors", new_tokens=NEW[:2])
    fresh_tokenizer, fresh = load_tiny_gpt2(tiny_gpt2_dir)
    apply_delta(fresh, path, tokenizer=fresh_tokenizer)
    with torch.no_grad():
        assert torch.equal(fresh(batch).logits, expected)
    assert fresh_tokenizer("the <zork> cat <blip>")["input_ids"] == batch[0].tolist()


def _saved_delta(model: torch.nn.Module, directory: Path) -> Path:
    ext = extend_vocabulary(model, 2, [[5], [6]])
    path = save_delta(ext, directory, new_tokens=NEW[:2])
    ext.remove()
    return path


def test_delta_for_another_vocabulary_size_is_refused(tmp_path):
    _, model = tiny_llama(True)
    path = _saved_delta(model, tmp_path)
    other = TinyBackbone(**SMALL_LLAMA, extra_tokens=["<extra>"]).build_model()
    with pytest.raises(ConfigError, match=r"base model with \d+ tokens, this model has \d+"):
        apply_delta(other, path)
    assert not isinstance(other.get_input_embeddings(), ExtendedEmbedding)


def test_delta_for_another_hidden_size_is_refused(tmp_path):
    _, model = tiny_llama(True)
    path = _saved_delta(model, tmp_path)
    other = TinyBackbone(**{**SMALL_LLAMA, "hidden_size": 16}).build_model()
    with pytest.raises(ConfigError, match="made for hidden size 32, this model has 16"):
        apply_delta(other, path)


def test_delta_for_another_base_of_the_same_shape_is_refused(tmp_path):
    _, model = tiny_llama(True)
    path = _saved_delta(model, tmp_path)
    other = TinyBackbone(**SMALL_LLAMA, seed=1).build_model()
    with pytest.raises(ConfigError, match="another base model"):
        apply_delta(other, path)
    apply_delta(other, path, check_fingerprint=False)  # the escape hatch


def test_delta_file_errors(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no vocabulary delta"):
        read_delta(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ConfigError, match="not a vocabulary delta"):
        read_delta(tmp_path / "other.safetensors")


def test_delta_without_token_strings_cannot_extend_a_tokenizer(tmp_path):
    backbone, model = tiny_llama(True)
    ext = extend_vocabulary(model, 1)
    path = save_delta(ext, tmp_path)
    ext.remove()
    with pytest.raises(ConfigError, match="no token strings"):
        apply_delta(model, path, tokenizer=backbone.tokenizer)
    assert not isinstance(model.get_input_embeddings(), ExtendedEmbedding)
