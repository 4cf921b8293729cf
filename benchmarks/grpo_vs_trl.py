"""Optimizer steps/s of GRPOModule vs TRL's GRPOTrainer, interleaved over repeats (ratio median and spread).

Same tiny Llama weights, same prompts, group size, prompts per step, max completion length, sampling
temperature, learning rate and CPU threads; beta = 0 and one optimizer step per rollout batch in both.
Each repeat runs both trainers for ``--steps`` steps, alternating which goes first (A B, B A, ...), and gives one
ratio; the machine's load drifts, so the median ratio and its spread over repeats are reported, not one run.
Also splits each trainer's time into generation (+ reward scoring) and the policy update.
TRL is an optional dependency of this benchmark only (``pip install 'paperzoo[bench]'``).

    python benchmarks/grpo_vs_trl.py [--steps 8] [--repeats 5] [--threads 2] [--json out.json] [--before old.json]

``--before`` adds the numbers of an earlier run (its ``--json`` output, e.g. of an older checkout) to the section.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import torch

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.modules import GRPOModule
from zoo.rl import ExactMatchReward, LossAggregator

GROUP, PROMPTS_PER_STEP, MAX_NEW, LR, TEMPERATURE = 8, 8, 64, 2e-4, 1.0
MICRO_BATCH_TOKENS = 1024  # conf/module/grpo.yaml's default


def prompts(n: int) -> list[dict]:
    return TaskSource(MultiSum(), num_train=n, num_val=8, seed=0).rows("train")


def timed(fn, bucket: dict, key: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        bucket[key] += time.perf_counter() - start
        return out

    return wrapper


#: where both trainers run: ``cpu`` (default) or ``cuda`` (``--device cuda``, benchmarks/gpu_check.sh)
DEVICE = "cpu"


def run_zoo(model_dir: Path, steps: int) -> dict:
    backbone = TinyBackbone(init_from=str(model_dir))
    dm = PromptDataModule(
        backbone.tokenizer,
        TaskSource(MultiSum(), num_train=steps * PROMPTS_PER_STEP, num_val=8),
        batch_size=PROMPTS_PER_STEP,
        shuffle=False,
    )
    module = GRPOModule(
        backbone,
        rewards={"accuracy": ExactMatchReward()},
        optimizer=lambda params: torch.optim.AdamW(params, lr=LR),
        aggregation=LossAggregator("token_mean"),
        group_size=GROUP,
        micro_batch_size=GROUP * PROMPTS_PER_STEP,
        micro_batch_tokens=MICRO_BATCH_TOKENS,
        generation={"max_new_tokens": MAX_NEW, "temperature": TEMPERATURE},
    )
    split: dict[str, float] = defaultdict(float)
    module.rollout = timed(module.rollout, split, "generation + rewards")
    module.policy_gradients = timed(module.policy_gradients, split, "policy loss forward + backward")
    module.reference_logprobs = timed(module.reference_logprobs, split, "old log-probs forward")
    trainer = pl.Trainer(
        accelerator="gpu" if DEVICE == "cuda" else "cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": trainer.global_step, "split": dict(split)}


def run_trl(model_dir: Path, steps: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = prompts(steps * PROMPTS_PER_STEP)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    reward = ExactMatchReward()

    def accuracy(prompts, completions, **kw):
        return reward(prompts, completions, **kw)

    split: dict[str, float] = defaultdict(float)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=DEVICE == "cpu",
            per_device_train_batch_size=GROUP * PROMPTS_PER_STEP,
            num_generations=GROUP,
            max_completion_length=MAX_NEW,
            temperature=TEMPERATURE,
            learning_rate=LR,
            beta=0.0,
            loss_type="dapo",
            max_steps=steps,
            logging_steps=1000,
            save_strategy="no",
            report_to=[],
            bf16=False,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=[accuracy], args=args, train_dataset=dataset, processing_class=tokenizer
        )
        trainer._generate_and_score_completions = timed(
            trainer._generate_and_score_completions, split, "generation + rewards"
        )
        trainer.compute_loss = timed(trainer.compute_loss, split, "policy loss forward")
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": trainer.state.global_step, "split": dict(split)}


def summary(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    median = statistics.median(values)
    return f"{median:.2f} (min {min(values):.2f}, quartiles {q[0]:.2f}-{q[2]:.2f}, max {max(values):.2f})"


def measure(model_dir: Path, steps: int, repeats: int) -> dict:
    run_zoo(model_dir, 2), run_trl(model_dir, 2)  # warm-up (imports, first-call costs)
    runs: dict[str, list[dict]] = {"zoo": [], "trl": []}
    order = [("zoo", run_zoo), ("trl", run_trl)]
    for r in range(repeats):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            runs[name].append(fn(model_dir, steps))
            last = runs[name][-1]
            print(f"repeat {r}: {name} {last['steps'] / last['seconds']:.3f} steps/s", flush=True)
    rate = {k: [x["steps"] / x["seconds"] for x in v] for k, v in runs.items()}
    ratios = [z / t for z, t in zip(rate["zoo"], rate["trl"])]
    return {"runs": runs, "rate": rate, "ratios": ratios}


def split_table(runs: list[dict]) -> str:
    total = sum(r["seconds"] for r in runs)
    parts: dict[str, float] = defaultdict(float)
    for r in runs:
        for k, v in r["split"].items():
            parts[k] += v
    parts["rest (optimizer step, framework, logging)"] = total - sum(parts.values())
    return "\n".join(f"| {k} | {100 * v / total:.0f}% |" for k, v in parts.items())


def section(result: dict, args: argparse.Namespace, before: dict | None) -> str:
    import trl

    rate, ratios = result["rate"], result["ratios"]
    lines = [
        f"Tiny Llama (0.87M params), {PROMPTS_PER_STEP} prompts x G={GROUP} completions per step, max {MAX_NEW} new "
        f"tokens, temperature {TEMPERATURE}, lr {LR}, beta 0, token-mean loss, {args.steps} steps per run, "
        f"{args.repeats} interleaved repeats (A B, B A, ...; after one warm-up run each), {args.threads} CPU threads, "
        f"TRL {trl.__version__}. `python benchmarks/grpo_vs_trl.py --steps {args.steps} --repeats {args.repeats} "
        f"--threads {args.threads}`.",
        "",
        "| | optimizer steps/s, median (min-max over repeats) |",
        "|---|---|",
        f"| GRPOModule (Lightning) | {statistics.median(rate['zoo']):.3f} ({min(rate['zoo']):.3f}-"
        f"{max(rate['zoo']):.3f}) |",
        f"| TRL GRPOTrainer | {statistics.median(rate['trl']):.3f} ({min(rate['trl']):.3f}-{max(rate['trl']):.3f}) |",
        "",
        f"**Steps/s ratio GRPOModule / TRL, per repeat: median {summary(ratios)}** (goal >= 1.5).",
    ]
    if before is not None:
        lines += [
            "",
            f"Before this round of changes (same script and settings, the earlier code; measured {before['when']}): "
            f"ratio median {summary(before['ratios'])}.",
        ]
    lines += [
        "",
        "Where the time goes (share of the run's wall time, summed over repeats):",
        "",
        "| GRPOModule part | share |\n|---|---|",
        split_table(result["runs"]["zoo"]),
        "",
        "| TRL part | share |\n|---|---|",
        split_table(result["runs"]["trl"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="a save_pretrained dir (default: a fresh tiny Llama)")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    parser.add_argument("--before", default=None, help="the --json output of an earlier run, reported beside")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both trainers run")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else Path(tmp)
        if not args.model:
            backbone = TinyBackbone(seed=0)
            backbone.build_model().save_pretrained(model_dir)
            backbone.tokenizer.save_pretrained(model_dir)
        result = measure(model_dir, args.steps, args.repeats)
    result["when"] = time.strftime("%Y-%m-%d")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    before = json.loads(Path(args.before).read_text()) if args.before else None
    body = section(result, args, before)
    print(body)
    if not args.no_write:
        from _results import write_section

        write_section("GRPO vs TRL", body)


if __name__ == "__main__":
    main()
