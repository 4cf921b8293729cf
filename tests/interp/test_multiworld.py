"""The WET demo's multi-world recall data: attributable wrong answers, the dominant-world prior, drift knobs,
seeding, and the WorldBatch built from its rows."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from interp_models import build_model, single_thread  # noqa: F401  (autouse fixture)

from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.data.multiworld import MultiWorldRecallTask
from zoo.data.sources import TaskSource
from zoo.errors import DataError
from zoo.interp.wet import PatchingEffectRanker, WorldBatch


def test_every_world_is_a_permutation_and_worlds_never_agree():
    task = MultiWorldRecallTask(num_worlds=4, num_entities=20)
    for k in range(4):
        assert sorted(task.value(k, i) for i in range(20)) == list(range(20))
    for i in range(20):
        assert len({task.value(k, i) for k in range(4)}) == 4
    assert MultiWorldRecallTask(permutation_seed=1)._table != task._table


def test_samples_follow_the_prior_and_the_drift_knobs():
    task = MultiWorldRecallTask(dominant_prob=0.7, min_distractors=3, max_distractors=6, conflict_prob=0.5)
    examples = task.examples(4000, seed=0)
    worlds = Counter(e.meta["world"] for e in examples)
    assert worlds[0] / 4000 == pytest.approx(0.7, abs=0.03)
    assert all(worlds[k] / 4000 == pytest.approx(0.1, abs=0.02) for k in (1, 2, 3))
    conflicts = [e for e in examples if e.meta["conflict_world"] >= 0]
    assert len(conflicts) / 4000 == pytest.approx(0.5, abs=0.03)
    for e in examples[:200]:
        m = e.meta
        assert e.prompt.startswith(f"W{m['world']}:") and e.prompt.endswith(f" E{m['entity']:02d}=")
        assert (
            e.completion
            == e.answer
            == m["world_values"][m["world"]]
            == task.value_text(task.value(m["world"], m["entity"]))
        )
        extra = len(f" see W{m['conflict_world']}") if m["conflict_world"] >= 0 else 0
        assert 3 <= m["distance"] - extra <= 6
        if m["conflict_world"] >= 0:
            assert m["conflict_world"] != m["world"] and f"see W{m['conflict_world']} E" in e.prompt
        assert m["counterfactual_prompt"] == e.prompt.replace(f"W{m['world']}:", f"W{(m['world'] + 1) % 4}:", 1)


def test_attribution_and_verification():
    task = MultiWorldRecallTask()
    right, other = task.value_text(task.value(2, 5)), task.value_text(task.value(3, 5))
    assert task.attribute(5, right) == 2 and task.attribute(5, other) == 3
    assert task.misattributed(2, 5, other) and not task.misattributed(2, 5, right)
    assert task.attribute(5, "zz") is None and not task.misattributed(2, 5, "zz")
    assert task.verify(right + "<eos>junk", right) and not task.verify(other, right)
    with pytest.raises(ValueError, match="num_entities"):
        MultiWorldRecallTask(num_entities=30)


def test_seeded_splits_and_the_world_batch_from_rows():
    source = TaskSource(MultiWorldRecallTask(max_distractors=4), num_train=64, num_val=16, num_test=16, seed=3)
    again = TaskSource(MultiWorldRecallTask(max_distractors=4), num_train=64, num_val=16, num_test=16, seed=3)
    assert source.rows("train") == again.rows("train")
    assert not {r["prompt"] for r in source.rows("train")} & source.held_out_prompts()
    tok = build_char_tokenizer()
    rows = source.rows("val")
    batch = WorldBatch.from_rows(tok, rows)
    assert batch.input_ids.shape[0] == 16 and batch.source_ids.shape[0] == 16
    assert batch.answer_ids.tolist() == tok.convert_tokens_to_ids([r["answer"] for r in rows])
    assert batch.worlds.tolist() == [r["world"] for r in rows]
    effects = PatchingEffectRanker().score(build_model("llama"), batch)
    assert effects.shape == (3, 4) and bool(torch.isfinite(effects).all())
    with pytest.raises(DataError, match="row 0: missing field 'world'"):
        WorldBatch.from_rows(tok, [{"prompt": "x"}])
