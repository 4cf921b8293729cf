"""SafeThinkMonitor in a plain Lightning script: no Hydra, and nothing from this repo except the callback
and a scorer (the tokenizer, model and LightningModule are built here from tokenizers/transformers).

Test doubles: the scorer is a plain function flagging traces with a marker character; the "reasoning
model" is a random tiny Llama, and frequent characters are the step delimiters.
"""

from __future__ import annotations

import json
import logging

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from zoo.callbacks.safethink import SafeThinkMonitor
from zoo.errors import ConfigError
from zoo.generation.decoders import SampleDecoder
from zoo.generation.stepwise import StepwiseDecoder
from zoo.protocols import SamplingParams
from zoo.safety import safethink_generate

from conftest import char_tokenizer

torch.set_num_threads(1)
PROMPTS = ["JB q1=", "q2=", "JB q3=", "q4="]
ANSWERS = ["1", "2", "3", "4"]
DELIMS = [chr(i) for i in range(32, 127)] + ["\n"]  # every character closes a step


def make_tokenizer():
    return char_tokenizer(pad=True)


class TinyGenerator(pl.LightningModule):
    """A minimal generating module: tokenizer, model, generate(), its evaluation decoding (12 new tokens, greedy;
    no decoder: SafeThink then decodes step-wise with its defaults) and the protocol dict from eval steps."""

    def __init__(self, decoder=None) -> None:
        super().__init__()
        self.eval_sampling = SamplingParams(max_new_tokens=12)
        if decoder is not None:
            self.decoder = decoder
        self.tokenizer = make_tokenizer()
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(self.tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                max_position_embeddings=128,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        )

    def generate(self, prompt_ids, prompt_attention_mask, params=None, generator=None):
        return self.model.generate(input_ids=prompt_ids, attention_mask=prompt_attention_mask, max_new_tokens=8)

    def training_step(self, batch, batch_idx):
        ids = self.tokenizer(batch["prompts"], return_tensors="pt", padding=True)["input_ids"]
        return self.model(input_ids=ids, labels=ids).loss

    def _eval(self, batch):
        return {
            "texts": ["<think>1</think>" + a for a in batch["answers"]],
            "meta": {"prompts": batch["prompts"], "answers": batch["answers"]},
        }

    def validation_step(self, batch, batch_idx):
        return self._eval(batch)

    def test_step(self, batch, batch_idx):
        return self._eval(batch)

    def predict_step(self, batch, batch_idx):
        return self._eval(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def loader():
    """Batches of prompts, answers and a column ``attack`` (the attack label of each row)."""
    rows = [{"prompt": p, "answer": a, "attack": p.startswith("JB")} for p, a in zip(PROMPTS, ANSWERS)]
    return DataLoader(
        rows,
        batch_size=2,
        collate_fn=lambda b: {
            "prompts": [r["prompt"] for r in b],
            "answers": [r["answer"] for r in b],
            "columns": {"attack": [r["attack"] for r in b]},
        },
    )


def flag_attacks(prompts, traces):
    """Scripted R_safe: every step of an attack prompt is unsafe."""
    return [0.0 if p.startswith("JB") else 1.0 for p in prompts]


def monitor(**kw):
    base = {
        "scorer": flag_attacks,
        "tau": 0.5,
        "max_steps_monitored": 2,
        "attack_column": "attack",
        "harm_fn": lambda text: "Wait" not in text,
    }
    return SafeThinkMonitor(**{**base, **kw})


def trainer(cb, tmp_path, **kw):
    return pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        limit_val_batches=2,
        callbacks=cb,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        **kw,
    )


def test_plain_lightning_validate_test_predict_log_metrics(tmp_path):
    cb = monitor()
    tr = trainer([cb], tmp_path)
    metrics = tr.validate(TinyGenerator(), loader(), verbose=False)[0]
    assert metrics["safethink/intervention_rate"] == 1.0  # every attack prompt is flagged at step 1
    assert metrics["safethink/false_intervention_rate"] == 0.0
    assert metrics["safethink/asr"] == 0.0  # harm_fn: no prefix in the text
    assert metrics["safethink/base_asr"] == 1.0
    assert metrics["safethink/added_tokens"] > 0
    assert 0.0 <= metrics["safethink/accuracy"] <= 1.0
    assert metrics["safethink/base_accuracy"] == 1.0
    tr.test(TinyGenerator(), loader(), verbose=False)
    assert cb.last_metrics["intervention_rate"] == 1.0
    tr.predict(TinyGenerator(), loader())
    assert cb.runs == 3
    assert cb.totals["attack_rows"] == 6


