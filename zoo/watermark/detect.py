"""Detection of sentence-level watermarks: a one-sided z-test over the scored sentences at a fixed threshold.

Sentence ``t`` is green when its region lies in ``G(key, region(sentence t-1))``. Sentence 1 is keyed on the
prompt's last sentence (:meth:`~zoo.watermark.sampler.WatermarkScheme.context_region`, as the samplers key it): given
``prompt=``, all ``n`` sentences are scored; without the prompt, sentence 1 cannot be scored and ``n - 1`` are. With
``m`` scored sentences, ``n_g`` of them green,

    z = (n_g - gamma m) / sqrt(m gamma (1 - gamma))

is compared with a fixed threshold (SemStamp's detection uses 3.0 [code]; fixed thresholds, not ones tuned per
text set, are what a deployment can use, THU-BPM/MarkLLM#32).

Results for degenerate inputs (documented, no exception, so batch evaluation never stops):

* empty or whitespace-only text -> ``z = None``, ``detected = False``, ``note`` says the text is empty;
* a single sentence without the prompt -> ``z = None``, ``detected = False``, ``note`` says z is undefined (no
  sentence is scored).

Errors: a partition whose dimension differs from the encoder's, ``gamma`` outside ``(0, 1)`` or with a
fractional ``gamma R``, a missing partition file (:class:`~zoo.errors.ConfigError` /
:class:`~zoo.errors.CheckpointNotFoundError`).

Command line (exit status 0 after a detection, 2 on an error)::

    python -m zoo.watermark.detect --key 42 --partition partitions/xguard.safetensors text.txt [more.txt ...]
        [--encoder minilm|hashing:<dim>|<dir>] [--gamma 0.25] [--threshold 3.0] [--prompt-file prompt.txt] [--json]

The encoder defaults to the one recorded with the partition.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.errors import ConfigError, DataError, ZooError
from zoo.text.encoders import load_encoder
from zoo.watermark.green import check_gamma
from zoo.watermark.partition import load_partitioner
from zoo.watermark.sampler import WatermarkScheme
from zoo.watermark.sentences import split_sentences

DEFAULT_Z_THRESHOLD = 3.0


def z_score(num_green: int, num_sentences: int, gamma: float) -> float:
    """``(n_g - gamma n) / sqrt(n gamma (1 - gamma))``: the one-proportion z statistic of ``n_g`` green out of ``n``.

    Raises:
        ConfigError: ``gamma`` not in ``(0, 1)``.
        DataError: ``num_sentences < 1`` (z is undefined) or ``num_green`` outside ``[0, num_sentences]``.
    """
    gamma = check_gamma(gamma)
    if num_sentences < 1:
        raise DataError(f"z is undefined for {num_sentences} scored sentences (needs at least 1)")
    if not 0 <= num_green <= num_sentences:
        raise DataError(f"num_green={num_green} is not in [0, num_sentences={num_sentences}]")
    return (num_green - gamma * num_sentences) / math.sqrt(num_sentences * gamma * (1.0 - gamma))


@dataclass
class DetectionResult:
    """Outcome of :func:`detect`.

    Attributes:
        sentences: the sentences of the text (the prompt removed when it was given and found).
        regions: region of each sentence.
        green: per sentence, whether it is green given the previous one (sentence 1: given the prompt's last
            sentence when the prompt was given, else None, not scored).
        num_scored: sentences scored (``len(sentences)`` with the prompt, else ``len(sentences) - 1``, at least 0).
        num_green: green sentences among the scored ones.
        gamma: the green fraction tested against.
        z: the z statistic (None when no sentence is scored).
        threshold: the fixed threshold.
        detected: ``z is not None and z > threshold``.
        note: why ``z`` is None (empty otherwise).
    """

    sentences: list[str]
    regions: list[int]
    green: list[bool | None]
    num_scored: int
    num_green: int
    gamma: float
    z: float | None
    threshold: float
    detected: bool
    note: str = ""

    @property
    def green_fraction(self) -> float | None:
        """``num_green / num_scored`` (None when nothing is scored)."""
        return self.num_green / self.num_scored if self.num_scored else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "green_fraction": self.green_fraction}


def strip_prompt(text: str, prompt: str | None) -> str:
    """``text`` without a leading ``prompt`` (compared after stripping whitespace); unchanged otherwise."""
    if not prompt or not prompt.strip():
        return text
    head, body = prompt.strip(), text.lstrip()
    return body[len(head) :] if body.startswith(head) else text


def detect(
    text: str,
    scheme: WatermarkScheme,
    *,
    threshold: float = DEFAULT_Z_THRESHOLD,
    prompt: str | None = None,
) -> DetectionResult:
    """Run the z-test on ``text``.

    Args:
        text: the generated text (with or without the prompt in front).
        scheme: the encoder, partition, key and gamma used for generation.
        threshold: fixed z threshold; detected when ``z > threshold``.
        prompt: the prompt the text was generated after (``""``: an empty prompt). If ``text`` starts with it, it is
            removed before splitting (MarkLLM returns prompt + generation and users then detect on both,
            THU-BPM/MarkLLM#65); its last sentence keys sentence 1, which is then scored. ``None``: unknown, sentence
            1 is not scored.
    """
    sentences = split_sentences(strip_prompt(text, prompt))
    regions = [int(r) for r in scheme.regions(sentences)[0]]
    if prompt is None:
        green: list[bool | None] = [None] * min(1, len(sentences))
        scored, previous = regions[1:], regions[:-1]
    else:
        green, scored, previous = [], regions, [scheme.context_region(prompt), *regions[:-1]]
    if scored:
        green += [bool(f) for f in scheme.green.is_green(torch.tensor(scored), torch.tensor(previous))]
    num_scored = len(scored)
    num_green = sum(bool(g) for g in green)
    z: float | None = None
    if not sentences:
        note = "empty text: no sentence to score"
    elif num_scored == 0:
        note = (
            "z undefined: a single sentence (sentence 1 is keyed on the prompt and not scored without it; give the "
            "prompt or need >= 2)"
        )
    else:
        note = ""
        z = z_score(num_green, num_scored, scheme.gamma)
    return DetectionResult(
        sentences=sentences,
        regions=regions,
        green=green,
        num_scored=num_scored,
        num_green=num_green,
        gamma=scheme.gamma,
        z=z,
        threshold=float(threshold),
        detected=z is not None and z > threshold,
        note=note,
    )


def build_scheme(partition: str | Path, key: int, gamma: float, encoder: str | None = None) -> WatermarkScheme:
    """Load a saved partition and its encoder (``encoder`` overrides the one recorded with the partition)."""
    check_gamma(gamma)
    partitioner, recorded = load_partitioner(partition)
    spec = encoder or recorded
    if spec is None:
        raise ConfigError(
            f"partition {str(partition)!r} records no encoder: pass --encoder (minilm, hashing:<dim> or a directory)"
        )
    try:
        return WatermarkScheme(load_encoder(spec), partitioner, key, gamma)
    except ConfigError as err:
        raise ConfigError(f"partition {str(partition)!r}: {err}") from err


def _format(path: str, result: DetectionResult) -> str:
    lines = [f"{path}: {len(result.sentences)} sentences, {result.num_scored} scored, {result.num_green} green"]
    for i, (sentence, region, green) in enumerate(zip(result.sentences, result.regions, result.green), start=1):
        mark = "-" if green is None else ("G" if green else ".")
        lines.append(f"  {i:3d} [{mark}] region {region:3d}  {sentence[:80]}")
    if result.z is None:
        lines.append(f"  z: undefined ({result.note}); detected: no")
    else:
        verdict = "yes" if result.detected else "no"
        test = f"gamma {result.gamma:g}, threshold {result.threshold:g}"
        lines.append(f"  z = {result.z:.3f} ({test}); detected: {verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m zoo.watermark.detect``: print per-sentence regions and the z-test of each file."""
    parser = argparse.ArgumentParser(prog="python -m zoo.watermark.detect", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="text files (UTF-8), each one generated text")
    parser.add_argument("--key", type=int, required=True, help="the secret integer key used for generation")
    parser.add_argument("--partition", required=True, help="partition .safetensors (its .json sits next to it)")
    parser.add_argument("--encoder", default=None, help="encoder spec (default: the one recorded with the partition)")
    parser.add_argument("--gamma", type=float, default=0.25, help="green fraction used for generation (default 0.25)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_Z_THRESHOLD, help="fixed z threshold")
    parser.add_argument(
        "--prompt-file",
        default=None,
        help="the prompt: removed from the front of each text; its last sentence keys sentence 1, then scored",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per file instead of the table")
    args = parser.parse_args(argv)
    try:
        scheme = build_scheme(args.partition, args.key, args.gamma, args.encoder)
        prompt = _read(args.prompt_file) if args.prompt_file else None
        for path in args.files:
            text = _read(path)
            result = detect(text, scheme, threshold=args.threshold, prompt=prompt)
            if args.json:
                sys.stdout.write(json.dumps({"file": path, **result.to_dict()}) + "\n")
            else:
                sys.stdout.write(_format(path, result) + "\n")
    except ZooError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    return 0


def _read(path: str) -> str:
    file = Path(path)
    if not file.is_file():
        raise DataError(f"text file {path!r} does not exist")
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"text file {path!r} is not UTF-8 text ({err})") from err


if __name__ == "__main__":
    raise SystemExit(main())
