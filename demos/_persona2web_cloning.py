"""What behaviour cloning of the tiny LM on Persona2Web would cost, measured next to a sweep of the Persona2Web demo.

Issue: the demo's in-process LLM arm (``llm_tiny``) cannot act, and a behaviour-cloned arm (``+method=agent_sft``, as
the UltraHorizon demo's ``llm_sft``) would need the tiny LM trained on the scripted history agents' chats. This
measures whether that fits a CPU: the rows ``+method=agent_sft`` trains on (one per model request of a scripted
teacher through the LLM agent's exact chat, :func:`zoo.agents.cloning.collect_demonstrations`, prompts rendered by
:class:`zoo.agents.cloning.ChatRendering` with the char tokenizer), their prompt lengths per level and teacher, how
many fit the contexts of the demo's tiny LM and of ``agent_sft``'s backbone, and the wall time and peak memory of one
SFT optimizer step (forward, backward and AdamW of ``agent_sft``'s backbone, its context raised to hold the prompt) at
the median and the longest prompt. The numbers go to ``<sweep dir>/cloning_cost.json``, which the page builder
``demos/persona2web.py`` reads::

    python demos/_persona2web_cloning.py <sweep dir>      # after python train.py -m +demo=persona2web

Levels and distractor settings are the sweep's; the worlds are the demonstration worlds of
:class:`~zoo.datamodules.AgentDemonstrationSource` (none shared with an evaluation run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FILE = "cloning_cost.json"
TEACHERS = {"pre_execution": "pre-execution", "on_demand": "on-demand"}


def _commit(root: Path) -> tuple[str | None, bool]:
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout
    except OSError:
        return None, False
    return (head.strip() or None), bool(dirty.strip())


def prompt_lengths(
    levels: list[int], distractors: int, episodes: int, seed: int = 0
) -> tuple[dict[str, dict[str, Any]], Any, int, int]:
    """``{"<teacher>/level<L>": {"rows", "episodes", "teacher_score", "lengths"}}``, the ``agent_sft`` backbone, its
    reply budget (``datamodule.reply_tokens``) and its default optimizer steps (``trainer.max_steps``)."""
    from hydra.utils import instantiate

    from zoo.agents.cloning import ChatRendering, collect_demonstrations
    from zoo.cli.artifacts import compose_config

    found: dict[str, dict[str, Any]] = {}
    backbone, reply, steps = None, 0, 0
    for teacher in TEACHERS:
        for level in levels:
            cfg = compose_config(
                [
                    "+method=agent_sft",
                    "env=persona2web",
                    f"agent=persona_{teacher}",
                    f"env.scheme={TEACHERS[teacher]}",
                    f"env.level={level}",
                    f"env.distractors={distractors}",
                    f"seed={seed}",
                ]
            )
            if backbone is None:
                backbone, reply = instantiate(cfg.backbone), int(cfg.datamodule.reply_tokens)
                steps = int(cfg.trainer.max_steps)
            rendering = ChatRendering(backbone.tokenizer)
            source = cfg.datamodule.source
            rows, trajectories = collect_demonstrations(
                instantiate(source.env),
                instantiate(source.agent),
                episodes,
                seed,
                role="demonstrations/train",
                max_steps=source.max_steps,
                crnr_window=None,
                code_tool=False,
            )
            found[f"{teacher}/level{level}"] = {
                "teacher": teacher,
                "level": level,
                "episodes": episodes,
                "rows": len(rows),
                "teacher_score": sum(t.score for t in trajectories) / max(len(trajectories), 1),
                "lengths": sorted(len(rendering.encode(r["chat"], r["tools"])) for r in rows),
            }
    return found, backbone, reply, steps


def step_cost(backbone: Any, length: int) -> dict[str, float]:
    """Wall seconds and peak resident memory (MiB, the process's high-water mark) of one SFT optimizer step of the
    backbone's fresh model on one row of ``length`` tokens (forward with the loss, backward, AdamW)."""
    import torch
    from transformers import LlamaForCausalLM

    config = backbone.model_config()
    config.max_position_embeddings = max(int(config.max_position_embeddings), length)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(8, int(config.vocab_size), (1, length), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    seconds = time.perf_counter() - start
    return {
        "tokens": length,
        "seconds": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def tiny_lm_context(sweep_dir: Path) -> int | None:
    """The context of the demo's in-process tiny LM (the ``llm_tiny`` arm's model), from its export's config."""
    for config in sorted(sweep_dir.rglob("llm_tiny/*/resolved_config.yaml")):
        import yaml

        path = ((yaml.safe_load(config.read_text()) or {}).get("backend") or {}).get("path")
        if isinstance(path, str) and (Path(path) / "config.json").is_file():
            return int(json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"])
    return None


def swept(sweep: Any, key: str, env_key: str) -> list[str]:
    """The values the sweep declares for ``key`` (``hydra.sweeper.params``, so runs still to come count), else the
    values its runs' ``env.<env_key>`` took."""
    params = ((sweep.multirun.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    if key in params:
        return [v.strip() for v in str(params[key]).split(",")]
    return sorted({str(r.get(f"env.{env_key}")) for r in sweep.runs if r.get(f"env.{env_key}") is not None})


def measure(sweep_dir: Path, episodes: int = 5, step_tokens: int | None = None) -> dict[str, Any]:
    """Measure and write ``<sweep_dir>/cloning_cost.json``; ``step_tokens`` caps the timed step's length (tests)."""
    import torch
    from omegaconf import OmegaConf

    from zoo.report import Sweep

    torch.set_num_threads(1)
    sweep = Sweep.load(sweep_dir)
    levels = sorted(int(v) for v in swept(sweep, "env.level", "level"))
    distractors = max(int(v) for v in swept(sweep, "env.distractors", "distractors"))
    started = time.time()
    found, backbone, reply, sft_steps = prompt_lengths(levels, distractors, episodes)
    lengths = sorted(n for entry in found.values() for n in entry["lengths"])
    median, longest = int(statistics.median(lengths)), lengths[-1]
    steps = [step_cost(backbone, min(n, step_tokens or n)) for n in (median, longest)]
    commit, dirty = _commit(Path(__file__).resolve().parents[1])
    result = {
        "distractors": distractors,
        "levels": levels,
        "by_teacher_level": found,
        "agent_sft_context": int(backbone.fresh_context_length()),
        "agent_sft_arch": OmegaConf.to_container(OmegaConf.create(dict(backbone.arch))),
        "reply_tokens": reply,
        "agent_sft_steps": sft_steps,
        "tiny_lm_context": tiny_lm_context(sweep_dir),
        "steps": steps,
        "commit": commit,
        "dirty": dirty,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": time.time() - started,
        "load_average": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(),
    }
    (sweep_dir / FILE).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the Persona2Web demo's sweep directory")
    parser.add_argument("--episodes", type=int, default=5, help="teacher episodes per (teacher, level)")
    args = parser.parse_args(argv)
    if not (args.sweep / "multirun.yaml").is_file():
        parser.error(f"{args.sweep} is not a sweep directory of the Persona2Web demo (no multirun.yaml)")
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    result = measure(args.sweep, args.episodes)
    sys.stdout.write(f"wrote {args.sweep / FILE} ({result['wall_seconds']:.0f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
