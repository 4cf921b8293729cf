"""GEM clustering cost: fit time vs N against scikit-learn's KMeans, memory of the fit; student labelling throughput.

    python benchmarks/gem.py [--sizes 1000 10000 100000] [--dim 384] [--clusters 24] [--iters 20] [--repeats 3]

Data: N points in d = 384 drawn around 24 random unit directions with Zipf-imbalanced sizes (no encoder: the cost of
the fit does not depend on where the vectors come from). Arms, interleaved per size (A B C A B C ...), ``--repeats``
times: ``zoo.mixing.fit_gem`` (lam 5000, Banerjee kappa), ``zoo.mixing.kmeans`` and ``sklearn.cluster.KMeans``
(``n_init=1``), all with ``--iters`` iterations (the GEM fit and our k-means may stop earlier at convergence; the
iterations run are reported). Time: median (min-max) seconds and the ratio to scikit-learn. Memory is stated from
the fit's buffers (the float64 copy of the embeddings and a few ``N x K`` float64 arrays), not measured: one process
runs every arm, so its peak RSS cannot be attributed to one arm. Student: documents/s of the linear bag-of-words
student labelling generated corpus documents (featurisation included). Writes the ``## GEM clustering`` section of
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _results import write_section

from zoo.data.mixture_corpus import MixtureCorpusSource
from zoo.mixing import fit_gem, kmeans
from zoo.mixing.gis import bag_of_words, train_student


def data(n: int, dim: int, clusters: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(clusters, dim, generator=g), dim=1)
    shares = torch.tensor([1.0 / (k + 1) for k in range(clusters)])
    labels = torch.multinomial(shares / shares.sum(), n, replacement=True, generator=g)
    return centres[labels] + 0.05 * torch.randn(n, dim, generator=g)


def arm_functions(x: torch.Tensor, xn, clusters: int, iters: int, sklearn_kmeans) -> dict:
    """The three fits on the same data, each returning the iterations it ran."""
    return {
        "GEM (fit_gem)": lambda: len(fit_gem(x, clusters, 5000.0, num_iters=iters).objective),
        "k-means (zoo)": lambda: len(kmeans(x, clusters, num_iters=iters).objective),
        "KMeans (scikit-learn)": lambda: int(
            sklearn_kmeans(clusters, n_init=1, max_iter=iters, random_state=0).fit(xn).n_iter_
        ),
    }


def time_fit(fn) -> tuple[float, int]:
    start = time.perf_counter()
    iterations = fn()
    return time.perf_counter() - start, iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=24)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sklearn.cluster import KMeans

    rows = []
    for n in args.sizes:
        x = data(n, args.dim, args.clusters)
        xn = x.numpy()
        arms = arm_functions(x, xn, args.clusters, args.iters, KMeans)
        times: dict[str, list[float]] = {name: [] for name in arms}
        iters: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, fn in arms.items():
                seconds, iters[name] = time_fit(fn)
                times[name].append(seconds)
        base = statistics.median(times["KMeans (scikit-learn)"])
        for name in arms:
            t = times[name]
            rows.append(
                f"| {n} | {name} | {iters[name]} | {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) | "
                f"{statistics.median(t) / base:.2f} |"
            )
        print(rows[-3:], flush=True)

    texts = [r["text"] for r in MixtureCorpusSource(num_train=20000).rows("train")]
    features = bag_of_words(texts[:2000])
    student = train_student(features, torch.randint(24, (2000,)), 24, epochs=20)
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        student.predict(bag_of_words(texts))
        rates.append(len(texts) / (time.perf_counter() - start))

    body = "\n".join(
        [
            f"`python benchmarks/gem.py` (d = {args.dim}, K = {args.clusters}, at most {args.iters} iterations, "
            f"{args.threads} thread(s), {args.repeats} interleaved repeats; the machine is shared with other jobs, so "
            "absolute times are noisy and the ratios are the comparable numbers).",
            "",
            "| N | arm | iterations run | seconds: median (min-max) | ratio to scikit-learn |",
            "|---|---|---|---|---|",
            *rows,
            "",
            "GEM's E-step runs 5 mirror steps per iteration, each `O(N K)` with per-point acceptance; its memory is a "
            "few `N x K` float64 buffers plus the float64 copy of the `N x d` embeddings (about "
            f"{8 * max(args.sizes) * args.dim / 2**20:.0f} MiB at N = {max(args.sizes)}).",
            "",
            f"Student labelling (hashed bag-of-words features + linear layer): {statistics.median(rates):,.0f} "
            f"documents/s (median of {args.repeats}; {min(rates):,.0f}-{max(rates):,.0f}), linear in N.",
        ]
    )
    write_section("GEM clustering", body)


if __name__ == "__main__":
    main()
