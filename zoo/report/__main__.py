"""``python -m zoo.report <run or multirun dir>`` and ``python -m zoo.report demo <paper>`` (see :mod:`zoo.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import zoo.report
from zoo.report.pages import build_demo_page, report


def fail(message: str) -> None:
    """One line on stderr and exit status 2 (the CLI's bad-input status)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        parser = argparse.ArgumentParser(
            prog="python -m zoo.report demo", description="Build docs/results/<paper>.md from a demo sweep."
        )
        parser.add_argument("paper", help="the demo's name (conf/demo/<paper>.yaml, demos/<paper>.py)")
        parser.add_argument("--sweep", default=None, help="sweep directory (default: the newest one of the demo)")
        parser.add_argument("--out", default="docs/results", help="output directory (default: docs/results)")
        parser.add_argument("--demos", default="demos", help="directory of the page builders (default: demos)")
        parser.add_argument("--log-dir", default=None, help="log directory (default: $ZOO_LOG_DIR or ./logs)")
        args = parser.parse_args(argv[1:])
        try:
            paths = build_demo_page(args.paper, args.sweep, args.out, args.demos, args.log_dir)
        except (FileNotFoundError, AttributeError, ValueError) as err:  # a missing sweep, builder or mismatched data
            fail(str(err))
        print("wrote " + ", ".join(map(str, paths)))
        return
    parser = argparse.ArgumentParser(prog="python -m zoo.report", description=zoo.report.__doc__.splitlines()[0])
    parser.add_argument("root", help="a run directory or a multirun directory (or: demo <paper> ...)")
    parser.add_argument("--metrics", default=None, help="comma-separated metric names (default: all)")
    parser.add_argument("--out", default=None, help="output path without suffix (default: <root>/report)")
    args = parser.parse_args(argv)
    if not Path(args.root).exists():
        fail(f"{args.root} does not exist; give a run directory or a multirun directory")
    metrics = args.metrics.split(",") if args.metrics else None
    md, png = report(args.root, metrics, args.out)
    print(f"wrote {md} and {png}")


if __name__ == "__main__":
    main()
