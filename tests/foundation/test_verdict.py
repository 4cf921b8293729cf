"""The generated Verdict of a results page: each claim decided from its interval, read back by the paper index."""

from __future__ import annotations

import pytest

from zoo.catalogue import verdict_cell
from zoo.report import write_page
from zoo.stats import compare, stat
from zoo.verdict import CONTRADICTED, NOT_SHOWN, SHOWN, Claim, read_verdict, seeds_note, verdict_section

HIGH = [1.0, 1.1, 0.9, 1.05]
LOW = [0.0, 0.1, -0.1, 0.05]
SAME = [0.5, 0.6, 0.4, 0.55]


@pytest.mark.parametrize(
    ("a", "b", "direction", "margin", "expected"),
    [
        (HIGH, LOW, "higher", 0.0, SHOWN),
        (HIGH, LOW, "higher", 2.0, NOT_SHOWN),  # resolved, but smaller than the effect that counts
        (LOW, HIGH, "higher", 0.0, CONTRADICTED),
        (LOW, HIGH, "lower", 0.0, SHOWN),
        (HIGH, LOW, "lower", 0.0, CONTRADICTED),
        (SAME, [0.45, 0.62, 0.41, 0.58], "higher", 0.0, NOT_SHOWN),
        (SAME, [0.45, 0.62, 0.41, 0.58], "within", 0.2, SHOWN),
        (HIGH, LOW, "within", 0.2, CONTRADICTED),
        ([1.0], LOW, "higher", 0.0, NOT_SHOWN),  # one seed: no interval
        # non-inferiority ("keeps the baseline's accuracy"): a clear gain keeps it, which equivalence would not call
        (HIGH, LOW, "not_lower", 0.2, SHOWN),
        (SAME, [0.45, 0.62, 0.41, 0.58], "not_lower", 0.2, SHOWN),
        (SAME, [0.45, 0.62, 0.41, 0.58], "not_lower", 0.01, NOT_SHOWN),  # the interval reaches below -margin
        (LOW, HIGH, "not_lower", 0.2, CONTRADICTED),
    ],
)
def test_a_claim_is_decided_by_where_its_interval_lies(a, b, direction, margin, expected):
    assert Claim("c", "m", compare(a, b), direction, margin).verdict == expected


def test_a_paired_effect_is_a_stat_of_the_differences():
    claim = Claim("c", "m", stat([0.2, 0.25, 0.3]), "higher")
    assert claim.verdict == SHOWN
    assert claim.effect_text().startswith("+0.250 [")


def test_the_seeds_note_counts_the_small_effects_and_asks_for_5_seeds_below_5():
    claims = [Claim("a", "m", stat([0.01, 0.02, 0.03]), "higher"), Claim("b", "m", stat([0.5, 0.6, 0.7]), "higher")]
    assert (
        seeds_note(claims, 3, 0.05)
        == "1 of the 2 verdict effects are below 0.05 in absolute value and would call for 5 seeds"
    )
    assert seeds_note(claims, 5, 0.05) == "1 of the 2 verdict effects are below 0.05 in absolute value"
    assert seeds_note(claims[1:], 3, 0.05) == "every verdict effect is at least 0.05 in absolute value"


def test_bad_claims_are_refused():
    with pytest.raises(ValueError, match="direction"):
        Claim("c", "m", stat(HIGH), "up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin"):
        Claim("c", "m", stat(HIGH), "within")
    with pytest.raises(ValueError, match="margin"):
        Claim("c", "m", stat(HIGH), "not_lower")
    with pytest.raises(ValueError, match="cannot test"):
        verdict_section([Claim("c", "m", stat(HIGH), "higher")], " ")


def test_the_page_opens_with_the_verdict_and_the_index_reads_it(tmp_path):
    claims = [
        Claim("method beats baseline", "score, method − baseline", compare(HIGH, LOW), "higher"),
        Claim("method is shorter", "length, method − baseline", compare(HIGH, LOW), "lower"),
        Claim("cost is equal", "cost, method − baseline", compare(SAME, SAME), "within", 0.2),
    ]
    page = write_page(tmp_path, "toy", ["# Toy demo", "", "## Results", "table"], verdict_section(claims, "real scale"))
    text = page.read_text().splitlines()
    assert text[0] == "# Toy demo" and text[2] == "## Verdict"
    assert text.index("## Verdict") < text.index("## Results")
    assert "What this demo cannot test: real scale" in text
    verdict = read_verdict(page)
    assert (verdict.shown, verdict.not_shown, verdict.contradicted) == (2, 0, 1)
    assert str(verdict) == "2/3 shown, 1 contradicted"

    class Method:  # the two fields of a catalogue entry the verdict column reads
        demo = "toy.md"

    assert verdict_cell([Method()], tmp_path) == "2/3 shown, 1 contradicted"
    (tmp_path / "toy.md").write_text("# an old page without a generated verdict\n")
    assert read_verdict(tmp_path / "toy.md") is None
    assert verdict_cell([Method()], tmp_path) == "no verdict yet"
