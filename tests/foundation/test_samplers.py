"""The training-sampler seam (``datamodule/sampler=``): the resumable default keeps its order; the weighted
multi-source sampler draws domains in the set proportions, deterministically per (seed, batch), takes weights from
the config, a file or a callback, logs and checkpoints them, and a resumed run draws exactly the same batches."""

import json

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from zoo.cli.train import build, run
from zoo.data.samplers import ResumableSampler, WeightedDomainSampler
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition
from zoo.datamodules import SFTDataModule
from zoo.errors import ConfigError, DataError

DOMAINS = {"add": 24, "rev": 12, "sum": 4}  # 40 rows, deliberately imbalanced

SMALL_MODEL = [
    "backbone.hidden_size=32",
    "backbone.intermediate_size=64",
    "backbone.num_hidden_layers=1",
    "backbone.num_attention_heads=2",
    "backbone.num_key_value_heads=2",
]


def domain_rows():
    rows = []
    for domain, count in DOMAINS.items():
        rows += [{"prompt": f"{domain}{i}=", "completion": f"{i}", "domain": domain} for i in range(count)]
    return rows


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in domain_rows()) + "\n")
    return path


def bound(weights=None, batch_size=16, seed=0, rows=None, **kwargs):
    sampler = WeightedDomainSampler(weights=weights, **kwargs)
    sampler.bind(rows or domain_rows(), batch_size=batch_size, seed=seed, shuffle=True)
    return sampler


# -- the default ----------------------------------------------------------------------------------------------------
def test_default_datamodule_sampler_is_the_seeded_per_epoch_permutation(tokenizer):
    dm = SFTDataModule(tokenizer, TaskSource(Addition(2), num_train=24, num_val=4), batch_size=8, seed=5)
    assert isinstance(dm.sampler, ResumableSampler)
    rows = dm.source.rows("train")
    loader = dm.train_dataloader()
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        seen = [p for batch in loader for p in batch["prompts"]]
        order = torch.randperm(24, generator=torch.Generator().manual_seed(5 + epoch)).tolist()
        assert seen == [rows[i]["prompt"] for i in order]


@pytest.fixture(scope="module")
def tokenizer():
    from zoo.backbones import build_char_tokenizer

    return build_char_tokenizer()


# -- the weighted sampler: proportions, determinism ---------------------------------------------------------------
def test_weighted_proportions_converge_to_the_set_weights():
    weights = {"add": 0.2, "rev": 0.3, "sum": 0.5}  # far from the row shares 0.6 / 0.3 / 0.1
    sampler = bound(weights)
    labels = [row["domain"] for row in domain_rows()]
    counts = dict.fromkeys(weights, 0)
    for step in range(400):
        for index in sampler.batch_indices(step):
            counts[labels[index]] += 1
    total = 400 * 16
    expected = {d: w * total for d, w in weights.items()}
    chi_square = sum((counts[d] - expected[d]) ** 2 / expected[d] for d in weights)
    assert chi_square < 13.82, (counts, chi_square)  # chi-square, 2 degrees of freedom, p = 0.001
    # the row shares would be rejected by the same test
    shares = {d: n / 40 * total for d, n in DOMAINS.items()}
    assert sum((counts[d] - shares[d]) ** 2 / shares[d] for d in weights) > 100


def test_a_batch_is_a_function_of_seed_and_step_only():
    a, b = bound({"add": 1, "rev": 1, "sum": 2}), bound({"add": 1, "rev": 1, "sum": 2})
    assert [a.batch_indices(s) for s in range(5)] == [b.batch_indices(s) for s in (0, 1, 2, 3, 4)]
    assert a.batch_indices(3) == a.batch_indices(3)
    assert a.batch_indices(3) != a.batch_indices(4)
    assert bound({"add": 1, "rev": 1, "sum": 2}, seed=1).batch_indices(3) != a.batch_indices(3)
    # one epoch = len(rows) // batch_size batches; epoch e holds batches e * 2, e * 2 + 1
    a.set_epoch(1)
    assert list(a) == a.batch_indices(2) + a.batch_indices(3)


