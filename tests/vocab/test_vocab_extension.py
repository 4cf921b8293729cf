"""zoo.vocab.extend_vocabulary: zero forgetting on old-only contexts, separate parameters, both parametrisations,
output rows, remove(), tied GPT-2 and the VLM's language model, and one clear error per bad input."""

from __future__ import annotations

import pytest
import torch
from vocab_helpers import load_tiny_gpt2, save_tiny_gpt2, tiny_llama, train_steps

from zoo.backbones import TinyVLMBackbone
from zoo.errors import ConfigError
from zoo.vocab import (
    DictionaryRows,
    ExtendedEmbedding,
    NewTokenLogitsMask,
    extend_vocabulary,
    forgetting_metrics,
    mask_new_token_logits,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory):
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


def old_contexts(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (3, 12), generator=torch.Generator().manual_seed(seed))


def new_token_batch(vocab: int, new_ids: list[int], seed: int = 1) -> torch.Tensor:
    """Old tokens with every new token placed in the middle of some row."""
    ids = torch.randint(3, vocab, (2 * len(new_ids), 10), generator=torch.Generator().manual_seed(seed))
    for row, token in enumerate(new_ids * 2):
        ids[row, 3 + row % 5] = token
    return ids


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("mode", ["free", "dictionary"])
@pytest.mark.parametrize("output_rows", [False, True], ids=["in", "in+out"])
def test_old_contexts_bit_identical_after_adamw_with_weight_decay(tie, mode, output_rows):
    _, model = tiny_llama(tie)
    vocab = model.get_input_embeddings().num_embeddings
    contexts = old_contexts(vocab)
    with torch.no_grad():
        before = model(contexts).logits
    old_state = {k: v.clone() for k, v in model.state_dict().items()}

    ext = extend_vocabulary(model, 3, [[5, 6, 7], [8, 9], [10]], mode=mode, output_rows=output_rows)
    ext.freeze_base()
    start = [p.detach().clone() for p in ext.parameters()]
    train_steps(model, ext.parameters(), new_token_batch(vocab, ext.new_token_ids), steps=6, weight_decay=0.5)

    # the new rows did move (otherwise the test would prove nothing)
    assert any(not torch.equal(a, p) for a, p in zip(start, ext.parameters()))
    with torch.no_grad():
        after = model(contexts).logits
    assert after.shape[-1] == vocab + (3 if output_rows else 0)
    assert torch.equal(after[..., :vocab], before)
    for name, value in old_state.items():  # every old parameter, byte for byte
        now = model.state_dict()[name]
        assert now.numpy().tobytes() == value.numpy().tobytes(), name


def test_frozen_parameters_get_no_gradient_and_new_rows_do():
    _, model = tiny_llama(False)
    vocab = model.get_input_embeddings().num_embeddings
    ext = extend_vocabulary(model, 2, [[5], [6, 7]], output_rows=True)
    ext.freeze_base()
    logits = model(new_token_batch(vocab, ext.new_token_ids)).logits
    logits.logsumexp(-1).sum().backward()
    trainable = {id(p) for p in ext.parameters()}
    assert [n for n, p in model.named_parameters() if id(p) not in trainable and p.grad is not None] == []
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ext.parameters())
    assert {n for n, _ in ext.named_parameters()} == {"input.rows", "output.rows"}


def test_parameters_are_only_the_new_rows_and_not_the_embedding():
    _, model = tiny_llama(True)
    embedding = model.get_input_embeddings()
    ext = extend_vocabulary(model, 4)
    assert isinstance(model.get_input_embeddings(), ExtendedEmbedding)
    assert model.get_input_embeddings().weight is embedding.weight  # same Parameter: keys and tying unchanged
    assert [p.shape for p in ext.parameters()] == [torch.Size([4, embedding.embedding_dim])]
    assert all(p is not embedding.weight for p in ext.parameters())
    assert "model.embed_tokens.weight" in model.state_dict()


def test_free_init_is_the_mean_of_the_dictionary_rows():
    _, model = tiny_llama(True)
    table = model.get_input_embeddings().weight.detach().clone()
    ext = extend_vocabulary(model, 3, [[5, 9], [], [11]])
    rows = ext.input_embeddings()
    torch.testing.assert_close(rows[0], (table[5] + table[9]) / 2)
    torch.testing.assert_close(rows[1], table.mean(0))  # empty dictionary in free mode: mean of all old rows
    assert torch.equal(rows[2], table[11])


@pytest.mark.parametrize("output_rows", [False, True])
def test_dictionary_mode_with_one_token_reproduces_that_token(output_rows):
    _, model = tiny_llama(False)
    vocab = model.get_input_embeddings().num_embeddings
    ext = extend_vocabulary(model, 2, [[17], [40]], mode="dictionary", output_rows=output_rows)
    with torch.no_grad():  # any mixing logit: the softmax of a single logit is exactly 1
        ext.input_rows.mixing_logits.copy_(torch.tensor([[3.7], [-1.2]]))
    original = torch.tensor([[4, 17, 8, 40, 9, 17]])
    replaced = torch.tensor([[4, ext.new_token_ids[0], 8, ext.new_token_ids[1], 9, ext.new_token_ids[0]]])
    with torch.no_grad():
        a, b = model(original).logits, model(replaced).logits
    assert torch.equal(a, b)
    if output_rows:  # the new output row is the dictionary token's output row
        torch.testing.assert_close(a[..., vocab], a[..., 17])
        torch.testing.assert_close(a[..., vocab + 1], a[..., 40])


