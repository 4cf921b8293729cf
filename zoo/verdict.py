"""The Verdict that opens every results page: one line per claim the demo tests, decided from the runs.

A :class:`Claim` holds a paper's claim as the demo tests it, the effect measured over seeds (an interval of a
difference between arms, a paired difference, or one arm's value) and the direction the claim predicts. Its
verdict is

- **shown**: the interval lies on the claimed side (``higher``: above ``margin``; ``lower``: below ``-margin``;
  ``within``: inside ``[-margin, margin]``, an equivalence claim such as "matches online RL"; ``not_lower``: above
  ``-margin``, a non-inferiority claim such as "keeps the baseline's accuracy", which a gain does not refute);
- **contradicted**: the interval lies on the other side (``higher``: below 0; ``lower``: above 0; ``within``: wholly
  outside ``[-margin, margin]``; ``not_lower``: wholly below ``-margin``);
- **not shown (within noise)**: anything else, including too few seeds for an interval.

:func:`verdict_section` writes the section (a table and the line on what the demo cannot test) with a
machine-readable marker that :func:`read_verdict` reads back, so the paper index can show each paper's verdict
without parsing prose.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zoo.stats import CONFIDENCE, Difference, Stat

SHOWN, NOT_SHOWN, CONTRADICTED = "shown", "not shown (within noise)", "contradicted"
VERDICTS = (SHOWN, NOT_SHOWN, CONTRADICTED)
Direction = Literal["higher", "lower", "within", "not_lower"]
MARKER = re.compile(r"<!-- verdict: shown=(\d+) not_shown=(\d+) contradicted=(\d+) -->")


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as the demo tests it.

    Attributes:
        claim: the claim in words ("GR3 shortens completions relative to GRPO").
        measure: what was measured and how it is signed ("completion length, GR3 − GRPO, tokens").
        effect: the measured effect with its interval: a :class:`~zoo.stats.Difference` (two arms), or a
            :class:`~zoo.stats.Stat` (paired differences, or one arm's value against a reference of 0).
        direction: ``higher`` (the claim predicts an effect above ``margin``), ``lower`` (below ``-margin``),
            ``within`` (inside ``[-margin, margin]``) or ``not_lower`` (above ``-margin``).
        margin: the smallest effect that counts (``higher``/``lower``), the equivalence band (``within``) or the
            largest loss that still counts as keeping (``not_lower``).
        digits: digits of the numbers on the page.
    """

    claim: str
    measure: str
    effect: Difference | Stat
    direction: Direction
    margin: float = 0.0
    digits: int = 3

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower", "within", "not_lower"):
            raise ValueError(f"direction must be higher, lower, within or not_lower, got {self.direction!r}")
        if self.margin < 0 or (self.direction in ("within", "not_lower") and self.margin == 0):
            raise ValueError(f"margin must be >= 0 (> 0 for 'within' and 'not_lower'), got {self.margin}")

    @property
    def estimate(self) -> float:
        return self.effect.delta if isinstance(self.effect, Difference) else self.effect.mean

    @property
    def interval(self) -> tuple[float, float]:
        return self.effect.lo, self.effect.hi

    @property
    def verdict(self) -> str:
        lo, hi = self.interval
        if math.isnan(lo) or math.isnan(hi):
            return NOT_SHOWN
        m = self.margin
        if self.direction == "higher":
            return SHOWN if lo > m else CONTRADICTED if hi < 0 else NOT_SHOWN
        if self.direction == "lower":
            return SHOWN if hi < -m else CONTRADICTED if lo > 0 else NOT_SHOWN
        if self.direction == "not_lower":
            return SHOWN if lo > -m else CONTRADICTED if hi < -m else NOT_SHOWN
        return SHOWN if -m <= lo and hi <= m else CONTRADICTED if lo > m or hi < -m else NOT_SHOWN

    def effect_text(self) -> str:
        """``+0.120 [+0.031, +0.209]`` (the estimate and its interval), or the estimate alone without one."""
        d = self.digits
        lo, hi = self.interval
        if math.isnan(lo):
            return f"{self.estimate:+.{d}f} (no interval: fewer than two seeds on a side)"
        return f"{self.estimate:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"


def verdict_section(claims: Sequence[Claim], cannot_test: str, confidence: float = CONFIDENCE) -> list[str]:
    """The page's opening ``## Verdict`` section: a table of the claims and the line on what the demo cannot test."""
    if not claims:
        raise ValueError("a verdict needs at least one claim")
    if not cannot_test.strip():
        raise ValueError("say what the demo cannot test")
    counts = Counter(c.verdict for c in claims)
    level = round(100 * confidence)
    lines = [
        "## Verdict",
        "",
        f"<!-- verdict: shown={counts[SHOWN]} not_shown={counts[NOT_SHOWN]} contradicted={counts[CONTRADICTED]} -->",
        f"| claim | measured | effect ({level}% CI) | verdict |",
        "|---|---|---|---|",
    ]
    lines += [f"| {c.claim} | {c.measure} | {c.effect_text()} | **{c.verdict}** |" for c in claims]
    lines += ["", f"What this demo cannot test: {cannot_test.strip()}", ""]
    return lines


def seeds_note(claims: Sequence[Claim], seeds: int, small_effect: float) -> str:
    """The fair test's point on seeds: how many of the verdict's effects are below ``small_effect`` in absolute value
    (such effects call for at least 5 seeds, fewer than ``seeds`` being shown as wanting more)."""
    small = [c for c in claims if abs(c.estimate) < small_effect]
    if not small:
        return f"every verdict effect is at least {small_effect} in absolute value"
    return f"{len(small)} of the {len(claims)} verdict effects are below {small_effect} in absolute value" + (
        " and would call for 5 seeds" if seeds < 5 else ""
    )


@dataclass(frozen=True)
class PageVerdict:
    """The counts of a page's Verdict section."""

    shown: int
    not_shown: int
    contradicted: int

    def __str__(self) -> str:
        total = self.shown + self.not_shown + self.contradicted
        parts = [f"{self.shown}/{total} shown"]
        if self.contradicted:
            parts.append(f"{self.contradicted} contradicted")
        return ", ".join(parts)


def read_verdict(page: str | Path) -> PageVerdict | None:
    """The verdict counts of a results page (``None``: the page has no generated Verdict section yet)."""
    path = Path(page)
    if not path.is_file():
        return None
    match = MARKER.search(path.read_text(encoding="utf-8"))
    return PageVerdict(*(int(g) for g in match.groups())) if match else None


__all__ = [
    "CONTRADICTED",
    "NOT_SHOWN",
    "SHOWN",
    "VERDICTS",
    "Claim",
    "PageVerdict",
    "read_verdict",
    "verdict_section",
]