def test_zero_weight_excludes_a_domain_and_uniform_is_the_default():
    labels = [row["domain"] for row in domain_rows()]
    sampler = bound({"add": 0, "rev": 1, "sum": 1})
    drawn = {labels[i] for s in range(50) for i in sampler.batch_indices(s)}
    assert drawn == {"rev", "sum"}
    uniform = bound()
    assert uniform.weights() == pytest.approx({"add": 1 / 3, "rev": 1 / 3, "sum": 1 / 3})
    assert uniform.metrics() == pytest.approx({f"weight/{d}": 1 / 3 for d in DOMAINS})


def test_weights_from_a_file(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"add": 1.0, "rev": 3.0, "sum": 0.0}))
    sampler = bound(weights_file=str(path))
    assert sampler.weights() == pytest.approx({"add": 0.25, "rev": 0.75, "sum": 0.0})


def test_set_weights_applies_from_the_next_batch_drawn():
    labels = [row["domain"] for row in domain_rows()]
    sampler = bound({"add": 1, "rev": 1, "sum": 1}, batch_size=8)  # 5 batches per epoch
    iterator = iter(sampler)
    first = [next(iterator) for _ in range(8 * 2)]  # two batches drawn
    assert sampler.set_weights([0.0, 0.0, 1.0]) == 2  # a sequence follows the sorted domain names
    rest = list(iterator)
    assert first == sampler.batch_indices(0) + sampler.batch_indices(1)
    assert {labels[i] for i in rest} == {"sum"}
    assert sampler.weights(1) == pytest.approx({"add": 1 / 3, "rev": 1 / 3, "sum": 1 / 3})
    assert sampler.weights(2) == {"add": 0.0, "rev": 0.0, "sum": 1.0}
    # a callback's tensor of weights (e.g. DoReMi's alpha), in sorted-name order or by name
    sampler.set_weights(torch.tensor([1.0, 1.0, 2.0]))
    assert sampler.weights() == {"add": 0.25, "rev": 0.25, "sum": 0.5}
    sampler.set_weights({"add": torch.tensor(3.0), "rev": np.float32(1.0), "sum": 0})
    assert sampler.weights() == {"add": 0.75, "rev": 0.25, "sum": 0.0}


# -- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": {"add": -1.0, "rev": 1.0}}, "weight of domain 'add' is negative"),
        ({"weights": {"add": 0.0, "rev": 0.0}}, "sum to 0.0"),
        ({"weights": {"add": float("inf")}}, "must be a finite number"),
        ({"weights": {"add": "1"}}, "weight of domain 'add' must be a finite number, got '1'"),
        ({"weights": {"add": 1.0}, "weights_file": "w.json"}, "either weights or weights_file"),
        ({"weights_file": "/nonexistent/w.json"}, r"w\.json: weights file not found"),
    ],
)
def test_bad_weights_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        WeightedDomainSampler(**kwargs)


def test_unknown_or_missing_domain_names_are_config_errors():
    with pytest.raises(ConfigError, match=r"unknown \['ad', 'sub'\], missing \['add'\]"):
        bound({"ad": 1.0, "rev": 1.0, "sum": 1.0, "sub": 1.0})
    sampler = bound()
    with pytest.raises(ConfigError, match=r"set_weights: .* unknown \['mul'\]"):
        sampler.set_weights({"add": 1.0, "rev": 1.0, "sum": 1.0, "mul": 1.0})
    with pytest.raises(ConfigError, match="2 weights for 3 domains"):
        sampler.set_weights([1.0, 2.0])


def test_a_weights_file_whose_domains_do_not_match_names_the_file(tmp_path):
    path = tmp_path / "weights.json"
    path.write_text(json.dumps({"add": 1.0, "rev": 1.0, "mul": 1.0}))
    with pytest.raises(ConfigError, match=r"weights file .*weights\.json: .*unknown \['mul'\], missing \['sum'\]"):
        bound(weights_file=str(path))
    path.write_text("{'add': 1}")
    with pytest.raises(DataError, match=r"weights\.json:1: not valid JSON"):
        WeightedDomainSampler(weights_file=str(path))


