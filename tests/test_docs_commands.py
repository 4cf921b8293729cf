"""Every command shown in README.md and docs/ works as written (docs/reliability.md, "README commands").

The commands are read from the shell code blocks of the documentation (:func:`documented_commands`), never copied
here. Each ``python train.py`` command is composed with its options exactly as written (fast: a misspelled key,
group or option fails here), and the slow tests run every command of a page, in order, from an empty directory --
without ``paths.log_dir`` or ``ZOO_LOG_DIR``, as a new user would -- with cheap settings appended: a few steps, the
method's catalogue ``smoke`` settings and a small base-policy recipe. Placeholders (``<dir>``, ``/path/to/llm``)
become a small saved model; commands that need hardware or services the tests do not have are skipped with the
reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, SMALL_BASE_POLICY, compose_train

SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
DOC_FILES = [
    REPO_ROOT / "README.md",
    *sorted((REPO_ROOT / "docs").glob("*.md")),
    *sorted((REPO_ROOT / "docs" / "methods").glob("*.md")),
]
# documented paths of a local model, replaced by a small model saved by save_pretrained
MODEL_PLACEHOLDERS = re.compile(
    r"(?<![\w/])(?:/models/[\w.-]+|/path/to/[\w./-]+|<(?:stage-1 )?run(?: dir)?>/export|"
    r"<run dir>|<export dir(?: of any model)?>|<save_pretrained dir>|<dir>)"
)
MODEL = "{model}"  # where a documented command names a local model (see MODEL_PLACEHOLDERS)
# the export of an earlier run of the same page (``<run>/export``): the newest export the page's runs wrote, else MODEL
RUN_EXPORT_PLACEHOLDERS = re.compile(r"(?<![\w/])<(?:stage-1 )?run(?: dir)?>/export")
RUN_EXPORT = "{run_export}"
# what cannot run in the tests, by the option that asks for it
SKIPPED = {
    "trainer=gpu": "needs a GPU",
    "trainer=ddp": "needs several devices (DDP is tested in tests/foundation/test_ddp.py)",
    "trainer=fsdp": "needs several GPUs (FSDP is tested on CPU in tests/rl/test_fsdp_grpo.py)",
    "+launcher=slurm": "needs a SLURM cluster",
    "+launcher=ray": "needs a Ray cluster",
    "backend=openai_compat": "needs an OpenAI-compatible server",
    "backbone=hf_vlm": "needs a local LLaVA-style checkpoint",
    "callbacks.safethink.scorer=": "needs a trained safety classifier export",
    "module.reference=": "needs a trained reference policy export",
    "+module.teacher.name_or_path=": "needs a local vision encoder (DINOv2)",
    "datamodule.source.path=rollouts.jsonl": "needs the rollouts of a +method=drift_rollouts run (drift.md)",
    "module.output=/": "writes outside the working directory",
    "module.generation.max_new_tokens=512": "needs a model whose context holds 512 new tokens per turn (the tests' "
    "small saved model has 256 positions)",
}
# cheap settings appended to every train.py command (a few steps; validation and tests limited)
CHEAP = [
    "trainer.max_steps=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.limit_predict_batches=2",
    *SMALL_BASE_POLICY,
]


@dataclass(frozen=True)
class Command:
    """One documented command: ``where`` (``file:line``), its environment assignments and its arguments."""

    where: str
    env: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env), *map(shlex.quote, self.argv)])

    @property
    def is_train(self) -> bool:
        return self.argv[:2] == ("python", "train.py") or self.argv[:1] == ("zoo-train",)

    @property
    def overrides(self) -> list[str]:
        return [a for a in self.argv[1 if self.argv[0] == "zoo-train" else 2 :] if a not in ("-m", "--multirun")]


def documented_commands(path: Path) -> list[Command]:
    """The zoo's commands (``python train.py``, ``zoo-train``, ``python -m zoo...``, ``python benchmarks/...``) in
    the shell code blocks of a markdown file; ``\\`` continuations joined, ``&&`` chains split, comments dropped."""
    commands: list[Command] = []
    lines = path.read_text().splitlines()
    in_block, shell, pending, start = False, False, "", 0
    for number, line in enumerate(lines, start=1):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            in_block, shell = (not in_block), fence.group(1) in SHELL_BLOCKS
            continue
        if not (in_block and shell):
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text, pending = MODEL_PLACEHOLDERS.sub(MODEL, RUN_EXPORT_PLACEHOLDERS.sub(RUN_EXPORT, pending + line)), ""
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError:
            continue
        while tokens:
            part = tokens[: tokens.index("&&")] if "&&" in tokens else tokens
            tokens = tokens[len(part) + 1 :]
            env = []
            while part and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", part[0]):
                env.append(tuple(part.pop(0).split("=", 1)))
            program = part[:2]
            if program[:1] == ["zoo-train"] or (
                program[:1] == ["python"]
                and len(program) == 2
                and (program[1] == "train.py" or program[1].startswith("benchmarks/") or program[1] == "-m")
                and (program[1] != "-m" or (len(part) > 2 and part[2].startswith("zoo")))
            ):
                commands.append(Command(f"{path.relative_to(REPO_ROOT)}:{start}", tuple(env), tuple(part)))
    return commands


def skip_reason(command: Command) -> str | None:
    text = command.text
    if "..." in text or "[--" in text or re.search(r"<(?:paper|date|run|m)>|<[^<>]* [^<>]*>", text):
        return "a template with placeholders, not a runnable command"
    for option, reason in SKIPPED.items():
        if any(a.startswith(option) for a in command.argv):
            return reason
    if any(a.startswith("+demo=") for a in command.argv):
        return "a demo multirun (minutes of CPU per arm): run by tests/test_demos.py"
    if command.argv[1:2] == ("-m",) and command.argv[2:4] == ("zoo.report", "demo"):
        return "needs the demo's runs (tests/test_demos.py)"
    if command.argv[1:2] and command.argv[1].startswith("benchmarks/"):
        return "a benchmark (timing is never run in tests)"
    return None


def all_commands() -> list[Command]:
    return [c for path in DOC_FILES for c in documented_commands(path)]


def test_the_documentation_shows_commands():
    """The extraction finds the README's commands (a change of format must not silently empty this test)."""
    readme = [c.text for c in documented_commands(REPO_ROOT / "README.md")]
    assert "python train.py -m module.optimizer.lr=1e-3,3e-3 seed=0,1" in readme
    assert "python train.py run_id=exp1" in readme and "python train.py run_id=exp1 ckpt_path=last" in readme
    assert len(all_commands()) > 50


