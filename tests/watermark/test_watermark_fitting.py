"""Partitions fit offline on a domain corpus (zoo.watermark.fitting): corpora, the pure fit, the artifact cache,
schemes from settings, the fitting CLI with the detection CLI, and bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
from wm_helpers import GRAMMAR

from zoo.artifacts import ARTIFACT_META
from zoo.errors import CheckpointNotFoundError, ConfigError, DataError
from zoo.watermark import (
    BalancedPartitioner,
    HashingEncoder,
    KMeansPartitioner,
    LSHPartitioner,
    PartitionSpec,
    SchemeSpec,
    detect,
    domain_corpus,
    fit_partition,
    load_partitioner,
)
from zoo.watermark.detect import main as detect_main
from zoo.watermark.fitting import fitted_partition, main, partition_artifact

ENCODER = HashingEncoder(64)
SMALL = {"corpus_size": 300}


def test_the_topics_corpus_is_the_seeded_grammar():
    assert domain_corpus("topics", 50, seed=3) == GRAMMAR.corpus(50, seed=3)
    assert domain_corpus("topics", 50, seed=3) != domain_corpus("topics", 50, seed=4)


def test_text_and_jsonl_corpora_are_split_into_sentences(tmp_path):
    sentences = GRAMMAR.corpus(40, seed=1)
    txt = tmp_path / "corpus.txt"
    txt.write_text(" ".join(sentences[:20]) + "\n\n" + "\n".join(sentences[20:]) + "\n")
    assert domain_corpus(str(txt), 1000) == sentences
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": " ".join(sentences[i : i + 4])}) for i in range(0, 40, 4)) + "\n")
    assert domain_corpus(str(jsonl), 1000, text_field="body") == sentences
    # more sentences than asked: a seeded subset in file order
    subset = domain_corpus(str(txt), 15, seed=2)
    assert len(subset) == 15 and subset == [s for s in sentences if s in subset]
    assert subset == domain_corpus(str(txt), 15, seed=2) != domain_corpus(str(txt), 15, seed=3)


def test_bad_corpora_name_the_file_and_line(tmp_path):
    with pytest.raises(DataError, match="neither 'topics' nor an existing"):
        domain_corpus(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "A sentence."}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: not valid JSON"):
        domain_corpus(str(bad))
    bad.write_text('{"text": "A sentence."}\n{"other": 1}\n')
    with pytest.raises(DataError, match=r"line 2: needs a string field 'text'"):
        domain_corpus(str(bad))
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(DataError, match="holds no sentence"):
        domain_corpus(str(empty))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("One sentence. Two sentences.")
    with pytest.raises(DataError, match="corpus .*tiny.txt.*needs at least 16"):
        fit_partition(PartitionSpec(corpus=str(tiny)), ENCODER)


@pytest.mark.parametrize(
    ("kind", "cls"), [("balanced", BalancedPartitioner), ("lsh", LSHPartitioner), ("kmeans", KMeansPartitioner)]
)
def test_the_fit_is_a_pure_function_of_spec_and_encoder(kind, cls):
    spec = PartitionSpec(kind=kind, seed=1, **SMALL)
    first, second = fit_partition(spec, ENCODER), fit_partition(spec, ENCODER)
    assert type(first) is cls and first.num_regions == 8 and first.dim == 64
    for name, tensor in first.state_tensors().items():
        assert torch.equal(tensor, second.state_tensors()[name]), name
    other = fit_partition(PartitionSpec(kind=kind, seed=2, **SMALL), ENCODER)
    assert any(not torch.equal(t, other.state_tensors()[n]) for n, t in first.state_tensors().items())
    # the same regions as fitting the class by hand on the corpus embeddings
    by_hand = cls(8, seed=1).fit(ENCODER.encode(GRAMMAR.corpus(300, seed=0)))
    probe = ENCODER.encode(GRAMMAR.corpus(100, seed=9))
    assert torch.equal(first.assign(probe), by_hand.assign(probe))


def test_partition_options_reach_the_partitioner_and_bad_ones_are_refused():
    spec = PartitionSpec(kind="balanced", options={"mass_balance": 0.0, "subspace_dim": 1}, **SMALL)
    partition = fit_partition(spec, ENCODER)
    assert partition.mass_balance == 0.0 and partition.subspace_dim == 1
    assert torch.equal(partition.offsets, torch.zeros(8, dtype=torch.float64))
    with pytest.raises(ConfigError, match="unknown partition kind 'voronoi'"):
        PartitionSpec(kind="voronoi").build()
    with pytest.raises(ConfigError, match="do not fit a lsh partition"):
        PartitionSpec(kind="lsh", options={"mass_balance": 1.0}).build()


def test_a_fitted_partition_is_a_trained_once_artifact(tmp_path):
    spec = PartitionSpec(kind="kmeans", seed=4, **SMALL)
    path = partition_artifact(spec, ENCODER, tmp_path)
    meta = json.loads((path.parent / ARTIFACT_META).read_text())
    assert meta["kind"] == "watermark_partition" and meta["spec"]["encoder"] == ENCODER.name
    loaded, recorded = load_partitioner(path)
    assert recorded == ENCODER.name
    assert torch.equal(loaded.centroids, fit_partition(spec, ENCODER).centroids)
    stamp = path.stat().st_mtime_ns
    assert partition_artifact(spec, ENCODER, tmp_path) == path and path.stat().st_mtime_ns == stamp  # not rebuilt
    assert partition_artifact(PartitionSpec(kind="kmeans", seed=5, **SMALL), ENCODER, tmp_path) != path
    # the scheme uses the cached artifact
    scheme = SchemeSpec(encoder="hashing:64", partition={"kind": "kmeans", "seed": 4, **SMALL}, cache_dir=str(tmp_path))
    assert torch.equal(scheme.build().partitioner.centroids, loaded.centroids)
    assert fitted_partition(spec, ENCODER) is fitted_partition(spec, ENCODER)  # once per process


def test_a_scheme_from_a_saved_file_uses_the_recorded_encoder(tmp_path):
    path = fit_partition(PartitionSpec(kind="lsh", **SMALL), HashingEncoder(32)).save(
        tmp_path / "p", encoder="hashing:32"
    )
    scheme = SchemeSpec(encoder=None, partition_file=str(path), key=5, gamma=0.5).build()
    assert scheme.encoder.dim == 32 and scheme.key == 5 and scheme.gamma == 0.5
    with pytest.raises(ConfigError, match=r"partition '.*p.safetensors'.*32-dim"):
        SchemeSpec(encoder="hashing:64", partition_file=str(path)).build()
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        SchemeSpec(partition_file=str(tmp_path / "missing.safetensors")).build()


def test_bad_scheme_settings_are_one_clear_error():
    with pytest.raises(ConfigError, match=r"gamma .* must be in \(0, 1\)"):
        SchemeSpec(gamma=1.5)
    with pytest.raises(ConfigError, match="key must be an integer"):
        SchemeSpec(key="secret")
    with pytest.raises(ConfigError, match=r"\['regions'\] are unknown"):
        SchemeSpec(partition={"regions": 8})
    with pytest.raises(ConfigError, match="needs an encoder spec"):
        SchemeSpec(encoder=None)
    with pytest.raises(ConfigError, match="gives 1.6 green regions"):
        SchemeSpec(encoder="hashing:64", gamma=0.2, partition={"kind": "lsh", **SMALL}).build()


def test_fitting_cli_writes_a_partition_the_detection_cli_reads(tmp_path, capsys):
    out = tmp_path / "parts" / "xg"
    code = main(
        [
            "--out",
            str(out),
            "--kind",
            "balanced",
            "--encoder",
            "hashing:64",
            "--size",
            "300",
            "--option",
            "mass_balance=0.5",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.strip() == f"{out}.safetensors"
    partition, recorded = load_partitioner(out)
    assert recorded == "hashing:64" and partition.mass_balance == 0.5
    text = tmp_path / "text.txt"
    text.write_text(" ".join(GRAMMAR.corpus(6, seed=1)))
    assert detect_main(["--key", "3", "--partition", f"{out}.safetensors", "--json", str(text)]) == 0
    row = json.loads(capsys.readouterr().out)
    scheme = SchemeSpec(encoder=None, partition_file=f"{out}.safetensors", key=3).build()
    assert row["z"] == pytest.approx(detect(text.read_text(), scheme).z)
    assert main(["--out", str(out), "--kind", "nope", "--encoder", "hashing:64"]) == 2
    assert "unknown partition kind 'nope'" in capsys.readouterr().err
    assert main(["--out", str(out), "--option", "novalue"]) == 2
    assert "expected name=value" in capsys.readouterr().err
