"""Optimizer steps/s of GRPOModule vs TRL's GRPOTrainer on the same learning problem, interleaved over repeats.

The problem is the one ``python train.py +method=grpo`` trains (:func:`setup`): its composed config gives the task's
prompts, the reward functions, group size, prompts per step, completion budget, sampling temperature, optimizer
(AdamW, lr, weight decay, constant schedule), gradient-norm clip, PPO clip, beta and token-mean loss; TRL's
``GRPOConfig`` is set to the same values (:func:`trl_config`). Both trainers start from the same weights, written with
``save_pretrained`` and loaded by each: by default the task's trained base policy (``backbone.init_from: base``, the
artifact the GRPO family starts from: :func:`zoo.cli.bootstrap.ensure_base_policy`, built once into ``--cache-dir``),
or a fresh random tiny Llama (``--init random``), or any exported model (``--model``). Both see the same prompts in
the same order (TRL's ``shuffle_dataset=False``; its prompt text carries the BOS token the zoo puts before every
prompt, so the token ids are the same), every other column of the rows, and the same reward-function objects, each
wrapped to record what it scored (:class:`RewardLog`): the mean reward per step of each arm is reported beside the
timings.

Each repeat runs both trainers for ``--steps`` steps, alternating which goes first (A B, B A, ...), and gives one
ratio; the machine's load drifts, so the median ratio and its spread over repeats are reported, not one run.
Each trainer's time is split into generation, reward scoring, the policy update's forward + backward, and the rest
(optimizer step, framework). TRL is an optional dependency of this benchmark only (``pip install 'paperzoo[bench]'``).

    python benchmarks/grpo_vs_trl.py [--steps 16] [--repeats 5] [--threads 1] [--init base|random] [--model DIR]
        [--cache-dir DIR] [--override key=value ...] [--json out.json] [--before old.json] [--no-write]

``--before`` adds the numbers of an earlier run (its ``--json`` output, e.g. of an older checkout) to the section.
Writes the ``## GRPO vs TRL`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from zoo.cli.artifacts import compose_config
from zoo.cli.bootstrap import ensure_base_policy
from zoo.data.sources import TaskSource
from zoo.encoding import encode_prompt

REPO = Path(__file__).resolve().parents[1]
#: the method whose learning problem both arms train
METHOD = "+method=grpo"
INITS = ("base", "random")
#: columns of a task's rows that are not passed to reward functions as columns (the zoo's PromptDataModule)
CONSUMED = ("prompt", "completion")

#: where both trainers run: ``cpu`` (default) or ``cuda`` (``--device cuda``, benchmarks/gpu_check.sh)
DEVICE = "cpu"


def default_cache_dir() -> Path:
    """``$ZOO_CACHE_DIR`` or the repository's ``.zoo_cache`` (``paths.cache_dir`` of a run started in the repo)."""
    return Path(os.environ.get("ZOO_CACHE_DIR") or REPO / ".zoo_cache").expanduser().resolve()


# -- the learning problem ----------------------------------------------------------------------------------------------
@dataclass
class Problem:
    """What both arms train on: the composed ``+method=grpo`` config (settings, task, rewards), the weights both load
    (``model_dir``, a ``save_pretrained`` directory with its tokenizer), where they came from (``init``), and the
    prompt rows of ``steps`` steps (``source``'s train split)."""

    cfg: DictConfig
    model_dir: Path
    init: str
    source: TaskSource
    steps: int
    reward_fns: dict[str, Callable[..., Any]]

    @property
    def group_size(self) -> int:
        return int(self.cfg.module.group_size)

    @property
    def prompts_per_step(self) -> int:
        return int(self.cfg.datamodule.batch_size)

    @property
    def max_new_tokens(self) -> int:
        return int(self.cfg.module.generation.max_new_tokens)

    @property
    def temperature(self) -> float:
        return float(self.cfg.module.generation.temperature)

    @property
    def lr(self) -> float:
        return float(self.cfg.module.optimizer.lr)

    def rows(self) -> list[dict[str, Any]]:
        return self.source.rows("train")

    def describe(self) -> str:
        """``the trained base policy of task multisum`` / ``a fresh random tiny Llama`` / ``the model at DIR``."""
        if self.init == "base":
            return f"the task's trained base policy, `{self.model_dir.parent.name}`"
        if self.init == "random":
            return "a fresh random-init tiny Llama"
        return f"the model at `{self.model_dir}`"


