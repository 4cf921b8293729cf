"""DTS's shared KV cache (zoo.generation.tree_cache.TreeKVCache, ``DTSDecoder(share_cache=True)``): rows read the
stored tokens they share (the prompt, every branch point's prefix) instead of holding copies.

Pinned here: a tree cache gives every row the logits it gets alone (branches, drops, crops, compaction; Llama with and
without grouped-query attention, GPT-2); DTS decodes the same tokens with it as with the stacked cache and as the
decoder before sharing; the stored cache holds each token once (the prompt plus one token per hypothesis and step),
and DTS's peak cache at N = 48 on a 512-token prompt is at most half of self-consistency's (bytes, not time); caches
it cannot share (sliding windows) are kept as they are.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

from zoo.answers import EXACT_ANSWER
from zoo.backbones import TinyBackbone
from zoo.encoding import encode_prompts
from zoo.generation import DTSDecoder, ModuleHook, SelfConsistencyDecoder
from zoo.generation.sampling import IncrementalDecoder, cache_kwarg_name
from zoo.generation.tree_cache import TreeKVCache, kv_cache_bytes
from zoo.protocols import SamplingParams

torch.set_num_threads(1)
PROMPTS = ["1+1=", "22+3=", "rev ab=", "9+9=", "5+50="]
ALWAYS = {"entropy_threshold": math.inf, "varentropy_threshold": -1.0}  # every row with >= 2 options branches
REPO = Path(__file__).resolve().parents[2]
# the last commit whose DTS decoder copied the prefix into every hypothesis (stacked cache only)
BEFORE_SHARING = "cb58244"


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _likely_eos(backbone: TinyBackbone):
    """A random tiny Llama whose EOS is likely enough that traces end at different steps."""
    model, tok = backbone.build_model().eval(), backbone.tokenizer
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[tok.eos_token_id] = head[tok.convert_tokens_to_ids("=")] * 0.9
    return model, tok


@pytest.fixture(scope="module")
def tiny():
    model, tok = _likely_eos(TinyBackbone(seed=1))
    return (model, tok, *encode_prompts(tok, PROMPTS))


def _gpt2(tok) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2, **ids))


@pytest.fixture(params=["llama", "llama_gqa", "gpt2"])
def any_model(request, tiny):
    model, tok, ids, mask = tiny
    if request.param == "llama_gqa":
        model = TinyBackbone(seed=2, num_key_value_heads=2).build_model()
    elif request.param == "gpt2":
        model = _gpt2(tok)
    return model.eval(), tok, ids, mask


def _alone(model, prompt_ids, prompt_mask, tokens):
    """Next-token logits of one branch run alone: uncached, unpadded, batch of one."""
    seq = torch.cat([prompt_ids[prompt_mask.bool()], torch.tensor(tokens, dtype=torch.long)])[None]
    return model(input_ids=seq).logits[0, -1].float()


class CacheRecorder:
    """A forward hook (decoder hook seam) recording the type and the largest size of the cache each forward leaves
    (:func:`kv_cache_bytes`: stored bytes; plus, for a tree cache, its largest one-layer view)."""

    def __init__(self, model) -> None:
        self.kwarg, self.types, self.peak, self.peak_with_view = cache_kwarg_name(model), set(), 0, 0

    def __call__(self, module, args, kwargs, output):
        cache = output[self.kwarg]
        self.types.add(type(cache).__name__)
        stored = kv_cache_bytes(cache)
        self.peak = max(self.peak, stored)
        self.peak_with_view = max(self.peak_with_view, stored + getattr(cache, "view_bytes", 0))

    def hook(self) -> ModuleHook:
        return ModuleHook("", self, with_kwargs=True)


# -- the cache on its own --------------------------------------------------------------------------------------------
@torch.no_grad()
def test_tree_cache_rows_give_each_branch_its_own_logits_without_copying(any_model):
    model, tok, ids, mask = any_model
    state = IncrementalDecoder(model, ids[:3], mask[:3])
    state.cache = TreeKVCache.from_cache(state.cache)
    assert state.cache is not None and state.cache.num_slots == 3 * ids.shape[1]
    owner, tokens = [0, 1, 2], [[], [], []]
    vocab = state.next_logits.shape[-1]
    for step, rows in enumerate([[0, 0, 1, 2, 2, 2], [5, 0, 0, 3, 1, 1], [4, 4, 2, 0, 5], [1, 1, 1, 3]]):
        before = state.cache.num_slots
        state.reorder_rows(torch.tensor(rows))
        assert state.cache.num_slots == before  # branching copies nothing (none of these drops half of the slots)
        owner, tokens = [owner[r] for r in rows], [list(tokens[r]) for r in rows]
        new = [(7 * i + 11 * step + 3) % vocab for i in range(len(rows))]
        for t, n in zip(tokens, new):
            t.append(n)
        state.feed(torch.tensor(new)[:, None])
        assert state.cache.num_slots == before + len(rows)  # one stored token per row fed
        for i in range(len(rows)):
            alone = _alone(model, ids[owner[i]], mask[owner[i]], tokens[i])
            torch.testing.assert_close(state.next_logits[i], alone, atol=1e-5, rtol=0)


@torch.no_grad()
def test_tree_cache_matches_a_dynamic_cache_through_select_crop_and_compaction(any_model):
    """The same row operations on a stacked DynamicCache and on a tree cache give equal logits (bit for bit: the
    view holds the stacked cache's keys/values); dropping most rows compacts the stores to the slots still read."""
    model, tok, ids, mask = any_model
    stacked, tree = IncrementalDecoder(model, ids, mask), IncrementalDecoder(model, ids, mask)
    tree.cache = TreeKVCache.from_cache(tree.cache)
    vocab = stacked.next_logits.shape[-1]

    def both(op, *args):
        for state in (stacked, tree):
            op(state, *args)
        assert torch.equal(stacked.next_logits, tree.next_logits)
        assert stacked.cache.get_seq_length() == tree.cache.get_seq_length()

    def feed(state, new):
        state.feed(torch.tensor(new)[:, None])

    def crop(state, n):
        state.cache.crop(-n)
        state.attention_mask = state.attention_mask[:, :-n]

    both(feed, [(3 * i + 5) % vocab for i in range(5)])
    both(lambda s, r: s.reorder_rows(torch.tensor(r)), [0, 0, 0, 1, 2, 3, 4, 4])
    for step in range(3):
        both(feed, [(5 * i + step) % vocab for i in range(8)])
    both(crop, 2)  # the last two positions of every row: a rollback
    both(feed, [(2 * i + 9) % vocab for i in range(8)])
    slots = tree.cache.num_slots
    both(lambda s, r: s.select_rows(torch.tensor(r)), [1, 2])  # two rows of one prompt left: most slots unread
    assert tree.cache.num_slots < slots / 2
    assert tree.cache.num_slots == torch.unique(tree.cache.index).numel() == int(tree.cache.index.max()) + 1
    both(feed, [4, 6])
    both(feed, [1, 2])
    with pytest.raises(ValueError, match="minus the number"):
        tree.cache.crop(3)


def test_only_full_attention_dynamic_caches_are_converted():
    assert TreeKVCache.from_cache(None) is None
    assert TreeKVCache.from_cache(((torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4)),)) is None  # legacy tuples
    assert TreeKVCache.from_cache(DynamicCache()) is None  # nothing prefilled


