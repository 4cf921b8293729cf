"""GEM clustering cost: fit time vs N against scikit-learn's KMeans, memory of the fit; student labelling throughput.

    OMP_NUM_THREADS=1 python benchmarks/gem.py [--sizes 1000 10000 100000] [--dim 384] [--clusters 24] [--iters 10 20]
        [--repeats 3] [--threads 1]

Data: N points in d = 384 drawn around 24 random unit directions with Zipf-imbalanced sizes (no encoder: the cost of
the fit does not depend on where the vectors come from), float32 as an encoder gives them. Arms, interleaved per size
and budget (A B C A B C ...), ``--repeats`` times: ``zoo.mixing.fit_gem`` (lam 5000, Banerjee kappa), the k-means
baseline ``zoo.mixing.kmeans`` (scikit-learn's ``KMeans`` on the float64 unit rows, ``tol=0``) and
``sklearn.cluster.KMeans`` on the float32 data as given (``n_init=1``, default ``tol``), all with the same budget of at
most ``--iters`` iterations, one table block per budget (each fit may stop earlier at convergence; the iterations run
are reported; scikit-learn's k-means++ seeding, with its local trials, is a fixed cost that weighs more at small
budgets). Time: median (min-max) seconds; the ratio to scikit-learn is taken within each repeat (the arms of one
repeat run back to back, so they share the machine's load) and reported as median (min-max) over the repeats. Memory
is stated from the fit's buffers, not measured: one process runs every arm, so its peak RSS cannot be attributed to
one arm. Student: documents/s of the linear bag-of-words student labelling generated corpus documents (featurisation
included). Writes the ``## GEM clustering`` section of ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _results import write_section

from zoo.data.mixture_corpus import MixtureCorpusSource
from zoo.mixing import fit_gem, kmeans
from zoo.mixing.clustering import BLOCK_ROWS
from zoo.mixing.gis import bag_of_words, train_student

SKLEARN = "KMeans (scikit-learn)"


def data(n: int, dim: int, clusters: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(clusters, dim, generator=g), dim=1)
    shares = torch.tensor([1.0 / (k + 1) for k in range(clusters)])
    labels = torch.multinomial(shares / shares.sum(), n, replacement=True, generator=g)
    return centres[labels] + 0.05 * torch.randn(n, dim, generator=g)


def arm_functions(x: torch.Tensor, xn, clusters: int, iters: int, sklearn_kmeans) -> dict:
    """The three fits on the same data, each returning the iterations it ran (``None``: not reported)."""

    def gem() -> int:
        return len(fit_gem(x, clusters, 5000.0, num_iters=iters).objective)

    def kmeans_baseline() -> None:
        kmeans(x, clusters, num_iters=iters)

    def sklearn() -> int:
        return int(sklearn_kmeans(clusters, n_init=1, max_iter=iters, random_state=0).fit(xn).n_iter_)

    return {"GEM (fit_gem)": gem, "k-means baseline (zoo.mixing.kmeans)": kmeans_baseline, SKLEARN: sklearn}


def time_fit(fn) -> tuple[float, int]:
    start = time.perf_counter()
    iterations = fn()
    return time.perf_counter() - start, iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--clusters", type=int, default=24)
    parser.add_argument("--iters", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from sklearn.cluster import KMeans

    rows = []
    for n in args.sizes:
        x = data(n, args.dim, args.clusters)
        xn = x.numpy()
        for budget in args.iters:
            arms = arm_functions(x, xn, args.clusters, budget, KMeans)
            times: dict[str, list[float]] = {name: [] for name in arms}
            iters: dict[str, int | None] = {}
            for _ in range(args.repeats):
                for name, fn in arms.items():
                    seconds, iters[name] = time_fit(fn)
                    times[name].append(seconds)
            for name in arms:
                t = times[name]
                ratios = [a / b for a, b in zip(t, times[SKLEARN])]
                ran = "-" if iters[name] is None else iters[name]
                rows.append(
                    f"| {n} | {budget} | {name} | {ran} | {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) | "
                    f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |"
                )
            print(*rows[-len(arms) :], sep="\n", flush=True)

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
            f"`OMP_NUM_THREADS={args.threads} python benchmarks/gem.py --threads {args.threads}` (d = {args.dim}, "
            f"K = {args.clusters}, iteration budgets {' and '.join(map(str, args.iters))}, {args.repeats} interleaved "
            "repeats; the machine is shared with other jobs, so absolute times are noisy and the ratios are the "
            "comparable numbers).",
            "",
            "| N | budget | arm | iterations run | seconds: median (min-max) | "
            "ratio to scikit-learn: median (min-max) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "GEM's E-step runs 5 mirror steps per iteration in blocks of "
            f"{BLOCK_ROWS} points (float64, a column per point, only refused steps retried); the products with the "
            "float32 embeddings (scores, M-step resultants) are float32, the sums over the points float64 "
            "(`zoo/mixing/clustering.py` says which parts stay float64 and why). Its memory: the embeddings as given "
            "(not copied), about six `N x K` float64 buffers (scores, responsibilities, the E-step's anchor, linear "
            f"term and output: about {6 * 8 * max(args.sizes) * args.clusters / 2**20:.0f} MiB at "
            f"N = {max(args.sizes)}); no copy of the `N x d` embeddings (a float64 one would be "
            f"{8 * max(args.sizes) * args.dim / 2**20:.0f} MiB). The k-means baseline normalises into a float64 copy "
            "and hands it to scikit-learn; it reports no iteration count.",
            "",
            f"Student labelling (hashed bag-of-words features + linear layer): {statistics.median(rates):,.0f} "
            f"documents/s (median of {args.repeats}; {min(rates):,.0f}-{max(rates):,.0f}), linear in N.",
        ]
    )
    write_section("GEM clustering", body)


if __name__ == "__main__":
    main()
