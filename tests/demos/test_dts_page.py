"""The DTS page's reading of task=multisum (demos/dts.py ``multisum_reading``) follows the runs: whether the tree
reaches its cap, whether several traces finish together (and vote), and which of DTS-Greedy and shortest-of-N decodes
less."""

from __future__ import annotations

import pytest
from sweep_files import write_run, write_sweep

from zoo.report import Sweep
from zoo.report.pages import load_page_builder

from conftest import REPO_ROOT

DTS = load_page_builder("dts", REPO_ROOT / "demos")


def rows_of(tmp_path, active: float, finished: int, dts_tokens: float) -> dict:
    root = write_sweep(
        tmp_path / f"sweep{active}{finished}", {"demo/dts/arm": "dts_greedy,shortest_of_n", "seed": "0,1"}
    )
    rows: dict = {"dts_greedy": [], "shortest_of_n": []}
    number = 0
    for arm, tokens in (("dts_greedy", dts_tokens), ("shortest_of_n", 75.0)):
        for seed in (0, 1):
            run = write_run(
                root,
                f"multisum/{arm}/p0/test/seed{seed}",
                {"demo/dts/arm": arm, "seed": seed},
                {"seed": seed, "stage": "test", "module": {"decoder": {"max_active": 12}}},
                number,
                metrics={
                    "test/decode/decoded_tokens_per_problem": tokens,
                    "test/decode/branch_events": 0.5,
                    "test/decode/max_active": active,
                },
                files={DTS.RECORDS: [{"num_finished": finished, "branch_steps": [], "varentropies": []}]},
            )
            number += 1
    sweep = Sweep.load(root)
    for run in sweep.runs:
        rows[run.name].append(run)  # the run's arm
    return rows


@pytest.mark.parametrize(
    ("active", "finished", "dts_tokens", "says", "not_says"),
    [
        (12.0, 3, 150.0, ["(the cap, 12)", "their answers vote", "shortest-of-N is the cheaper"], ["rarely"]),
        (
            1.0,
            1,
            25.0,
            ["(cap 12): the policy is rarely uncertain", "nothing to vote over", "DTS-Greedy is the cheaper"],
            ["(the cap, 12)", "answers vote"],
        ),
    ],
)
def test_the_multisum_reading_follows_the_runs(tmp_path, active, finished, dts_tokens, says, not_says):
    text = " ".join(DTS.multisum_reading(rows_of(tmp_path, active, finished, dts_tokens), {}))
    assert f"reaches {active:.1f} active hypotheses" in text and f"{finished:.1f} traces per problem" in text
    for part in says:
        assert part in text, (part, text)
    for part in not_says:
        assert part not in text, (part, text)
