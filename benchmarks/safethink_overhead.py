"""SafeThink's cost over plain generation on the same prompts, interleaved over repeats (median ratio and spread).

    python benchmarks/safethink_overhead.py [--rows 64] [--repeats 7] [--m 3] [--policy EXPORT_DIR] [--json out.json]

Policy: the tiny Llama backbone (random init unless ``--policy`` points to an export, e.g. the jailbreak task's base
SFT policy, whose steps end at newlines); scorer: a tiny Llama sequence classifier (the safety-RM architecture of
the demo, random init -- its cost, not its accuracy, matters here). Three runs per repeat, in rotating order
(A B C, C A B, B C A, ...): plain generation; SafeThink with ``hook_lookahead=0`` (each step scored before its row
samples on) whose scorer never flags (``tau = 0``, the common case: the completions are token-identical to plain
generation, so the time ratio is the overhead); the same where every monitored step is flagged (``tau = 1.01``, the
worst case: ``m`` injections per row, different completions, compared in sampled tokens per second).
``--lookahead L`` adds both SafeThink runs with ``hook_lookahead=L`` (batched scorer calls; SafeThink's default is
32), ``--compare-full`` SafeThink with no violation whose classifier re-reads prompt + trace at every step
(``incremental=False``; by default it scores each row from its KV cache); ``--scorer-hidden``/``--scorer-layers``
size the scorer.
``--before`` adds the numbers of an earlier run (its ``--json`` output, e.g. of an older checkout) to the
``## SafeThink`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from zoo.backbones import TinyBackbone
from zoo.data.jailbreak import JailbreakTask
from zoo.generation.decoders import generate_text
from zoo.generation.stepwise import StepwiseDecoder
from zoo.protocols import SamplingParams
from zoo.safety import SequenceClassifierScorer, safethink_generate


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    median = statistics.median(values)
    return f"{median:.2f} (min {min(values):.2f}, quartiles {q[0]:.2f}-{q[2]:.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--m", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--policy", type=str, default=None, help="export directory of a trained policy")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    parser.add_argument("--before", default=None, help="the --json output of an earlier run, reported beside")
    parser.add_argument("--lookahead", type=int, default=0, help="also time SafeThink with this hook_lookahead (> 0)")
    parser.add_argument("--compare-full", action="store_true", help="also time the scorer re-reading every text")
    parser.add_argument("--scorer-hidden", type=int, default=64)
    parser.add_argument("--scorer-layers", type=int, default=2)
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
            hidden_size=args.scorer_hidden,
            intermediate_size=3 * args.scorer_hidden,
            num_hidden_layers=args.scorer_layers,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    ).eval()  # as from_pretrained returns it
    scorer = SequenceClassifierScorer(rm, tok, name="tiny-rm")
    full_scorer = SequenceClassifierScorer(rm, tok, name="tiny-rm", incremental=False) if args.compare_full else None
    prompts = [e.prompt for e in JailbreakTask(trigger_prob=1.0).examples(args.rows, seed=123)]
    # a random policy rarely writes newlines: let frequent characters close steps so that the scorer runs
    delims = ["\n"] if args.policy else list("\n=+ ")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, do_sample=True)

    def plain() -> dict:
        t0 = time.perf_counter()
        out = generate_text(model, tok, prompts, params, torch.Generator().manual_seed(0))
        n = int(out.lengths.sum())
        return {
            "seconds": time.perf_counter() - t0,
            "kept": n,
            "sampled": n,
            "counted": n,
            "scorer": 0.0,
            "texts": out.texts,
        }

    def safethink(tau: float, lookahead: int = 0, which=None) -> dict:
        t0 = time.perf_counter()
        out = safethink_generate(
            model,
            tok,
            prompts,
            which or scorer,
            tau=tau,
            max_steps_monitored=args.m,
            params=params,
            generator=torch.Generator().manual_seed(0),
            decoder=StepwiseDecoder(step_delimiters=delims, hook_lookahead=lookahead),
        )
        return {
            "seconds": time.perf_counter() - t0,
            "kept": int(out.generation.completion_mask.sum()),
            "sampled": sum(out.generation.sampled_tokens),
            # against the budget: the sampled tokens less those discarded by lookahead (= sampled at lookahead 0)
            "counted": sum(out.generation.counted_tokens),
            "scorer": out.scorer_seconds,
            "calls": out.scorer_calls,
            "texts": out.texts,
        }

    arms = {"plain": plain, "safe": lambda: safethink(0.0), "worst": lambda: safethink(1.01)}
    if args.lookahead:
        arms["lookahead"] = lambda: safethink(0.0, args.lookahead)
        arms["worst_lookahead"] = lambda: safethink(1.01, args.lookahead)
    if full_scorer is not None:
        arms["full"] = lambda: safethink(0.0, which=full_scorer)
    for fn in arms.values():
        fn()  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    names = list(arms)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            runs[name].append(arms[name]())

    def work(fn) -> dict:
        """One more run of an arm with the policy's forward passes counted (the same in every run: not timing)."""
        fed = {"passes": 0, "row_tokens": 0, "row_context": 0}

        def count(_module, _args, kwargs) -> None:
            shape = (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]).shape
            fed["passes"] += 1
            fed["row_tokens"] += shape[0] * shape[1]
            fed["row_context"] += shape[0] * kwargs["attention_mask"].shape[1]

        handle = model.register_forward_pre_hook(count, with_kwargs=True)
        try:
            fn()
        finally:
            handle.remove()
        return fed

    work_done = {name: work(fn) for name, fn in arms.items()}
    identical = all(s["texts"] == p["texts"] for s, p in zip(runs["safe"], runs["plain"]))
    identical_ahead = all(s["texts"] == p["texts"] for s, p in zip(runs.get("lookahead", []), runs["plain"]))
    overhead = [s["seconds"] / p["seconds"] for s, p in zip(runs["safe"], runs["plain"])]
    ahead = [s["seconds"] / p["seconds"] for s, p in zip(runs.get("lookahead", []), runs["plain"])]
    full = [s["seconds"] / p["seconds"] for s, p in zip(runs.get("full", []), runs["plain"])]
    load = os.getloadavg()
    decoding = [(s["seconds"] - s["scorer"]) / p["seconds"] for s, p in zip(runs["safe"], runs["plain"])]
    scoring = [s["scorer"] / p["seconds"] for s, p in zip(runs["safe"], runs["plain"])]

    def slowdown(name: str) -> list[float]:
        pairs = zip(runs.get(name, []), runs["plain"])
        return [(p["counted"] / p["seconds"]) / (w["counted"] / w["seconds"]) for w, p in pairs]

    worst, worst_ahead = slowdown("worst"), slowdown("worst_lookahead")
    result = {
        "when": time.strftime("%Y-%m-%d"),
        "overhead": overhead,
        "worst_slowdown": worst,
        "lookahead": args.lookahead,
        "lookahead_overhead": ahead,
        "lookahead_worst_slowdown": worst_ahead,
        "lookahead_identical": identical_ahead,
        "full_read_overhead": full,
        "load_average": load,
        "decoding_overhead": decoding,
        "scorer_share": scoring,
        "identical": identical,
        "work": work_done,
        "runs": {k: [{kk: vv for kk, vv in x.items() if kk != "texts"} for x in v] for k, v in runs.items()},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    before = json.loads(Path(args.before).read_text()) if args.before else None

    def row(name: str, label: str) -> str:
        rs = runs[name]
        sec = statistics.median(x["seconds"] for x in rs)
        scorer_s = statistics.median(x["scorer"] for x in rs)
        calls = statistics.median(x.get("calls", 0) for x in rs)
        w = work_done[name]
        return (
            f"| {label} | {rs[0]['kept']} | {rs[0]['sampled']} | {sec:.2f} | {scorer_s:.2f} ({calls:.0f} calls) | "
            f"{rs[0]['sampled'] / sec:.0f} | {w['passes']} / {w['row_tokens']} / {w['row_context']} |"
        )

    lines = [
        f"`python benchmarks/safethink_overhead.py --rows {args.rows} --repeats {args.repeats} --m {args.m}"
        f"{' --policy <jailbreak base policy export>' if args.policy else ''}"
        f"{f' --lookahead {args.lookahead}' if args.lookahead else ''}{' --compare-full' if args.compare_full else ''}"
        f"{f' --scorer-hidden {args.scorer_hidden}' if args.scorer_hidden != 64 else ''}"
        f"{f' --scorer-layers {args.scorer_layers}' if args.scorer_layers != 2 else ''}` ({args.threads} thread(s); "
        f"{args.repeats} repeats of the {len(arms)} runs in rotating order after a warm-up; medians; load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end, 2 cores shared with other jobs).",
        f"Policy: tiny Llama ({'the jailbreak task base SFT policy' if args.policy else 'random init'}); scorer: "
        f"{args.scorer_layers}-layer tiny Llama sequence classifier (hidden {args.scorer_hidden}, random init; "
        f"scores each row incrementally from its KV cache unless marked); {args.rows} attack prompts, sampled, "
        f"{args.max_new_tokens} new tokens max, m = {args.m}. The scorer runs when a step closes (the last reasoning "
        "step included, at `</think>`) and only while t <= m.",
        "",
        "| run | kept tokens | sampled tokens | total s | scorer s | sampled tokens/s | policy forward passes / "
        "rows x tokens fed / rows x context |",
        "|---|---|---|---|---|---|---|",
        row("plain", "plain generation"),
        row("safe", "SafeThink, no violation (tau=0), hook_lookahead=0"),
        row("worst", "SafeThink, every step <= m violates (tau=1.01), hook_lookahead=0"),
        *([row("lookahead", f"SafeThink, no violation, hook_lookahead={args.lookahead}")] if ahead else []),
        *(
            [row("worst_lookahead", f"SafeThink, every step <= m violates, hook_lookahead={args.lookahead}")]
            if ahead
            else []
        ),
        *([row("full", "SafeThink, no violation, scorer re-reading every text (incremental=false)")] if full else []),
        "",
        "**SafeThink with no violation / plain generation, time per repeat, hook_lookahead=0: median "
        f"{spread(overhead)}** (goal <= 1.15; completions token-identical to plain generation: "
        f"{'yes' if identical else 'NO'}).",
        f"Worst case (every monitored step flagged), hook_lookahead=0: plain / SafeThink sampled tokens per second "
        f"{spread(worst)}.",
        "Where the no-violation overhead goes: SafeThink's decoding without the scorer's time takes "
        f"{spread(decoding)} times plain generation's; the scorer's calls add {spread(scoring)} of plain "
        "generation's time.",
    ]
    if ahead:
        lines += [
            f"**With hook_lookahead={args.lookahead} (batched scorer calls; SafeThink's default is 32), no violation: "
            f"median {spread(ahead)}** (goal <= 1.15; completions token-identical to plain generation: "
            f"{'yes' if identical_ahead else 'NO'}).",
            f"Worst case with hook_lookahead={args.lookahead}: plain / SafeThink tokens per second counting the "
            "tokens of the budget (the tokens sampled after a violating step are discarded, decoded again and not "
            f"counted; {runs['worst_lookahead'][0]['sampled'] - runs['worst_lookahead'][0]['counted']} of them "
            f"in the first repeat) {spread(worst_ahead)}.",
        ]
    if full:
        lines.append(f"With the scorer re-reading prompt + trace at every call, no violation: {spread(full)}.")
    if before is not None:
        lines += [
            "",
            f"Before this round of changes (same script and settings, the earlier code; measured {before['when']}): "
            f"no-violation time ratio median {spread(before['overhead'])}; worst case "
            f"{spread(before['worst_slowdown'])}"
            + (
                f"; with hook_lookahead={before['lookahead']}: no violation {spread(before['lookahead_overhead'])}, "
                f"worst case {spread(before['lookahead_worst_slowdown'])}"
                if before.get("lookahead_overhead")
                else ""
            )
            + ".",
            *(
                [
                    "Policy forward work then (passes / rows x tokens fed / rows x context): "
                    + "; ".join(
                        f"{name} {w['passes']} / {w['row_tokens']} / {w['row_context']}"
                        for name, w in before["work"].items()
                    )
                    + "."
                ]
                if before.get("work")
                else []
            ),
        ]
    body = "\n".join(lines) + "\n"
    print(body)
    if not args.no_write:
        from _results import write_section

        write_section("SafeThink", body)


if __name__ == "__main__":
    main()
