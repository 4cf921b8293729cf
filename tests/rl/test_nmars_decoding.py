"""N-MARS undo-aware decoding (module/decoder=undo): keep-in-context and KV-crop modes against an uncached reference,
the cap, the empty-prefix ban, the cache cropping, and bad inputs.

The reference re-forwards the whole context at every step (no KV cache, no masking tricks): in ``keep`` mode the
prompt + every sampled token, in ``crop`` mode the prompt + the resolved tokens. It shares only the sampling
primitive ``sample_next`` with the decoder, so seeded runs must agree token for token.
"""

from __future__ import annotations

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompt, encode_prompts
from zoo.errors import ConfigError
from zoo.generation import ModuleHook, decode_completion, sample_next
from zoo.generation.sampling import IncrementalDecoder
from zoo.generation.undo import UNDO_TOKEN, UndoDecoder, resolve_undo
from zoo.modules import GRPOModule
from zoo.protocols import SamplingParams
from zoo.rl import ExactMatchReward
from zoo.vocab import extend_vocabulary, register_new_tokens

torch.set_num_threads(1)
PROMPTS = ["1+1=", "22+3=", "rev ab=", "9+9="]
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
SAMPLED = SamplingParams(20, do_sample=True, temperature=1.0)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def undo_model():
    """A tiny Llama with <UNDO> added through the vocabulary extension (output rows on)."""
    backbone = TinyBackbone(**SMALL, num_key_value_heads=2, seed=3)
    model = backbone.build_model().eval()
    tok = backbone.tokenizer
    extension = extend_vocabulary(model, 1, output_rows=True)
    (undo_id,) = register_new_tokens(tok, [UNDO_TOKEN], first_id=extension.first_new_id)
    return model, tok, undo_id