def with_model(argument: str, model_dir: Path, run_export: Path | None = None) -> str:
    return argument.replace(RUN_EXPORT, str(run_export or model_dir)).replace(MODEL, str(model_dir))


def newest_export(cwd: Path) -> Path | None:
    """The export directory most recently written by a run in ``cwd`` (``logs/**/export``)."""
    exports = [e for e in cwd.glob("logs/**/export") if e.is_dir()]
    return max(exports, key=lambda e: e.stat().st_mtime) if exports else None


def first_of_sweeps(argument: str) -> str:
    """``key=a,b`` -> ``key=a`` (one job of a multirun sweep); lists in brackets are kept."""
    key, sep, value = argument.partition("=")
    if not sep or value.startswith(("[", "{", "'")) or "," not in value:
        return argument
    return f"{key}={value.split(',')[0]}"


def composable(command: Command) -> bool:
    return command.is_train and skip_reason(command) is None


# the README's commands are composed in the default run; the method pages' (about a hundred) with the slow tests
TRAIN_COMMANDS = [
    c if c.where.startswith("README") else pytest.param(c, marks=pytest.mark.slow)
    for c in all_commands()
    if composable(c)
]


@pytest.mark.parametrize("command", TRAIN_COMMANDS, ids=[getattr(c, "values", [c])[0].where for c in TRAIN_COMMANDS])
def test_a_documented_train_command_composes(command, tmp_path):
    """Every option of a documented ``python train.py`` command exists (one job of a sweep)."""
    overrides = [first_of_sweeps(with_model(a, tmp_path / "model")) for a in command.overrides]
    compose_train(overrides, tmp_path)


# -- running them (slow) ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model saved with save_pretrained, for the documented local-model paths."""
    from zoo.backbones import TinyBackbone

    directory = tmp_path_factory.mktemp("model")
    tiny = TinyBackbone()
    tiny.build_model().save_pretrained(directory)
    tiny.tokenizer.save_pretrained(directory)
    return directory