# -- DTS: the same tokens out -------------------------------------------------------------------------------------
CONFIGS = {
    "stable_k3": ({**ALWAYS, "branch_top_k": 3, "max_active": 8, "mode": "stable", "num_traces": 99}, {}),
    "greedy_k2": ({**ALWAYS, "branch_top_k": 2, "max_active": 12}, {}),
    "argmax_k4": ({**ALWAYS, "branch_top_k": 4, "max_active": 20, "temperature": 0, "mode": "stable"}, {}),
    "decision_tokens": (
        {"entropy_threshold": 4.5, "varentropy_threshold": 0.2, "max_active": 6, "mode": "stable", "temperature": None},
        {"top_k": 40},
    ),
    "high_entropy_stop": (
        {"branch_rule": "high_entropy", "entropy_threshold": 4.53, "max_active": 9, "mode": "stable", "num_traces": 5},
        {"stop_strings": ("3",)},
    ),
    "early_stop": (
        {**ALWAYS, "max_active": 10, "mode": "stable", "num_traces": 9, "early_stop": True},
        {},
    ),
}


def _fields(out) -> dict:
    return {
        "completion_ids": out.completion_ids.tolist(),
        "logprobs": out.logprobs.tolist(),
        "texts": out.texts,
        "answers": out.answers,
        "voted": out.voted,
        "finished": out.finished.tolist(),
        "decoded_tokens": out.decoded_tokens,
        "branch_events": out.branch_events,
        "active_counts": out.active_counts,
        "finished_lengths": out.finished_lengths,
    }


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dts_decodes_the_same_tokens_with_the_shared_and_the_stacked_cache(tiny, name):
    model, tok, ids, mask = tiny
    settings, sampling = CONFIGS[name]
    params = SamplingParams(24, do_sample=True, **sampling)
    runs = {}
    for share in (True, False):
        recorder = CacheRecorder(model)
        decoder = DTSDecoder(**settings, share_cache=share, verifier=EXACT_ANSWER, hooks=[recorder.hook()])
        for seed in (0, 1):
            runs[share, seed] = _fields(decoder(model, tok, ids, mask, params=params, generator=_gen(seed)))
        assert ("TreeKVCache" in recorder.types) == share
    for seed in (0, 1):
        assert runs[True, seed] == runs[False, seed]
    branched = sum(len(e) for seed in (0, 1) for e in runs[True, seed]["branch_events"])
    assert branched > 0, "the configuration must branch"
    finished = sum(len(lengths) for seed in (0, 1) for lengths in runs[True, seed]["finished_lengths"])
    assert finished > 0, "some traces must finish"