def test_dictionary_mode_mixes_rows_with_softmax_weights():
    _, model = tiny_llama(True)
    table = model.get_input_embeddings().weight.detach().clone()
    ext = extend_vocabulary(model, 2, [[3, 4, 5], [6]], mode="dictionary")
    with torch.no_grad():
        ext.input_rows.mixing_logits.copy_(torch.tensor([[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]]))
    w = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    torch.testing.assert_close(ext.input_embeddings()[0], w[0] * table[3] + w[1] * table[4] + w[2] * table[5])
    assert torch.equal(ext.input_embeddings()[1], table[6])  # padded entries get weight 0
    assert isinstance(ext.input_rows, DictionaryRows)
    assert torch.equal(ext.input_rows.weights().sum(-1), torch.ones(2))


def test_remove_restores_the_original_model_exactly():
    _, model = tiny_llama(True)
    vocab = model.get_input_embeddings().num_embeddings
    original_embedding, original_head = model.get_input_embeddings(), model.get_output_embeddings()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    contexts = old_contexts(vocab)
    with torch.no_grad():
        before = model(contexts).logits
    ext = extend_vocabulary(model, 2, [[5], [6]], mode="free", output_rows=True)
    ext.freeze_base()
    train_steps(model, ext.parameters(), new_token_batch(vocab, ext.new_token_ids))
    assert model.config.vocab_size == vocab + 2
    ext.remove()
    assert model.get_input_embeddings() is original_embedding and model.get_output_embeddings() is original_head
    assert model.config.vocab_size == vocab
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    with torch.no_grad():
        assert torch.equal(model(contexts).logits, before)
    with pytest.raises(IndexError):
        model(torch.tensor([[1, ext.new_token_ids[0]]]))
    ext.attach()  # and back: the trained rows are kept
    with torch.no_grad():
        assert model(torch.tensor([[1, ext.new_token_ids[0]]])).logits.shape[-1] == vocab + 2


def test_tied_gpt2_keeps_old_logits_exact_without_output_rows(tiny_gpt2_dir):
    tokenizer, model = load_tiny_gpt2(tiny_gpt2_dir)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    vocab = model.get_input_embeddings().num_embeddings
    ids = [torch.tensor([tokenizer(text)["input_ids"]]) for text in ("the cat sat on the mat", "models read tokens")]
    with torch.no_grad():
        before = [model(x).logits for x in ids]
    ext = extend_vocabulary(model, 2, [[5, 6], [7]])
    ext.freeze_base()
    train_steps(model, ext.parameters(), new_token_batch(vocab, ext.new_token_ids), steps=6, weight_decay=0.5)
    with torch.no_grad():
        after = [model(x).logits for x in ids]
    assert all(a.shape[-1] == vocab and torch.equal(a, b) for a, b in zip(after, before))


def test_tied_gpt2_output_rows_are_the_input_rows(tiny_gpt2_dir):
    _, model = load_tiny_gpt2(tiny_gpt2_dir)
    vocab = model.get_input_embeddings().num_embeddings
    ext = extend_vocabulary(model, 2, [[5, 6], [7]], output_rows=True)
    assert ext.tied_output_rows
    assert [n for n, _ in ext.named_parameters()] == ["input.rows"]
    hidden = torch.randn(1, 3, model.config.n_embd)
    logits = model.get_output_embeddings()(hidden)
    torch.testing.assert_close(logits[..., vocab:], hidden @ ext.input_embeddings().T)
    ext.remove()
    untied = extend_vocabulary(model, 2, [[5, 6], [7]], output_rows=True, tie_output_rows=False)
    assert [n for n, _ in untied.named_parameters()] == ["input.rows", "output.rows"]


def test_tying_new_rows_of_an_untied_model_is_refused():
    _, model = tiny_llama(False)
    with pytest.raises(ConfigError, match="not tied"):
        extend_vocabulary(model, 1, output_rows=True, tie_output_rows=True)


def test_the_vlm_language_model_is_extended(tmp_path):
    backbone = TinyVLMBackbone(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vision_hidden_size=16)
    model = backbone.build_model().eval()
    tok = backbone.tokenizer
    vocab = model.get_input_embeddings().num_embeddings
    image = [tok.bos_token_id, *([backbone.image_token_id] * backbone.num_image_tokens)]
    pixels = torch.randn(1, 3, 32, 32)
    old = torch.tensor([[*image, *tok("abcab")["input_ids"]]])
    with torch.no_grad():
        before = model(input_ids=old, pixel_values=pixels).logits
    ext = extend_vocabulary(model, 2, [[tok.convert_tokens_to_ids("a")], [tok.convert_tokens_to_ids("b")]])
    ext.freeze_base()
    new = torch.tensor([[*image, *tok("ab")["input_ids"], ext.new_token_ids[0], ext.new_token_ids[1]]])
    train_steps(model, ext.parameters(), new, steps=4, pixel_values=pixels)
    with torch.no_grad():
        assert torch.equal(model(input_ids=old, pixel_values=pixels).logits, before)
        assert model(input_ids=new, pixel_values=pixels).logits.shape[-1] == vocab
    ext.remove()
    assert not isinstance(model.get_input_embeddings(), ExtendedEmbedding)


