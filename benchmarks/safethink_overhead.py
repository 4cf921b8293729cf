"""SafeThink overhead vs plain generation on the same prompts (tokens/s), split into scorer and generation time.

    python benchmarks/safethink_overhead.py [--rows 64] [--repeats 3] [--m 3]

Policy: the tiny Llama backbone (random init unless ``--policy`` points to an export, e.g. the demo's cached
policy); scorer: a tiny Llama sequence classifier (the safety-RM architecture of the demo, random init --
its cost, not its accuracy, matters here) flagging every step (``tau=1.01``), which is SafeThink's worst case
(an intervention at every monitored step), and the same scorer never flagging (``tau=0``), the common case.
Appends/updates the ``## SafeThink`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from zoo.backbones import TinyBackbone
from zoo.data.jailbreak import JailbreakTask
from zoo.generation.sampling import SamplingParams, generate_text
from zoo.safety import SequenceClassifierScorer, safethink_generate

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--m", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--policy", type=str, default=None, help="export directory of a trained policy")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    backbone = TinyBackbone(init_from=args.policy)
    model, tok = backbone.build_model().eval(), backbone.tokenizer
    rm = LlamaForSequenceClassification(
        LlamaConfig(
            vocab_size=len(tok),
            num_labels=2,
            pad_token_id=tok.pad_token_id,
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    )
    scorer = SequenceClassifierScorer(rm, tok, name="tiny-rm")
    prompts = [e.prompt for e in JailbreakTask(trigger_prob=1.0).examples(args.rows, seed=123)]
    # a random policy rarely writes newlines: let frequent characters close steps so that the scorer runs
    delims = ["\n"] if args.policy else list("\n=+ ")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, do_sample=True)

    def plain():
        t0 = time.perf_counter()
        out = generate_text(model, tok, prompts, params, torch.Generator().manual_seed(0))
        n = int(out.lengths.sum())
        return time.perf_counter() - t0, n, n, 0.0

    def safethink(tau):
        t0 = time.perf_counter()
        out = safethink_generate(
            model,
            tok,
            prompts,
            scorer,
            tau=tau,
            max_steps_monitored=args.m,
            params=params,
            generator=torch.Generator().manual_seed(0),
            step_delimiters=delims,
        )
        kept = int(out.generation.completion_mask.sum())
        return time.perf_counter() - t0, kept, sum(out.generation.sampled_tokens), out.scorer_seconds

    rows = []
    base_tps = None
    for name, fn in (
        ("plain generate", plain),
        ("SafeThink, no violation (tau=0)", lambda: safethink(0.0)),
        ("SafeThink, every step <= m violates (tau=1.01)", lambda: safethink(1.01)),
    ):
        fn()  # warm-up
        runs = [fn() for _ in range(args.repeats)]
        total = statistics.median(r[0] for r in runs)
        kept = statistics.median(r[1] for r in runs)
        sampled = statistics.median(r[2] for r in runs)
        scorer_s = statistics.median(r[3] for r in runs)
        tps = sampled / total
        base_tps = base_tps or tps
        rows.append((name, kept, sampled, total, scorer_s, total - scorer_s, tps, tps / base_tps))
        print(
            f"{name}: {sampled} sampled / {kept} kept tokens in {total:.2f}s (scorer {scorer_s:.2f}s) -> "
            f"{tps:.0f} sampled tok/s, ratio {tps / base_tps:.2f}"
        )
    if args.no_write:
        return
    table = "\n".join(
        f"| {n} | {k} | {m} | {t:.2f} | {s:.2f} | {g:.2f} | {tps:.0f} | {r:.2f} |" for n, k, m, t, s, g, tps, r in rows
    )
    section = f"""## SafeThink

`python benchmarks/safethink_overhead.py --rows {args.rows} --repeats {args.repeats} --m {args.m}`
({platform.machine()}, {args.threads} thread(s), torch {torch.__version__}; median of {args.repeats} runs after a
warm-up; shared machine, so absolute numbers are noisy).
Policy: tiny Llama ({"trained export" if args.policy else "random init"}); scorer: 2-layer tiny Llama sequence
classifier; {args.rows} attack prompts, sampled, {args.max_new_tokens} new tokens max, m = {args.m}.
"sampled" counts decoding steps (the work; discarded steps included), "kept" the completion tokens (injected
prefix tokens included). The scorer runs only when a step closes and only while t <= m; generation time
includes the step bookkeeping of the outer loop (Python, per token). tau = 0: the scorer runs but never
flags (the common, safe case); tau = 1.01: every monitored step is flagged (the worst case: m injections
per row, and the completions change, so the token counts differ from plain generation).

| run | kept tokens | sampled tokens | total s | scorer s | generation s | sampled tokens/s | ratio vs plain |
|---|---|---|---|---|---|---|---|
{table}
"""
    path = ROOT / "docs" / "benchmarks.md"
    text = (
        path.read_text()
        if path.is_file()
        else "# Benchmarks\n\nSide-by-side performance numbers (scripts in `benchmarks/`).\n"
    )
    pattern = re.compile(r"^## SafeThink\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"updated {path}")


if __name__ == "__main__":
    main()
