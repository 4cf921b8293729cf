"""Reports built from run directories only: the generic table/plot of any run or multirun, and the demo pages.

Generic: ``python -m zoo.report <run or multirun dir> [--metrics val/exact_match,train/loss] [--out docs/results/x]``.
Every run directory with a ``csv/metrics.csv`` (Lightning's CSV logger) becomes one row; the row is labelled by the
run's Hydra overrides (``.hydra/overrides.yaml``) so the arms of a multirun are told apart. The table holds the last
logged value of each metric; the plot draws each metric over ``step`` for every run.

Demo pages: ``python -m zoo.report demo <paper> [--sweep DIR] [--out docs/results]`` builds
``<out>/<paper>.md`` and its plots from the sweep of ``python train.py -m +demo=<paper>`` (default: the newest
sweep under ``<log dir>/demos/<paper>/``) by calling ``build(sweep, out)`` of the page builder ``demos/<paper>.py``
(see ``docs/demos.md``). The package, by concern:

* :mod:`zoo.report.runs` -- a sweep -> :class:`Sweep` of :class:`Run` (each run's overrides -> arm + seed, metric
  series from the CSV logger, JSON/JSONL files a callback wrote, the resolved config and ``run_info.json``); the
  prerequisites the runs used -> :func:`artifact_values`, their validation-loss curves -> :func:`artifact_val_losses`
  (per run) and :func:`artifact_val_loss_curves` (per prerequisite), the runs that used each -> :func:`artifact_users`,
  their build runs (resolved config, log) -> :func:`build_run` / :func:`artifact_runs`;
  the plateau readings of a curve ->
  :func:`last_change` (over the last interval), :func:`loss_settled` (a change below a share or
  :data:`LOSS_FLOOR_NATS`), :func:`quarter_change` (third to last quarter) and
  :func:`val_loss_plateau` (the prerequisites' last validation loss and its last change);
* :mod:`zoo.report.choice` -- a tuned knob's grid point per seed, chosen on the other seeds: a sweep's runs by arm,
  grid point and seed (:func:`group_runs`), one arm's choices (:func:`choose_per_seed` -> :class:`GridChoice`), on
  :func:`best_on_other_seeds` (:func:`best_mean` over every seed);
* :mod:`zoo.stats` -- aggregating over seeds (mean, sd and Student-t interval; Welch and paired differences);
* :mod:`zoo.verdict` -- the Verdict that opens every page, one line per claim, decided from its interval;
* :mod:`zoo.report.plots` -- curves with confidence bands (:func:`curve`, :func:`plot_curves`), one legend rule;
* :mod:`zoo.report.pages` -- markdown (:func:`table`, :func:`fmt`, :func:`contrast`, :func:`paired_contrast`), the
  page header :func:`provenance` (the exact command, date, machine and wall time, read from the runs) and the page
  itself, :func:`write_page` (the Verdict after the title, the footer with the commands that regenerate it).

Each demo's own prose lives with its page builder in ``demos/``. This module holds the names page builders use.
"""

from __future__ import annotations

from zoo.report.choice import (
    RATE_KEY,
    GridChoice,
    best_mean,
    best_on_other_seeds,
    choose_per_seed,
    group_runs,
    lr_order,
    split_by_length,
)
from zoo.report.pages import (
    build_demo_page,
    contrast,
    fmt,
    known_demos,
    load_page_builder,
    markdown_table,
    paired_contrast,
    provenance,
    report,
    table,
    write_page,
)
from zoo.report.plots import Curve, curve, legend, plot, plot_curves, pyplot, save_figure
from zoo.report.runs import (
    LOSS_FLOOR_NATS,
    Run,
    Sweep,
    artifact_runs,
    artifact_users,
    artifact_val_loss_curves,
    artifact_val_losses,
    artifact_values,
    base_policy_val_losses,
    build_run,
    build_seconds,
    decaying_schedule_caveat,
    doubling_checks,
    last_change,
    latest_sweep,
    loss_settled,
    quarter_change,
    read_metrics,
    summarize,
    val_loss_plateau,
    values,
)

__all__ = [
    "LOSS_FLOOR_NATS",
    "RATE_KEY",
    "Curve",
    "GridChoice",
    "Run",
    "Sweep",
    "artifact_runs",
    "artifact_users",
    "artifact_val_loss_curves",
    "artifact_val_losses",
    "artifact_values",
    "base_policy_val_losses",
    "build_run",
    "build_seconds",
    "decaying_schedule_caveat",
    "doubling_checks",
    "best_mean",
    "best_on_other_seeds",
    "build_demo_page",
    "choose_per_seed",
    "contrast",
    "curve",
    "fmt",
    "group_runs",
    "lr_order",
    "split_by_length",
    "known_demos",
    "last_change",
    "latest_sweep",
    "loss_settled",
    "legend",
    "load_page_builder",
    "markdown_table",
    "paired_contrast",
    "plot",
    "plot_curves",
    "provenance",
    "pyplot",
    "quarter_change",
    "read_metrics",
    "report",
    "save_figure",
    "summarize",
    "table",
    "val_loss_plateau",
    "values",
    "write_page",
]
