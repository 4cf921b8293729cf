"""Optimizer steps/s and completion tokens/s of GRPOModule vs TRL's GRPOTrainer, side by side.

Same tiny Llama weights, same prompts, group size, prompts per step, max completion length, sampling
temperature, learning rate and CPU threads; beta = 0 and one optimizer step per rollout batch in both.
Also splits GRPOModule's step time into generation, reward scoring and policy-gradient (forward + backward).
TRL is an optional dependency of this benchmark only (``pip install trl``).

    python benchmarks/grpo_vs_trl.py [--steps 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import torch
from _results import write_section

from zoo.backbones import TinyBackbone
from zoo.data.sources import TaskSource
from zoo.data.tasks import MultiSum
from zoo.datamodules import PromptDataModule
from zoo.modules import GRPOModule
from zoo.rl import ExactMatchReward, LossAggregator

GROUP, PROMPTS_PER_STEP, MAX_NEW, LR, TEMPERATURE = 8, 8, 64, 2e-4, 1.0


def prompts(n: int) -> list[dict]:
    return TaskSource(MultiSum(), num_train=n, num_val=8, seed=0).rows("train")


def timed(fn, bucket: dict, key: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        bucket[key] += time.perf_counter() - start
        return out

    return wrapper


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
        generation={"max_new_tokens": MAX_NEW, "temperature": TEMPERATURE},
    )
    split = defaultdict(float)
    module.generate = timed(module.generate, split, "generation")
    module.policy_gradients = timed(module.policy_gradients, split, "policy gradient (fwd+bwd)")
    module.reference_logprobs = timed(module.reference_logprobs, split, "old log-probs (fwd)")
    import zoo.modules.grpo as grpo_module

    original = grpo_module.reward_matrix
    grpo_module.reward_matrix = timed(original, split, "reward scoring")
    tokens = []
    original_log = module.log_rollout

    def log_rollout(rollout, loss, metrics):
        tokens.append(int(rollout["result"].lengths.sum()))
        original_log(rollout, loss, metrics)

    module.log_rollout = log_rollout
    trainer = pl.Trainer(
        accelerator="cpu",
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
    grpo_module.reward_matrix = original
    return {"seconds": seconds, "steps": steps, "tokens": sum(tokens), "split": dict(split)}


def run_trl(model_dir: Path, steps: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = prompts(steps * PROMPTS_PER_STEP)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    reward = ExactMatchReward()
    tokens: list[int] = []

    def accuracy(prompts, completions, completion_ids=None, **kw):
        if completion_ids is not None:
            tokens.append(sum(len(c) for c in completion_ids))
        return reward(prompts, completions, **kw)

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
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
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "steps": trainer.state.global_step, "tokens": sum(tokens)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="a save_pretrained dir (default: a fresh tiny Llama)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else Path(tmp)
        if not args.model:
            backbone = TinyBackbone(seed=0)
            backbone.build_model().save_pretrained(model_dir)
            backbone.tokenizer.save_pretrained(model_dir)
        zoo = run_zoo(model_dir, args.steps)
        trl = run_trl(model_dir, args.steps)
    rate = {name: r["steps"] / r["seconds"] for name, r in (("zoo", zoo), ("trl", trl))}
    tok = {name: r["tokens"] / r["seconds"] for name, r in (("zoo", zoo), ("trl", trl))}
    split = "\n".join(f"| {k} | {v:.2f} s | {100 * v / zoo['seconds']:.0f}% |" for k, v in zoo["split"].items())
    body = (
        f"Tiny Llama (0.87M params), {PROMPTS_PER_STEP} prompts x G={GROUP} completions per step, max "
        f"{MAX_NEW} new tokens, temperature {TEMPERATURE}, lr {LR}, beta 0, token-mean loss, {args.steps} steps, "
        f"{args.threads} CPU threads, TRL {__import__('trl').__version__}.\n\n"
        "| trainer | optimizer steps/s | completion tokens/s |\n|---|---|---|\n"
        f"| GRPOModule (Lightning) | {rate['zoo']:.3f} | {tok['zoo']:.0f} |\n"
        f"| TRL GRPOTrainer | {rate['trl']:.3f} | {tok['trl']:.0f} |\n\n"
        f"**Steps/s ratio GRPOModule / TRL: {rate['zoo'] / rate['trl']:.2f}** (goal >= 1.5); tokens/s ratio "
        f"{tok['zoo'] / tok['trl']:.2f}.\n\nWhere GRPOModule's time goes:\n\n| part | time | share |\n|---|---|---|\n"
        f"{split}\n"
    )
    write_section("GRPO vs TRL", body)
    print(body)


if __name__ == "__main__":
    main()
