"""DRIFT (arXiv 2605.31455): the cost of offline DRIFT against online multi-turn GRPO, and rollout throughput.

1. **DRIFT vs online GRPO to the same multi@3.** From the same reference policy (the cached base policy of the DRIFT
   methods), DRIFT collects ``--prompts x --n-traj`` episodes once (``+method=drift_rollouts``) and fine-tunes on them
   (``+method=drift``, one epoch); its final ``val/multi@3`` (or ``--metric``: a sampled one, for a reference whose
   greedy mode already solves every prompt) is the target. Online multi-turn GRPO (``+method=drift_grpo``) trains
   until the same metric reaches the target or ``--grpo-steps`` run out. Measured:
   wall-clock of the training phases (validation time excluded: both arms evaluate the same prompts) and tokens
   generated for training (DRIFT: the rollouts; GRPO: every step's episodes). Arms interleaved over ``--repeats``
   (DRIFT, GRPO, DRIFT, GRPO, ...), each repeat with its own seed offset.
2. **Rollout collection throughput.** The same episodes (same model, prompts, ``n_traj``, environment) played through
   the zoo's decoder seam (``SampleDecoder``, as ``+method=drift_rollouts`` does) and through plain ``transformers``
   ``model.generate``, interleaved A B A B; trajectories/s and tokens/s, median and spread, and the ratio.

Writes the ``## DRIFT`` section of docs/benchmarks.md.

    python benchmarks/drift.py [--prompts 128] [--n-traj 8] [--grpo-steps 120] [--repeats 2] [--threads 1]
        [--metric multi@3|sampled_multi@1|sampled_multi@3]
        [--reference <export dir>] [--override key=value ...]

``--reference`` makes an exported model the reference of every run (default: the cached base policy of the DRIFT
methods, built on first use); ``--override`` adds command-line overrides to every run (e.g. a smaller
``base_policy.num_train``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _results import write_section
from omegaconf import open_dict

from zoo.callbacks import TrainingClock
from zoo.cli.artifacts import compose_config
from zoo.cli.bootstrap import ensure_base_policy
from zoo.cli.train import build, run
from zoo.data.feedback import ChatPolicy, FeedbackEnvironment, run_episodes
from zoo.data.tasks import Addition
from zoo.generation import SampleDecoder
from zoo.generation.sampling import context_length, decode_completion
from zoo.protocols import GenerationResult, SamplingParams

REPO = Path(__file__).resolve().parents[1]


def compose(overrides: list[str], out: Path, cache: Path) -> Any:
    cfg = compose_config(overrides, root_dir=REPO, cache_dir=cache)
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.log_dir = str(out / "logs")
    return cfg


def fit_with_clock(cfg: Any, metric: str) -> list[tuple[float, int, float]]:
    """Build the run as train.py does, fit it with a :class:`~zoo.callbacks.TrainingClock` attached, and return
    ``(training seconds, tokens generated, metric)`` at every validation."""
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module, datamodule, trainer = build(cfg)
    clock = TrainingClock(metrics=(metric,))
    trainer.callbacks.append(clock)
    trainer.fit(module, datamodule)
    return [(seconds, tokens, values[metric]) for _, seconds, tokens, values in clock.history if metric in values]


def drift_arm(args: argparse.Namespace, common: list[str], out: Path, cache: Path) -> dict[str, float]:
    rollouts = out / "rollouts.jsonl"
    collect = compose(
        [
            "+method=drift_rollouts",
            *common,
            f"datamodule.source.num_train={args.prompts}",
            f"datamodule.source.num_val={args.val}",
            f"module.n_traj={args.n_traj}",
            f"module.output={rollouts}",
        ],
        out / "collect",
        cache,
    )
    start = time.perf_counter()
    stats = run(collect)
    collect_seconds = time.perf_counter() - start
    tokens = stats["rollouts/tokens_per_trajectory"] * stats["rollouts/new_trajectories"]
    train = compose(
        [
            "+method=drift",
            *common,
            f"datamodule.source.path={rollouts}",
            f"datamodule.source.held_out.num_val={args.val}",
            "trainer.val_check_interval=0.5",
        ],
        out / "train",
        cache,
    )
    curve = fit_with_clock(train, args.metric)
    return {
        "collect_s": collect_seconds,
        "train_s": curve[-1][0],
        "seconds": collect_seconds + curve[-1][0],
        "tokens": tokens,
        "final": curve[-1][2],
        "reference_turn1": stats["rollouts/turn1_accuracy"],
        "reference_solved": stats["rollouts/solved"],
    }


def grpo_arm(args: argparse.Namespace, common: list[str], target: float, out: Path, cache: Path) -> dict[str, float]:
    cfg = compose(
        [
            "+method=drift_grpo",
            *common,
            f"trainer.max_steps={args.grpo_steps}",
            f"trainer.val_check_interval={args.grpo_val_every}",
            f"datamodule.source.num_val={args.val}",
            "callbacks.log_generations=null",
        ],
        out,
        cache,
    )
    curve = fit_with_clock(cfg, args.metric)
    reached = next(((s, t, v) for s, t, v in curve if v >= target), None)
    best = max((v for _, _, v in curve), default=float("nan"))
    shape = {"prompts_per_step": cfg.datamodule.batch_size, "group_size": cfg.module.group_size}
    if reached is None:
        return {"seconds": curve[-1][0], "tokens": curve[-1][1], "reached": 0.0, "best": best, **shape}
    return {"seconds": reached[0], "tokens": reached[1], "reached": 1.0, "best": best, **shape}


# -- collection throughput --------------------------------------------------------------------------------------------
def hf_generate(model: torch.nn.Module, tokenizer: Any):
    """``model.generate`` of transformers as a ``ChatPolicy`` generate function (EOS ends a row)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def generate(ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams, generator: Any) -> GenerationResult:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=params.do_sample,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        completion = out[:, ids.shape[1] :]
        is_eos = completion == eos
        ended = is_eos.cumsum(-1)
        mask_out = ((ended == 0) | (is_eos & (ended == 1))).long()
        texts = [decode_completion(tokenizer, row.tolist()) for row in completion]
        logprobs = torch.zeros_like(completion, dtype=torch.float)
        return GenerationResult(ids, completion, mask_out, logprobs, texts, is_eos.any(-1))

    return generate


