"""Backbones: the char tokenizer, a BPE trained on a corpus, the tiny Llama, save/load round trips, the HF path and
init_from errors."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from zoo.backbones import HFBackbone, TinyBackbone, add_special_tokens, build_char_tokenizer, train_bpe_tokenizer
from zoo.errors import CheckpointNotFoundError, ConfigError


def test_char_tokenizer_is_a_real_fast_tokenizer_with_the_specials():
    tok = build_char_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    for special in ["<pad>", "<bos>", "<eos>", "<think>", "</think>"]:
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, special
    text = "12+34=<think>2+4=6\n1+3=4</think>46"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) == len(text) - len("<think>") - len("</think>") + 2


def test_reasoning_tags_survive_decoding_that_skips_special_tokens(tmp_path):
    """TRL decodes completions with skip_special_tokens=True: the think tags are added tokens that are not special (as
    reasoning models' tokenizers register them), pad/BOS/EOS are dropped; the same after a save/load round trip."""
    tok = build_char_tokenizer(["<UNDO>"])
    ids = tok("<think>9+9</think>18", add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<think>") and len(ids) == 7
    row = [tok.bos_token_id, *ids, tok.eos_token_id, tok.pad_token_id]
    tok.save_pretrained(tmp_path)
    for t in (tok, AutoTokenizer.from_pretrained(tmp_path)):
        assert t.decode(row, skip_special_tokens=True) == "<think>9+9</think>18"
        assert t.decode(t.convert_tokens_to_ids(["<UNDO>", "a"]), skip_special_tokens=True) == "a"  # methods' stay
        assert t.convert_tokens_to_ids(["<think>", "</think>"]) == [3, 4]  # ids (and embeddings) unchanged


def test_a_bpe_trained_on_a_corpus_keeps_the_specials_and_shortens_its_text(tmp_path):
    """The BPE has the character tokenizer's special tokens at the same ids and the reasoning tags as single tokens,
    encodes any text (bytes, beyond the corpus's characters) back to itself, and spends fewer tokens on text like its
    corpus; a tiny backbone built with it (``tokenizer``: its saved directory) has one embedding row per token."""
    corpus = [f'<tool_call>{{"name": "move", "arguments": {{"direction": "{d}"}}}}</tool_call>' for d in "ab" * 50]
    tok = train_bpe_tokenizer(corpus, vocab_size=300)
    char = build_char_tokenizer()
    names = ["<pad>", "<bos>", "<eos>", "<unk>", "<think>", "</think>"]
    assert tok.convert_tokens_to_ids(names) == char.convert_tokens_to_ids(names)
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == (char.pad_token, char.bos_token, char.eos_token)
    for text in (corpus[0], "<think>9+9</think>18", "naïve ≠ ascii\n\ttabs"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert len(tok("<think>", add_special_tokens=False)["input_ids"]) == 1
    assert len(tok(corpus[0], add_special_tokens=False)["input_ids"]) < len(corpus[0]) / 2
    tok.save_pretrained(tmp_path)
    backbone = TinyBackbone(tokenizer=str(tmp_path), extra_tokens=["<UNDO>"])
    model = backbone.build_model()
    assert len(backbone.tokenizer) == len(tok) + 1 == model.get_input_embeddings().num_embeddings
    assert backbone.tokenizer(corpus[0])["input_ids"] == tok(corpus[0])["input_ids"]
    assert "tokenizer" in backbone.describe() and "tokenizer" not in TinyBackbone().describe()  # char keys unchanged
    with pytest.raises(ConfigError, match="backbone.tokenizer=.*no tokenizer saved there"):
        _ = TinyBackbone(tokenizer=str(tmp_path / "missing")).tokenizer


def test_methods_can_add_tokens_and_the_model_is_resized():
    tok = build_char_tokenizer()
    (undo,) = add_special_tokens(tok, ["<UNDO>"])
    assert tok("a<UNDO>b", add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids("a"),
        undo,
        tok.convert_tokens_to_ids("b"),
    ]
    backbone = TinyBackbone(extra_tokens=["<UNDO>"])
    model = backbone.build_model()
    assert model.get_input_embeddings().num_embeddings == len(backbone.tokenizer) == len(build_char_tokenizer()) + 1


def test_tiny_model_is_about_one_million_parameters_and_deterministic():
    a, b = TinyBackbone(seed=3).build_model(), TinyBackbone(seed=3).build_model()
    n = sum(p.numel() for p in a.parameters())
    assert 0.5e6 < n < 1.5e6
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    c = TinyBackbone(seed=4).build_model()
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_tiny_round_trips_through_save_pretrained(tmp_path):
    backbone = TinyBackbone()
    model = backbone.build_model()
    model.save_pretrained(tmp_path)
    backbone.tokenizer.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([tok("7+8=", add_special_tokens=False)["input_ids"]])
    assert torch.allclose(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)
    # the same directory through both backbones' init_from / name_or_path
    via_init = TinyBackbone(init_from=str(tmp_path)).build_model()
    via_hf = HFBackbone(name_or_path=str(tmp_path)).build_model()
    for other in (via_init, via_hf):
        assert torch.allclose(model(input_ids=ids).logits, other(input_ids=ids).logits)


def test_hf_backbone_options_and_offline_missing_path(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such directory"):
        HFBackbone(name_or_path=str(tmp_path / "missing")).tokenizer  # noqa: B018
    with pytest.raises(ConfigError):
        HFBackbone(name_or_path="")
    assert HFBackbone(name_or_path=str(tmp_path)).from_pretrained_options()["trust_remote_code"] is False


def test_init_from_missing_path_names_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(CheckpointNotFoundError, match=str(missing)):
        TinyBackbone(init_from=str(missing)).build_model()
    with pytest.raises(CheckpointNotFoundError, match="nowhere.ckpt"):
        TinyBackbone(init_from=str(tmp_path / "nowhere.ckpt")).build_model()
    with pytest.raises(ConfigError, match="init_from=base"):
        TinyBackbone(init_from="base").build_model()