def test_a_row_without_a_domain_is_a_data_error():
    rows = domain_rows()
    del rows[7]["domain"]
    with pytest.raises(DataError, match="train row 7: no 'domain' column"):
        bound(rows=rows)


# -- through Lightning: callback, logging, checkpoint, resume -----------------------------------------------------
class RecordBatches(pl.Callback):
    """Records the prompts of every training batch, by global step."""

    def __init__(self):
        self.prompts = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.prompts[trainer.global_step] = list(batch["prompts"])


class ChangeWeights(pl.Callback):
    """The way a data-mixing callback (DoReMi) acts: set the datamodule sampler's weights at given steps."""

    def __init__(self, schedule):
        self.schedule = schedule
        self.applied_from = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step in self.schedule:
            weights = self.schedule[trainer.global_step]
            self.applied_from[trainer.global_step] = trainer.datamodule.sampler.set_weights(weights)


class Killed(Exception):
    pass


class KillAt(pl.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            raise Killed


def weighted_run_cfg(train_cfg, rows_file, run_dir, extra=()):
    cfg = train_cfg(
        [
            *SMALL_MODEL,
            "datamodule=sft_jsonl",
            f"datamodule.source.train_path={rows_file}",
            f"datamodule.source.val_path={rows_file}",
            "datamodule/sampler=weighted",
            "datamodule.batch_size=8",
            "module.generate_on_eval=false",
            "trainer.max_steps=14",
            "trainer.max_epochs=-1",
            "trainer.limit_val_batches=0",
            "callbacks.model_checkpoint.every_n_train_steps=4",
            "export=false",
            *extra,
        ]
    )
    cfg.paths.output_dir = str(run_dir)
    cfg.callbacks.model_checkpoint.dirpath = str(run_dir / "checkpoints")
    return cfg


def test_weighted_run_logs_checkpoints_and_resumes_with_a_callback_changing_weights(train_cfg, rows_file, tmp_path):
    schedule = {2: {"add": 1.0, "rev": 0.0, "sum": 0.0}, 9: {"add": 0.0, "rev": 0.0, "sum": 1.0}}
    by_prompt = {row["prompt"]: row["domain"] for row in domain_rows()}

    def fit(run_dir, kill_at=None, ckpt_path=None):
        module, datamodule, trainer = build(weighted_run_cfg(train_cfg, rows_file, run_dir, ["datamodule.seed=3"]))
        record, change = RecordBatches(), ChangeWeights(schedule)
        trainer.callbacks[:0] = [record, change] + ([KillAt(kill_at)] if kill_at else [])
        if kill_at:
            with pytest.raises(Killed):
                trainer.fit(module, datamodule, ckpt_path=ckpt_path)
        else:
            trainer.fit(module, datamodule, ckpt_path=ckpt_path)
        return record, change, trainer

    full, full_change, trainer = fit(tmp_path / "full")
    assert sorted(full.prompts) == list(range(14))  # 40 rows / 8 = 5 batches per epoch: the run spans 3 epochs
    first_add_only, first_sum_only = full_change.applied_from[2], full_change.applied_from[9]
    assert 2 <= first_add_only <= 4 and 9 <= first_sum_only <= 11  # from the next batch drawn (after prefetch)
    for step, prompts in full.prompts.items():
        domains = {by_prompt[p] for p in prompts}
        if first_add_only <= step < first_sum_only:
            assert domains == {"add"}, step
        elif step >= first_sum_only:
            assert domains == {"sum"}, step
    # logged: the weights in force (latest set)
    assert trainer.callback_metrics["train/sampler/weight/sum"] == 1.0
    assert trainer.callback_metrics["train/sampler/weight/add"] == 0.0

    # kill after step 6 (checkpoint at step 4, after the first change), resume from it
    resumed_dir = tmp_path / "resumed"
    fit(resumed_dir, kill_at=6)
    last = resumed_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == 4
    saved = checkpoint["SFTDataModule"]["sampler"]
    assert saved["weights"] == {"add": 1.0, "rev": 0.0, "sum": 0.0}
    assert saved["domains"] == ["add", "rev", "sum"]
    resumed, resumed_change, _ = fit(resumed_dir, ckpt_path=str(last))
    assert sorted(resumed.prompts) == list(range(4, 14))
    assert {s: resumed.prompts[s] for s in range(4, 14)} == {s: full.prompts[s] for s in range(4, 14)}
    assert resumed_change.applied_from == {9: first_sum_only}


def test_resume_with_different_domains_is_a_config_error():
    sampler = bound()
    state = sampler.state_dict(0, 0)
    other = bound(rows=[r for r in domain_rows() if r["domain"] != "sum"])
    with pytest.raises(ConfigError, match=r"for domains \['add', 'rev', 'sum'\] but the training data has"):
        other.load_state_dict(state)


def test_state_dict_keeps_only_the_history_a_resume_needs():
    sampler = bound(batch_size=8)  # 5 batches per epoch
    iterator = iter(sampler)
    for _ in range(8 * 3):
        next(iterator)
    sampler.set_weights([1, 0, 0])  # from batch 3
    state = sampler.state_dict(0, 8 * 4)  # resume at batch 4
    assert state["history"] == [[3, [1.0, 0.0, 0.0]]]
    assert len(sampler.state_dict(0, 8 * 2)["history"]) == 2  # resume at batch 2 still needs the uniform weights
    fresh = bound(batch_size=8)
    fresh.load_state_dict(state)
    fresh.resume_at(0, 8 * 4)
    assert list(fresh) == sampler.batch_indices(4)
    assert np.allclose(list(fresh.weights().values()), [1, 0, 0])


def test_weighted_sampler_from_the_command_line_with_a_weights_file(train_cfg, rows_file, tmp_path):
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({"add": 2, "rev": 1, "sum": 1}))
    cfg = weighted_run_cfg(
        train_cfg, rows_file, tmp_path / "run", [f"datamodule.sampler.weights_file={weights}", "debug=fdr"]
    )
    metrics = run(cfg)
    assert metrics["train/sampler/weight/add"] == 0.5
    cfg = weighted_run_cfg(train_cfg, rows_file, tmp_path / "run", ["datamodule.sampler.weights={add: 1, rev: 3}"])
    with pytest.raises(ConfigError, match=r"missing \['sum'\]"):
        run(cfg)


