"""The GEM page (demos/gem.py) on a sweep whose outcomes the test chooses: it opens with the generated Verdict (GEM's
balance and mixing claims against k-means buckets, DoReMi and RegMix against uniform bucket weights, RegMix's held-out
rank correlation as the RegMix run logged it before its final LM), says whether the RegMix arm worked from that
correlation, has a generated Fair-test section (plateau read from the final LMs' held-out curves, RegMix's selection
split read from the runs' config) and the cross-check table naming the official code."""

from __future__ import annotations

import json

import pytest
import yaml
from sweep_files import write_metrics, write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder
from zoo.verdict import read_verdict

from conftest import REPO_ROOT

BUCKETINGS = ("kmeans", "gem")
MIXERS = ("doremi", "regmix")
SEEDS = (0, 1, 2)
K = 13
LABELS = {
    "kmeans": "k-means",
    "spherical_kmeans": "spherical k-means",
    "vmf_em": "vMF-EM (learned prior)",
    "gem": "GEM (lambda 5000)",
    "doremi": "DoReMi",
    "regmix": "RegMix",
}


def final_loss(bucketing: str, mixer: str, seed: int) -> float:
    """DoReMi 0.05 below uniform on every bucketing; RegMix 0.4 above; no bucketing effect."""
    uniform = 0.40 + 0.01 * seed
    return uniform + {"doremi": -0.05, "regmix": 0.40}[mixer]


@pytest.fixture
def make_sweep(tmp_path):
    def make(
        rhos: tuple[float, ...] = (0.05, -0.3, 0.2),
        last_change: float = 0.001,
        bucketings: tuple = BUCKETINGS,
        selection: str | None = "test",
        runtime_rho: bool = True,
        mixers: dict[str, tuple[str, ...]] | None = None,
        name: str = "sweep",
        proxy_losses: tuple[float, float] = (2.8, 3.0),
        gem_uniform_shift: float = 0.0,
        scheduler: str = "zoo.optim.one_cycle",
    ) -> Sweep:
        """``selection``: the split RegMix's proxies score on (``None``: the corpus itself, i.e. ``val``);
        ``runtime_rho``: RegMix runs log rho at step 0 (the check callback), else only their artifact has it (an
        older sweep; the artifact's value is then rho + 0.5 where the run logs rho); ``mixers``: per bucketing."""
        root = write_sweep(
            tmp_path / f"{name}{len(bucketings)}",
            {"seed": "0,1,2", "bucketing": ",".join(bucketings), "demo/gem/mixer": "doremi,regmix"},
        )
        proxy_source = {"_target_": "zoo.data.mixture_corpus.BucketedCorpusSource", "directory": "/b/export"}
        if selection is not None:
            proxy_source = {
                "_target_": "zoo.data.regmix_split.RegMixSelectionSource",
                "source": proxy_source,
                "val_split": selection,
            }
        number = 0
        for seed in SEEDS:
            for bucketing in bucketings:
                entropy = {"kmeans": 0.95, "gem": 0.99}[bucketing] + 0.002 * seed
                buckets = tmp_path / "cache" / "buckets" / f"{bucketing}{seed}"
                reference = tmp_path / "cache" / "doremi_reference" / f"{bucketing}{seed}"
                mixture = tmp_path / "cache" / "regmix_mixture" / f"{bucketing}{seed}"
                mixture.mkdir(parents=True, exist_ok=True)
                proxies = [{"mixture": {"b00": 1.0}, "loss": value} for value in proxy_losses]
                (mixture / "regmix.json").write_text(json.dumps({"spearman": [rhos[seed]] * 10, "proxies": proxies}))
                uniform = 0.40 + 0.01 * seed + (gem_uniform_shift if bucketing == "gem" else 0.0)
                for mixer in (mixers or {}).get(bucketing, MIXERS):
                    loss = final_loss(bucketing, mixer, seed)
                    artifacts = [
                        {
                            "kind": "buckets",
                            "path": str(buckets),
                            "metrics": {"bucketing/mass_entropy_ratio": entropy, "bucketing/max_share": 0.1},
                        }
                    ]
                    if mixer == "doremi":
                        artifacts.append(
                            {
                                "kind": "doremi_reference",
                                "path": str(reference),
                                "metrics": {"val/loss": uniform},
                            }
                        )
                    else:
                        built = rhos[seed] + (0.5 if runtime_rho else 0.0)
                        artifacts.append(
                            {"kind": "regmix_mixture", "path": str(mixture), "metrics": {"regmix/spearman": built}}
                        )
                        proxy = tmp_path / name / "cache" / "regmix_proxy" / f"{bucketing}{seed}"
                        proxy.mkdir(parents=True, exist_ok=True)
                        spec = {"spec": {"datamodule": {"source": proxy_source}}}
                        (proxy / "artifact.json").write_text(json.dumps(spec))
                        artifacts.append({"kind": "regmix_proxy", "path": str(proxy), "metrics": {"val/loss": 2.8}})
                    weights = [0.99] + [0.01 / (K - 1)] * (K - 1) if mixer == "regmix" else [1 / K] * K
                    run = write_run(
                        root,
                        f"{bucketing}/{mixer}/seed{seed}",
                        {"seed": seed, "bucketing": bucketing, "demo/gem/mixer": mixer},
                        {
                            "seed": seed,
                            "bucketing": bucketing,
                            "num_buckets": K,
                            "regmix_proxies": 42,
                            "regmix_proxy_steps": 30,
                            "trainer": {"max_steps": 500, "val_check_interval": 100},
                            "module": {"scheduler": {"_target_": scheduler}},
                            # as the run saves it: the weights file is the prepared path
                            "datamodule": {"batch_size": 32, "sampler": {"weights_file": "/c/weights.json"}},
                            "demo": {"labels": LABELS},
                        },
                        number,
                        info={"artifacts": artifacts},
                    )
                    logged = (
                        [{"step": 0, "regmix/spearman": rhos[seed], "regmix/spearman_lightgbm": rhos[seed] - 0.1}]
                        if mixer == "regmix" and runtime_rho
                        else []
                    )
                    write_metrics(
                        run,
                        [
                            *logged,
                            {"step": 399, "val/loss": loss / (1 + last_change)},
                            {
                                "step": 499,
                                "val/loss": loss,
                                **{f"train/sampler/weight/b{i:02d}": w for i, w in enumerate(weights)},
                            },
                        ],
                    )
                    number += 1
        return Sweep.load(root)

    return make


