"""Shared test set-up: offline Hugging Face, one thread per core (torch and OpenMP), Hydra composition helpers."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one OpenMP thread per worker and per process a test launches (DDP ranks, app runs): `pytest -n 2` on two cores
    # already fills both, and an OpenMP team that waits for a core it cannot get spins (LightGBM's fits took 36 s
    # instead of 2 s beside a busy worker)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

# two cores: two threads in a serial run, one per worker in a parallel one (`pytest -n 2`)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

REPO_ROOT = Path(__file__).resolve().parents[1]


def compose_train(overrides: list[str], tmp_path: Path, cache_dir: Path | None = None) -> DictConfig:
    """Compose ``train.yaml`` as ``python train.py <overrides>`` would, with run dirs under ``tmp_path``."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="zoo.conf", version_base="1.3"):
        cfg = compose(
            config_name="train",
            overrides=[
                f"hydra.run.dir={tmp_path / 'run'}",
                f"hydra.runtime.output_dir={tmp_path / 'run'}",
                f"hydra.runtime.cwd={REPO_ROOT}",
                f"paths.log_dir={tmp_path / 'logs'}",
                f"paths.cache_dir={cache_dir or tmp_path / 'cache'}",
                *overrides,
            ],
            return_hydra_config=True,
        )
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.root_dir = str(REPO_ROOT)
    return cfg


@pytest.fixture
def train_cfg(tmp_path: Path) -> Iterator[Callable[..., DictConfig]]:
    """Factory: ``train_cfg(["+method=sft", ...])`` -> composed config with run dirs in ``tmp_path``."""

    def make(overrides: list[str] | None = None, cache_dir: Path | None = None) -> DictConfig:
        return compose_train(list(overrides or []), tmp_path, cache_dir)

    yield make
    GlobalHydra.instance().clear()


@pytest.fixture
def zoo_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Iterator[Callable[..., tuple]]:
    """Factory: ``zoo_main(args, cwd)`` runs ``python train.py <args>`` from ``cwd`` in this process (the console entry
    point ``zoo.cli.train.main``, Hydra included) and returns ``(exit status, stdout, stderr)``."""
    from zoo.cli.train import main

    def call(args: list[str], cwd: Path) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["train.py", *args])
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield call
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def base_policy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the session, so the small test base policy is trained once: shared by the workers of a
    parallel run (``pytest -n 2``; the artifact cache's file lock lets one worker build while the others wait)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "zoo_cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("zoo_cache")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Multi-process tests (``distributed``: two gloo ranks each) run one after another on one worker of a parallel
    run (``--dist loadgroup``), so no more than three processes share the two cores."""
    for item in items:
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.xdist_group("distributed"))


# A small base-policy recipe for tests (a few seconds instead of minutes).
SMALL_BASE_POLICY = [
    "base_policy.num_train=512",
    "base_policy.max_epochs=1",
    "base_policy.batch_size=64",
]


def plain_trainer(callbacks: list | tuple = (), **kwargs: Any) -> Any:
    """A CPU Lightning trainer without logger, checkpoints or progress output (callbacks in plain scripts)."""
    import lightning.pytorch as pl

    options = {
        "accelerator": "cpu",
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        **kwargs,
    }
    return pl.Trainer(callbacks=list(callbacks), **options)


def char_tokenizer(pad: bool = True):
    """A character-level Hugging Face tokenizer built from ``tokenizers`` (printable ASCII and newline).

    ``pad=True``: ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` special tokens. ``pad=False``: the GPT-2 / Llama-3
    convention, one ``<|endoftext|>`` token for BOS and EOS and no pad token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"] if pad else ["<|endoftext|>", "<unk>"]
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*specials, *chars])}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    if pad:
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<unk>"
    )
