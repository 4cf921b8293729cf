"""ThoughtFold (arXiv:2606.03503): search, pair masks, importance, the GRPO auxiliary-loss seam, bad inputs."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.backbones.tokenizer import build_char_tokenizer
from zoo.callbacks import LineRemovalProbe, PreferencePairRecords, ReasoningRedundancy
from zoo.cli.train import run
from zoo.data.tasks import MultiSum
from zoo.errors import ConfigError
from zoo.losses import IGNORE_INDEX, masked_sequence_logprobs
from zoo.modules import GRPOModule
from zoo.modules.thoughtfold import ThoughtFoldLoss
from zoo.rl import ExactMatchReward, masked_dpo_loss
from zoo.rl.losses import pair_side_logprobs
from zoo.rl.thoughtfold import (
    FoldTarget,
    ThoughtFolder,
    Verdict,
    attention_importance,
    bridging_steps,
    completion_text,
    encode_pair,
    fold_pair,
    fold_steps,
    join_steps,
    leave_one_out_importance,
    line_removals,
    parse_reasoning,
    passes,
    redundancy_stats,
    shortest_passing,
    split_steps,
    tail_cut_points,
    tail_pair,
)

from conftest import SMALL_BASE_POLICY

TOKENIZER = build_char_tokenizer()


def encode(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def scored_spans(ids: list[int], labels: list[int]) -> list[str]:
    """The maximal runs of labelled tokens, decoded."""
    spans, current = [], []
    for token, label in zip(ids, labels):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return [TOKENIZER.decode(s, skip_special_tokens=False) for s in spans]


# -- binary search ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 64, 100, 257])
def test_shortest_passing_finds_the_threshold_within_log2_calls(n):
    for threshold in range(1, n + 2):  # n + 1: even n fails
        calls = []

        def oracle(k, t=threshold, calls=calls):
            calls.append(k)
            return k >= t

        budget = math.ceil(math.log2(n)) + 1
        found = shortest_passing(n, oracle, max_iterations=budget)
        assert found == (threshold if threshold <= n else None)
        assert len(calls) <= budget


def test_shortest_passing_never_returns_a_failed_k():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 40)
        answers = {k: rng.random() < 0.5 for k in range(1, n + 1)}  # not monotone
        failed = set()

        def oracle(k, answers=answers, failed=failed):
            if not answers[k]:
                failed.add(k)
            return answers[k]

        found = shortest_passing(n, oracle, max_iterations=rng.randint(1, 8))
        assert found is None or (found not in failed and answers[found])
        assert (found is None) == (not answers[n])


def test_shortest_passing_respects_the_call_budget():
    calls = []
    found = shortest_passing(1000, lambda k: calls.append(k) or k >= 3, max_iterations=4)
    assert calls == [1000, 500, 250, 125]  # n first, then bisection, stopped by the budget
    assert found == 125  # the smallest k that passed so far


# -- text -----------------------------------------------------------------------------------------------------------
def test_step_split_rejoin_round_trips():
    rng = random.Random(1)
    alphabet = "ab1+= \n"
    for _ in range(200):
        body = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        for delimiter in ("\n", "\n\n"):
            assert join_steps(split_steps(body, delimiter), delimiter) == body
    for example in MultiSum(redundant_prob=0.5).examples(50, seed=3):
        parsed = parse_reasoning(example.completion)
        assert completion_text(split_steps(parsed.body), parsed.answer) == example.completion


def test_bad_rollouts_are_classified_not_crashed_on():
    assert parse_reasoning("12") == "no_reasoning"
    assert parse_reasoning("<think>1+2=3") == "no_reasoning"
    assert parse_reasoning("<think>1+2=3</think>") == "unparsable_answer"
    assert parse_reasoning("<think>1+2=3</think><think>3") == "unparsable_answer"
    assert parse_reasoning("<think>1+2=3</think>3").answer == "3"


def released_smart_cut(cot: str, mid: int) -> str:
    """The released ``BinarySearchEnvironment._smart_cut`` (thoughtfold/binsearch/binary_search_environment.py),
    restated to compare the cut points: snap to the previous newline, then the keyword window of the last line."""
    chopped = cot[:mid]
    if not chopped.endswith("\n"):
        last = chopped.rfind("\n")
        if last == -1:
            return ""
        chopped = chopped[: last + 1]
    mid = len(chopped)
    prev1 = chopped.rfind("\n", 0, mid)
    prev2 = chopped.rfind("\n", 0, prev1)
    words = {"".join(c for c in t.lower() if c.isalnum() or c == "_") for t in chopped[prev2 + 1 : mid].split()}
    if words & {"see", "another"}:
        return chopped[: prev1 if prev1 != -1 else mid]
    if words & {"yes", "no", "so", "true", "good", "fine"}:
        nxt = chopped.find("\n", mid)
        return chopped[: nxt + 1 if nxt != -1 else len(chopped)]
    return chopped


def test_tail_cut_points_are_the_released_smart_cut_prefixes():
    """A 6-line reasoning with forward and backward keywords: every character cut of the released heuristic keeps
    0-5 whole lines (the keywords never change the kept lines); the zoo offers 1..5 (min_steps 1), then all 6."""
    steps = ["a=1", "so b=2", "see c", "yes d=4", "another e", "f=6"]
    body = join_steps(steps)
    cuts = {released_smart_cut(body, mid) for mid in range(1, len(body))}
    kept = {0 if not cut else cut.rstrip("\n").count("\n") + 1 for cut in cuts}
    assert all(not cut or body.startswith(cut) and body[len(cut)] == "\n" or cut.endswith("\n") for cut in cuts)
    assert sorted(kept) == [0, 1, 2, 3, 4, 5]
    assert tail_cut_points(steps) == [1, 2, 3, 4, 5, 6]
    assert tail_cut_points(steps, min_steps=0) == [*sorted(kept), 6]
    assert tail_cut_points(["x", "y", "z"], min_steps=2) == [2, 3]


def test_fold_steps_and_bridging():
    assert fold_steps([0.1, 0.9, 0.5, 0.9], 2) == [1, 3]
    assert fold_steps([1.0, 1.0, 1.0], 2) == [0, 1]
    assert bridging_steps([0, 1, 2, 3, 4], [0, 2, 4]) == [2, 4]
    assert bridging_steps([0, 2, 4], [0, 2]) == []  # only the tail was pruned


# -- pairs --------------------------------------------------------------------------------------------------------
def test_tail_pair_masks_are_exactly_the_pruned_tail_and_the_answer():
    for example in MultiSum(min_operands=3, max_operands=6, redundant_prob=0.5).examples(40, seed=5):
        parsed = parse_reasoning(example.completion)
        steps = split_steps(parsed.body)
        prompt = encode(example.prompt)
        for previous in range(1, len(steps) + 1):
            for keep in range(previous):
                pair = tail_pair(0, steps, keep, previous, "42", parsed.answer)
                rows = encode_pair(pair, prompt, encode)
                assert scored_spans(rows["rejected_input_ids"], rows["rejected_labels"]) == steps[keep:previous]
                assert scored_spans(rows["chosen_input_ids"], rows["chosen_labels"]) == ["42<eos>"]
                assert len(rows["chosen_input_ids"]) < len(rows["rejected_input_ids"]) or previous - keep == 0
                assert rows["chosen_labels"][: len(prompt)] == [IGNORE_INDEX] * len(prompt)


def test_fold_pair_masks_are_exactly_the_pruned_and_bridging_steps():
    rng = random.Random(7)
    steps = [f"s{i}={i * 3}" for i in range(8)]
    for _ in range(200):
        previous = sorted(rng.sample(range(8), rng.randint(2, 8)))
        kept = sorted(rng.sample(previous, rng.randint(1, len(previous) - 1)))
        pair = fold_pair(0, steps, kept, previous, "7", "7")
        rows = encode_pair(pair, encode("q="), encode)
        pruned = [steps[i] for i in previous if i not in kept]
        bridging = [steps[i] for i in bridging_steps(previous, kept)]
        assert scored_spans(rows["rejected_input_ids"], rows["rejected_labels"]) == pruned
        chosen = scored_spans(rows["chosen_input_ids"], rows["chosen_labels"])
        assert chosen == (bridging or ["7<eos>"])
        assert len(rows["chosen_input_ids"]) < len(rows["rejected_input_ids"])


def test_folder_never_emits_a_pair_whose_chosen_side_failed():
    """A fake oracle (test double for a policy's validation): a candidate passes iff it keeps every essential step."""
    rng = random.Random(11)
    task = MultiSum(min_operands=3, max_operands=6, redundant_prob=0.6)
    examples = task.examples(30, seed=2)
    targets, essential = [], []
    for i, example in enumerate(examples):
        steps = split_steps(parse_reasoning(example.completion).body)
        targets.append(FoldTarget(i, steps, example.answer))
        essential.append({s for s, r in zip(steps, example.meta["step_redundant"]) if not r})
    validated = {}

    def validate(queries):
        out = []
        for t, kept in queries:
            ok = essential[t] <= {targets[t].steps[j] for j in kept} and rng.random() < 0.9
            validated[(t, tuple(kept))] = ok
            out.append(Verdict(ok, "ans" if ok else None, None if ok else "bad"))
        return out

    def importance(t, steps, answer):
        return [0.0 if s.startswith("check") else 1.0 for s in steps]

    pairs, stats = ThoughtFolder(min_cot_length=0, delimiter="\n").search(targets, validate, importance)
    assert stats["candidates"] == len(validated)
    for pair in pairs:
        if pair.kind in ("tail", "fold"):
            chosen_steps = split_steps(parse_reasoning(pair.text("chosen")).body)
            steps = targets[pair.row].steps
            assert any(
                ok and [steps[j] for j in kept] == chosen_steps for (t, kept), ok in validated.items() if t == pair.row
            ), "the chosen side of a pair must have passed validation"
            assert len(pair.text("chosen")) < len(pair.text("rejected"))
            assert pair.text("chosen").endswith("</think>ans<eos>")
        if pair.kind == "fold":  # the lowest-importance steps go first: only the redundant ones can be pruned
            pruned = pair.text("rejected", True).replace("check", "\ncheck").split("\n")
            assert all(span.startswith("check") for span in pruned if span)
        if pair.kind.startswith("overjump"):
            assert pair.text("rejected").endswith("</think>bad<eos>")
    assert any(p.kind == "fold" for p in pairs)


def test_passes_counts_invalid_answers_as_failures():
    assert passes([True] * 3 + [False], [True] * 4, 0.75)
    assert not passes([True] * 3 + [True], [True, True, False, False], 0.75)
    assert passes([True, True, False, False], [True, True, False, False], 0.75, rate_over="valid")


# -- masked DPO -----------------------------------------------------------------------------------------------------
def test_masked_dpo_identical_sides_give_log2_and_zero_gradient():
    policy = TinyBackbone(seed=0).build_model()
    reference = TinyBackbone(seed=1).build_model()
    example = MultiSum(redundant_prob=0.5).examples(1, seed=4)[0]
    parsed = parse_reasoning(example.completion)
    steps = split_steps(parsed.body)
    pair = tail_pair(0, steps, len(steps) - 1, len(steps), parsed.answer, parsed.answer)
    rows = encode_pair(pair, encode(example.prompt), encode)
    # the same side twice: identical tokens and identical masks
    same = {
        f"{side}_{key}": torch.tensor([rows[f"rejected_{key}"]])
        for side in ("chosen", "rejected")
        for key in ("input_ids", "labels")
    }
    same["chosen_attention_mask"] = same["rejected_attention_mask"] = torch.ones_like(same["chosen_input_ids"])
    c, r = pair_side_logprobs(policy, same, TOKENIZER.pad_token_id)
    with torch.no_grad():
        rc, rr = pair_side_logprobs(reference, same, TOKENIZER.pad_token_id)
    loss = masked_dpo_loss(c, r, rc, rr, beta=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(2), abs=1e-6)
    assert max(p.grad.abs().max().item() for p in policy.parameters() if p.grad is not None) < 1e-6


def test_perturbing_logits_at_masked_positions_changes_nothing():
    torch.manual_seed(0)
    labels = torch.randint(0, 20, (3, 12))
    labels[:, :4] = IGNORE_INDEX
    labels[1, 8:] = IGNORE_INDEX
    logits = torch.randn(3, 12, 20, requires_grad=True)

    def loss_of(lg):
        logps = masked_sequence_logprobs(lg, labels)
        return masked_dpo_loss(logps[:2], logps[1:], torch.zeros(2), torch.ones(2), beta=0.3)

    base = loss_of(logits)
    (grad,) = torch.autograd.grad(base, logits)
    # positions t predict labels[t + 1]: the masked ones are those whose next label is -100
    masked = torch.zeros(3, 12, dtype=torch.bool)
    masked[:, :-1] = labels[:, 1:] == IGNORE_INDEX
    masked[:, -1] = True
    assert torch.all(grad[masked] == 0)
    perturbed = logits.detach().clone()
    perturbed[masked] += 5 * torch.randn_like(perturbed[masked])
    perturbed.requires_grad_(True)
    again = loss_of(perturbed)
    (grad2,) = torch.autograd.grad(again, perturbed)
    torch.testing.assert_close(again, base)
    torch.testing.assert_close(grad2, grad)


# -- importance -----------------------------------------------------------------------------------------------------
def test_leave_one_out_importance_equals_separate_answer_logprobs():
    model = TinyBackbone(seed=3).build_model().eval()
    steps, answer, prompt = ["1+2=3", "check 3", "3+4=7"], "7", encode("1+2+4=")

    def answer_logp(kept):
        ids = prompt + encode("<think>" + "\n".join(kept) + "</think>")
        full = ids + encode(answer + "<eos>")
        labels = torch.tensor([[IGNORE_INDEX] * len(ids) + full[len(ids) :]])
        with torch.no_grad():
            return masked_sequence_logprobs(model(input_ids=torch.tensor([full])).logits, labels).item()

    scores = leave_one_out_importance(model, prompt, steps, answer, encode, TOKENIZER.pad_token_id)
    expected = [answer_logp(steps) - answer_logp([s for j, s in enumerate(steps) if j != i]) for i in range(3)]
    assert scores == pytest.approx(expected, abs=1e-4)


def test_attention_importance_needs_eager_attention():
    model = TinyBackbone(seed=3).build_model()
    model.config._attn_implementation = "sdpa"
    with pytest.raises(ConfigError, match="attn_implementation=eager"):
        attention_importance(model, encode("1+2="), ["1+2=3", "check 3"], "3", encode)
    model.config._attn_implementation = "eager"
    scores = attention_importance(model, encode("1+2="), ["1+2=3", "check 3", "x"], "3", encode)
    assert len(scores) == 3 and all(s > 0 for s in scores)


def test_attention_importance_config_error_names_the_fix():
    module = GRPOModule(
        TinyBackbone(seed=3), rewards=[ExactMatchReward()], group_size=2, aux=ThoughtFoldLoss(importance="attention")
    )
    module.model = module.backbone.build_model()
    module.model.config._attn_implementation = "sdpa"
    with pytest.raises(ConfigError, match="attn_implementation=eager"):
        module.aux.setup(module)


# -- the auxiliary-loss seam ----------------------------------------------------------------------------------------
def always_correct(completion, answer):
    """Test double for a trained policy's verifier: every parsable candidate passes (a random tiny policy solves
    nothing), so the search, pairs and loss run end to end."""
    return parse_reasoning(completion) != "no_reasoning"


def tiny_module(aux, micro_batch_size=64):
    torch.manual_seed(0)
    module = GRPOModule(
        TinyBackbone(seed=2),
        rewards={"accuracy": ExactMatchReward()},
        group_size=2,
        micro_batch_size=micro_batch_size,
        generation={"max_new_tokens": 12},
        verifier=always_correct,
        aux=aux,
    )
    module.configure_model()
    return module


def reference_rollout(module, num_prompts=3):
    """A rollout whose completions are the task's reference completions (plus one without a reasoning block)."""
    examples = MultiSum(min_operands=4, max_operands=5, redundant_prob=0.7).examples(num_prompts, seed=9)
    texts = [e.completion for e in examples for _ in range(2)]
    texts[1] = "17"  # no reasoning block: skipped and counted
    prompts = [encode(e.prompt) for e in examples for _ in range(2)]
    completions = [encode(t) + [TOKENIZER.eos_token_id] for t in texts]
    width, cwidth = max(map(len, prompts)), max(map(len, completions))
    pad = TOKENIZER.pad_token_id

    class Result:
        pass

    result = Result()
    result.prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    result.completion_ids = torch.tensor([c + [pad] * (cwidth - len(c)) for c in completions])
    result.lengths = torch.tensor([len(c) for c in completions])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return {
        "result": result,
        "prompt_mask": prompt_mask,
        "texts": texts,
        "correct": [True] * len(texts),
        "answers": [e.answer for e in examples for _ in range(2)],
    }


def test_thoughtfold_prepare_builds_pairs_counts_skips_and_cost():
    aux = ThoughtFoldLoss(folder=ThoughtFolder(min_cot_length=0, delimiter="\n", max_iterations=3), repeat=2)
    module = tiny_module(aux)
    items = aux.prepare(module, reference_rollout(module))
    metrics = aux.metrics()
    assert metrics["tf_skipped_no_reasoning"] == 1
    assert metrics["tf_rollouts_folded"] == 5
    assert metrics["tf_validation_samples"] == 2 * metrics["tf_candidates"] > 0
    assert metrics["tf_pairs_accepted"] == items.size == len(aux.last_pairs) > 0
    assert items.batch["chosen_input_ids"].shape[0] == items.size
    loss = aux.loss(module, items, slice(0, items.size))
    # the policy has not moved from the (frozen, initial) reference yet: the DPO loss is exactly log 2
    assert loss.item() == pytest.approx(math.log(2), abs=1e-5)


def test_default_reference_is_frozen_so_the_dpo_term_moves_after_an_update():
    """With the rollout-time policy as reference and one update per step, the policy equals the reference at every
    update and the DPO loss is log 2 forever. The default (a frozen copy of the initial policy, standard DPO) is not:
    after an update along the DPO gradient the next step's DPO loss is below log 2."""
    folder = ThoughtFolder(min_cot_length=0, delimiter="\n", max_iterations=3)

    def losses(aux):
        module = tiny_module(aux)
        items = aux.prepare(module, reference_rollout(module))
        first = aux.loss(module, items, slice(0, items.size))
        first.backward()
        with torch.no_grad():
            for p in module.model.parameters():
                if p.grad is not None:
                    p.sub_(0.5 * p.grad)
                    p.grad = None
        items = aux.prepare(module, reference_rollout(module))
        return first.item(), aux.loss(module, items, slice(0, items.size)).item()

    assert ThoughtFoldLoss().reference == "frozen"
    first, second = losses(ThoughtFoldLoss(folder=folder, repeat=2))
    assert first == pytest.approx(math.log(2), abs=1e-5)
    assert second < math.log(2) - 1e-3
    stuck = losses(ThoughtFoldLoss(folder=folder, repeat=2, reference="rollout"))
    assert stuck == pytest.approx((math.log(2), math.log(2)), abs=1e-5)  # the degenerate reading, still available


def test_pair_records_write_every_accepted_pair_with_its_scored_spans(tmp_path):
    import lightning.pytorch as pl

    aux = ThoughtFoldLoss(folder=ThoughtFolder(min_cot_length=0, delimiter="\n", max_iterations=3), repeat=2)
    module = tiny_module(aux)
    aux.prepare(module, reference_rollout(module))
    path = tmp_path / "pairs.jsonl"
    PreferencePairRecords(path).on_train_batch_end(pl.Trainer(logger=False), module, None, None, 0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == len(aux.last_pairs) > 0
    for record, pair in zip(records, aux.last_pairs):
        assert (record["kind"], record["row"]) == (pair.kind, pair.row)
        # a success pair prunes: its chosen side is shorter, and both sides carry loss on a part of their text
        assert len(record["chosen"]) < len(record["rejected"])
        assert record["rejected_scored"] and record["rejected_scored"] != record["rejected"]
        assert record["chosen_scored"] in record["chosen"]


def grads(module):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in module.model.parameters()]


def policy_and_aux_gradient(aux, micro_batch_size=64, reference="frozen"):
    module = tiny_module(aux, micro_batch_size)
    rollout = reference_rollout(module)
    with torch.no_grad():  # move the policy away from the reference so the DPO gradient is not trivial
        for p in module.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    from zoo.protocols import GenerationResult

    result = rollout["result"]
    rollout["result"] = GenerationResult(
        prompt_ids=result.prompt_ids,
        completion_ids=result.completion_ids,
        completion_mask=(result.completion_ids != TOKENIZER.pad_token_id).long(),
        logprobs=torch.zeros(result.completion_ids.shape),
        texts=rollout["texts"],
        finished=torch.ones(len(rollout["texts"]), dtype=torch.bool),
    )
    rows = module.sequences(rollout["result"], rollout["prompt_mask"])
    advantages = torch.linspace(-1, 1, rows[0].shape[0])
    items = aux.prepare(module, rollout) if aux is not None else None
    module.policy_gradients(rows, advantages, None)
    if items is not None:
        module.auxiliary_gradients(items)
    return grads(module)


def make_aux(weight, reference="frozen"):
    folder = ThoughtFolder(min_cot_length=0, delimiter="\n", max_iterations=2)
    return ThoughtFoldLoss(weight=weight, reference=reference, repeat=1, folder=folder)


def test_aux_weight_zero_gives_exactly_the_plain_grpo_gradient():
    plain = policy_and_aux_gradient(None)
    zero = policy_and_aux_gradient(make_aux(0.0))
    for a, b in zip(plain, zero):
        assert torch.equal(a, b)
    weighted = policy_and_aux_gradient(make_aux(1.0))
    assert any(not torch.allclose(a, b) for a, b in zip(plain, weighted))  # the test can fail


def test_aux_loss_is_micro_batch_invariant():
    full = policy_and_aux_gradient(make_aux(1.0), micro_batch_size=64)
    split = policy_and_aux_gradient(make_aux(1.0), micro_batch_size=2)
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_line_removals_drop_each_line_once_and_say_which_kind():
    assert line_removals([False, True, False]) == [
        ("full", [0, 1, 2]),
        ("essential", [1, 2]),
        ("redundant", [0, 2]),
        ("essential", [0, 1]),
    ]
    assert line_removals([]) == [("full", [])]


def needs_every_product_line(completion, answer):
    """Test double for the verifier of a policy that reads its answer off the lines: correct when the values of the
    written product lines sum to the reference answer, whatever answer was sampled after them."""
    body = completion.split("<think>")[1].split("</think>")[0]
    values = [int(s.split("=")[1]) for s in split_steps(body) if "*" in s]
    return sum(values) == int(answer)


class ProbeTrainer:
    """What the probe reads from the trainer: the validation batches and the loggers."""

    def __init__(self, batches):
        self.datamodule = type("DataModule", (), {"val_dataloader": lambda _: batches})()
        self.loggers = []
        self.global_step = 0


def test_line_removal_probe_counts_passes_per_kind_through_thoughtfold_validation():
    examples = MultiSum(4, 6, min_value=2, max_value=4, redundant_prob=0.5, partials="products").examples(6, seed=3)
    assert any(e.meta["num_redundant"] for e in examples)
    prompts = [encode(e.prompt) for e in examples]
    width, pad = max(map(len, prompts)), TOKENIZER.pad_token_id
    batch = {
        "prompt_ids": torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
        "prompt_attention_mask": torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
        "prompts": [e.prompt for e in examples],
        "columns": {
            "reference": [e.completion for e in examples],
            "step_redundant": [e.meta["step_redundant"] for e in examples],
            "answer": [e.answer for e in examples],
        },
    }
    aux = ThoughtFoldLoss(folder=ThoughtFolder(min_cot_length=0, delimiter="\n"), repeat=2)
    module = tiny_module(aux)
    # a policy that ends its answer at once (its end token's logit raised), so that every sampled answer is valid
    bias = torch.zeros(module.model.config.vocab_size)
    bias[TOKENIZER.eos_token_id] = 50.0
    module.model.lm_head.register_forward_hook(lambda _, __, logits: logits + bias)
    module.verifier = needs_every_product_line
    probe = LineRemovalProbe(max_rows=5)
    trainer = ProbeTrainer([batch])
    probe.record(trainer, module, "start")
    out = probe.results["start"]
    assert out["rows"] == 5
    assert out["pass_full"] == 1.0 and out["pass_drop_redundant"] == 1.0
    assert out["pass_drop_essential"] == 0.0 and out["rows_any_essential_drop_passes"] == 0.0
    module.verifier = always_correct  # a policy that answers right without any line: every removal passes
    probe.record(trainer, module, "end")
    assert probe.results["end"]["pass_drop_essential"] == probe.results["end"]["rows_any_essential_drop_passes"] == 1
    with pytest.raises(ConfigError, match="module/grpo/aux=thoughtfold"):
        probe.probe(trainer, tiny_module(None))


def test_thoughtfold_config_errors():
    with pytest.raises(ConfigError, match="module.aux.importance"):
        ThoughtFoldLoss(importance="gradients")
    with pytest.raises(ConfigError, match="module.aux.reference"):
        ThoughtFoldLoss(reference="sft")
    with pytest.raises(ConfigError, match="keep ratios"):
        ThoughtFolder(min_keep_ratio=0.9, max_keep_ratio=0.5)


# -- ground truth and the method -----------------------------------------------------------------------------------
def test_redundancy_stats_against_labelled_references():
    example = MultiSum(min_operands=4, max_operands=4, redundant_prob=1.0).examples(1, seed=0)[0]
    ref_steps = split_steps(parse_reasoning(example.completion).body)
    labels = example.meta["step_redundant"]
    essential = [s for s, r in zip(ref_steps, labels) if not r]
    assert redundancy_stats(join_steps(ref_steps), ref_steps, labels)["redundant_rate"] == pytest.approx(0.5)
    folded = redundancy_stats(join_steps(essential), ref_steps, labels)
    assert folded["redundant_rate"] == 0 and folded["essential_retention"] == 1
    cut = redundancy_stats(join_steps(essential[:1]), ref_steps, labels)
    assert cut["essential_retention"] == pytest.approx(1 / 3)


def test_reasoning_redundancy_names_the_missing_column():
    callback = ReasoningRedundancy()
    with pytest.raises(ConfigError, match="completion_column"):
        callback.stats(None, ["<think>1</think>1"], {"prompts": ["1="], "columns": {"answer": ["1"]}})


@pytest.mark.slow  # trains the small test base policy first (minutes on a loaded machine)
def test_method_runs_and_logs_the_issue_metrics(train_cfg, base_policy_cache):
    overrides = [
        "+method=thoughtfold",
        *SMALL_BASE_POLICY,
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.log_every_n_steps=1",
        "datamodule.batch_size=2",
        "datamodule.source.num_val=4",
        "module.group_size=2",
        "module.aux.repeat=2",
        "module.aux.folder.max_iterations=2",
        "module.generation.max_new_tokens=40",
    ]
    metrics = run(train_cfg(overrides, cache_dir=base_policy_cache))
    for key in [
        "train/think_tokens",
        "train/tf_pairs_built",
        "train/tf_pairs_accepted",
        "train/tf_validation_samples",
        "train/tf_validation_tokens",
        "train/tf_rollouts_folded",
        "val/think_tokens",
        "val/exact_match",
    ]:
        assert key in metrics, key