def boost(undo_id: int, amount: float):
    """A logits processor making <UNDO> likely (the same one is applied in the reference)."""

    def processor(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        scores[:, undo_id] += amount
        return scores

    return processor


@torch.no_grad()
def reference_undo_decode(model, tok, prompts, params, generator, undo_id, mode, max_undos, processor):
    """Uncached undo decoding (see the module docstring): ``(physical rows, resolved rows)``."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompt_rows = [encode_prompt(tok, p) for p in prompts]
    batch = len(prompts)
    physical: list[list[int]] = [[] for _ in range(batch)]
    stacks: list[list[int]] = [[] for _ in range(batch)]
    undos, done = [0] * batch, [False] * batch
    for _ in range(params.max_new_tokens):
        contexts = [prompt_rows[i] + (physical[i] if mode == "keep" else stacks[i]) for i in range(batch)]
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].float()
        for i in range(batch):
            if not done[i] and (not stacks[i] or undos[i] >= max_undos):
                logits[i, undo_id] = float("-inf")
        tokens, _ = sample_next(processor(None, logits), params, generator)
        for i in range(batch):
            if done[i]:
                continue
            token = int(tokens[i])
            physical[i].append(token)
            if token == eos:
                done[i] = True
            elif token == undo_id:
                stacks[i].pop()
                undos[i] += 1
            else:
                stacks[i].append(token)
        if all(done):
            break
    return physical, stacks


def rows(result) -> list[list[int]]:
    return [ids[: int(n)] for ids, n in zip(result.completion_ids.tolist(), result.completion_mask.sum(-1).tolist())]


@pytest.mark.parametrize("mode", ["keep", "crop"])
def test_decoding_equals_the_uncached_reference_of_its_mode(undo_model, mode):
    model, tok, undo_id = undo_model
    processor = boost(undo_id, 3.0)
    decoder = UndoDecoder(mode=mode, max_undos=6, processors=[processor])
    ids, mask = encode_prompts(tok, PROMPTS)
    result = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(11))
    physical, resolved = reference_undo_decode(model, tok, PROMPTS, SAMPLED, _gen(11), undo_id, mode, 6, processor)
    assert sum(row.count(undo_id) for row in physical) >= 4, "the test needs generations that use <UNDO>"
    assert rows(result) == physical
    assert result.resolved_ids == resolved
    assert result.num_undos == [row.count(undo_id) for row in physical]
    # output = the resolved sequence; completion_ids = the physical one
    eos = tok.eos_token_id
    for text, row in zip(result.texts, physical):
        content = row[: row.index(eos)] if eos in row else row
        assert text == decode_completion(tok, resolve_undo(content, undo_id))
    assert all(UNDO_TOKEN not in t for t in result.texts)
    assert any(UNDO_TOKEN in t for t in result.physical_texts)


def test_keep_and_crop_differ_once_an_undo_happened(undo_model):
    """The modes are different semantics: with the same seed, contexts differ after the first <UNDO>."""
    model, tok, undo_id = undo_model
    ids, mask = encode_prompts(tok, PROMPTS)
    processor = boost(undo_id, 3.0)
    keep = UndoDecoder(mode="keep", processors=[processor])(model, tok, ids, mask, params=SAMPLED, generator=_gen(11))
    crop = UndoDecoder(mode="crop", processors=[processor])(model, tok, ids, mask, params=SAMPLED, generator=_gen(11))
    assert rows(keep) != rows(crop)


def test_cap_and_empty_prefix_ban(undo_model):
    """With <UNDO> overwhelmingly likely: never at an empty prefix, never more than the cap."""
    model, tok, undo_id = undo_model
    ids, mask = encode_prompts(tok, PROMPTS)
    for mode in ("keep", "crop"):
        decoder = UndoDecoder(mode=mode, max_undos=3, processors=[boost(undo_id, 1e4)])
        result = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(2))
        for row, count, capped in zip(rows(result), result.num_undos, result.capped):
            assert row[0] != undo_id
            assert count == row.count(undo_id) == 3 and capped
            stack = 0
            for token in row:  # an UNDO only ever retracts a token
                if token == undo_id:
                    assert stack > 0
                    stack -= 1
                else:
                    stack += 1


def test_crop_mode_removes_retracted_positions_from_the_cache(undo_model):
    """One row: every <UNDO> shrinks the cache (Cache.crop) instead of growing it, unlike keep mode."""
    model, tok, undo_id = undo_model
    ids, mask = encode_prompts(tok, ["22+3="])
    widths: dict[str, list[int]] = {"keep": [], "crop": []}
    for mode in widths:
        record = ModuleHook(
            "",
            lambda m, args, kwargs, mode=mode: widths[mode].append(kwargs["attention_mask"].shape[1]),
            pre=True,
            with_kwargs=True,
        )
        decoder = UndoDecoder(mode=mode, max_undos=8, processors=[boost(undo_id, 3.0)], hooks=[record])
        result = decoder(model, tok, ids, mask, params=SamplingParams(24, do_sample=True), generator=_gen(5))
        physical = rows(result)[0]
        assert physical.count(undo_id) >= 2
        depth, deepest = 0, 0
        for token in physical:
            depth += -1 if token == undo_id else 1
            deepest = max(deepest, depth)
        prompt = ids.shape[1]
        if mode == "keep":
            assert max(widths[mode]) >= prompt + len(physical) - 1  # every sampled token stayed in context
        else:
            assert max(widths[mode]) <= prompt + deepest  # only effective tokens occupy the cache
    assert max(widths["crop"]) < max(widths["keep"])


def test_drop_masked_tail_crops_the_cache_and_keeps_the_outputs(undo_model):
    model, tok, _ = undo_model
    ids, mask = encode_prompts(tok, ["12+34=", "5+6="])
    state = IncrementalDecoder(model, ids, mask)
    state.feed(torch.tensor([[7, 8, 9], [7, 8, 9]]))
    width = state.attention_mask.shape[1]
    state.attention_mask[:, -2:] = 0  # retract the last two tokens of both rows
    assert state.drop_masked_tail() == 2
    assert state.cache.get_seq_length() == width - 2 == state.attention_mask.shape[1]
    logits = state.feed(torch.tensor([[10], [10]]))
    fresh = IncrementalDecoder(model, ids, mask)
    expected = fresh.feed(torch.tensor([[7, 10], [7, 10]]))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    state.attention_mask[0, -1] = 0  # masked in one row only: nothing to drop
    assert state.drop_masked_tail() == 0


def test_bad_inputs_are_clear_errors(undo_model):
    model, tok, _ = undo_model
    with pytest.raises(ConfigError, match="cap of at least 1"):
        UndoDecoder(max_undos=0)
    with pytest.raises(ConfigError, match="mode must be one of"):
        UndoDecoder(mode="rewind")
    plain = TinyBackbone(**SMALL, num_key_value_heads=2)
    ids, mask = encode_prompts(plain.tokenizer, ["1+1="])
    with pytest.raises(ConfigError, match="has no '<UNDO>' token"):
        UndoDecoder()(plain.build_model(), plain.tokenizer, ids, mask, params=SAMPLED)
    # <UNDO> in the tokenizer, but no output row: the model cannot emit it
    backbone = TinyBackbone(**SMALL, num_key_value_heads=2)
    readonly = backbone.build_model()
    extension = extend_vocabulary(readonly, 1, output_rows=False)
    register_new_tokens(backbone.tokenizer, [UNDO_TOKEN], first_id=extension.first_new_id)
    with pytest.raises(ConfigError, match="cannot emit the token"):
        UndoDecoder()(readonly, backbone.tokenizer, ids, mask, params=SAMPLED)


def test_grpo_refuses_crop_mode_rollouts():
    with pytest.raises(ConfigError, match="mode=keep"):
        GRPOModule(TinyBackbone(**SMALL), rewards={"a": ExactMatchReward()}, decoder=UndoDecoder(mode="crop"))
    GRPOModule(TinyBackbone(**SMALL), rewards={"a": ExactMatchReward()}, decoder=UndoDecoder(mode="keep"))