def throughput(model: torch.nn.Module, tokenizer: Any, engine: str, args: argparse.Namespace) -> tuple[float, float]:
    env = FeedbackEnvironment(Addition(), max_turns=3)
    problems = Addition().examples(args.throughput_prompts, seed=123)
    episodes = [env.reset(e.prompt, e.answer, str(i), j) for i, e in enumerate(problems) for j in range(args.n_traj)]
    params = SamplingParams(max_new_tokens=48, do_sample=True, temperature=1.0)
    if engine == "zoo":
        decoder = SampleDecoder()

        def generate(ids, mask, p, g):
            return decoder(model, tokenizer, ids, mask, params=p, generator=g)
    else:
        generate = hf_generate(model, tokenizer)
    policy = ChatPolicy(
        generate,
        tokenizer,
        env.chat_format,
        params,
        torch.Generator().manual_seed(0),
        max_context=context_length(model),
    )
    torch.manual_seed(0)
    start = time.perf_counter()
    run_episodes(env, episodes, policy)
    seconds = time.perf_counter() - start
    return len(episodes) / seconds, policy.tokens_generated / seconds


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--n-traj", type=int, default=8)
    parser.add_argument("--val", type=int, default=64)
    parser.add_argument("--grpo-steps", type=int, default=120)
    parser.add_argument("--grpo-val-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--throughput-prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", type=str, default=None, help="artifact cache (default: ZOO_CACHE_DIR/.zoo_cache)")
    parser.add_argument("--skip-training", action="store_true", help="only the collection throughput")
    parser.add_argument("--reference", type=str, default=None, help="export dir of the reference policy")
    parser.add_argument("--override", action="append", default=[], help="an override of every run (repeatable)")
    parser.add_argument(
        "--metric",
        choices=("multi@3", "sampled_multi@1", "sampled_multi@3"),
        default="multi@3",
        help="the target metric: greedy multi@3 (the released evaluation), or sampled at temperature 1 (the "
        "policy's distribution; 2 episodes per prompt) -- for a reference whose greedy mode already solves everything",
    )
    args = parser.parse_args()
    label = args.metric
    args.metric = f"val/{args.metric}"
    torch.set_num_threads(args.threads)
    cache = Path(args.cache).resolve() if args.cache else REPO / ".zoo_cache"
    command = " ".join("<reference export>" if a == args.reference else a for a in sys.argv[1:])
    lines = [
        f"`python benchmarks/drift.py {command}`",
        "",
        f"Reference policy: the cached base policy of the DRIFT methods (tiny backbone, `task=addition`, 3 turns). "
        f"Machine: {args.threads} torch thread(s) on a shared, heavily loaded CPU: absolute times are noisy, the "
        "ratios are the result.",
    ]

    overrides = list(args.override)
    if args.metric.startswith("val/sampled_"):
        # the sampled evaluation of the DRIFT demo (conf/demo/drift.yaml): 2 episodes per prompt at temperature 1
        callback = "+callbacks.multiturn_sampled"
        overrides += [
            f"{callback}._target_=zoo.callbacks.MultiTurnEvaluation",
            f"{callback}.environment=${{multiturn}}",
            f"{callback}.max_new_tokens=48",
            f"{callback}.splits=[val]",
            f"{callback}.do_sample=true",
            f"{callback}.temperature=1.0",
            f"{callback}.samples=2",
            f"{callback}.prefix=sampled_",
            f"{callback}.seed=${{seed}}",
        ]
    if args.reference:
        overrides.append(f"backbone.init_from={Path(args.reference).resolve()}")
        name = Path(args.reference).resolve()
        name = name.parent.name if name.name == "export" else name.name
        lines[2] = lines[2].replace("the cached base policy of the DRIFT methods", f"`{name}` (one for every seed)")
    # 2. throughput (cheap): zoo decoder vs transformers generate, interleaved
    if args.reference:
        reference = Path(args.reference)
    else:
        reference = ensure_base_policy(compose(["+method=drift", *overrides], Path(tempfile.mkdtemp()), cache))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(reference, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(reference, local_files_only=True)
    runs: dict[str, list[tuple[float, float]]] = {"zoo": [], "hf": []}
    for _ in range(max(args.repeats, 2)):
        for engine in ("zoo", "hf"):
            runs[engine].append(throughput(model, tokenizer, engine, args))
    zoo_traj, hf_traj = [r[0] for r in runs["zoo"]], [r[0] for r in runs["hf"]]
    ratios = [a / b for a, b in zip(zoo_traj, hf_traj)]
    lines += [
        "",
        "### Rollout collection throughput",
        "",
        f"{args.throughput_prompts} prompts x {args.n_traj} trajectories, up to 3 turns of 48 sampled tokens, one "
        "batch per turn; the same episode loop, decoded by the zoo's `SampleDecoder` (the decoder seam of "
        "`+method=drift_rollouts`) or by `transformers` `model.generate`. Median (min-max) over "
        f"{len(ratios)} interleaved repeats.",
        "",
        "| engine | trajectories/s | tokens/s |",
        "|---|---|---|",
        f"| zoo decoder | {spread(zoo_traj)} | {spread([r[1] for r in runs['zoo']])} |",
        f"| transformers generate | {spread(hf_traj)} | {spread([r[1] for r in runs['hf']])} |",
        f"| ratio zoo / transformers | {spread(ratios)} | |",
    ]

    # 1. DRIFT vs online multi-turn GRPO, interleaved
    if not args.skip_training:
        drift_runs, grpo_runs = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for repeat in range(args.repeats):
                common = [f"seed={repeat}", *overrides]
                root = Path(tmp) / f"r{repeat}"
                drift = drift_arm(args, common, root / "drift", cache)
                drift_runs.append(drift)
                grpo_runs.append(grpo_arm(args, common, drift["final"], root / "grpo", cache))
        # a target of 0 is "reached" by GRPO's first validation: such repeats say nothing about the cost to a gain
        informative = [(d, g) for d, g in zip(drift_runs, grpo_runs) if d["final"] > 0]
        time_ratio = [g["seconds"] / d["seconds"] for d, g in informative]
        token_ratio = [g["tokens"] / d["tokens"] for d, g in informative]
        lines += [
            "",
            f"### DRIFT (collection + training) vs online multi-turn GRPO to the same {label}",
            "",
            f"DRIFT: {args.prompts} prompts x {args.n_traj} episodes collected once, then one epoch of weighted SFT "
            f"(beta 0.1, gamma 0.9); target = its final `{args.metric}` on {args.val} held-out prompts. GRPO: "
            f"`+method=drift_grpo` ({grpo_runs[0]['prompts_per_step']} prompts x {grpo_runs[0]['group_size']} "
            f"episodes per step) validated every {args.grpo_val_every} steps, stopped at the target or after "
            f"{args.grpo_steps} steps. Seconds exclude validation. {args.repeats} interleaved repeats (seeds "
            f"0..{args.repeats - 1}).",
            "",
            f"| repeat | reference turn-1 / multi@3 (sampled) | DRIFT {label} | DRIFT s (collect + train) "
            f"| DRIFT tokens | GRPO reached | GRPO best {label} | GRPO s | GRPO tokens |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for i, (d, g) in enumerate(zip(drift_runs, grpo_runs)):
            lines.append(
                f"| {i} | {d['reference_turn1']:.3f} / {d['reference_solved']:.3f} | {d['final']:.3f} | "
                f"{d['seconds']:.0f} ({d['collect_s']:.0f} + {d['train_s']:.0f}) | {d['tokens']:.0f} | "
                f"{('yes' if g['reached'] else 'no') + (' (target 0)' if d['final'] <= 0 else '')} | {g['best']:.3f} | "
                f"{g['seconds']:.0f} | {g['tokens']:.0f} |"
            )
        lines.append("")
        if informative:
            lines.append(
                f"GRPO / DRIFT wall-clock: {spread(time_ratio)}; tokens generated: {spread(token_ratio)} (median, "
                f"min-max over the {len(informative)} repeat(s) with a target above 0; where GRPO did not reach the "
                "target, its whole budget counts, so the ratio is a lower bound)."
            )
        else:
            lines.append("No repeat has a target above 0: no cost-to-target ratio (the reference is too weak here).")
    write_section("DRIFT", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
