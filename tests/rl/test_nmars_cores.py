"""N-MARS cores (zoo.generation.undo): resolve, augmentation, random error injection, bad inputs.

The invariants are checked against facts computed here independently of the implementation: ``resolve`` by a
stack written in the test, the per-gap UNDO counts from the run structure of the output, and hand-computed pairs.
"""

from __future__ import annotations

import random

import pytest

from zoo.generation.undo import (
    augment_with_undo,
    deviation_gaps,
    inject_random_errors,
    resolve_undo,
    trace_undo,
)

U = 99  # the UNDO id of these tests


def stack_resolve(ids: list[int], undo: int) -> list[int]:
    out: list[int] = []
    for t in ids:
        if t == undo:
            if out:
                out.pop()
        else:
            out.append(t)
    return out


def error_runs(ids: list[int], mask: list[bool]) -> list[tuple[int, int]]:
    """``(error span length, UNDOs right after it)`` for every maximal run of mask-False positions."""
    runs, i = [], 0
    while i < len(ids):
        if mask[i]:
            i += 1
            continue
        j = i
        while j < len(ids) and not mask[j]:
            j += 1
        k = j
        while k < len(ids) and ids[k] == U:
            k += 1
        runs.append((j - i, k - j))
        i = k
    return runs


def test_resolve_pops_the_last_effective_token_and_ignores_undo_at_an_empty_prefix():
    assert resolve_undo([1, 2, U, 3], U) == [1, 3]
    assert resolve_undo([1, 2, U, U, U, 4], U) == [4]  # the third UNDO finds nothing: a no-op
    assert resolve_undo([U, U, 5], U) == [5]
    assert resolve_undo([], U) == []
    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.choice([1, 2, 3, U]) for _ in range(rng.randint(0, 12))]
        assert resolve_undo(ids, U) == stack_resolve(ids, U)


@pytest.mark.parametrize(
    ("reference", "sample", "expected_ids", "expected_mask"),
    [
        # substitution: the error, one UNDO, the correction
        ([1, 2, 3], [1, 5, 3], [1, 5, U, 2, 3], [True, False, True, True, True]),
        # insertion: the extra tokens, their UNDOs, no correction
        ([1, 2], [1, 7, 8, 2], [1, 7, 8, U, U, 2], [True, False, False, True, True, True]),
        # deletion: nothing to undo, the missing token is written
        ([1, 2, 3], [1, 3], [1, 2, 3], [True] * 3),
        # a sample that stops early: the rest of the reference is the correction
        ([1, 2, 3, 4], [1, 2], [1, 2, 3, 4], [True] * 4),
        # two gaps
        (
            [1, 2, 3, 4, 5],
            [1, 6, 3, 4, 7, 7],
            [1, 6, U, 2, 3, 4, 7, 7, U, U, 5],
            [True, False] + [True] * 4 + [False] * 2 + [True] * 3,
        ),
    ],
)
def test_augmentation_of_hand_computed_pairs(reference, sample, expected_ids, expected_mask):
    ids, mask = augment_with_undo(reference, sample, U)
    assert ids == expected_ids
    assert mask == expected_mask


