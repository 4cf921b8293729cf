"""Write one named section of docs/benchmarks.md, keeping the others."""

from __future__ import annotations

import datetime
import platform
import re
from pathlib import Path

import torch

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nSide-by-side measurements (ratios within one run); produced by the scripts in `benchmarks/`. "
    "Timing never appears in tests.\n"
)


def write_section(title: str, body: str) -> None:
    """Replace (or append) the ``## <title>`` section of docs/benchmarks.md."""
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.is_file() else HEADER
    machine = platform.processor() or platform.machine()
    stamp = f"_Measured {datetime.date.today()} on {machine}, torch {torch.__version__}._\n\n"
    section = f"## {title}\n\n{stamp}{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    BENCHMARKS_MD.parent.mkdir(parents=True, exist_ok=True)
    BENCHMARKS_MD.write_text(text)