def test_state_round_trips_through_a_checkpoint(tmp_path):
    cb = monitor()
    tr = trainer([cb], tmp_path)
    tr.fit(TinyGenerator(), loader(), loader())
    assert cb.runs >= 1
    path = tmp_path / "last.ckpt"
    tr.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["callbacks"][cb.state_key]
    assert saved == cb.state_dict()
    fresh = monitor()
    assert fresh.state_key == cb.state_key
    fresh.load_state_dict(saved)
    assert fresh.state_dict() == cb.state_dict()
    # resuming through Lightning restores it as well
    resumed = monitor()
    trainer(
        [resumed],
        tmp_path,
    ).fit(TinyGenerator(), loader(), loader(), ckpt_path=path)
    assert resumed.totals["rows"] == cb.totals["rows"]
    assert resumed.runs == cb.runs


def test_two_instances_side_by_side_have_distinct_state(tmp_path):
    a, b = monitor(tau=0.5, log_prefix="st_a"), monitor(tau=0.0, log_prefix="st_b")
    assert a.state_key != b.state_key
    metrics = trainer([a, b], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    assert metrics["st_a/intervention_rate"] == 1.0
    assert metrics["st_b/intervention_rate"] == 0.0


class NoProtocol(pl.LightningModule):
    def validation_step(self, batch, batch_idx):
        return None


def test_module_without_the_protocol_fails_in_setup_naming_what_is_missing(tmp_path):
    with pytest.raises(Exception, match="lacks tokenizer, model, generate\\(\\)"):
        trainer([monitor()], tmp_path).validate(NoProtocol(), loader(), verbose=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"stages": ["fit"]}, "stages"),
        ({"max_steps_monitored": -2}, "max_steps_monitored"),
        ({"prefix": ""}, "prefix"),
        ({"harm_fn": 3}, "harm_fn"),
    ],
)
def test_arguments_are_validated_in_init(kwargs, match):
    with pytest.raises(ValueError, match=match):
        monitor(**kwargs)


def test_records_file_holds_one_line_per_row_that_agrees_with_the_rates(tmp_path):
    path = tmp_path / "records" / "safethink.jsonl"
    cb = monitor(records_file=str(path))
    metrics = trainer([cb], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["prompt"] for r in records] == PROMPTS
    assert all(r["stage"] == "validate" for r in records)
    attack = [r for r in records if r["attack"]]
    benign = [r for r in records if not r["attack"]]
    assert [r["prompt"] for r in attack] == ["JB q1=", "JB q3="]
    assert metrics["safethink/asr"] == sum(r["harmful"] for r in attack) / len(attack)
    assert metrics["safethink/accuracy"] == sum(r["correct"] for r in benign) / len(benign)
    assert all(r["interventions"] and r["interventions"][0]["step"] == 1 for r in attack)
    assert all(r["interventions"] == [] and r["added_tokens"] == 0 for r in benign)
    assert all("Wait, think safely" in r["completion"] for r in attack)
    assert all("harmful" not in r for r in benign) and all("correct" not in r for r in attack)


def test_always_prefix_baseline_opens_every_reasoning_block_with_the_prefix(tmp_path):
    from zoo.safety import always_prefix_generate

    path = tmp_path / "always.jsonl"
    cb = monitor(always_prefix=True, records_file=str(path), scorer=lambda p, t: 1 / 0)  # the scorer is never called
    metrics = trainer([cb], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    assert metrics["safethink/intervention_rate"] == 1.0
    assert metrics["safethink/false_intervention_rate"] == 1.0
    assert metrics["safethink/asr"] == 0.0  # harm_fn: the prefix is in every text
    module = TinyGenerator()
    expected = []
    for batch in loader():  # greedy: the baseline's texts are always_prefix_generate's
        expected += always_prefix_generate(
            module.model, module.tokenizer, batch["prompts"], params=module.eval_sampling
        )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["completion"] for r in records] == expected
    # the opener, the prefix and the step delimiter of SafeThink's default step-wise decoder
    assert all(r["completion"].startswith("<think>Wait, think safely\n") for r in records)
    prefix_tokens = len(module.tokenizer("Wait, think safely", add_special_tokens=False)["input_ids"])
    assert metrics["safethink/added_tokens"] == prefix_tokens
    assert cb.state_key != monitor().state_key


