"""Sentence watermarks: sentences/s of watermarked vs unwatermarked generation, encoder and detection throughput.

    python benchmarks/watermark.py [--policy <export dir>] [--rows 16] [--sentences 5] [--repeats 3] [--threads 1]

Generation: the tiny LM trained on multi-topic text (``+method=sft task=topic_text``, the X-Guard demo's recipe,
built once through the artifact cache, or ``--policy``) writes ``--sentences`` sentences after each of ``--rows``
prompts, in one batch:

* ``sentences`` -- :class:`~zoo.watermark.SemanticWatermarkDecoder` with ``max_trials = 1``: the same sentence loop
  without rejection (the unwatermarked baseline of the watermark);
* ``semstamp`` / ``ksemstamp`` / ``xguard`` -- watermarked (8 candidates per round, ``max_trials`` 100, the
  methods' margins), MiniLM encoder.

Arms run interleaved (A B C ... A B C ...), ``--repeats`` times; the table gives the median and the spread
(min-max) of sentences/s and the ratio of medians to ``sentences``. Encoders: sentences/s of MiniLM and the hashing
encoder on 512 grammar sentences. Detection: texts/s of :func:`~zoo.watermark.detect` on 64 texts of 6 sentences.
Writes the ``## Sentence watermarks`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from _results import write_section

from zoo.backbones import TinyBackbone
from zoo.data.topic_sentences import TopicText
from zoo.generation import generate_text
from zoo.protocols import SamplingParams
from zoo.text.topics import TopicGrammar
from zoo.watermark import SemanticWatermarkDecoder, detect
from zoo.watermark.fitting import shared_encoder

METHODS = {"semstamp": ("lsh", 0.01), "ksemstamp": ("kmeans", 0.01), "xguard": ("balanced", 0.05)}
SENTENCE_TOKENS = 110


# the generator's recipe of the X-Guard demo (conf/demo/xguard.yaml, backbone.init_from): the same cached model
TOPIC_LM = [
    "+method=sft",
    "task=topic_text",
    "datamodule.max_length=208",
    "module.generate_on_eval=false",
    "datamodule.source.num_train=19200",
    "trainer.max_epochs=4",
]


def topic_lm() -> str:
    """The export of the tiny LM trained on ``task=topic_text`` (the artifact cache builds it on first use)."""
    from zoo.cli.artifacts import train_artifact

    return str(train_artifact("topic_lm", TOPIC_LM, name="topic_text", reason="the watermark benchmark"))


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    count = fn()
    return count, time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=None, help="export of a topic_text LM (default: the cached artifact)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    policy = args.policy or topic_lm()
    backbone = TinyBackbone(init_from=policy)
    model, tokenizer = backbone.build_model().eval(), backbone.tokenizer
    prompts = [e.prompt for e in TopicText().examples(args.rows, seed=321)]
    budget = args.sentences * SENTENCE_TOKENS
    params = SamplingParams(budget, do_sample=True, temperature=0.7)
    window = {"context_sentences": 1, "sentence_max_tokens": SENTENCE_TOKENS, "max_sentences": args.sentences}
    decoders: dict[str, SemanticWatermarkDecoder] = {}
    for name, (kind, margin) in METHODS.items():
        scheme = {"encoder": "minilm", "partition": {"kind": kind}, "key": 42}
        decoders[name] = SemanticWatermarkDecoder(scheme, margin=margin, candidates_per_round=8, **window)
        decoders[name].scheme  # noqa: B018 - load MiniLM and fit the partition before timing
    plain = decoders["xguard"].unwatermarked()
    trials: dict[str, list[float]] = {name: [] for name in METHODS}

    def run_decoder(name: str, decoder: SemanticWatermarkDecoder) -> Callable[[], float]:
        def go() -> float:
            out = generate_text(model, tokenizer, prompts, params, torch.Generator().manual_seed(0), decoder)
            if name in trials:
                trials[name].append(out.mean_trials)
            return float(len(out.samples))

        return go

    arms = {"sentences": run_decoder("sentences", plain)}
    arms.update({name: run_decoder(name, decoder) for name, decoder in decoders.items()})
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, fn in arms.items():
            count, seconds = timed(fn)
            rates[name].append(count / seconds)
            print(f"{name}: {count:.0f} sentences in {seconds:.1f}s")

    base = statistics.median(rates["sentences"])
    rows = [
        "| decoder | sentences/s: median (min-max) | ratio vs `sentences` | mean trials / sentence |",
        "|---|---|---|---|",
    ]
    for name, values in rates.items():
        mean_trials = f"{statistics.mean(trials[name]):.2f}" if trials.get(name) else "1 (no rejection)"
        rows.append(f"| `{name}` | {spread(values)} | {statistics.median(values) / base:.2f}x | {mean_trials} |")

    sentences = TopicGrammar().corpus(512, seed=5)
    encoder_rows = ["| encoder | sentences/s: median (min-max) |", "|---|---|"]
    for spec in ("minilm", "hashing:256"):
        encoder = shared_encoder(spec)
        values = []
        for _ in range(args.repeats):
            _, seconds = timed(lambda encoder=encoder: float(len(encoder.encode(sentences))))
            values.append(len(sentences) / seconds)
        encoder_rows.append(f"| `{spec}` | {spread(values)} |")

    texts = [" ".join(TopicGrammar().corpus(6, seed=1000 + i)) for i in range(64)]
    detect_rows = ["| detection (xguard partition) | texts/s: median (min-max) |", "|---|---|"]
    for spec in ("minilm", "hashing:256"):
        scheme_spec = {"encoder": spec, "partition": {"kind": "balanced"}, "key": 42}
        scheme = SemanticWatermarkDecoder(scheme_spec).scheme
        values = []
        for _ in range(args.repeats):
            _, seconds = timed(lambda scheme=scheme: float(sum(detect(t, scheme).num_scored for t in texts)))
            values.append(len(texts) / seconds)
        detect_rows.append(f"| encoder `{spec}` | {spread(values)} |")

    body = "\n".join(
        [
            f"`python benchmarks/watermark.py --rows {args.rows} --sentences {args.sentences} --repeats "
            f"{args.repeats} --threads {args.threads}`: the tiny Llama trained on `task=topic_text` writes "
            f"{args.sentences} sentences after each of {args.rows} prompts in one batch (temperature 0.7, one "
            "sentence of context, 8 candidates per round, `max_trials` 100, gamma 0.25, 8 regions, MiniLM). Arms "
            "interleaved; `sentences` is the same sentence loop without rejection (`max_trials` 1). The machine is "
            "a shared 2-core CPU that other jobs were loading: "
            "absolute rates are noisy, ratios within one run are the measurement.",
            "",
            *rows,
            "",
            "Encoder throughput (512 grammar sentences):",
            "",
            *encoder_rows,
            "",
            "Detection throughput (64 texts of 6 sentences; one encoder call per text):",
            "",
            *detect_rows,
        ]
    )
    print(body)
    if not args.no_write:
        write_section("Sentence watermarks", body)


if __name__ == "__main__":
    main()
