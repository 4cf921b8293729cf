"""Page builder of the GEM demo (arXiv 2605.26121): ``docs/results/gem.md`` + ``gem.png``.

Runs: ``OMP_NUM_THREADS=1 python train.py -m +demo=gem`` (``conf/demo/gem.yaml``); page: ``python -m zoo.report demo
gem``. Everything is read from the sweep: each run's final ``val/loss`` curve (the LM trained on its mixer's weights,
on topic-uniform held-out documents) and the weights its sampler used, and the build metrics of the prerequisites it
used (``run_info.json`` -> ``artifacts``): the bucketing (``buckets``: mass entropy, largest share, NMI, student
accuracy) and DoReMi's reference (``doremi_reference``: uniform bucket weights, the baseline). RegMix's held-out rank
correlation is the one the RegMix run logged before its final LM's first step (``regmix/spearman`` and
``regmix/spearman_lightgbm`` at step 0 of its metrics, ``callbacks/regmix_check.py``); a run without it falls back to
the build metric of its ``regmix_mixture`` prerequisite. RegMix's selection split is read from the run's config (the
proxies' source, ``zoo.data.regmix_split``).

The page opens with the Verdict (:mod:`zoo.verdict`): GEM's claims (balanced buckets; mixing over them helps) and the
two mixers' claims (DoReMi and RegMix beat uniform bucket weights; RegMix's proxies rank mixtures) as the demo tests
them. The RegMix arm counts as working only when its regressor ranks held-out proxies (rho's interval above 0); the
readings of its final LM say so.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from zoo.report import (
    Run,
    Sweep,
    artifact_values,
    build_run,
    decaying_schedule_caveat,
    last_change,
    provenance,
    pyplot,
    save_figure,
    table,
    write_page,
)
from zoo.stats import compare, fmt_stat, paired, stat
from zoo.verdict import SHOWN, Claim, seeds_note, verdict_section

PAPER = "gem"
MIXER_KEY = "demo/gem/mixer"
BUCKETINGS = ("kmeans", "spherical_kmeans", "vmf_em", "gem")
MIXERS = ("doremi", "regmix")
BUCKET_METRICS = (
    ("bucketing/mass_entropy_ratio", "mass entropy / log K"),
    ("bucketing/max_share", "largest bucket share"),
    ("bucketing/nmi", "NMI vs latent topics"),
    ("bucketing/student_accuracy", "student accuracy"),
)
WEIGHT_PREFIX = "train/sampler/weight/"
# the split the final LM is reported on (its val/loss); RegMix's proxies must select on another one
REPORTED_SPLIT = "val"
# a model is at its plateau when its held-out loss moved by less than this share over the last validation interval
PLATEAU = 0.02
# GEM's balance claim: the mass entropy of its buckets within this share of log K (uniform masses)
BALANCED = 0.02
# effects below this (nats per character, or entropy ratio) call for 5 seeds
SMALL_EFFECT = 0.02
# The official code each zoo piece was compared with, and the test that pins the comparison.
CROSS_CHECKS = (
    (
        "RegMix top-k averaging of simulated mixtures",
        "sail-sg/regmix `regression_fitting/regression.ipynb` (`np.random.dirichlet(prior_dist * 1, 100000)`, "
        "`samples[np.argsort(simulation)[0:k]]`, `np.mean(..., axis=0)`)",
        "`zoo.mixing.regmix.predict_best_mixture`",
        "`tests/mixing/test_official_crosscheck.py::test_regmix_top_k_average_is_the_notebooks`",
    ),
    (
        "RegMix held-out rank correlation",
        "sail-sg/regmix notebook (`scipy.stats.spearmanr(reg.predict(X_test), test_target)`)",
        "`zoo.mixing.regmix.spearman`",
        "`tests/mixing/test_official_crosscheck.py::test_spearman_is_scipys`",
    ),
    (
        "RegMix proxy mixtures",
        "sail-sg/regmix `mixture_config/synthesize_mixture.py` (`generate_weights_dirichlet`)",
        "`zoo.mixing.regmix.sample_mixtures`",
        "`tests/mixing/test_regmix.py` (Dir(c p) variance, strength grid, usage bound, rounding, de-duplication)",
    ),
    (
        "RegMix regressor on the official 1M-parameter proxies",
        "sail-sg/regmix `regression_fitting/regression.ipynb` (`lgb.LGBMRegressor(**hyper_params)`, early stopping 3, "
        "`spearmanr` on `data/test_*_1m.csv`)",
        "`zoo.mixing.regmix.LightGBMRegressor`",
        "`tests/mixing/test_regmix_official_data.py`",
    ),
    (
        "DoReMi domain-weight update",
        "sangmichaelxie/doremi `doremi/trainer.py` (`update_domain_weights`, `doremiv1`)",
        "`zoo.mixing.doremi.doremi_update` + `resolve_absent`",
        "`tests/mixing/test_official_crosscheck.py::test_doremi_update_is_the_official_step`",
    ),
    (
        "GEM MM updates (no official code)",
        "the paper's equations transcribed in NumPy",
        "`zoo.mixing.clustering.fit_gem`",
        "`tests/mixing/test_gem_reference.py::test_fit_gem_follows_the_paper_equations_point_by_point`",
    ),
)


def by_arm(sweep: Sweep) -> dict[tuple[str, str], dict[int, Run]]:
    """``{(bucketing, mixer): {seed: run}}`` of the finished runs (a stopped run's last loss is not its final one)."""
    out: dict[tuple[str, str], dict[int, Run]] = {}
    for run in (r for r in sweep.runs if r.finished):
        mixer = run.choice(MIXER_KEY, "doremi") or "doremi"
        out.setdefault((str(run.get("bucketing")), mixer), {})[int(run.get("seed"))] = run
    return out


def artifact_metric(run: Run, kind: str, metric: str) -> float:
    """The build metric of the run's prerequisite of ``kind`` (``nan`` when it used none)."""
    for used in run.artifacts(kind):
        value = (used.get("metrics") or {}).get(metric)
        if value is not None:
            return float(value)
    return math.nan


def uniform_loss(run: Run) -> float:
    """``val/loss`` of DoReMi's reference (uniform bucket weights) that the DoReMi run used: from the run's own
    artifacts, or from the ``run_info.json`` of its cached DoReMi weights (which lists the reference)."""
    found = artifact_metric(run, "doremi_reference", "val/loss")
    if not math.isnan(found):
        return found
    for used in run.artifacts("doremi_weights"):
        found = artifact_metric(build_run(used), "doremi_reference", "val/loss")
        if not math.isnan(found):
            return found
        found = cached_reference_loss(Path(used["path"]))
        if not math.isnan(found):
            return found
    return math.nan


def reference_key(spec: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies DoReMi's reference for a weights artifact: the data directory, the seed and the steps."""
    source = ((spec.get("datamodule") or {}).get("source")) or {}
    return source.get("directory"), spec.get("seed"), (spec.get("trainer") or {}).get("max_steps")


def cached_reference_loss(weights_dir: Path) -> float:
    """``val/loss`` of the cached ``doremi_reference`` built for the same data, seed and steps as the cached DoReMi
    weights in ``weights_dir`` (when another run built both, neither run's record lists the reference)."""
    meta = weights_dir / "artifact.json"
    if not meta.is_file():
        return math.nan
    key = reference_key(json.loads(meta.read_text()).get("spec") or {})
    for candidate in sorted((weights_dir.parent.parent / "doremi_reference").glob("*/artifact.json")):
        reference = json.loads(candidate.read_text())
        value = (reference.get("metrics") or {}).get("val/loss")
        if value is not None and reference_key(reference.get("spec") or {}) == key:
            return float(value)
    return math.nan


def run_time_rho(run: Run, metric: str = "regmix/spearman") -> float:
    """The held-out rho the RegMix run logged before its final LM trained (``callbacks/regmix_check.py``); for
    ``regmix/spearman`` a run that logged none falls back to its ``regmix_mixture`` build metric."""
    value = run.last(metric)
    if math.isnan(value) and metric == "regmix/spearman":
        return artifact_metric(run, "regmix_mixture", metric)
    return value


def selection_split(run: Run) -> str:
    """The split RegMix's proxies scored their mixtures on: their ``val`` split, which is the corpus' ``val`` unless
    their source is ``RegMixSelectionSource`` (it reads ``val`` from another split). Read from the specs of the proxy
    artifacts the run used (what the proxies trained with), else from the run's composed config; ``""`` when
    neither says."""
    for used in run.artifacts("regmix_proxy"):
        meta = Path(used["path"]) / "artifact.json"
        if meta.is_file():
            source = ((json.loads(meta.read_text()).get("spec") or {}).get("datamodule") or {}).get("source") or {}
            return selection_of(source)
    composed = run.path / ".hydra" / "config.yaml"
    if composed.is_file():
        node = yaml.safe_load(composed.read_text()) or {}
        for key in ("datamodule", "sampler", "weights_file", "proxy_values"):
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and "datamodule.source" in node:
            return selection_of(node["datamodule.source"])
    return ""


def selection_of(source: Any) -> str:
    """The split a proxy source's ``val`` reads."""
    if isinstance(source, dict) and str(source.get("_target_", "")).endswith("RegMixSelectionSource"):
        return str(source.get("val_split", "test"))
    return "val"


def regmix_report(run: Run) -> dict[str, Any]:
    """``regmix.json`` of the run's RegMix regressor (per-split rho, proxies' mixtures and losses; ``{}``: none)."""
    for used in run.artifacts("regmix_mixture"):
        path = Path(used["path"]) / "regmix.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def mixture_weights(run: Run) -> dict[str, float]:
    """The bucket weights the run's sampler used (logged ``train/sampler/weight/<bucket>``)."""
    return {k[len(WEIGHT_PREFIX) :]: v[-1][1] for k, v in run.metrics.items() if k.startswith(WEIGHT_PREFIX) and v}


def plateau_change(run: Run) -> float:
    """Relative change of the held-out loss over the last validation interval (``nan`` with fewer than two)."""
    points = [v for _, v in run.series("val/loss") if not math.isnan(v)]
    return last_change(points)


def seeded(runs: dict[int, Run], fn: Any) -> dict[int, float]:
    """``{seed: fn(run)}`` without the NaNs."""
    out = {seed: float(fn(run)) for seed, run in runs.items()}
    return {seed: value for seed, value in out.items() if not math.isnan(value)}


def final_loss(run: Run) -> float:
    return run.last("val/loss")


def entropy_ratio(weights: dict[str, float]) -> float:
    """Entropy of a mixture / log K (1 = uniform)."""
    total = sum(weights.values())
    if len(weights) < 2 or total <= 0:
        return math.nan
    probs = [w / total for w in weights.values() if w > 0]
    return -sum(p * math.log(p) for p in probs) / math.log(len(weights))


class Results:
    """The sweep's numbers, by arm and seed."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.arms = by_arm(sweep)
        self.unfinished = [r for r in sweep.runs if not r.finished]
        self.bucketings = [b for b in BUCKETINGS if any(key[0] == b for key in self.arms)]
        self.mixers = [m for m in MIXERS if any(key[1] == m for key in self.arms)]
        first = sweep.runs[0] if sweep.runs else None
        self.labels: dict[str, str] = dict(first.get("demo.labels") or {}) if first else {}

    def label(self, key: str) -> str:
        return self.labels.get(key, key)

    def runs(self, bucketing: str, mixer: str) -> dict[int, Run]:
        return self.arms.get((bucketing, mixer), {})

    def every(self, bucketing: str) -> list[Run]:
        return [run for m in self.mixers for run in self.runs(bucketing, m).values()]

    def bucket_metric(self, bucketing: str, metric: str) -> list[float]:
        return artifact_values(self.every(bucketing), "buckets", metric)

    def loss(self, bucketing: str, mixer: str) -> dict[int, float]:
        return seeded(self.runs(bucketing, mixer), final_loss)

    def uniform(self, bucketing: str) -> dict[int, float]:
        return seeded(self.runs(bucketing, "doremi"), uniform_loss)

    def rho(self, bucketing: str, metric: str = "regmix/spearman") -> dict[int, float]:
        return seeded(self.runs(bucketing, "regmix"), lambda r: run_time_rho(r, metric))

    def rho_logged_at_run_time(self) -> tuple[int, int]:
        """(RegMix runs that logged rho before their final LM, RegMix runs)."""
        runs = [r for b in self.bucketings for r in self.runs(b, "regmix").values()]
        return sum(not math.isnan(r.last("regmix/spearman")) for r in runs), len(runs)

    def has(self, bucketing: str, mixer: str) -> bool:
        return bool(self.runs(bucketing, mixer))

    def largest_weight(self, bucketing: str, mixer: str) -> list[float]:
        return [max(w.values()) for w in map(mixture_weights, self.runs(bucketing, mixer).values()) if w]

    def weight_entropy(self, bucketing: str, mixer: str) -> list[float]:
        return [entropy_ratio(w) for w in map(mixture_weights, self.runs(bucketing, mixer).values()) if w]


def claims(res: Results) -> list[Claim]:
    """GEM's and the mixers' claims as this demo tests them, over the seeds."""
    gem, base = "gem", "kmeans"
    found: list[Claim] = []
    if gem in res.bucketings:
        found.append(
            Claim(
                f"GEM's bucket masses are uniform within {BALANCED:g} of the maximum entropy (uniform prior, mass "
                "penalty)",
                "bucket mass entropy / log K − 1",
                stat(v - 1 for v in res.bucket_metric(gem, "bucketing/mass_entropy_ratio")),
                "within",
                margin=BALANCED,
            )
        )
    if gem in res.bucketings and base in res.bucketings:
        found.append(
            Claim(
                f"GEM's buckets are more balanced than {res.label(base)} buckets (uniform prior, mass penalty)",
                f"bucket mass entropy / log K, GEM − {res.label(base)}",
                compare(
                    res.bucket_metric(gem, "bucketing/mass_entropy_ratio"),
                    res.bucket_metric(base, "bucketing/mass_entropy_ratio"),
                ),
                "higher",
            )
        )
        if res.has(gem, "doremi") and res.has(base, "doremi"):
            found.append(
                Claim(
                    f"Uniform weights over GEM buckets give a lower held-out loss than over {res.label(base)} buckets "
                    "(balanced buckets as the mixing unit)",
                    f"uniform-topic held-out loss (nats/char), uniform bucket weights: GEM − {res.label(base)} buckets",
                    compare(res.uniform(gem).values(), res.uniform(base).values()),
                    "lower",
                )
            )
        for mixer in (m for m in res.mixers if res.has(gem, m) and res.has(base, m)):
            found.append(
                Claim(
                    f"{res.label(mixer)} over GEM buckets gives a lower held-out loss than over "
                    f"{res.label(base)} buckets",
                    f"uniform-topic held-out loss (nats/char), {res.label(mixer)}: GEM − {res.label(base)} buckets",
                    compare(res.loss(gem, mixer).values(), res.loss(base, mixer).values()),
                    "lower",
                )
            )
    target = gem if gem in res.bucketings else (res.bucketings[0] if res.bucketings else gem)
    if "doremi" in res.mixers:
        found.append(
            Claim(
                f"DoReMi's weights lower the held-out loss against uniform bucket weights ({res.label(target)} "
                "buckets)",
                "uniform-topic held-out loss, DoReMi − uniform weights (paired by seed)",
                paired(res.loss(target, "doremi"), res.uniform(target)),
                "lower",
            )
        )
    if "regmix" in res.mixers:
        for bucketing in (b for b in res.bucketings if res.has(b, "regmix")):
            found.append(
                Claim(
                    f"RegMix's regressor ranks held-out proxy mixtures ({res.label(bucketing)} buckets): the arm works",
                    "Spearman rho of predicted vs measured proxy loss on held-out proxies (mean of 10 splits per seed)",
                    stat(res.rho(bucketing).values()),
                    "higher",
                )
            )
        if res.has(target, "doremi") and res.has(target, "regmix"):
            found.append(
                Claim(
                    f"RegMix's mixture lowers the held-out loss against uniform bucket weights ({res.label(target)} "
                    "buckets)",
                    "uniform-topic held-out loss, RegMix − uniform weights (paired by seed)",
                    paired(res.loss(target, "regmix"), res.uniform(target)),
                    "lower",
                )
            )
    return found


def cannot_test(res: Results) -> str:
    first = res.sweep.runs[0] if res.sweep.runs else None
    steps = first.get("trainer.max_steps") if first else "?"
    left_out = [res.label(b) for b in BUCKETINGS if b not in res.bucketings]
    no_mixer = [
        f"{res.label(m)} over {res.label(b)} buckets" for b in res.bucketings for m in MIXERS if not res.has(b, m)
    ]
    return (
        "the paper's downstream accuracy gains (a 1.1B model on 25B tokens; the LMs here have about 90K parameters and "
        f"train {steps} steps on 3000 generated documents); its FastText student (a linear bag-of-words one here); "
        "RegMix at its scale (512 proxies; here a few dozen proxies, the mixture chosen with the linear regressor and "
        "LightGBM's held-out rank correlation measured on the same proxies) and its claim that the ranking carries "
        "over to a far larger model"
        + (f"; the bucketings left out of this sweep for its CPU budget ({', '.join(left_out)})" if left_out else "")
        + (f"; the arms left out for its CPU budget ({', '.join(no_mixer)})" if no_mixer else "")
        + "."
    )


def rho_reading(res: Results, bucketing: str) -> str:
    """Whether the RegMix arm over ``bucketing`` worked, from its held-out rho and the mixture it chose."""
    rho = stat(res.rho(bucketing).values())
    if rho.n == 0:
        return f"- RegMix over {res.label(bucketing)} buckets: no regressor in the runs."
    trees = stat(res.rho(bucketing, "regmix/spearman_lightgbm").values())
    lightgbm = (
        f" LightGBM (the official regressor) on the same proxies and splits: held-out rho {fmt_stat(trees)}."
        if trees.n
        else ""
    )
    worked = rho.n > 1 and rho.lo > 0
    largest = stat(res.largest_weight(bucketing, "regmix"))
    spread = stat(res.weight_entropy(bucketing, "regmix"))
    verdict = (
        "the regressor ranks held-out proxies better than chance: the arm worked as RegMix intends"
        if worked
        else "the regressor does not rank held-out proxies better than chance: **the arm did not work**, and its "
        "final LM tests a mixture the proxies do not support"
    )
    runs = list(res.runs(bucketing, "regmix").values())
    proxy_losses = [[float(p["loss"]) for p in regmix_report(r).get("proxies", [])] for r in runs]
    proxy_losses = [losses for losses in proxy_losses if losses]
    regime = ""
    if proxy_losses and runs:
        low = stat(min(losses) for losses in proxy_losses)
        high = stat(max(losses) for losses in proxy_losses)
        final = stat(res.loss(bucketing, "regmix").values())
        uniform = stat(res.uniform(bucketing).values())
        far = uniform.n > 0 and low.mean > 2 * uniform.mean
        regime = (
            f" Its proxies ({runs[0].get('regmix_proxy_steps')} steps) end at held-out losses "
            f"{fmt_stat(low, ci=False)} to {fmt_stat(high, ci=False)} (lowest to highest proxy), the uniform-weight "
            f"LM of {runs[0].get('trainer.max_steps')} steps at {fmt_stat(uniform, ci=False)} and the final LM on "
            f"RegMix's mixture at {fmt_stat(final, ci=False)}"
            + (
                ": the proxies rank mixtures at more than twice the loss the final LMs reach, a regime the ranking "
                "need not carry over from."
                if far
                else "."
            )
        )
    return (
        f"- RegMix over {res.label(bucketing)} buckets: held-out rho {fmt_stat(rho)}; {verdict}. Its chosen mixture "
        f"puts {fmt_stat(largest, ci=False)} on its largest bucket (entropy / log K {fmt_stat(spread, ci=False)})."
        + lightgbm
        + regime
    )


def loss_table(res: Results) -> tuple[list[str], list[list[str]]]:
    header = ["bucketing", "uniform weights (DoReMi reference)"]
    header += [f"{res.label(m)}: final LM" for m in res.mixers]
    header += [f"{res.label(m)}: largest weight" for m in res.mixers]
    if "regmix" in res.mixers:
        header += ["RegMix held-out ρ", "LightGBM held-out ρ (same proxies)"]
    rows = []
    for b in res.bucketings:
        uniform = res.uniform(b)
        cells = [res.label(b), fmt_stat(stat(uniform.values())) if uniform else "—"]
        for m in res.mixers:
            loss = res.loss(b, m)
            cells.append(fmt_stat(stat(loss.values())) if loss else "—")
        for m in res.mixers:
            largest = res.largest_weight(b, m)
            cells.append(fmt_stat(stat(largest), ci=False) if largest else "—")
        if "regmix" in res.mixers:
            for metric in ("regmix/spearman", "regmix/spearman_lightgbm"):
                rho = res.rho(b, metric)
                cells.append(fmt_stat(stat(rho.values())) if rho else "—")
        rows.append(cells)
    return header, rows


def fair_test(res: Results, all_claims: list[Claim]) -> list[str]:
    """How the design meets each point of a fair test, from the numbers."""
    first = res.sweep.runs[0] if res.sweep.runs else None
    get = first.get if first else (lambda key, default=None: default)
    k = int(get("num_buckets", 0) or 0)
    proxies = int(get("regmix_proxies", 0) or 0)
    ratio = f"{proxies / (k + 1):.1f}×"
    lines = ["## Fair test", ""]
    shares = "; ".join(
        f"{res.label(b)} {fmt_stat(stat(res.bucket_metric(b, 'bucketing/max_share')), ci=False)}"
        for b in res.bucketings
    )
    lines.append(
        "- **The baselines' failures can occur.** The training corpus is Zipf-imbalanced over 12 latent topics with a "
        "near-duplicate cluster, so a bucketing without a balance term can give a few topics most of the mass "
        f"(largest bucket share: {shares}"
        + (f"; 1/K = {1 / k:.3f})" if k else ")")
        + (
            ""
            if "kmeans" in res.bucketings
            else "; no balance-free bucketing is in this sweep, so GEM's balance is read against uniform masses only"
        )
        + "; the held-out documents are topic-uniform, so uniform bucket weights over imbalanced buckets train on "
        "another distribution than the one scored, which a mixer can correct."
    )
    rho_all = stat(v for b in res.bucketings for v in res.rho(b).values())
    lines.append(
        "- **The method's signal carries information the baseline lacks.** GEM's mass penalty sees the bucket masses "
        "(k-means does not); DoReMi's weights follow the per-bucket excess loss of a proxy over its uniform-weight "
        "reference; RegMix's follow proxy losses over sampled mixtures, and whether those carry information about "
        f"the mixture is measured: held-out rho over every bucketing and seed {fmt_stat(rho_all)}."
    )
    lines.append(
        "- **Same tuning effort for every arm.** None is tuned: every LM (uniform reference, DoReMi proxy and final "
        f"LM, RegMix final LM) has the same model, batch ({get('datamodule.batch_size')}), learning-rate schedule "
        f"and {get('trainer.max_steps')} steps; each method runs with its paper's or official code's settings (GEM "
        "lambda 5000; DoReMi eta 1, smoothing 1e-3; RegMix's sampler, 100k simulations, top 128), with "
        f"{proxies} RegMix proxies of {get('regmix_proxy_steps')} steps ({ratio} the linear regressor's K + 1 = "
        f"{k + 1} unknowns) as the CPU budget allows."
    )
    regmix_runs = [r for b in res.bucketings for r in res.runs(b, "regmix").values()]
    splits = sorted({selection_split(r) for r in regmix_runs})
    if not regmix_runs:
        regmix_point = "No RegMix arm in this sweep"
    elif "" in splits:
        regmix_point = "RegMix's selection split cannot be read from its runs: **not known** for the RegMix arm"
    elif REPORTED_SPLIT in splits:
        regmix_point = (
            "RegMix scores its proxies on `val/loss`, the same topic-uniform held-out documents the final LM is "
            "reported on: **not met** for the RegMix arm (a bias in its favour)"
        )
    else:
        regmix_point = (
            f"RegMix's proxies score their mixtures on the corpus' {' / '.join(splits)} split (topic-uniform "
            "documents drawn apart from the reported ones; `zoo.data.regmix_split`), and the final LMs are reported "
            f"on `{REPORTED_SPLIT}`: met for the RegMix arm"
        )
    logged, total = res.rho_logged_at_run_time()
    lines.append(
        "- **Chosen on a split that is not reported.** GEM and the k-means baseline see only the training documents; "
        f"DoReMi's weights come from training-batch excess losses: met. {regmix_point}."
        + (
            f" RegMix's held-out rho was logged by {logged} of its {total} runs before their final LM's first step "
            "(`regmix/spearman`, `callbacks/regmix_check.py`)."
            if total
            else ""
        )
    )
    changes = [c for runs in res.arms.values() for c in map(plateau_change, runs.values()) if not math.isnan(c)]
    change = stat(changes)
    largest = 100 * max(map(abs, changes), default=math.nan)
    met = "met" if change.n and abs(change.mean) < PLATEAU else "not met"
    interval = get("trainer.val_check_interval")
    lines.append(
        f"- **Models trained to a plateau.** Final LMs: change of the held-out loss over the last {interval} steps "
        f"{100 * change.mean:+.1f}% (mean over {change.n} LMs; largest {largest:.1f}%); "
        f"a plateau is a change below {100 * PLATEAU:.0f}%: **{met}**. The uniform reference and DoReMi's proxy "
        "train the same steps (validated at the end only); RegMix's proxies are short by design."
        + decaying_schedule_caveat(
            [r for runs in res.arms.values() for r in runs.values()],
            None,
            "validation interval",
            relative=PLATEAU,
            whose="The final LMs'",
        )
    )
    seeds = len(res.sweep.seeds)
    lines.append(
        f"- **Seeds.** {seeds} seeds ({', '.join(map(str, res.sweep.seeds))}): each varies the clustering's "
        f"initialisation, every LM and RegMix's mixtures; {seeds_note(all_claims, seeds, SMALL_EFFECT)}."
    )
    return [*lines, ""]


def cross_check_section() -> list[str]:
    return [
        "## Cross-check against the official code",
        "",
        table(["piece", "official code", "here", "compared by"], [list(row) for row in CROSS_CHECKS]),
        "",
        "Official commits compared: sail-sg/regmix `b004d3a`, sangmichaelxie/doremi `7cde52d`. GEM has no official "
        "code; its k-means baseline is scikit-learn's (`tests/mixing/test_gem_reference.py`).",
        "",
    ]


def build(sweep: Sweep, out: Path) -> list[Path]:
    res = Results(sweep)
    all_claims = claims(res)

    balance_rows = [
        [res.label(b), *(fmt_stat(stat(res.bucket_metric(b, metric))) for metric, _ in BUCKET_METRICS)]
        for b in res.bucketings
    ]

    figure = out / f"{PAPER}.png"
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    xs = list(range(len(res.bucketings)))
    for ax, (metric, title) in zip(axes[:2], (BUCKET_METRICS[0], BUCKET_METRICS[2])):
        stats = [stat(res.bucket_metric(b, metric)) for b in res.bucketings]
        ax.bar(xs, [s.mean for s in stats], yerr=[s.sd if s.n > 1 else 0 for s in stats], color="#4878a8")
        ax.set_xticks(xs, [res.label(b) for b in res.bucketings], rotation=20, fontsize=8)
        ax.set_title(title)
    ax = axes[2]
    arms = [("uniform", None)] + [(m, m) for m in res.mixers]
    width = 0.8 / max(1, len(arms))
    for i, (name, mixer) in enumerate(arms):
        stats = [stat((res.uniform(b) if mixer is None else res.loss(b, mixer)).values()) for b in res.bucketings]
        ax.bar(
            [x + (i - (len(arms) - 1) / 2) * width for x in xs],
            [s.mean for s in stats],
            width,
            yerr=[s.sd if s.n > 1 else 0 for s in stats],
            label=res.label(name) if mixer else "uniform weights",
        )
    ax.set_xticks(xs, [res.label(b) for b in res.bucketings], rotation=20, fontsize=8)
    ax.set_title("uniform-topic held-out loss")
    ax.legend(fontsize=7)
    paths = [save_figure(fig, figure)]

    header, rows = loss_table(res)
    first = sweep.runs[0] if sweep.runs else None
    k = first.get("num_buckets") if first else "?"
    stopped = ", ".join(str(r.path.relative_to(sweep.path)) for r in res.unfinished)
    lines = [
        "# GEM: Geometric Entropy Mixing — toy demo",
        "",
        provenance(sweep, PAPER),
        "",
        *([f"**Runs that did not finish, left out of every number below:** {stopped}.", ""] if stopped else []),
        "One procedurally generated corpus (3000 training documents: 12 latent topics with Zipf-imbalanced sizes "
        "and a cluster of near-duplicate templated documents, 10% of the corpus; `zoo.data.mixture_corpus`), "
        f"embedded once with the real all-MiniLM-L6-v2, is bucketed into K = {k} buckets; a mixer then chooses "
        "per-bucket sampling weights for a 2-layer character-level LM, and the LM's loss on held-out documents with "
        "the same number of documents of every latent label (the uniform-topic held-out loss) is measured. Values: "
        "mean ± sd [95% CI] over the seeds (clustering initialisation and every LM).",
        "",
        *fair_test(res, all_claims),
        "## Buckets",
        "",
        table(["bucketing", *[name for _, name in BUCKET_METRICS]], balance_rows),
        "",
        "Student accuracy: agreement of the linear bag-of-words student (trained on the top-influence 10% of the "
        "corpus, balanced over buckets; GIS for the vMF arms, cosine to the centre for the k-means arms) with the "
        "clustering's own labels on the other 90%.",
        "",
        f"![bucket balance, NMI and held-out loss]({figure.name})",
        "",
        "## Mixing",
        "",
        table(header, rows),
        "",
        "Columns: uniform-topic held-out loss (nats per character) of the LM trained with uniform bucket weights "
        "(DoReMi's reference) and of the final LM trained with each mixer's weights; the largest bucket weight of "
        "the mixture each mixer chose; RegMix ρ: Spearman rank correlation between the regressor's predicted and the "
        "measured loss of held-out proxies (the paper's mixing-predictability probe), computed before the final LM "
        "trains.",
        "",
        "## Reading",
        "",
        *[rho_reading(res, b) for b in res.bucketings if res.has(b, "regmix")],
        *[f"- {c.claim}: {c.verdict} ({c.measure}: {c.effect_text()})." for c in all_claims if c.verdict != SHOWN],
        *[f"- {c.claim}: shown ({c.measure}: {c.effect_text()})." for c in all_claims if c.verdict == SHOWN],
        "",
        *cross_check_section(),
    ]
    verdict = verdict_section(all_claims, cannot_test(res)) if all_claims else None
    paths.insert(0, write_page(out, PAPER, lines, verdict))
    return paths