def test_property_resolve_of_augmented_is_the_reference_for_thousands_of_random_pairs():
    rng = random.Random(1234)
    gaps_with_errors = 0
    for case in range(4000):
        alphabet = list(range(rng.choice([2, 3, 5, 20])))
        reference = [rng.choice(alphabet) for _ in range(rng.randint(0, 25))]
        if case % 3 == 0:  # a corrupted copy of the reference (the realistic case: mostly right)
            sample = list(reference)
            for _ in range(rng.randint(0, 4)):
                op = rng.random()
                pos = rng.randint(0, len(sample))
                if op < 0.4 and sample and pos < len(sample):
                    sample[pos] = rng.choice(alphabet)
                elif op < 0.7:
                    sample.insert(pos, rng.choice(alphabet))
                elif sample and pos < len(sample):
                    del sample[pos]
        else:
            sample = [rng.choice(alphabet) for _ in range(rng.randint(0, 25))]
        ids, mask = augment_with_undo(reference, sample, U)
        assert resolve_undo(ids, U) == reference == stack_resolve(ids, U)
        assert len(ids) == len(mask)
        # every error span is followed by exactly as many UNDOs as it has tokens, and UNDOs are only there
        runs = error_runs(ids, mask)
        assert all(length == undos for length, undos in runs)
        assert ids.count(U) == sum(length for length, _ in runs) == mask.count(False)
        # one error span per gap with deviating tokens, in order, of the gap's size
        assert [length for length, _ in runs] == [
            g.num_deviating for g in deviation_gaps(reference, sample) if g.num_deviating
        ]
        gaps_with_errors += len(runs)
        if sample == reference:
            assert ids == reference and all(mask) and U not in ids
    assert gaps_with_errors > 1000  # the property was exercised on many gaps


def test_identical_sample_gives_the_reference_without_undo():
    reference = [4, 2, 4, 2, 7]
    assert augment_with_undo(reference, list(reference), U) == (reference, [True] * 5)
    assert augment_with_undo([], [], U) == ([], [])


def test_alignment_does_not_treat_frequent_tokens_as_junk():
    # difflib's autojunk would drop a token that fills > 1% of a sequence of 200+ items
    reference = [1] * 150 + [2] + [1] * 150
    sample = [1] * 150 + [3] + [1] * 150
    ids, mask = augment_with_undo(reference, sample, U)
    assert mask.count(False) == 1 and ids.count(U) == 1


def test_random_error_injection_inserts_undone_spans():
    rng = random.Random(7)
    reference = list(range(10, 30))
    pool = [50, 51, 52]
    for _ in range(300):
        num_errors = rng.randint(1, 4)
        ids, mask = inject_random_errors(reference, U, pool, rng, num_errors=num_errors, max_error_length=3)
        assert resolve_undo(ids, U) == reference
        runs = error_runs(ids, mask)
        assert len(runs) == num_errors  # distinct insertion points give separate spans
        assert all(1 <= length <= 3 and length == undos for length, undos in runs)
        errors = [t for t, m in zip(ids, mask) if not m]
        assert set(errors) <= set(pool)
        assert ids[0] == reference[0]  # an error comes after at least one reference token
        assert [t for t, m in zip(ids, mask) if m and t != U] == reference  # nothing else is inserted


def test_trace_reports_first_attempt_resolved_output_and_undo_count():
    trace = trace_undo([1, 2, 5, U, 3, U, U, 4], U)
    assert trace.first_attempt == [1, 2, 5]
    assert trace.resolved == [1, 4]
    assert trace.num_undos == 3
    assert trace_undo([1, 2], U).first_attempt == [1, 2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: augment_with_undo([1], [1], 120, vocab_size=100), "undo_id = 120 is outside the vocabulary"),
        (lambda: resolve_undo([1], -1), "undo_id = -1 is outside the vocabulary"),
        (lambda: resolve_undo([1, 150], U, vocab_size=100), r"ids\[1\] = 150 is outside the vocabulary"),
        # ids of another (larger) tokenizer
        (lambda: augment_with_undo([1, 2], [1, 500], U, vocab_size=100), "same tokenizer"),
        (lambda: augment_with_undo([1, U], [1], U), r"reference\[1\] is the UNDO token"),
        (lambda: augment_with_undo([1], [1, U], U), "resolve_undo"),
        (lambda: augment_with_undo([1], [True], U), "is not a token id"),
        (lambda: augment_with_undo([1], [1], True), "undo_id must be an integer"),
        (lambda: inject_random_errors([], U, [1], random.Random(0)), "empty reference"),
        (lambda: inject_random_errors([1], U, [U], random.Random(0)), "contains the UNDO id"),
        (lambda: inject_random_errors([1, 2], U, [3], random.Random(0), num_errors=3), "num_errors must be in 1..2"),
    ],
)
def test_bad_inputs_are_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