def test_output_rows_shift_old_context_mass_unless_masked():
    _, model = tiny_llama(False)
    vocab = model.get_input_embeddings().num_embeddings
    contexts = old_contexts(vocab)
    with torch.no_grad():
        reference = model(contexts).logits
    ext = extend_vocabulary(model, 2, [[5], [6]], output_rows=True)
    with torch.no_grad():
        logits = model(contexts).logits
    unmasked = forgetting_metrics(reference, logits)
    masked = forgetting_metrics(reference, ext.mask_logits(logits, contexts))
    assert unmasked["max_abs_logit_diff"] == 0  # the old logits themselves never move
    assert unmasked["kl_mean"] > 0 and unmasked["new_token_mass"] > 0  # ... but the softmax spreads over new tokens
    assert masked["kl_max"] == 0 and masked["new_token_mass"] == 0


def test_mask_opens_once_a_new_token_is_in_the_context():
    logits = torch.zeros(1, 4, 6)
    ids = torch.tensor([[1, 2, 4, 1]])  # first new id 4 at position 2
    masked = mask_new_token_logits(logits, ids, first_new_id=4)
    assert torch.isinf(masked[0, :2, 4:]).all() and torch.equal(masked[0, 2:, 4:], torch.zeros(2, 2))
    assert torch.equal(masked[..., :4], logits[..., :4])
    processor = NewTokenLogitsMask(4)
    scores = processor(torch.tensor([[1, 2], [1, 5]]), torch.zeros(2, 6))
    assert torch.isinf(scores[0, 4:]).all() and torch.equal(scores[1], torch.zeros(6))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_new_tokens": 2, "dictionaries": [[5], [10_000]]}, r"dictionaries\[1\]\[0\] = 10000 is not a token"),
        ({"num_new_tokens": 1, "dictionaries": [[-1]]}, r"dictionaries\[0\]\[0\] = -1 is not a token"),
        ({"num_new_tokens": 2, "dictionaries": [[5], []], "mode": "dictionary"}, r"dictionaries\[1\] is empty"),
        ({"num_new_tokens": 2, "mode": "dictionary"}, "needs dictionaries"),
        ({"num_new_tokens": 2, "dictionaries": [[5]]}, "1 dictionaries for 2 new tokens"),
        ({"num_new_tokens": 1, "dictionaries": [[5, 5]]}, "twice"),
        ({"num_new_tokens": 0}, "positive integer"),
        ({"num_new_tokens": 1, "mode": "sparse"}, "mode must be one of"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, message):
    _, model = tiny_llama(True)
    with pytest.raises(ConfigError, match=message):
        extend_vocabulary(model, **kwargs)
    assert not isinstance(model.get_input_embeddings(), ExtendedEmbedding)  # nothing half-done


def test_extending_twice_is_refused():
    _, model = tiny_llama(True)
    extend_vocabulary(model, 1)
    with pytest.raises(ConfigError, match="already extended"):
        extend_vocabulary(model, 1)


class ScaledEmbedding(torch.nn.Embedding):
    """Like Gemma's embedding: the module scales its output by ``embed_scale``."""

    def __init__(self, num: int, dim: int) -> None:
        super().__init__(num, dim)
        self.register_buffer("embed_scale", torch.tensor(3.0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.embed_scale


class ToyLM(torch.nn.Module):
    """The smallest model with the Hugging Face embedding accessors: scaled embedding, untied head with a bias."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = ScaledEmbedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=True)

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def get_output_embeddings(self):
        return self.head

    def set_output_embeddings(self, value):
        self.head = value

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


def test_scaled_embeddings_and_head_biases_follow_the_original_modules():
    model = ToyLM()
    ext = extend_vocabulary(model, 2, [[3], [4, 5]], mode="dictionary", output_rows=True)
    assert [n for n, _ in ext.named_parameters()] == ["input.mixing_logits", "output.mixing_logits"]
    with torch.no_grad():
        out = model(torch.tensor([3, 10, 4]))
    # the new token with dictionary [3] reads token 3's scaled embedding: same logits, and its own logit (row + bias)
    # equals token 3's
    assert torch.equal(out[0], out[1])
    torch.testing.assert_close(out[:, 10], out[:, 3])
    bias = model.head.bias.detach()
    free = ToyLM()
    ext_free = extend_vocabulary(free, 1, [[4, 5]], output_rows=True)
    assert {n for n, _ in ext_free.named_parameters()} == {"input.rows", "output.rows", "output_bias.rows"}
    torch.testing.assert_close(ext_free.output_bias.rows, ((bias[4] + bias[5]) / 2).reshape(1))
