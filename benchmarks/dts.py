"""DTS decoder vs the plain sampler and self-consistency: tokens/s and peak KV-cache memory as the number of active
hypotheses grows.

    python benchmarks/dts.py [--hyps 1 4 12 48] [--prompts 4] [--max-new-tokens 64] [--repeats 5]

Arms, for each N (hypotheses per prompt), on the same prompts in one batch:

* ``sample``: the plain sampler, one trace per prompt (the reference of the tokens/s ratios);
* ``self-consistency N``: :class:`~zoo.generation.SelfConsistencyDecoder` with N samples per prompt;
* ``DTS N``: :class:`~zoo.generation.DTSDecoder` forced to branch at every token (``tau_H = inf``, ``tau_V = -1``,
  ``k = 2``) until N hypotheses per prompt are active (``max_active = N``), then frozen.

EOS is made unreachable (the tokenizer's EOS is a token the model has no row for), so every trace and every
hypothesis runs the whole budget and the active count is exactly N after the first steps. Arms are interleaved
(A B C A B C ...), each measured ``--repeats`` times after a warm-up; the table gives medians and the spread
(max-min over median). "Peak KV cache" is the largest total size of the keys and values the model receives in
one forward (read by a forward pre-hook through the decoder's hook seam): the memory the method needs beyond the
weights, without allocator noise. DTS copies the prompt's and its ancestors' keys/values into every hypothesis
(no prefix sharing), so it should need about as much cache as N independent samples.

Writes the ``## DTS`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch
from _results import write_section

from zoo.backbones import TinyBackbone
from zoo.data.forked import ForkedTask
from zoo.encoding import encode_prompts
from zoo.generation import DTSDecoder, ModuleHook, SampleDecoder, SelfConsistencyDecoder
from zoo.protocols import SamplingParams


class PeakCache:
    """A decoder hook recording the largest KV cache (bytes) any forward of the decode receives."""

    def __init__(self) -> None:
        self.peak = 0

    def __call__(self, module, args, kwargs):  # forward pre-hook with kwargs
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        layers = getattr(cache, "layers", None) or []
        size = sum(
            t.nbytes
            for layer in layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if isinstance(t, torch.Tensor)
        )
        self.peak = max(self.peak, size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hyps", type=int, nargs="+", default=[1, 4, 12, 48])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    backbone = TinyBackbone(seed=0)
    model = backbone.build_model().eval()
    tok = copy.deepcopy(backbone.tokenizer)
    tok.add_special_tokens({"eos_token": "<never>"})  # an id the model has no logit for: no trace ends early
    assert tok.eos_token_id >= model.get_input_embeddings().num_embeddings
    prompts = [e.prompt for e in ForkedTask().examples(args.prompts, seed=0)]
    ids, mask = encode_prompts(tok, prompts)
    params = SamplingParams(args.max_new_tokens, do_sample=True, temperature=1.0)

    def arm(decoder) -> Callable[[], tuple[float, int, int]]:
        peak = PeakCache()
        decoder.hooks.append(ModuleHook("", peak, pre=True, with_kwargs=True))

        def run() -> tuple[float, int, int]:
            peak.peak = 0
            start = time.perf_counter()
            out = decoder(model, tok, ids, mask, params=params, generator=torch.Generator().manual_seed(0))
            seconds = time.perf_counter() - start
            tokens = sum(getattr(out, "decoded_tokens", None) or out.lengths.tolist())
            return seconds, int(tokens), peak.peak

        return run

    arms: dict[str, Callable[[], tuple[float, int, int]]] = {"sample": arm(SampleDecoder())}
    for n in args.hyps:
        arms[f"self-consistency {n}"] = arm(SelfConsistencyDecoder(num_samples=n, temperature=None))
        arms[f"DTS {n}"] = arm(
            DTSDecoder(
                entropy_threshold=float("inf"),
                varentropy_threshold=-1.0,
                branch_top_k=2,
                max_active=n,
                mode="stable",
                num_traces=n,
                temperature=None,
            )
        )
    for run in arms.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in arms}
    facts: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for name, run in arms.items():
            seconds, tokens, peak = run()
            times[name].append(seconds)
            facts[name] = (tokens, peak)

    base_rate = facts["sample"][0] / statistics.median(times["sample"])
    base_cache = facts["sample"][1]
    rows = []
    for name in arms:
        median = statistics.median(times[name])
        spread = (max(times[name]) - min(times[name])) / median
        tokens, peak = facts[name]
        rate = tokens / median
        rows.append(
            f"| {name} | {tokens} | {median:.3f} | {spread:.0%} | {rate:.0f} | {rate / base_rate:.2f} | "
            f"{peak / 2**20:.2f} | {peak / base_cache:.1f} |"
        )
        print(rows[-1])
    command = (
        f"python benchmarks/dts.py --hyps {' '.join(map(str, args.hyps))} --prompts {args.prompts} "
        f"--max-new-tokens {args.max_new_tokens} --repeats {args.repeats}"
    )
    body = f"""`{command}`
({args.threads} thread(s); interleaved repeats, median; the machine is shared by several jobs, so absolute times are
noisy -- read the ratios).

Tiny Llama (random init, 4 layers, width 128), {args.prompts} prompts decoded in one batch, {args.max_new_tokens} new
tokens per trace, EOS unreachable (every trace runs the whole budget). DTS is forced to branch (k = 2) at every token
until N hypotheses per prompt are active, then frozen. "tokens" counts every token generated (all traces / hypotheses);
"tokens/s ratio" is relative to the plain sampler with one trace per prompt; "peak KV cache" is the largest
key/value cache a forward received (the decoder's forward pre-hook), relative to the plain sampler's.

| arm | tokens | median s | spread | tokens/s | tokens/s ratio | peak KV cache (MiB) | cache ratio |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Reading: DTS keeps one stacked cache and advances every hypothesis in one batched forward per step, like N
independent samples; its per-step Python bookkeeping (entropy/varentropy, the branch plan, the cache reorder when
hypotheses branch) is the overhead over self-consistency at equal N. The prefix is copied, not shared: every
hypothesis holds its own copy of the prompt's and its ancestors' keys/values, so the cache grows linearly with the
number of active hypotheses, as for N independent samples (the official decoder also copies caches per branch, and
additionally stacks and splits every cache at every step).
"""
    if not args.no_write:
        write_section("DTS", body)


if __name__ == "__main__":
    main()