def build(sweep: Sweep, out) -> str:
    return load_page_builder("gem", REPO_ROOT / "demos").build(sweep, out)[0].read_text()


def test_page_opens_with_the_verdict_and_flags_a_regmix_arm_that_does_not_rank(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "## Verdict"
    verdict = read_verdict(tmp_path / "out" / "gem.md")
    # shown: GEM's masses uniform within 0.02 and above k-means', DoReMi below uniform; contradicted: RegMix above
    # uniform; within noise: the bucketing effects on the loss (uniform weights, DoReMi, RegMix) and RegMix's rho on
    # either bucketing
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (3, 5, 1)
    assert "| Uniform weights over GEM buckets give a lower held-out loss than over k-means buckets" in text
    assert "| GEM's bucket masses are uniform within 0.02 of the maximum entropy" in text
    assert "| -0.008 [-0.013, -0.003] | **shown** |" in text
    assert "| GEM's buckets are more balanced than k-means buckets (uniform prior, mass penalty) |" in text
    assert "| -0.050 [-0.050, -0.050] | **shown** |" in text  # DoReMi - uniform, paired by seed
    assert "| +0.400 [+0.400, +0.400] | **contradicted** |" in text  # RegMix - uniform
    assert text.count("**the arm did not work**") == 2  # both bucketings: rho's interval contains 0
    assert "puts 0.990 ± 0.000 on its largest bucket" in text


def test_a_regmix_regressor_that_ranks_held_out_proxies_counts_as_working(make_sweep, tmp_path):
    text = build(make_sweep(rhos=(0.6, 0.7, 0.8)), tmp_path / "out")
    assert "**the arm did not work**" not in text
    assert text.count("the arm worked as RegMix intends") == 2
    assert "| RegMix's regressor ranks held-out proxy mixtures (GEM (lambda 5000) buckets): the arm works |" in text
    assert "| +0.700 [+0.452, +0.948] | **shown** |" in text


def test_fair_test_reads_the_plateau_and_the_selection_split(make_sweep, tmp_path):
    fair = build(make_sweep(), tmp_path / "out")
    fair = fair[fair.index("## Fair test") : fair.index("## Buckets")]
    assert "over the last 100 steps +0.1% (mean over 12 LMs" in fair and "**met**" in fair
    assert "42 RegMix proxies of 30 steps (3.0× the linear regressor's K + 1 = 14 unknowns)" in fair
    assert "RegMix's proxies score their mixtures on the corpus' test split" in fair
    assert "met for the RegMix arm" in fair
    assert "**not met** for the RegMix arm" not in fair
    assert "logged by 6 of its 6 runs before their final LM's first step" in fair
    on_val = build(make_sweep(selection=None, name="onval"), tmp_path / "out3")
    on_val = on_val[on_val.index("## Fair test") : on_val.index("## Buckets")]
    assert "**not met** for the RegMix arm" in on_val
    explicit_val = build(make_sweep(selection="val", name="explicit"), tmp_path / "out4")
    assert "**not met** for the RegMix arm" in explicit_val
    # a run whose proxy artifacts are gone: the composed config (.hydra/config.yaml) says; neither: not known
    sweep = make_sweep(name="gone")
    for run in sweep.runs:
        info = json.loads((run.path / "run_info.json").read_text())
        info["artifacts"] = [a for a in info["artifacts"] if a["kind"] != "regmix_proxy"]
        (run.path / "run_info.json").write_text(json.dumps(info))
    unknown = build(Sweep.load(sweep.path), tmp_path / "out5")
    assert "**not known** for the RegMix arm" in unknown
    for run in sweep.runs:
        composed = {
            "datamodule": {
                "sampler": {
                    "weights_file": {
                        "proxy_values": {
                            "datamodule.source": {
                                "_target_": "zoo.data.regmix_split.RegMixSelectionSource",
                                "val_split": "test",
                            }
                        }
                    }
                }
            }
        }
        (run.path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(composed))
    composed_page = build(Sweep.load(sweep.path), tmp_path / "out6")
    chosen = next(line for line in composed_page.splitlines() if line.startswith("- **Chosen on a split"))
    assert "met for the RegMix arm" in chosen and "**not" not in chosen
    still_falling = build(make_sweep(last_change=-0.05), tmp_path / "out2")
    assert "-5.0%" in still_falling and "a change below 2%: **not met**" in still_falling
    # the final LMs' one-cycle schedule flattens their last interval: said; a constant rate needs no caveat
    assert "The final LMs' learning rate follows a one-cycle schedule that decays towards 0" in fair
    constant = build(make_sweep(scheduler="zoo.optim.constant", name="constant"), tmp_path / "out7")
    assert "learning rate follows" not in constant


def test_cross_check_table_names_the_official_code(make_sweep, tmp_path):
    text = build(make_sweep(), tmp_path / "out")
    table = text[text.index("## Cross-check against the official code") :]
    assert "sangmichaelxie/doremi `doremi/trainer.py`" in table and "sail-sg/regmix" in table
    for test in (
        "test_official_crosscheck.py::test_regmix_top_k_average_is_the_notebooks",
        "test_official_crosscheck.py::test_doremi_update_is_the_official_step",
    ):
        assert test in table
        name = test.split("::")[1]
        assert f"def {name}(" in (REPO_ROOT / "tests" / "mixing" / test.split("::")[0]).read_text()


def test_a_sweep_over_gem_buckets_alone_tests_the_mixers_and_says_what_is_left_out(make_sweep, tmp_path):
    text = build(make_sweep(bucketings=("gem",)), tmp_path / "out")
    verdict = read_verdict(tmp_path / "out" / "gem.md")
    # GEM's masses uniform, DoReMi below uniform weights (shown); RegMix's rho (within noise); RegMix above (contra.)
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (2, 1, 1)
    assert "k-means buckets" not in text.split("## Fair test")[0]
    assert "left out of this sweep for its CPU budget (k-means, spherical k-means, vMF-EM" in text
    assert "no balance-free bucketing is in this sweep" in text


def test_a_run_that_did_not_finish_is_left_out_and_named(make_sweep, tmp_path):
    sweep = make_sweep()
    stopped = sweep.path / "gem" / "regmix" / "seed2"
    info = json.loads((stopped / "run_info.json").read_text())
    (stopped / "run_info.json").write_text(json.dumps({k: v for k, v in info.items() if k != "finished_at"}))
    text = build(Sweep.load(sweep.path), tmp_path / "out")
    assert "**Runs that did not finish, left out of every number below:** gem/regmix/seed2." in text
    # RegMix - uniform on GEM buckets over the two finished seeds only
    assert "uniform-topic held-out loss, RegMix − uniform weights (paired by seed) | +0.400 [+0.400, +0.400]" in text
    assert "(mean of 10 splits per seed) | -0.125 [" in text  # GEM buckets' rho: seeds 0 and 1


def test_the_uniform_baseline_is_found_in_the_cache_when_another_run_built_the_weights(make_sweep, tmp_path):
    """A DoReMi run that found its weights cached lists no reference: the page takes the cached reference built for
    the same data directory, seed and steps."""
    sweep = make_sweep()
    cache = tmp_path / "cache2"
    for number, seed in enumerate(SEEDS):
        spec = {
            "datamodule": {"source": {"directory": f"/b/gem{seed}/export"}},
            "seed": seed,
            "trainer": {"max_steps": 500},
        }
        weights = cache / "doremi_weights" / f"w{seed}"
        weights.mkdir(parents=True)
        (weights / "artifact.json").write_text(json.dumps({"spec": spec, "metrics": {"val/loss": 9.0}}))
        for other, loss in ((seed + 10, 5.0), (seed, 0.5 + 0.01 * seed)):  # another seed's reference, then its own
            reference = cache / "doremi_reference" / f"r{number}-{other}"
            reference.mkdir(parents=True)
            spec_other = {**spec, "seed": other}
            (reference / "artifact.json").write_text(json.dumps({"spec": spec_other, "metrics": {"val/loss": loss}}))
        run = sweep.path / "gem" / "doremi" / f"seed{seed}"
        info = json.loads((run / "run_info.json").read_text())
        info["artifacts"] = [a for a in info["artifacts"] if a["kind"] != "doremi_reference"]
        info["artifacts"].append({"kind": "doremi_weights", "path": str(weights), "metrics": {"val/loss": 9.0}})
        (run / "run_info.json").write_text(json.dumps(info))
    text = build(Sweep.load(sweep.path), tmp_path / "out")
    # GEM row: the cached references (0.50, 0.51, 0.52), not the DoReMi proxy's 9.0 nor another seed's 5.0
    assert "| GEM (lambda 5000) | 0.510 ± 0.010 [" in text


def test_rho_is_the_one_the_run_logged_before_its_final_lm(make_sweep, tmp_path):
    """The runs log rho at step 0 (callbacks/regmix_check.py); the page reads that, not the artifact's build metric
    (set 0.5 higher here), and shows LightGBM's rho on the same proxies; a sweep whose runs logged none falls back."""
    text = build(make_sweep(rhos=(0.6, 0.7, 0.8)), tmp_path / "out")
    assert "| +0.700 [+0.452, +0.948] | **shown** |" in text
    assert "LightGBM (the official regressor) on the same proxies and splits: held-out rho 0.600 ± 0.100" in text
    older = build(make_sweep(rhos=(0.6, 0.7, 0.8), runtime_rho=False, name="older"), tmp_path / "out2")
    assert "| +0.700 [+0.452, +0.948] | **shown** |" in older and "LightGBM (the official" not in older
    assert "logged by 0 of its 6 runs" in older


def test_the_k_means_half_with_doremi_alone(make_sweep, tmp_path):
    """The sweep the page comes from when RegMix runs over GEM buckets only: GEM vs k-means through DoReMi, RegMix's
    claims on GEM buckets, and the page names the arm left out."""
    sweep = make_sweep(mixers={"kmeans": ("doremi",), "gem": ("doremi", "regmix")}, name="half")
    text = build(sweep, tmp_path / "out")
    verdict = read_verdict(tmp_path / "out" / "gem.md")
    # shown: GEM uniform within 0.02, more balanced than k-means, DoReMi below uniform; not shown: uniform weights'
    # and DoReMi's loss GEM vs k-means (equal), RegMix's rho; contradicted: RegMix above uniform
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (3, 3, 1)
    assert "DoReMi over GEM buckets gives a lower held-out loss than over k-means buckets" in text
    assert "RegMix over GEM buckets gives" not in text
    assert "the arms left out for its CPU budget (RegMix over k-means buckets)" in text
    assert "RegMix over k-means buckets: no regressor" not in text
    table = text[text.index("## Mixing") : text.index("## Reading")]
    assert "| k-means | 0.410 ± 0.010 [0.385, 0.435] | 0.360 ± 0.010 [0.335, 0.385] | — |" in table


def test_the_reading_compares_the_proxies_regime_with_the_final_lms(make_sweep, tmp_path):
    """The RegMix reading gives the proxies' held-out losses (from regmix.json) beside the uniform-weight and final
    LMs'; it says the regimes differ only when the proxies' lowest loss is over twice the uniform LM's."""
    text = build(make_sweep(), tmp_path / "out")
    assert "Its proxies (30 steps) end at held-out losses 2.800 ± 0.000 to 3.000 ± 0.000" in text
    assert "the uniform-weight LM of 500 steps at 0.410 ± 0.010" in text
    assert text.count("more than twice the loss the final LMs reach") == 2
    close = build(make_sweep(proxy_losses=(0.7, 0.9), name="close"), tmp_path / "out2")
    assert "end at held-out losses 0.700 ± 0.000 to 0.900 ± 0.000" in close
    assert "more than twice the loss" not in close


def test_uniform_weights_over_gem_buckets_can_lose_to_k_means_buckets(make_sweep, tmp_path):
    text = build(make_sweep(gem_uniform_shift=0.2, name="shift"), tmp_path / "out")
    row = next(line for line in text.splitlines() if line.startswith("| Uniform weights over GEM buckets"))
    assert "| +0.200 [" in row and row.endswith("| **contradicted** |")