def test_sampler_weights_logger_in_a_plain_lightning_script(tokenizer, rows_file):
    """No Hydra: the sampler and the logging callback used directly with a Trainer."""
    from zoo.backbones import TinyBackbone
    from zoo.callbacks import LogSamplerWeights
    from zoo.data.sources import JsonlSource
    from zoo.modules import CausalLMModule

    sampler = WeightedDomainSampler(weights={"add": 1.0, "rev": 1.0, "sum": 2.0})
    datamodule = SFTDataModule(tokenizer, JsonlSource(str(rows_file), str(rows_file)), batch_size=8, sampler=sampler)
    backbone = TinyBackbone(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    trainer = pl.Trainer(
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[LogSamplerWeights()],
    )
    trainer.fit(CausalLMModule(backbone, generate_on_eval=False), datamodule)
    assert trainer.callback_metrics["train/sampler/weight/sum"] == 0.5
    assert trainer.callback_metrics["train/sampler/weight/add"] == 0.25

    class NoSampler(pl.LightningDataModule):
        def train_dataloader(self):
            return datamodule.train_dataloader()

    with pytest.raises(ConfigError, match="LogSamplerWeights needs a datamodule whose `sampler` has metrics"):
        pl.Trainer(max_steps=1, logger=False, callbacks=[LogSamplerWeights()], enable_progress_bar=False).fit(
            CausalLMModule(backbone, generate_on_eval=False), NoSampler()
        )