def test_dts_decodes_the_same_tokens_on_gpt2(tiny):
    _, tok, ids, mask = tiny
    model = _gpt2(tok).eval()
    settings, _ = CONFIGS["stable_k3"]
    params = SamplingParams(16, do_sample=True)
    shared = DTSDecoder(**settings)(model, tok, ids, mask, params=params, generator=_gen(3))
    stacked = DTSDecoder(**settings, share_cache=False)(model, tok, ids, mask, params=params, generator=_gen(3))
    assert _fields(shared) == _fields(stacked)


def _decoder_before_sharing():
    """``zoo/generation/dts.py`` as of :data:`BEFORE_SHARING`, loaded as a module (``None`` without the history)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{BEFORE_SHARING}:zoo/generation/dts.py"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(__file__).with_name("_dts_before_sharing.py")
    spec = importlib.util.spec_from_loader("_dts_before_sharing", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    finally:
        sys.modules.pop(spec.name, None)
    return module


@pytest.mark.parametrize("name", ["stable_k3", "greedy_k2", "decision_tokens"])
def test_dts_decodes_the_tokens_of_the_decoder_before_sharing(tiny, name):
    """The decoder of the last commit before the shared cache (its source read from git, run in this session) and
    today's default decode token-identical traces."""
    old = _decoder_before_sharing()
    if old is None:
        pytest.skip(f"no git history with commit {BEFORE_SHARING} (e.g. an installed copy)")
    model, tok, ids, mask = tiny
    settings, sampling = CONFIGS[name]
    params = SamplingParams(24, do_sample=True, **sampling)
    for seed in (0, 1):
        before = old.DTSDecoder(**settings)(model, tok, ids, mask, params=params, generator=_gen(seed))
        now = DTSDecoder(**settings)(model, tok, ids, mask, params=params, generator=_gen(seed))
        assert torch.equal(now.completion_ids, before.completion_ids) and now.texts == before.texts
        assert torch.equal(now.logprobs, before.logprobs)
        assert now.answers == before.answers and now.active_counts == before.active_counts
        assert now.finished_lengths == before.finished_lengths