def setup(
    steps: int,
    init: str = "base",
    cache_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    model: str | Path | None = None,
    workdir: str | Path | None = None,
) -> Problem:
    """Compose ``+method=grpo`` (plus ``overrides``) and resolve the weights both arms start from.

    Args:
        steps: optimizer steps per run (the train split holds ``steps x prompts per step`` prompts).
        init: ``base`` -- the task's trained base policy (built into ``cache_dir`` on first use, reused after);
            ``random`` -- the backbone's fresh random init, saved into ``workdir``.
        cache_dir: the artifact cache (default: :func:`default_cache_dir`).
        overrides: command-line overrides of the composed run (e.g. ``base_policy.num_train=512``).
        model: a ``save_pretrained`` directory both arms load instead (``init`` is then ignored).
        workdir: where a random init is saved (required for ``init='random'``).
    """
    if init not in INITS:
        raise ValueError(f"init={init!r}: use one of {list(INITS)}")
    cfg = compose_config([METHOD, *overrides], root_dir=REPO, cache_dir=cache_dir or default_cache_dir())
    if model is not None:
        model_dir, init = Path(model).expanduser().resolve(), "model"
    elif init == "base":
        model_dir = ensure_base_policy(cfg)
    else:
        if workdir is None:
            raise ValueError("init='random' needs a workdir to save the random weights into")
        model_dir = Path(workdir) / "random_init"
        backbone = instantiate(cfg.backbone, init_from=None, _convert_="all")
        backbone.build_model().save_pretrained(model_dir)
        backbone.tokenizer.save_pretrained(model_dir)
    num_train = steps * int(cfg.datamodule.batch_size)
    source = instantiate(cfg.datamodule.source, num_train=num_train, _convert_="all")
    rewards = instantiate(cfg.module.rewards, _convert_="all")
    if not isinstance(rewards, Mapping):
        raise ValueError(f"module.rewards of {METHOD} is not a mapping name -> function: {rewards!r}")
    return Problem(cfg, model_dir, init, source, steps, dict(rewards))


@dataclass
class RewardLog:
    """What an arm's reward functions scored: one entry per call (a rollout step), per function: the prompts and
    completions it saw, its scores, the completion lengths in tokens, and the seconds it took."""

    calls: list[dict[str, Any]] = field(default_factory=list)

    def wrap(self, name: str, fn: Callable[..., Any], prompt_of: Mapping[str, str] | None = None) -> Callable[..., Any]:
        """``fn`` recording into this log. ``prompt_of`` maps the prompt text a trainer passes to the row's prompt
        (TRL's prompts carry the BOS text: :func:`trl_prompt`), so ``fn`` sees the same prompts in both arms."""

        def recorded(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float | None]:
            prompts = [prompt_of.get(p, p) for p in prompts] if prompt_of else list(prompts)
            start = time.perf_counter()
            scores = fn(prompts=prompts, completions=completions, **kwargs)
            seconds = time.perf_counter() - start
            ids = kwargs.get("completion_ids")
            self.calls.append(
                {
                    "name": name,
                    "function": fn,
                    "prompts": prompts,
                    "completions": list(completions),
                    "scores": [None if s is None else float(s) for s in scores],
                    "lengths": [len(row) for row in ids] if ids is not None else [],
                    "seconds": seconds,
                }
            )
            return scores

        recorded.__name__ = name  # TRL names a function's metrics after it
        recorded.wrapped = fn  # type: ignore[attr-defined]
        return recorded

    def wrap_all(
        self, fns: Mapping[str, Callable[..., Any]], prompt_of: Mapping[str, str] | None = None
    ) -> dict[str, Callable[..., Any]]:
        return {name: self.wrap(name, fn, prompt_of) for name, fn in fns.items()}

    def step_rewards(self, weights: Mapping[str, float] | None = None) -> list[float]:
        """Mean reward of each step: per row the weighted sum of the functions that scored it (``None`` left out, as
        TRL and the zoo do), averaged over the step's rows."""
        steps: list[list[float]] = []
        index: dict[str, int] = defaultdict(int)
        for call in self.calls:
            step = index[call["name"]]
            index[call["name"]] += 1
            if step == len(steps):
                steps.append([0.0] * len(call["scores"]))
            w = (weights or {}).get(call["name"], 1.0)
            for i, s in enumerate(call["scores"]):
                if s is not None:
                    steps[step][i] += w * s
        return [sum(row) / len(row) for row in steps]

    def mean_length(self) -> float:
        """Mean completion length in tokens (the rows the first reward function scored)."""
        first = self.calls[0]["name"] if self.calls else None
        lengths = [n for c in self.calls if c["name"] == first for n in c["lengths"]]
        return sum(lengths) / len(lengths) if lengths else float("nan")

    def seconds(self) -> float:
        return sum(c["seconds"] for c in self.calls)