def test_attack_labels_from_a_callable_equal_those_from_the_column(tmp_path):
    by_column = trainer([monitor()], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    by_callable = monitor(attack_column=None, is_attack=lambda prompt: prompt.startswith("JB"))
    metrics = trainer([by_callable], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    timing = "safethink/scorer_seconds"
    assert {k: v for k, v in metrics.items() if k != timing} == {k: v for k, v in by_column.items() if k != timing}
    assert by_column["safethink/intervention_rate"] == 1.0


def test_without_attack_labels_or_harm_judge_the_monitor_says_once_what_it_cannot_compute(tmp_path, caplog):
    """No task-specific defaults: without labels the 'JB' prompts are not taken for attacks, and attack metrics are
    not reported (interventions on them are not false interventions either)."""
    cb = monitor(attack_column=None, harm_fn=None)
    tr = trainer([cb], tmp_path)
    with caplog.at_level(logging.WARNING, logger="zoo.callbacks.safethink"):
        metrics = tr.validate(TinyGenerator(), loader(), verbose=False)[0]
        tr.test(TinyGenerator(), loader(), verbose=False)
    for name in ("asr", "base_asr", "intervention_rate", "false_intervention_rate"):
        assert f"safethink/{name}" not in metrics
        assert name not in cb.last_metrics
    assert metrics["safethink/intervened_fraction"] == 0.5  # the two 'JB' rows of four
    assert metrics["safethink/base_accuracy"] == 1.0  # over every answered row
    said = [r.getMessage() for r in caplog.records if "cannot compute" in r.getMessage()]
    assert len(said) == 1
    assert "asr" in said[0] and "intervention_rate" in said[0] and "harm_fn" in said[0]

    labelled = monitor(harm_fn=None)  # labels but no harm judge: only the attack success is missing
    metrics = trainer([labelled], tmp_path).validate(TinyGenerator(), loader(), verbose=False)[0]
    assert metrics["safethink/intervention_rate"] == 1.0
    assert "safethink/asr" not in metrics


class TemplateGenerator(pl.LightningModule):
    """A module with its own prompt encoding (a template, no BOS), a GPT-2 style tokenizer without pad token, and
    greedy evaluation with a 7-token budget; it returns the prompt ids it generated from."""

    TEMPLATE = "User: {}\nAssistant:"

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = char_tokenizer(pad=False)
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=len(self.tokenizer), n_positions=128, n_embd=32, n_layer=1, n_head=2)
        self.model = GPT2LMHeadModel(config)
        self.eval_sampling = SamplingParams(max_new_tokens=7)

    def generate(self, prompt_ids, prompt_attention_mask, params=None, generator=None):
        return SampleDecoder()(
            self.model, self.tokenizer, prompt_ids, prompt_attention_mask, params=params or self.eval_sampling
        )

    def encode(self, prompts):
        ids = [self.tokenizer(self.TEMPLATE.format(p), add_special_tokens=False)["input_ids"] for p in prompts]
        width = max(len(i) for i in ids)
        eos = self.tokenizer.eos_token_id
        return (
            torch.tensor([[eos] * (width - len(i)) + i for i in ids]),
            torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]),
        )

    def validation_step(self, batch, batch_idx):
        result = self.generate(batch["prompt_ids"], batch["prompt_attention_mask"])
        meta = {"prompts": batch["prompts"], "answers": batch["answers"]}
        return {"prompt_ids": result.prompt_ids, "texts": result.texts, "meta": meta}


def test_safethink_decodes_from_the_module_prompt_ids_with_its_budget(tmp_path):
    """With a scorer that never flags, SafeThink's completion of every row equals the module's own: same input ids
    (its template, EOS-padded), same budget (the module's eval_sampling, 7 tokens)."""
    module = TemplateGenerator()
    rows = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS)]

    def collate(batch):
        ids, mask = module.encode([r["prompt"] for r in batch])
        return {
            "prompt_ids": ids,
            "prompt_attention_mask": mask,
            "prompts": [r["prompt"] for r in batch],
            "answers": [r["answer"] for r in batch],
            "columns": {"attack": [True] * len(batch)},
        }

    judged: list[str] = []
    cb = SafeThinkMonitor(
        scorer=lambda prompts, traces: [1.0] * len(traces),
        tau=0.5,
        max_steps_monitored=None,
        attack_column="attack",
        harm_fn=lambda text: judged.append(text) or False,
    )
    trainer([cb], tmp_path).validate(module, DataLoader(rows, batch_size=3, collate_fn=collate), verbose=False)
    safethink, base = judged[0::2], judged[1::2]  # per attack row: SafeThink's completion, then the module's
    assert len(base) == len(PROMPTS)
    assert safethink == base
    assert all(len(module.tokenizer(t)["input_ids"]) <= 7 for t in base)