def test_a_sliding_window_cache_is_kept_stacked_and_decodes_the_same(tiny):
    _, tok, ids, mask = tiny
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=6,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = MistralForCausalLM(config).eval()
    settings, _ = CONFIGS["stable_k3"]
    params = SamplingParams(12, do_sample=True)
    recorder = CacheRecorder(model)
    shared = DTSDecoder(**settings, hooks=[recorder.hook()])(model, tok, ids, mask, params=params, generator=_gen(0))
    stacked = DTSDecoder(**settings, share_cache=False)(model, tok, ids, mask, params=params, generator=_gen(0))
    assert recorder.types == {"DynamicCache"}
    assert _fields(shared) == _fields(stacked)


# -- memory: bytes, deterministic -----------------------------------------------------------------------------------
def _never_ending(max_positions: int = 1024):
    """The tiny Llama with an EOS it has no logit for: every hypothesis runs the whole budget."""
    backbone = TinyBackbone(seed=0, max_position_embeddings=max_positions)
    model, tok = backbone.build_model().eval(), copy.deepcopy(backbone.tokenizer)
    tok.add_special_tokens({"eos_token": "<never>"})
    assert tok.eos_token_id >= model.get_input_embeddings().num_embeddings
    model.generation_config.eos_token_id = tok.eos_token_id
    return model, tok


def _forced(n: int, **kwargs) -> DTSDecoder:
    """DTS forced to branch in two at every token until ``n`` hypotheses are active (the benchmark's arm)."""
    return DTSDecoder(**ALWAYS, branch_top_k=2, max_active=n, mode="stable", num_traces=n, temperature=None, **kwargs)


def test_the_shared_cache_stores_the_prompt_once_and_one_token_per_hypothesis_and_step():
    model, tok = _never_ending()
    ids, mask = encode_prompts(tok, ["12+34=", "5+6="])
    recorder = CacheRecorder(model)
    steps = 10
    out = _forced(6, hooks=[recorder.hook()])(
        model, tok, ids, mask, params=SamplingParams(steps, do_sample=True), generator=_gen(0)
    )
    # tokens fed: the children of every step but the last (whose tokens are never fed) = the active counts of
    # steps 1 ..; the slots of the prompts are the prefill's, padding included
    fed = sum(sum(counts[1:]) for counts in out.active_counts)
    slots = ids.numel() + fed
    layers = model.config.num_hidden_layers
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    per_slot = 2 * layers * model.config.num_key_value_heads * head_dim * 4  # keys + values, float32
    rows = sum(counts[-1] for counts in out.active_counts)
    table = rows * (ids.shape[1] + steps - 1) * 8 * (1 + model.config.num_key_value_heads)  # int64 table + gather
    assert recorder.peak == slots * per_slot + table


def test_dts_peak_cache_at_n48_on_a_512_token_prompt_is_at_most_half_of_self_consistency():
    """The issue's goal, in bytes: N = 48 hypotheses (forced branching, then frozen) against 48 independent samples
    on one 512-token prompt, the same budget. Counted: the stored cache at its largest, plus, for the tree cache,
    the largest one-layer view the attention received (transient). The stacked DTS cache is about as large as
    self-consistency's (the measure sees the copies)."""
    model, tok = _never_ending()
    text = "".join(f"{i}+{i + 1}={2 * i + 1};" for i in range(200))
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[:, :512]
    assert ids.shape == (1, 512)
    mask = torch.ones_like(ids)
    params = SamplingParams(16, do_sample=True)
    peaks = {}
    decoders = {
        "self_consistency": SelfConsistencyDecoder(num_samples=48, temperature=None),
        "dts_shared": _forced(48),
        "dts_stacked": _forced(48, share_cache=False),
    }
    outputs = {}
    for name, decoder in decoders.items():
        recorder = CacheRecorder(model)
        decoder.hooks.append(recorder.hook())
        outputs[name] = decoder(model, tok, ids, mask, params=params, generator=_gen(0))
        peaks[name] = (recorder.peak, recorder.peak_with_view)
    assert max(outputs["dts_shared"].active_counts[0]) == 48
    assert _fields(outputs["dts_shared"]) == _fields(outputs["dts_stacked"])
    consistency = peaks["self_consistency"][0]
    assert peaks["dts_shared"][1] <= 0.5 * consistency
    assert peaks["dts_shared"][0] < 0.2 * consistency  # 512 + ~48 x 16 stored tokens against 48 x 528
    assert peaks["dts_stacked"][0] >= 0.9 * consistency