def timed(fn: Callable[..., Any], bucket: dict[str, float], key: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        bucket[key] += time.perf_counter() - start
        return out

    return wrapper


def result(problem: Problem, seconds: float, steps: int, split: dict[str, float], log: RewardLog) -> dict[str, Any]:
    weights = OmegaConf.to_container(problem.cfg.module.reward_weights) if problem.cfg.module.reward_weights else None
    split = dict(split)
    split["reward functions"] = log.seconds()
    split["generation"] = split.pop("generation + rewards") - split["reward functions"]
    return {
        "seconds": seconds,
        "steps": steps,
        "split": split,
        "step_rewards": log.step_rewards(weights),
        "mean_length": log.mean_length(),
    }


# -- the arms ---------------------------------------------------------------------------------------------------------
def build_zoo(problem: Problem, log: RewardLog) -> tuple[Any, Any]:
    """The GRPOModule and datamodule of ``+method=grpo`` (its composed ``module`` and ``datamodule`` nodes) on the
    problem's weights, rows and recorded reward functions."""
    cfg = problem.cfg
    backbone = instantiate(cfg.backbone, init_from=str(problem.model_dir), _convert_="all")
    datamodule = instantiate(
        cfg.datamodule, tokenizer=backbone.tokenizer, source=problem.source, shuffle=False, _convert_="all"
    )
    module = instantiate(
        cfg.module,
        backbone=backbone,
        quantizer=instantiate(cfg.quant, _convert_="all"),
        rewards=log.wrap_all(problem.reward_fns),
        _convert_="all",
    )
    return module, datamodule


def run_zoo(problem: Problem, steps: int | None = None, log: RewardLog | None = None) -> dict[str, Any]:
    steps = steps or problem.steps
    log = log if log is not None else RewardLog()
    module, datamodule = build_zoo(problem, log)
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
    datamodule.setup("fit")
    start = time.perf_counter()
    trainer.fit(module, train_dataloaders=datamodule.train_dataloader())
    seconds = time.perf_counter() - start
    return result(problem, seconds, trainer.global_step, split, log)


def trl_prompt(tokenizer: Any, prompt: str) -> str:
    """The text whose tokenization by TRL (``tokenizer(text=...)``) is the zoo's prompt ids
    (:func:`zoo.encoding.encode_prompt`: BOS, then the prompt): the BOS token's text before the prompt when the
    tokenizer does not add it itself."""
    zoo_ids = encode_prompt(tokenizer, prompt)
    for text in (prompt, f"{tokenizer.bos_token or ''}{prompt}"):
        if tokenizer(text=text)["input_ids"] == zoo_ids:
            return text
    raise ValueError(f"no TRL prompt text tokenizes to the zoo's prompt ids {zoo_ids} for {prompt!r}")


def trl_config(problem: Problem, output_dir: str | Path, steps: int | None = None) -> Any:
    """TRL's ``GRPOConfig`` with the settings of ``problem.cfg`` (the composed ``+method=grpo`` run)."""
    from trl import GRPOConfig

    module = problem.cfg.module
    loss = module.policy_loss
    if module.aggregation.mode != "token_mean" or module.advantage.scale not in ("group", "batch", "none"):
        raise ValueError("the TRL arm maps module/grpo/aggregation=token_mean and GRPO's advantage scaling only")
    if module.optimizer._target_ != "torch.optim.AdamW" or module.scheduler._target_ != "zoo.optim.constant":
        raise ValueError("the TRL arm maps AdamW with a constant learning rate only")
    weights = OmegaConf.to_container(module.reward_weights) if module.reward_weights else None
    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=DEVICE == "cpu",
        per_device_train_batch_size=problem.group_size * problem.prompts_per_step,
        num_generations=problem.group_size,
        max_completion_length=problem.max_new_tokens,
        temperature=problem.temperature,
        top_p=float(module.generation.get("top_p", 1.0)),
        top_k=int(module.generation.get("top_k", 0)),
        learning_rate=problem.lr,
        weight_decay=float(module.optimizer.get("weight_decay", 0.0)),
        lr_scheduler_type="constant",
        max_grad_norm=float(module.max_grad_norm) if module.max_grad_norm is not None else 0.0,
        beta=float(loss.beta),
        epsilon=float(loss.eps_low),
        epsilon_high=float(loss.eps_high if loss.eps_high is not None else loss.eps_low),
        delta=None if loss.clip_ratio_c is None else float(loss.clip_ratio_c),
        num_iterations=int(module.num_iterations),
        scale_rewards=str(module.advantage.scale),
        mask_truncated_completions=bool(module.mask_truncated_completions),
        reward_weights=[float(weights.get(n, 1.0)) for n in problem.reward_fns] if weights else None,
        loss_type="dapo",  # token-mean over the batch (module/grpo/aggregation=token_mean)
        shuffle_dataset=False,  # the zoo's order (the benchmark's datamodule does not shuffle)
        max_steps=steps or problem.steps,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        bf16=False,
        seed=int(problem.cfg.seed),
        dataloader_num_workers=0,
    )