def test_safethink_decodes_with_the_modules_evaluation_settings_and_needs_them():
    """No decoding settings of its own: the monitor decodes with the module's ``eval_sampling`` (else ``sampling``);
    a module with neither is one ConfigError naming what to add."""
    module = TemplateGenerator()
    assert SafeThinkMonitor.decoding(module) is module.eval_sampling
    del module.eval_sampling
    with pytest.raises(ConfigError, match="no eval_sampling/sampling .*self.eval_sampling = SamplingParams"):
        monitor().setup(None, module, "validate")


def test_safethink_monitors_through_the_modules_stepwise_decoder(tmp_path):
    """One decoding path: with a step-wise decoder on the module, SafeThink uses its settings (every character closes
    a step here) and its logits processors, and leaves it as it was (no step hook set on it)."""
    module = TinyGenerator()

    def through(decoder, prompts=PROMPTS):
        return safethink_generate(
            module.model,
            module.tokenizer,
            prompts,
            flag_attacks,
            max_steps_monitored=2,
            params=module.eval_sampling,
            decoder=decoder,
        ).texts

    unbanned = through(StepwiseDecoder(step_delimiters=DELIMS))
    # ban a character these completions use (not one of the prefix)
    banned_char = next(c for text in unbanned for c in text if c not in "Wait, think safely<>/")
    banned = module.tokenizer.convert_tokens_to_ids(banned_char)

    def ban(ids, scores):
        scores = scores.clone()
        scores[:, banned] = float("-inf")
        return scores

    decoder = StepwiseDecoder(step_delimiters=DELIMS, processors=[ban])
    path = tmp_path / "records.jsonl"
    cb = monitor(records_file=str(path))
    metrics = trainer([cb], tmp_path).validate(TinyGenerator(decoder), loader(), verbose=False)[0]
    assert decoder.step_hook is None
    assert metrics["safethink/intervention_rate"] == 1.0
    expected = [text for batch in loader() for text in through(decoder, batch["prompts"])]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["completion"] for r in records] == expected
    assert not any(banned_char in text for text in expected) and expected != unbanned  # its processor applied
    assert through(None) != unbanned  # SafeThink's default decoder (newline steps) writes other completions


def test_a_decoder_safethink_cannot_monitor_step_by_step_is_refused_in_setup():
    from zoo.generation.decoders import GreedyDecoder

    with pytest.raises(ConfigError, match="GreedyDecoder.*module/decoder=stepwise"):
        monitor().setup(None, TinyGenerator(GreedyDecoder()), "validate")


