"""Detection: the closed-form z, calibration on unwatermarked text, prompt invariance, bad inputs, the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import cache

import pytest
import torch
from wm_helpers import ENCODER, GRAMMAR, fitted

from zoo.errors import ConfigError, DataError
from zoo.watermark import RejectionSampler, WatermarkScheme, detect, green_regions, z_score
from zoo.watermark.detect import main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = 2024


def scheme(key: int = KEY, kind: str = "balanced") -> WatermarkScheme:
    return WatermarkScheme(ENCODER, fitted(kind), key=key, gamma=0.25)


@cache
def watermarked(prompt: str = "The morning fog covered the bridge.") -> str:
    sampler = RejectionSampler(scheme(), max_trials=80, candidates_per_round=8)
    return sampler.generate(GRAMMAR.proposer(7), prompt, 10).text


@pytest.mark.parametrize(("num_green", "num_sentences", "gamma"), [(5, 10, 0.25), (0, 7, 0.5), (20, 20, 0.125)])
def test_z_score_is_the_closed_form(num_green, num_sentences, gamma):
    expected = (num_green - gamma * num_sentences) / math.sqrt(num_sentences * gamma * (1 - gamma))
    assert z_score(num_green, num_sentences, gamma) == pytest.approx(expected, rel=1e-12)


def test_z_score_refuses_bad_arguments():
    with pytest.raises(ConfigError, match="gamma"):
        z_score(1, 4, 1.0)
    with pytest.raises(DataError, match="undefined"):
        z_score(0, 0, 0.25)
    with pytest.raises(DataError, match="num_green=5"):
        z_score(5, 4, 0.25)


def test_detection_counts_green_sentences_two_to_n():
    text = watermarked()
    result = detect(text, scheme())
    partition = fitted("balanced")
    regions = partition.assign(ENCODER.encode(result.sentences)).tolist()
    assert result.regions == regions and len(regions) == 10
    expected_green = [int(r) in green_regions(KEY, p, 8, 0.25).tolist() for p, r in zip(regions, regions[1:])]
    assert result.green == [None, *expected_green]
    assert result.num_scored == 9 and result.num_green == sum(expected_green)
    assert result.z == pytest.approx(z_score(sum(expected_green), 9, 0.25))
    assert result.detected and result.z > result.threshold
    # with another key the same text is not detected
    assert not detect(text, scheme(key=KEY + 1)).detected


def test_unwatermarked_green_fraction_within_binomial_interval_of_gamma():
    # human-like text (grammar sentences, independent topics), 24 keys x 5 texts x 11 sentences = 1200 scored
    green = scored = 0
    for key in range(24):
        s = scheme(key=key)
        for t in range(5):
            text = " ".join(GRAMMAR.corpus(11, seed=10_000 + 100 * key + t))
            result = detect(text, s)
            green, scored = green + result.num_green, scored + result.num_scored
    assert scored == 24 * 5 * 10
    half_width = 3.29 * math.sqrt(0.25 * 0.75 / scored)  # 99.9% normal interval of a binomial proportion
    assert abs(green / scored - 0.25) < half_width, green / scored


def test_detection_with_the_prompt_scores_every_generated_sentence():
    """The sampler keys sentence 1 on the prompt's last sentence; given ``prompt=``, the detector does too, so all
    ``n`` sentences are scored (``n - 1`` without the prompt). The prompt is stripped when it is in front."""
    prompt = "The morning fog covered the bridge."
    text = watermarked(prompt)
    reference = detect(text, scheme())
    for given in (f"{prompt} {text}", text):
        with_prompt = detect(given, scheme(), prompt=prompt)
        assert with_prompt.sentences == reference.sentences and with_prompt.regions == reference.regions
        assert with_prompt.num_scored == len(with_prompt.sentences) == 10
        assert with_prompt.green[1:] == reference.green[1:]
        assert with_prompt.green[0] is True  # the first sentence was sampled green given the prompt
        assert with_prompt.num_green == reference.num_green + 1
        assert with_prompt.z == pytest.approx(z_score(with_prompt.num_green, 10, 0.25))
    for other in ["Investors sold new bonds. The market fell.", ""]:  # sentence 1 keyed on another region
        expected = scheme().context_region(other)
        keyed = detect(f"{other} {text}", scheme(), prompt=other)
        assert keyed.num_scored == 10 and keyed.green[1:] == reference.green[1:]
        first = int(reference.regions[0]) in green_regions(KEY, expected, 8, 0.25).tolist()
        assert keyed.green[0] == first


def test_degenerate_texts_have_documented_results():
    empty = detect("   \n", scheme())
    assert empty.z is None and not empty.detected and empty.num_scored == 0 and "empty" in empty.note
    single = detect("The chef baked fresh bread.", scheme())
    assert single.z is None and not single.detected and "undefined" in single.note
    assert single.regions and single.green == [None]


@pytest.fixture
def partition_file(tmp_path):
    return fitted("balanced").save(tmp_path / "xguard", encoder=ENCODER.name)


def test_cli_reports_regions_and_z(partition_file, tmp_path, capsys):
    text_file = tmp_path / "text.txt"
    text_file.write_text(watermarked())
    assert main(["--key", str(KEY), "--partition", str(partition_file), str(text_file)]) == 0
    out = capsys.readouterr().out
    result = detect(watermarked(), scheme())
    assert f"z = {result.z:.3f}" in out and "detected: yes" in out
    for i, region in enumerate(result.regions, start=1):
        assert f"{i:3d} [" in out and f"region {region:3d}" in out
    assert main(["--key", str(KEY), "--partition", str(partition_file), "--json", str(text_file)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["regions"] == result.regions and record["z"] == pytest.approx(result.z)


def test_cli_degenerate_and_bad_inputs(partition_file, tmp_path, capsys):
    empty, single = tmp_path / "empty.txt", tmp_path / "single.txt"
    empty.write_text("")
    single.write_text("The chef baked fresh bread.")
    args = ["--key", "1", "--partition", str(partition_file)]
    assert main([*args, str(empty), str(single)]) == 0
    out = capsys.readouterr().out
    assert "empty text" in out and "z undefined: a single sentence" in out
    assert main([*args, "--encoder", "hashing:64", str(single)]) == 2
    assert "gives 64-dim embeddings but the partition was fit on 128-dim" in capsys.readouterr().err
    assert main([*args, "--gamma", "1.5", str(single)]) == 2
    assert "gamma" in capsys.readouterr().err
    assert main(["--key", "1", "--partition", str(tmp_path / "nope.safetensors"), str(single)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err


def test_cli_runs_as_a_module(partition_file, tmp_path):
    text_file = tmp_path / "text.txt"
    text_file.write_text(watermarked())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "zoo.watermark.detect", "--key", str(KEY), "--partition", str(partition_file)]
    done = subprocess.run([*command, str(text_file)], capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert "detected: yes" in done.stdout


@pytest.mark.parametrize("module", ["zoo.watermark.detect", "zoo.watermark.fitting"])
def test_the_command_line_tools_start_without_a_runpy_warning(module):
    """``python -m zoo.watermark.<tool>`` imports the package first: it must not have imported the tool's module
    already (runpy's 'found in sys.modules' RuntimeWarning on every call); the package's names still resolve, and
    ``zoo.watermark.detect`` stays the function after the submodule is imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
    )
    assert done.returncode == 0 and "usage: python -m " + module in done.stdout, done.stderr
    assert "RuntimeWarning" not in done.stderr
    script = (
        "import zoo.watermark as w, zoo.watermark.detect, inspect; "
        "assert inspect.isfunction(w.detect); [getattr(w, n) for n in w.__all__]; "
        "from zoo.watermark import detect, SemanticWatermarkDecoder; assert inspect.isfunction(detect)"
    )
    checked = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    assert checked.returncode == 0, checked.stderr


def test_green_sets_do_not_depend_on_the_embedding_device():
    # regions are computed in float64 on CPU whatever the input device/dtype; green sets from a CPU generator
    embeddings = ENCODER.encode(GRAMMAR.corpus(20, seed=3))
    partition = fitted("balanced")
    assert torch.equal(partition.assign(embeddings), partition.assign(embeddings.double()))
    if torch.cuda.is_available():
        assert torch.equal(partition.assign(embeddings), partition.assign(embeddings.cuda()))