def build_trl(problem: Problem, log: RewardLog, output_dir: str | Path, steps: int | None = None) -> Any:
    """TRL's GRPOTrainer on the problem's weights, rows (same order, same columns) and recorded reward functions."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(problem.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(problem.model_dir, local_files_only=True)
    rows = problem.rows()
    texts = [trl_prompt(tokenizer, row["prompt"]) for row in rows]
    dataset = Dataset.from_list(
        [{"prompt": text, **{k: v for k, v in row.items() if k not in CONSUMED}} for text, row in zip(texts, rows)]
    )
    prompt_of = {text: row["prompt"] for text, row in zip(texts, rows)}
    reward_funcs = list(log.wrap_all(problem.reward_fns, prompt_of).values())
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=trl_config(problem, output_dir, steps),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def run_trl(problem: Problem, steps: int | None = None, log: RewardLog | None = None) -> dict[str, Any]:
    log = log if log is not None else RewardLog()
    split: dict[str, float] = defaultdict(float)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trl(problem, log, out, steps)
        trainer._generate_and_score_completions = timed(
            trainer._generate_and_score_completions, split, "generation + rewards"
        )
        trainer._prepare_inputs = timed(trainer._prepare_inputs, split, "prepare")
        trainer.training_step = timed(trainer.training_step, split, "training step")
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # its end-of-training metrics: stdout is the section
            trainer.train()
        seconds = time.perf_counter() - start
    # training_step = _prepare_inputs (generation, scoring, old log-probs when needed) + loss forward + backward
    split["policy loss forward + backward"] = split.pop("training step") - split["prepare"]
    split["old log-probs forward"] = split.pop("prepare") - split["generation + rewards"]
    return result(problem, seconds, trainer.state.global_step, split, log)


# -- measurement and report -------------------------------------------------------------------------------------------
def measure(problem: Problem, repeats: int) -> dict[str, Any]:
    run_zoo(problem, 2), run_trl(problem, 2)  # warm-up (imports, first-call costs)
    runs: dict[str, list[dict]] = {"zoo": [], "trl": []}
    order = [("zoo", run_zoo), ("trl", run_trl)]
    for r in range(repeats):
        for name, fn in order if r % 2 == 0 else order[::-1]:
            runs[name].append(fn(problem))
            last = runs[name][-1]
            print(
                f"repeat {r}: {name} {last['steps'] / last['seconds']:.3f} steps/s, mean reward "
                f"{statistics.fmean(last['step_rewards']):.3f}",
                file=sys.stderr,
                flush=True,
            )
    rate = {k: [x["steps"] / x["seconds"] for x in v] for k, v in runs.items()}
    ratios = [z / t for z, t in zip(rate["zoo"], rate["trl"])]
    return {"runs": runs, "rate": rate, "ratios": ratios}


def summary(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    median = statistics.median(values)
    return f"{median:.2f} (min {min(values):.2f}, quartiles {q[0]:.2f}-{q[2]:.2f}, max {max(values):.2f})"


#: the parts of a step's time (keys of a run's ``split``) and how the table names them
PARTS = {
    "generation": "generation (sampling, decoding, advantages)",
    "reward functions": "reward functions",
    "old log-probs forward": "old log-probs forward, batch preparation",
    "policy loss forward + backward": "policy loss forward + backward",
    "rest (optimizer step, framework)": "rest (optimizer step, training loop)",
}


def parts(runs: list[dict]) -> dict[str, float]:
    """Seconds per optimizer step of each part, summed over the runs."""
    steps = sum(r["steps"] for r in runs)
    total: dict[str, float] = defaultdict(float)
    for r in runs:
        for k, v in r["split"].items():
            total[k] += v
    total["rest (optimizer step, framework)"] = sum(r["seconds"] for r in runs) - sum(total.values())
    return {k: total[k] / steps for k in PARTS}


def rewards_line(runs: list[dict]) -> tuple[float, float, float]:
    """Mean reward over every step of every run, and the mean of the first and of the last step over runs."""
    every = [s for r in runs for s in r["step_rewards"]]
    first = [r["step_rewards"][0] for r in runs if r["step_rewards"]]
    last = [r["step_rewards"][-1] for r in runs if r["step_rewards"]]
    return statistics.fmean(every), statistics.fmean(first), statistics.fmean(last)


def command(args: argparse.Namespace) -> str:
    words = ["python benchmarks/grpo_vs_trl.py", f"--steps {args.steps}", f"--repeats {args.repeats}"]
    words.append(f"--threads {args.threads}")
    if args.model:
        words.append("--model <dir>")
    elif args.init != "base":
        words.append(f"--init {args.init}")
    words += [f"--override {o}" for o in args.override]
    return " ".join(words)


def section(result: dict, problem: Problem, args: argparse.Namespace, before: dict | None) -> str:
    import trl

    rate, ratios, runs = result["rate"], result["ratios"], result["runs"]
    cfg = problem.cfg
    model = instantiate(cfg.backbone, init_from=str(problem.model_dir)).build_model()
    params = sum(p.numel() for p in model.parameters())
    described = instantiate(cfg.task).describe()
    task = f"`{described.pop('name')}`: {', '.join(f'{k} {v}' for k, v in described.items())}"
    rewards = ", ".join(f"`{n}` ({type(f).__name__})" for n, f in problem.reward_fns.items())
    ratio = statistics.median(ratios)
    lines = [
        f"The learning problem of `python train.py {METHOD}` (task {task}), started by both trainers from "
        f"{problem.describe()} ({params / 1e6:.2f}M params; each loads it from its `save_pretrained` export): "
        f"{problem.prompts_per_step} prompts x G={problem.group_size} completions per step, the same prompts in the "
        f"same order, max {problem.max_new_tokens} new tokens, temperature {problem.temperature}, AdamW lr "
        f"{problem.lr} (constant), beta {cfg.module.policy_loss.beta}, token-mean loss, reward functions {rewards} "
        f"(the same objects in both trainers). {args.steps} steps per run, {args.repeats} interleaved repeats "
        f"(A B, B A, ...; after one warm-up run each), {args.threads} CPU thread(s), TRL {trl.__version__}, on "
        f"{platform.machine()} with {os.cpu_count()} cores (1-minute load average {result['load_average']:.1f} when "
        "the last repeat ended: other jobs shared the cores). "
        f"`{command(args)}`.",
        "",
        "| | optimizer steps/s, median (min-max over repeats) | mean reward per step (step 1 -> last step) | "
        "mean completion tokens |",
        "|---|---|---|---|",
    ]
    for name, label in (("zoo", "GRPOModule (Lightning)"), ("trl", "TRL GRPOTrainer")):
        mean, first, last = rewards_line(runs[name])
        length = statistics.fmean(r["mean_length"] for r in runs[name])
        lines.append(
            f"| {label} | {statistics.median(rate[name]):.3f} ({min(rate[name]):.3f}-{max(rate[name]):.3f}) | "
            f"{mean:.3f} ({first:.3f} -> {last:.3f}) | {length:.1f} |"
        )
    lines += [
        "",
        f"**Steps/s ratio GRPOModule / TRL, per repeat: median {summary(ratios)}**; spread (max - min) / median "
        f"{(max(ratios) - min(ratios)) / ratio:.0%}. Goal >= 2: "
        + ("met." if ratio >= 2 else f"not met (the median is {ratio / 2:.0%} of it)."),
    ]
    if before is not None:
        lines += [
            "",
            f"An earlier run (its `--json`, measured {before['when']}): ratio median {summary(before['ratios'])}.",
        ]
    zoo, trl_parts = parts(runs["zoo"]), parts(runs["trl"])
    zoo_total, trl_total = sum(zoo.values()), sum(trl_parts.values())
    lines += [
        "",
        "Where the time goes (seconds per optimizer step, and share of the run's wall time, over every repeat):",
        "",
        "| part | GRPOModule s/step | share | TRL s/step | share | TRL / GRPOModule |",
        "|---|---|---|---|---|---|",
    ]
    for k, label in PARTS.items():
        times = f"{trl_parts[k] / zoo[k]:.2f}" if zoo[k] > 1e-4 else "-"
        lines.append(
            f"| {label} | {zoo[k]:.3f} | {zoo[k] / zoo_total:.0%} | {trl_parts[k]:.3f} | "
            f"{trl_parts[k] / trl_total:.0%} | {times} |"
        )
    lines.append(f"| total | {zoo_total:.3f} | | {trl_total:.3f} | | {trl_total / zoo_total:.2f} |")
    largest = max(PARTS, key=lambda k: zoo[k])
    lines += [
        "",
        f"GRPOModule's largest part is {PARTS[largest]} ({zoo[largest] / zoo_total:.0%} of its step). Generation: "
        f"{zoo['generation']:.3f} s per step in GRPOModule vs {trl_parts['generation']:.3f} s in TRL "
        f"(`model.generate`); the update (loss forward + backward, old log-probs): "
        f"{zoo['policy loss forward + backward'] + zoo['old log-probs forward']:.3f} s vs "
        f"{trl_parts['policy loss forward + backward'] + trl_parts['old log-probs forward']:.3f} s; the rest "
        f"(optimizer step, Lightning / Trainer loop, logging): {zoo['rest (optimizer step, framework)']:.3f} s vs "
        f"{trl_parts['rest (optimizer step, framework)']:.3f} s.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--init",
        choices=INITS,
        default="base",
        help="base: the task's trained base policy (built into --cache-dir on first use); random: a fresh tiny Llama",
    )
    parser.add_argument("--model", default=None, help="a save_pretrained dir both arms load (instead of --init)")
    parser.add_argument(
        "--cache-dir", default=None, help="the artifact cache (default: $ZOO_CACHE_DIR or <repo>/.zoo_cache)"
    )
    parser.add_argument(
        "--override", action="append", default=[], help="an override of the composed +method=grpo run (repeatable)"
    )
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    parser.add_argument("--before", default=None, help="the --json output of an earlier run, reported beside")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both trainers run")
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--steps, --repeats and --threads must be >= 1")
    if args.model and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no save_pretrained directory there (no config.json)")
    if args.before and not Path(args.before).is_file():
        parser.error(f"--before {args.before}: no such file")
    global DEVICE
    DEVICE = args.device
    torch.set_num_threads(args.threads)
    import zoo.cli  # noqa: F401  (registers the app that builds the base policy)

    with tempfile.TemporaryDirectory() as tmp:
        problem = setup(args.steps, args.init, args.cache_dir, args.override, args.model, tmp)
        print(f"both arms start from {problem.model_dir}", file=sys.stderr, flush=True)
        result = measure(problem, args.repeats)
        result["when"] = time.strftime("%Y-%m-%d")
        result["load_average"] = os.getloadavg()[0]
        result["model_dir"] = str(problem.model_dir)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        before = json.loads(Path(args.before).read_text()) if args.before else None
        body = section(result, problem, args, before)
    print(body)
    if not args.no_write:
        from _results import write_section

        write_section("GRPO vs TRL", body)


if __name__ == "__main__":
    main()