def write_data_files(command: Command, cwd: Path) -> None:
    """The small data files a command names (``*.jsonl``, ``*.json``, ``*.txt``; ``*.parquet``, ``*.csv`` and
    ``*_dataset`` -- a ``save_to_disk`` DatasetDict with train/validation/test splits -- of the rows, their columns
    renamed by the command's ``datamodule.source.columns``) that do not exist in ``cwd``."""
    domains = ("code", "math", "chat")
    rows = [
        {
            "prompt": f"{i}+1=",
            "completion": str(i + 1),
            "answer": str(i + 1),
            "chosen": str(i + 1),
            "rejected": str(i + 2),
            "text": f"item {i} of the documentation data",
            "label": "safe" if i % 2 else "unsafe",
            "domain": domains[i % 3],
        }
        for i in range(48)
    ]
    mapping: dict[str, str] = {}
    for argument in command.argv:
        key, _, value = argument.partition("=")
        if key == "datamodule.source.columns":
            mapping.update(yaml.safe_load(value) or {})
        elif key.startswith("datamodule.source.columns."):
            mapping[key.rsplit(".", 1)[1]] = value
    if mapping:
        rows = [{mapping.get(k, k): v for k, v in r.items()} for r in rows]
    for argument in command.argv:
        value = argument.split("=", 1)[-1]
        if (
            "/" in value
            or not re.fullmatch(r"[\w.-]+\.(jsonl|json|txt|parquet|csv)|\w+_dataset", value)
            or (cwd / value).exists()
        ):
            continue
        if value.endswith(("_dataset", ".parquet", ".csv")):
            import datasets

            data = datasets.Dataset.from_list(rows)
            if value.endswith(".parquet"):
                data.to_parquet(str(cwd / value))
            elif value.endswith(".csv"):
                data.to_csv(str(cwd / value), index=False)
            else:
                datasets.DatasetDict(train=data, validation=data, test=data).save_to_disk(str(cwd / value))
        elif value.endswith(".jsonl"):
            (cwd / value).write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif value.endswith(".json"):
            (cwd / value).write_text(json.dumps(dict.fromkeys(domains, 1.0)))
        else:
            (cwd / value).write_text("A short text to check for a watermark.\n")


def cheap_settings(command: Command) -> list[str]:
    """Appended to a train.py command: :data:`CHEAP` and the catalogue smoke settings of its methods."""
    from zoo.catalogue import method_entries

    entries = method_entries()
    names = []
    for argument in command.overrides:
        if argument.startswith("+method="):
            names.extend(n.strip() for n in argument.split("=", 1)[1].strip("[]").split(","))
    smoke = [s for name in names for s in (entries.get(name, {}).get("smoke") or [])]
    # a command that replaces a node (``module.teacher=null``, ``callbacks/wet/ranker=random``) drops the smoke
    # settings of the node it replaced
    replaced = [a.split("=", 1)[0].lstrip("+~").replace("/", ".") + "." for a in command.overrides if "=" in a]
    smoke = [s for s in smoke if not any(s.lstrip("+~").startswith(node) for node in replaced)]
    return [*CHEAP, *smoke]


def run_documented(command: Command, cwd: Path, model_dir: Path, cache_dir: Path) -> subprocess.CompletedProcess:
    argv = [with_model(a, model_dir, newest_export(cwd)) for a in command.argv]
    if command.is_train:
        argv = [*argv, *cheap_settings(command)]
    program = [sys.executable, str(REPO_ROOT / "train.py")] if command.is_train else [sys.executable, *argv[1:2]]
    rest = argv[2:] if argv[0] == "python" else argv[1:]
    env = {k: v for k, v in os.environ.items() if k != "ZOO_LOG_DIR"}
    env.update(dict(command.env), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", ZOO_CACHE_DIR=str(cache_dir))
    return subprocess.run(
        [*program, *rest], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("page", DOC_FILES, ids=[str(p.relative_to(REPO_ROOT)) for p in DOC_FILES])
def test_the_commands_of_a_page_run_as_written(page, small_model, tmp_path_factory):
    """The page's commands, in order, from one empty directory (a later command may use an earlier one's run)."""
    commands = documented_commands(page)
    runnable = [c for c in commands if skip_reason(c) is None]
    if not runnable:
        pytest.skip("no runnable command: " + "; ".join(f"{c.where} ({skip_reason(c)})" for c in commands))
    cwd = tmp_path_factory.mktemp("cwd")
    cache = tmp_path_factory.getbasetemp() / "docs_cache"
    failures = []
    for command in runnable:
        write_data_files(command, cwd)
        done = run_documented(command, cwd, small_model, cache)
        if done.returncode != 0:
            failures.append(f"{command.where}: {command.text}\n  exit {done.returncode}: {done.stderr[-1500:]}")
    assert not failures, "\n".join(failures)
