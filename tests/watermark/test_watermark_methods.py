"""The sentence-watermark methods as configs: +method=xguard, +method=semstamp, +method=ksemstamp compose the same
callback and decoder and differ only in the partition (and its margin); module/decoder=semantic_watermark puts the
decoder on any generating module."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.callbacks import WatermarkCallback
from zoo.cli.train import check_methods
from zoo.watermark import BalancedPartitioner, KMeansPartitioner, LSHPartitioner, SemanticWatermarkDecoder

METHODS = {"xguard": BalancedPartitioner, "semstamp": LSHPartitioner, "ksemstamp": KMeansPartitioner}
CHEAP = [
    "callbacks.watermark.decoder.scheme.encoder=hashing:64",
    "callbacks.watermark.decoder.scheme.partition.corpus_size=120",
]


@pytest.mark.parametrize(("method", "partition_cls"), list(METHODS.items()))
def test_each_method_builds_the_watermark_callback_with_its_partition(method, partition_cls, train_cfg, tmp_path):
    cfg = train_cfg([f"+method={method}", *CHEAP])
    info = check_methods(cfg)[method]
    assert info["kind"] == "callback"
    assert cfg.task._target_ == "zoo.data.topic_sentences.TopicText"
    callback = instantiate(cfg.callbacks.watermark)
    assert isinstance(callback, WatermarkCallback)
    assert isinstance(callback.decoder, SemanticWatermarkDecoder)
    scheme = callback.decoder.scheme
    assert type(scheme.partitioner) is partition_cls and scheme.partitioner.num_regions == 8
    assert scheme.key == 42 and scheme.gamma == 0.25
    # fit once, kept in the artifact cache of the run's paths.cache_dir
    assert list((tmp_path / "cache" / "watermark_partition").glob("*/partition.safetensors"))


def test_the_three_methods_differ_only_in_partition_kind_and_margin(train_cfg):
    nodes = {}
    for method in METHODS:
        watermark = OmegaConf.to_container(train_cfg([f"+method={method}"]).callbacks.watermark, resolve=True)
        decoder = watermark["decoder"]
        nodes[method] = (decoder["scheme"]["partition"].pop("kind"), decoder.pop("margin"), watermark)
    assert [kind for kind, _, _ in nodes.values()] == ["balanced", "lsh", "kmeans"]
    assert nodes["semstamp"][1] == nodes["ksemstamp"][1] == 0.01  # MarkLLM margin_m
    assert nodes["xguard"][2] == nodes["semstamp"][2] == nodes["ksemstamp"][2]


def test_the_decoder_group_puts_the_watermark_on_a_generating_module(train_cfg):
    cfg = train_cfg(["+method=sft", "module/decoder=semantic_watermark", "module.decoder.scheme.encoder=hashing:64"])
    decoder = instantiate(cfg.module.decoder, _convert_="all")
    assert isinstance(decoder, SemanticWatermarkDecoder)
    assert decoder.spec.partition.kind == "balanced" and decoder.max_trials == 100
