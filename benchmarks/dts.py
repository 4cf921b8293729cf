"""DTS decoder vs the plain sampler and self-consistency: tokens/s and peak KV-cache memory as the number of active
hypotheses grows, and DTS's shared cache against its stacked one on a long prompt.

    python benchmarks/dts.py [--hyps 1 4 12 48] [--prompts 4] [--max-new-tokens 64] [--repeats 3]
                             [--prompt-tokens 512] [--shared-hyps 48]

Part 1 (``--hyps``): for each N (hypotheses per prompt), on the same short task prompts in one batch:

* ``sample``: the plain sampler, one trace per prompt (the reference of the ratios);
* ``self-consistency N``: :class:`~zoo.generation.SelfConsistencyDecoder` with N samples per prompt;
* ``DTS N``: :class:`~zoo.generation.DTSDecoder` forced to branch at every token (``tau_H = inf``, ``tau_V = -1``,
  ``k = 2``) until N hypotheses per prompt are active (``max_active = N``), then frozen; its shared KV cache
  (:class:`~zoo.generation.tree_cache.TreeKVCache`, the default) and ``DTS N stacked`` (``share_cache=False``: every
  hypothesis holds a copy of the prompt's and its ancestors' keys/values, the decoder before sharing).

Part 2 (``--prompt-tokens``, ``--shared-hyps``): one prompt of ``--prompt-tokens`` tokens, N = ``--shared-hyps``:
self-consistency, DTS stacked and DTS shared side by side, with a check that both DTS caches decode token-identical
traces (completion ids, log-probabilities, tree shape).

EOS is made unreachable (the tokenizer's and the generation config's EOS is a token the model has no row for), so
every trace and every hypothesis runs the whole budget and the active count is exactly N after the first steps.
Memory is counted, not sampled: after every forward a forward hook (the decoder's hook seam) reads the cache the
model returns and counts the bytes of its stored tensors (:func:`~zoo.generation.tree_cache.kv_cache_bytes`: the
keys/values of a ``DynamicCache``; the stores and slot table of a tree cache); "peak" is the largest. A tree cache
also hands every attention layer a dense view of its rows' keys/values, gathered for that layer and freed after it:
the largest such view (one layer, transient) is reported too, and added in the "+ view" column. Times come from
separate runs without the hook (the measurement runs first, then ``--repeats`` interleaved timed repeats: A B C A B
C ...; medians and the spread max-min over median).

Writes the ``## DTS`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import dataclass, field

import torch
from _results import write_section

from zoo.backbones import TinyBackbone
from zoo.data.forked import ForkedTask
from zoo.encoding import encode_prompts
from zoo.generation import DTSDecoder, ModuleHook, SampleDecoder, SelfConsistencyDecoder
from zoo.generation.sampling import cache_kwarg_name
from zoo.generation.tree_cache import kv_cache_bytes
from zoo.protocols import SamplingParams

MIB = 2**20
SWEEP_COLUMNS = ["arm", "tokens", "median s", "spread", "tokens/s", "tokens/s ratio", "peak KV cache (MiB)"]
SWEEP_COLUMNS += ["cache ratio", "cache + view ratio"]
LONG_COLUMNS = ["arm", "tokens", "median s", "spread", "tokens/s", "peak KV cache (MiB)", "ratio to self-consistency"]
LONG_COLUMNS += ["largest one-layer view (MiB)", "cache + view ratio"]


def table_head(columns: list[str]) -> str:
    return "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"


class PeakCache:
    """A decoder forward hook: the largest stored KV cache (bytes) after any forward of the decode, and the largest
    one-layer view a tree cache handed to the attention."""

    def __init__(self, kwarg: str) -> None:
        self.kwarg, self.stored, self.view = kwarg, 0, 0

    def __call__(self, module, args, kwargs, output):  # forward hook with kwargs
        cache = output[self.kwarg]
        self.stored = max(self.stored, kv_cache_bytes(cache))
        self.view = max(self.view, getattr(cache, "view_bytes", 0))


@dataclass
class Arm:
    """One decoder measured on one batch: its cache once (hooked run), then timed runs without the hook."""

    decoder: object
    ids: torch.Tensor
    mask: torch.Tensor
    times: list[float] = field(default_factory=list)
    tokens: int = 0
    stored: int = 0
    view: int = 0
    result: object = None

    def measure(self, model, tok, params) -> None:
        peak = PeakCache(cache_kwarg_name(model))
        self.decoder.hooks = [ModuleHook("", peak, with_kwargs=True)]
        self.result = self.decoder(
            model, tok, self.ids, self.mask, params=params, generator=torch.Generator().manual_seed(0)
        )
        self.decoder.hooks = []
        self.tokens = int(sum(getattr(self.result, "decoded_tokens", None) or self.result.lengths.tolist()))
        self.stored, self.view = peak.stored, peak.view

    def time(self, model, tok, params) -> None:
        start = time.perf_counter()
        self.decoder(model, tok, self.ids, self.mask, params=params, generator=torch.Generator().manual_seed(0))
        self.times.append(time.perf_counter() - start)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        return (max(self.times) - min(self.times)) / self.median


def run_arms(arms: dict[str, Arm], model, tok, params, repeats: int) -> None:
    for arm in arms.values():
        arm.measure(model, tok, params)  # also the warm-up
    for _ in range(repeats):
        for arm in arms.values():
            arm.time(model, tok, params)


def forced_dts(n: int, share_cache: bool = True) -> DTSDecoder:
    """DTS branching in two at every token until ``n`` hypotheses per prompt are active, then frozen."""
    return DTSDecoder(
        entropy_threshold=float("inf"),
        varentropy_threshold=-1.0,
        branch_top_k=2,
        max_active=n,
        mode="stable",
        num_traces=n,
        temperature=None,
        share_cache=share_cache,
    )


def same_traces(a, b) -> bool:
    return (
        torch.equal(a.completion_ids, b.completion_ids)
        and torch.equal(a.logprobs, b.logprobs)
        and a.active_counts == b.active_counts
        and a.branch_events == b.branch_events
    )


def long_prompt(tok, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One prompt of exactly ``length`` tokens: the forked task's prompts one after another."""
    prompts, text = ForkedTask().examples(4 * length, seed=1), ""
    for example in prompts:
        text += example.prompt + " "
        if len(tok(text, add_special_tokens=False).input_ids) >= length:
            break
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[:, :length]
    if ids.shape[1] != length:
        raise SystemExit(f"could not build a {length}-token prompt")
    return ids, torch.ones_like(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hyps", type=int, nargs="+", default=[1, 4, 12, 48])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--shared-hyps", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    positions = 2 * (args.prompt_tokens + args.max_new_tokens)
    backbone = TinyBackbone(seed=0, max_position_embeddings=max(256, positions))  # no position weights: same model
    model = backbone.build_model().eval()
    tok = copy.deepcopy(backbone.tokenizer)
    tok.add_special_tokens({"eos_token": "<never>"})  # an id the model has no logit for: no trace ends early
    assert tok.eos_token_id >= model.get_input_embeddings().num_embeddings
    model.generation_config.eos_token_id = tok.eos_token_id  # the decoders also stop at the generation config's EOS
    params = SamplingParams(args.max_new_tokens, do_sample=True, temperature=1.0)

    # -- part 1: the sweep over N on short prompts ----------------------------------------------------------------
    ids, mask = encode_prompts(tok, [e.prompt for e in ForkedTask().examples(args.prompts, seed=0)])
    sweep: dict[str, Arm] = {"sample": Arm(SampleDecoder(), ids, mask)}
    for n in args.hyps:
        sweep[f"self-consistency {n}"] = Arm(SelfConsistencyDecoder(num_samples=n, temperature=None), ids, mask)
        sweep[f"DTS {n} stacked"] = Arm(forced_dts(n, share_cache=False), ids, mask)
        sweep[f"DTS {n}"] = Arm(forced_dts(n), ids, mask)
    run_arms(sweep, model, tok, params, args.repeats)
    base = sweep["sample"]
    base_rate = base.tokens / base.median
    sweep_rows = []
    for name, arm in sweep.items():
        rate = arm.tokens / arm.median
        sweep_rows.append(
            f"| {name} | {arm.tokens} | {arm.median:.3f} | {arm.spread:.0%} | {rate:.0f} | {rate / base_rate:.2f} | "
            f"{arm.stored / MIB:.2f} | {arm.stored / base.stored:.1f} | {(arm.stored + arm.view) / base.stored:.1f} |"
        )
        print(sweep_rows[-1])

    # -- part 2: one long prompt, N hypotheses: self-consistency, DTS stacked, DTS shared --------------------------
    n = args.shared_hyps
    long_ids, long_mask = long_prompt(tok, args.prompt_tokens)
    long: dict[str, Arm] = {
        f"self-consistency {n}": Arm(SelfConsistencyDecoder(num_samples=n, temperature=None), long_ids, long_mask),
        f"DTS {n} stacked": Arm(forced_dts(n, share_cache=False), long_ids, long_mask),
        f"DTS {n} shared": Arm(forced_dts(n), long_ids, long_mask),
    }
    run_arms(long, model, tok, params, args.repeats)
    reference = long[f"self-consistency {n}"]
    identical = same_traces(long[f"DTS {n} stacked"].result, long[f"DTS {n} shared"].result)
    long_rows = []
    for name, arm in long.items():
        long_rows.append(
            f"| {name} | {arm.tokens} | {arm.median:.3f} | {arm.spread:.0%} | {arm.tokens / arm.median:.0f} | "
            f"{arm.stored / MIB:.2f} | {arm.stored / reference.stored:.3f} | {arm.view / MIB:.2f} | "
            f"{(arm.stored + arm.view) / reference.stored:.3f} |"
        )
        print(long_rows[-1])
    print("DTS stacked and shared traces identical:", identical)

    command = (
        f"python benchmarks/dts.py --hyps {' '.join(map(str, args.hyps))} --prompts {args.prompts} "
        f"--max-new-tokens {args.max_new_tokens} --repeats {args.repeats} --prompt-tokens {args.prompt_tokens} "
        f"--shared-hyps {args.shared_hyps}"
    )
    layers = model.config.num_hidden_layers
    body = f"""`{command}`
({args.threads} thread(s); interleaved repeats, median; the machine is shared by several jobs, so absolute times are
noisy -- read the ratios. Cache bytes are counted, not sampled: they do not vary between runs.)

Tiny Llama (random init, {layers} layers, width {model.config.hidden_size}, float32), EOS unreachable (every trace
and every hypothesis runs the whole budget of {args.max_new_tokens} new tokens). DTS is forced to branch (k = 2) at
every token until N hypotheses per prompt are active, then frozen. "tokens" counts every token generated (all
traces / hypotheses). "peak KV cache" is the largest stored cache after any forward of the decode (a forward hook
on the decoder's hook seam: the keys/values of a `DynamicCache`; the stores and the slot table of DTS's shared
`TreeKVCache`); "+ view" adds the largest dense keys/values view of one layer that the shared cache gathers for the
attention and frees after it (transient, 1/{layers} of a stacked cache of the same rows here; 0 for the other arms).
"DTS N stacked" is `share_cache=false`, the decoder before sharing: every hypothesis holds a copy of the prompt's
and its ancestors' keys/values.

### Tokens/s and peak cache as N grows

{args.prompts} short prompts decoded in one batch. Ratios are relative to the plain sampler with one trace per
prompt.

{table_head(SWEEP_COLUMNS)}
{chr(10).join(sweep_rows)}

### Shared KV cache: N = {n} on a {args.prompt_tokens}-token prompt

One prompt of {args.prompt_tokens} tokens, N = {n}: self-consistency ({n} independent samples), DTS with the
stacked cache and DTS with the shared cache, in one run. Ratios are relative to self-consistency's peak cache.
DTS stacked and DTS shared decode token-identical traces (completion ids, log-probabilities, branch events and
active counts compared in this run): **{"yes" if identical else "NO"}**.

{table_head(LONG_COLUMNS)}
{chr(10).join(long_rows)}

Reading: DTS advances every hypothesis in one batched forward per step, like N independent samples; its per-step
Python bookkeeping (entropy/varentropy, the branch plan, the row reorder when hypotheses branch) is the overhead over
self-consistency at equal N. With the stacked cache (`share_cache=false`, as the official decoder, which copies
caches per branch) every hypothesis holds its own copy of the prompt and of its ancestors' tokens, so the cache is
about N independent samples' (`N x (prompt + generated)`). The shared cache stores each token once -- the prompt,
every branch point's prefix, and one token per hypothesis and step -- and reorders only a slot table when
hypotheses branch or finish: its stored cache is `prompt + tokens decoded`. The price is a gather per layer and
step (each attention layer receives the dense view of its rows, the same keys/values as the stacked cache, which is
why the traces are identical) in place of the stacked cache's growth by concatenation; its cost is in the tokens/s
columns. What sharing saves is what hypotheses have in common: on the long prompt nearly everything, on the short
prompts of the first table only the first tokens before the tree froze (the tokens a hypothesis generated after its
last branch are its own). There the transient one-layer view -- 1/{layers} of a stacked cache for this {layers}-layer
model, 1/L for an L-layer one -- can make "cache + view" exceed the stacked cache; `share_cache=false` keeps the
stacked cache.
"""
    if not args.no_write:
        write_section("DTS", body)


if __name__ == "__main__":
    main()