def test_a_policy_that_never_writes_the_delimiter_is_still_monitored(tmp_path):
    """A plain Lightning module whose decoder (a plain sampler) never samples the newline that ends SafeThink's steps
    (a logits processor bans it; an adversarial prompt can ask for that): every attack row is still scored -- its
    step closes at the end of the row -- and steered; none of the benign rows is."""
    newline = make_tokenizer().convert_tokens_to_ids("\n")
    seen: list[str] = []

    def ban_newline(ids, scores):
        scores = scores.clone()
        scores[:, newline] = float("-inf")
        return scores

    def scorer(prompts, traces):
        seen.extend(traces)
        return flag_attacks(prompts, traces)

    path = tmp_path / "records.jsonl"
    cb = monitor(scorer=scorer, records_file=str(path))
    metrics = trainer([cb], tmp_path).validate(
        TinyGenerator(SampleDecoder(processors=[ban_newline])), loader(), verbose=False
    )[0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert not any("\n" in r["completion"] for r in records)
    assert seen, "the rows' text was scored"
    assert metrics["safethink/intervention_rate"] == 1.0
    assert metrics["safethink/false_intervention_rate"] == 0.0
    assert metrics["safethink/asr"] == 0.0  # harm_fn: the prefix steered every attack row
    assert all(r["interventions"][0]["step"] == 1 for r in records if r["attack"])


@pytest.mark.parametrize("monitor_answer", [True, False])
def test_an_answer_written_right_after_the_closing_tag_is_monitored(tmp_path, monitor_answer):
    """A plain Lightning module whose decoder (a plain sampler) closes the reasoning at once and then writes 'Z' (a
    logits processor forces ``</think>`` as the first characters, then pushes 'Z' and bans the newline and EOS): the
    scorer flags a 'Z' after the tag in an attack row. By default (``monitor_answer``) every attack row's answer is
    scored and steered -- the prefix replaces the violating answer step, right after the tag -- and the records and
    ``answer_interventions_per_row`` say the interventions lay in the answer; ``monitor_answer=False`` scores only the
    (safe) final step, so the attack goes through, as before."""
    tok = make_tokenizer()
    close = tok("</think>", add_special_tokens=False)["input_ids"]
    equals, z = tok.convert_tokens_to_ids("="), tok.convert_tokens_to_ids("Z")
    banned = [tok.convert_tokens_to_ids("\n"), tok.eos_token_id]

    def adversary(ids, scores):
        out = scores.clone()
        out[:, banned] = float("-inf")
        out[:, z] += 100.0
        for r, row in enumerate(ids.tolist()):
            written = [t for t in row[row.index(equals) + 1 :] if t != tok.pad_token_id]  # prompts end at their '='
            if len(written) < len(close):
                out[r] = float("-inf")
                out[r, close[len(written)]] = 0.0
        return out

    def flag_z_in_attack_answers(prompts, traces):
        return [
            0.0 if p.startswith("JB") and "Z" in t.partition("</think>")[2] else 1.0 for p, t in zip(prompts, traces)
        ]

    path = tmp_path / "records.jsonl"
    cb = monitor(scorer=flag_z_in_attack_answers, records_file=str(path), monitor_answer=monitor_answer)
    module = TinyGenerator(SampleDecoder(processors=[adversary]))
    metrics = trainer([cb], tmp_path).validate(module, loader(), verbose=False)[0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(r["completion"].startswith("</think>") for r in records)
    benign = [r for r in records if not r["attack"]]
    assert all(r["completion"] == "</think>ZZZZ" and not r["interventions"] for r in benign)
    attack = [r for r in records if r["attack"]]
    if monitor_answer:
        assert metrics["safethink/intervention_rate"] == 1.0 and metrics["safethink/asr"] == 0.0
        assert metrics["safethink/false_intervention_rate"] == 0.0
        assert metrics["safethink/answer_interventions_per_row"] == 0.5  # one per attack row, 2 of 4 rows
        for r in attack:
            assert r["completion"] == "</think>Wait, think safely"  # the 12-token budget ran out in the prefix
            assert [(i["step"], i["answer"], i["discarded"]) for i in r["interventions"]] == [(2, True, True)]
    else:
        assert metrics["safethink/intervention_rate"] == 0.0 and metrics["safethink/asr"] == 1.0
        assert metrics["safethink/answer_interventions_per_row"] == 0.0
        assert all(r["completion"] == "</think>ZZZZ" and not r["interventions"] for r in attack)
    assert cb.state_key != monitor(monitor_answer=not monitor_answer).state_key


def _classifier_scorer(tok):
    from transformers import LlamaForSequenceClassification

    from zoo.safety.scorers import SequenceClassifierScorer

    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=len(tok),
        num_labels=2,
        pad_token_id=tok.pad_token_id,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    return SequenceClassifierScorer(LlamaForSequenceClassification(config), tok)


@pytest.mark.parametrize(("option", "expected"), [(None, torch.bfloat16), ("keep", torch.float32)])
def test_a_model_scorer_runs_in_the_policys_dtype_and_device_unless_told(tmp_path, option, expected):
    """The scorer loads in fp32 on the host; by default the monitor moves it next to the policy (here a bf16 policy:
    the scorer runs in bf16), ``scorer_dtype='keep'`` leaves it as loaded (DESIGN "Scale")."""
    policy = TinyGenerator()
    policy.model.to(torch.bfloat16)
    scorer = _classifier_scorer(policy.tokenizer)
    cb = monitor(scorer=scorer, scorer_dtype=option, max_batches=1)
    trainer([cb], tmp_path).validate(policy, loader(), verbose=False)
    assert cb.runs == 1
    assert scorer.model.dtype == expected
    assert next(scorer.model.parameters()).device == next(policy.model.parameters()).device


def test_place_auxiliary_follows_the_policys_device_and_refuses_a_bad_dtype():
    """Device placement checked without an accelerator: a policy on the ``meta`` device pulls the auxiliary there."""
    from zoo.backbones.placement import place_auxiliary

    policy = torch.nn.Linear(2, 2, device="meta", dtype=torch.float16)
    aux = torch.nn.Linear(2, 2)
    assert place_auxiliary(aux, policy) is aux
    assert aux.weight.device.type == "meta" and aux.weight.dtype == torch.float16
    kept = torch.nn.Linear(2, 2)
    place_auxiliary(kept, policy, device="keep", dtype="keep")
    assert kept.weight.device.type == "cpu" and kept.weight.dtype == torch.float32
    with pytest.raises(ConfigError, match="scorer_dtype='int8'"):
        monitor(scorer_dtype="int8")
