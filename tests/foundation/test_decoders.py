"""The decoder seam (zoo.generation.decoders): every decoder path against independent references, the logits
processor and forward hook lists, run-time edits by a callback, the ``module/decoder`` group, and the
no-Lightning rule for the generation core.

References are independent of the code under test: an uncached loop that re-forwards the whole sequence at every
step (sharing only the per-step sampling primitive ``sample_next``, so that seeded sampling can be compared), and
Hugging Face ``model.generate`` for greedy decoding.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    SuppressTokensLogitsProcessor,
)

from zoo.backbones import HFBackbone, TinyBackbone, build_char_tokenizer
from zoo.data.sources import TaskSource
from zoo.data.tasks import Addition, Reverse
from zoo.datamodules import SFTDataModule
from zoo.encoding import encode_prompts
from zoo.generation import Decoder, ModuleHook, SampleDecoder, StepAction, StepwiseDecoder, generate, sample_next
from zoo.generation.decoders import as_prefill
from zoo.generation.prefix import SharedPrefix
from zoo.generation.sampling import IncrementalDecoder
from zoo.modules import CausalLMModule
from zoo.protocols import SamplingParams

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["1+1=", "22+3=", "rev ab=", "9+9=", "5+50=", "rev abcd="]
SAMPLED = SamplingParams(24, do_sample=True, temperature=1.3, top_k=20, top_p=0.95)
GREEDY = SamplingParams(24)


def quiet_stepwise(**kwargs) -> StepwiseDecoder:
    """A step-wise decoder with the newline delimiter that random models rarely write (no warning about it)."""
    return StepwiseDecoder(warn_no_delimiter=False, **kwargs)


DECODERS = pytest.mark.parametrize("decoder_cls", [SampleDecoder, quiet_stepwise], ids=["sample", "stepwise"])


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_eos_likely(model: torch.nn.Module, tokenizer, ids, mask) -> None:
    """Give EOS the output row (x 1.05) of the greedy token whose first occurrences are spread over the most
    steps, so that rows end by EOS at different steps (and some not at all)."""
    rows = generate(model, tokenizer, ids, mask, GREEDY).completion_ids.tolist()

    def spread(token: int) -> int:
        return len({row.index(token, 1) for row in rows if token in row[1:]})

    token = max(sorted({t for row in rows for t in row[1:]}), key=spread)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[tokenizer.eos_token_id] = head[token] * 1.05


@pytest.fixture(scope="module")
def tiny():
    backbone = TinyBackbone(seed=1)
    model = backbone.build_model().eval()
    tok = backbone.tokenizer
    ids, mask = encode_prompts(tok, PROMPTS)
    make_eos_likely(model, tok, ids, mask)
    return model, tok, ids, mask


@torch.no_grad()
def reference_decode(model, tok, ids, mask, params, generator):
    """Uncached reference of the standard loop: full re-forward every step, one ``sample_next`` over the batch."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    seq, att = ids, mask
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    out_ids, out_lp = [], []
    for _ in range(params.max_new_tokens):
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=att, position_ids=pos).logits[:, -1].float()
        tokens, logprobs = sample_next(logits, params, generator)
        tokens = torch.where(done, torch.full_like(tokens, pad), tokens)
        out_ids.append(tokens)
        out_lp.append(torch.where(done, torch.zeros_like(logprobs), logprobs))
        done = done | (tokens == eos)
        if bool(done.all()):
            break
        seq = torch.cat([seq, tokens[:, None]], 1)
        att = torch.cat([att, (~done).long()[:, None]], 1)
    return torch.stack(out_ids, 1), torch.stack(out_lp, 1), done


# -- decoder paths against references ------------------------------------------------------------------------------
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_sample_decoder_through_a_module_equals_the_uncached_reference(tiny, params):
    model, tok, ids, mask = tiny
    module = CausalLMModule(TinyBackbone(seed=1))
    module.model = model
    assert isinstance(module.decoder, SampleDecoder)
    result = module.generate(ids, mask, params, _gen(3))
    ref_ids, ref_lp, ref_done = reference_decode(model, tok, ids, mask, params, _gen(3))
    assert 1 < int(ref_done.sum()) < len(PROMPTS), "rows must end early (EOS; finished rows leave the batch)"
    assert torch.equal(result.completion_ids, ref_ids)
    torch.testing.assert_close(result.logprobs, ref_lp, atol=1e-4, rtol=0)
    assert torch.equal(result.finished, ref_done)
    assert torch.equal(result.prompt_ids, ids)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_repeated_prompts_are_prefilled_once_and_decode_as_the_reference(tiny, params):
    """Several samples of one prompt (a GRPO group): the distinct rows are prefilled once and their state copied to
    the repeats; every row still decodes as the uncached reference (which re-forwards every row)."""
    model, tok, ids, mask = tiny
    order = torch.tensor([2, 0, 2, 5, 0, 2, 5, 1])  # repeats, out of order, first appearances 2, 0, 5, 1
    rep_ids, rep_mask = ids[order], mask[order]
    prefill = as_prefill(rep_ids, rep_mask, None, {})
    first, inverse = prefill.distinct_rows()
    assert first.tolist() == [0, 1, 3, 7]
    assert torch.equal(rep_ids[first][inverse], rep_ids)
    batch_sizes = []
    handle = model.register_forward_pre_hook(
        lambda m, a, kw: batch_sizes.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        result = SampleDecoder()(model, tok, rep_ids, rep_mask, params=params, generator=_gen(5))
    finally:
        handle.remove()
    assert batch_sizes[0] == 4, "the prefill runs on the 4 distinct prompts"
    # a decoder with forward hooks prefills every row: hooks see the batch the model runs on
    seen = []
    hooked = SampleDecoder(hooks=[ModuleHook("", lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), True, True)])
    hooked_result = hooked(model, tok, rep_ids, rep_mask, params=params, generator=_gen(5))
    assert seen[0] == len(order)
    assert torch.equal(hooked_result.completion_ids, result.completion_ids)
    ref_ids, ref_lp, ref_done = reference_decode(model, tok, rep_ids, rep_mask, params, _gen(5))
    assert torch.equal(result.completion_ids, ref_ids)
    torch.testing.assert_close(result.logprobs, ref_lp, atol=1e-4, rtol=0)
    assert torch.equal(result.finished, ref_done)
    # the state after the prefill: the one a full prefill gives every row (logits and hidden states)
    shared = prefill.start(model, output_hidden_states=True)
    full = IncrementalDecoder(model, rep_ids, rep_mask, output_hidden_states=True)
    torch.testing.assert_close(shared.next_logits, full.next_logits, atol=1e-5, rtol=0)
    for a, b in zip(shared.hidden_states, full.hidden_states):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert torch.equal(shared.attention_mask, rep_mask)


def test_distinct_rows_is_none_when_nothing_repeats_or_the_prefill_is_not_token_ids(tiny):
    model, _, ids, mask = tiny
    assert as_prefill(ids, mask, None, {}).distinct_rows() is None
    doubled = torch.cat([ids, ids])
    embeds = model.get_input_embeddings()(doubled)
    assert as_prefill(doubled, torch.cat([mask, mask]), None, {}).distinct_rows() is not None
    assert as_prefill(None, torch.cat([mask, mask]), embeds, {}).distinct_rows() is None
    # the same ids under a different mask are different prompts
    hidden_last = mask.clone()
    hidden_last[:, -1] = 0
    other = torch.cat([mask, hidden_last])
    assert as_prefill(doubled, other, None, {}).distinct_rows() is None


def _hf_dir(kind: str, tmp_path: Path) -> str:
    tok = build_char_tokenizer()
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if kind == "gpt2":
        config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2, **ids)
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
            **ids,
        )
        model = LlamaForCausalLM(config)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_a_shared_prefix_gives_the_full_forward_logits_and_gradient(kind, tmp_path):
    """Rows that repeat a left-padded prompt: the prompt runs once, micro-batches of the rows read its keys/values;
    the logits after ``split`` and, after :meth:`SharedPrefix.backward`, the parameters' gradient equal the full
    forward's."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(_hf_dir(kind, tmp_path)).eval()  # no dropout (GPT-2 has some)
    tok = build_char_tokenizer()
    prompt_ids, prompt_mask = encode_prompts(tok, ["1+1=", "22+333=", "rev ab="])
    order = torch.tensor([0, 0, 1, 2, 1, 0, 2])
    completions = torch.randint(5, 60, (len(order), 9))
    completion_mask = torch.ones_like(completions)
    completion_mask[1, 6:] = 0  # a row that ended early
    ids = torch.cat([prompt_ids[order], completions], 1)
    mask = torch.cat([prompt_mask[order], completion_mask], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    split = prompt_ids.shape[1] - 1

    def loss(logits, rows):
        return (logits.log_softmax(-1)[..., 3] * mask[rows, split : split + logits.shape[1]]).sum()

    full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, split:]
    loss(full, slice(None)).backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    prefix = SharedPrefix.compute(model, ids, mask, positions, split)
    assert prefix is not None and prefix.keys[0].shape[0] == 3  # three distinct prompts
    # micro-batches of rows in any order, row 1's cut short after its last attended column
    batches = ((torch.tensor([1]), ids.shape[1] - 3), (torch.tensor([5, 3, 0]), None), (torch.tensor([2, 4, 6]), None))
    for rows, width in batches:
        width = width or ids.shape[1]
        cut = (ids[rows, :width], mask[rows, :width], positions[rows, :width])
        logits = prefix.logits(model, *cut, rows=rows)
        torch.testing.assert_close(logits, full[rows, : width - split], atol=1e-5, rtol=0)
        loss(logits, rows).backward()
    prefix.backward()
    for a, b in zip([p.grad for p in model.parameters()], full_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # nothing to share, no prefix or no suffix, activation checkpointing (no cache): the caller's full forward
    distinct = torch.tensor([0, 2, 3])  # prompts 0, 1, 2
    assert SharedPrefix.compute(model, ids[distinct], mask[distinct], positions[distinct], split) is None
    assert SharedPrefix.compute(model, ids, mask, positions, 0) is None
    assert SharedPrefix.compute(model, ids, mask, positions, ids.shape[1]) is None
    model.activation_checkpointing_enable()
    model.train()
    assert SharedPrefix.compute(model, ids, mask, positions, split) is None


@pytest.fixture(params=["llama", "gpt2"])
def hf_module(request, tmp_path):
    torch.manual_seed(0)
    module = CausalLMModule(HFBackbone(name_or_path=_hf_dir(request.param, tmp_path)))
    module.configure_model()
    module.model.eval()
    ids, mask = encode_prompts(module.tokenizer, ["1+1=", "22+33=", "rev abcdef=", "x"])
    make_eos_likely(module.model, module.tokenizer, ids, mask)
    return module, ids, mask


def test_greedy_decoding_equals_hugging_face_generate(hf_module):
    module, ids, mask = hf_module
    tok = module.tokenizer
    ours = module.generate(ids, mask, SamplingParams(20))
    theirs = module.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=20,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )[:, ids.shape[1] :]
    assert bool(ours.finished.any()), "some rows must end by EOS"
    assert ours.completion_ids.shape == theirs.shape
    assert torch.equal(ours.completion_ids, theirs)


@DECODERS
def test_inputs_embeds_prefill_equals_ids_prefill(hf_module, decoder_cls):
    module, ids, mask = hf_module
    model, tok = module.model, module.tokenizer
    decoder = decoder_cls()
    from_ids = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(7))
    embeds = model.get_input_embeddings()(ids)
    from_embeds = decoder(model, tok, attention_mask=mask, inputs_embeds=embeds, params=SAMPLED, generator=_gen(7))
    assert torch.equal(from_ids.completion_ids, from_embeds.completion_ids)
    torch.testing.assert_close(from_ids.logprobs, from_embeds.logprobs, atol=1e-5, rtol=0)
    assert from_ids.texts == from_embeds.texts
    assert from_embeds.prompt_ids.shape == (ids.shape[0], 0)
    both = decoder(model, tok, ids, mask, inputs_embeds=embeds, params=SAMPLED, generator=_gen(7))
    assert torch.equal(both.prompt_ids, ids)
    assert torch.equal(both.completion_ids, from_ids.completion_ids)


def _never_acts(events):
    assert events
    return {}


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("hook", [None, _never_acts], ids=["no_hook", "idle_hook"])
def test_stepwise_decoder_without_actions_equals_the_sample_decoder(tiny, params, hook):
    model, tok, ids, mask = tiny
    plain = SampleDecoder()(model, tok, ids, mask, params=params, generator=_gen(5))
    stepwise = StepwiseDecoder(hook, step_delimiters=list("aeiou =+"), warn_no_delimiter=False)
    out = stepwise(model, tok, ids, mask, params=params, generator=_gen(5))
    assert torch.equal(plain.completion_ids, out.completion_ids[:, : plain.completion_ids.shape[1]])
    assert not out.completion_mask[:, plain.completion_ids.shape[1] :].any()
    torch.testing.assert_close(plain.logprobs, out.logprobs[:, : plain.logprobs.shape[1]], atol=1e-5, rtol=0)
    assert plain.texts == out.texts
    assert torch.equal(plain.finished, out.finished)


# -- logits processors ------------------------------------------------------------------------------------------------
class RecordingProcessor:
    """Records the ``input_ids`` it is called with; returns the scores unchanged."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls.append(input_ids.clone())
        return scores


def _most_common(result) -> int:
    kept = result.completion_ids[result.completion_mask.bool()]
    return int(torch.mode(kept).values)


@DECODERS
def test_a_banning_processor_means_the_token_is_never_generated(tiny, decoder_cls):
    model, tok, ids, mask = tiny
    free = decoder_cls()(model, tok, ids, mask, params=SAMPLED, generator=_gen(1))
    banned = _most_common(free)
    decoder = decoder_cls(processors=[SuppressTokensLogitsProcessor([banned])])
    out = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(1))
    assert not bool((out.completion_ids[out.completion_mask.bool()] == banned).any())
    assert bool(torch.isfinite(out.logprobs).all())


@DECODERS
def test_processors_run_in_order_on_the_prompt_and_the_kept_tokens(tiny, decoder_cls):
    model, tok, ids, mask = tiny
    first, second = RecordingProcessor(), RecordingProcessor()
    order: list[str] = []

    def tagged(name, processor):
        def run(input_ids, scores):
            order.append(name)
            return processor(input_ids, scores)

        return run

    decoder = decoder_cls(processors=[tagged("a", first), tagged("b", second)])
    out = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(2))
    assert order[:4] == ["a", "b", "a", "b"]
    assert len(first.calls) == len(second.calls) == out.completion_ids.shape[1]
    for step, context in enumerate(first.calls):
        assert torch.equal(context[:, : ids.shape[1]], ids)
        assert context.shape[1] == ids.shape[1] + step
        kept = out.completion_ids[:, :step].masked_fill(out.completion_mask[:, :step] == 0, tok.pad_token_id)
        assert torch.equal(context[:, ids.shape[1] :], kept)


def test_processor_context_includes_tokens_injected_by_a_step_hook(tiny):
    model, tok, ids, mask = tiny
    inject = tok("XYZ", add_special_tokens=False)["input_ids"]
    recorder = RecordingProcessor()

    def hook(events):
        return {e.row: StepAction(append_ids=inject) for e in events if e.step_index == 1}

    decoder = StepwiseDecoder(hook, step_delimiters=list("aeiou =+"), processors=[recorder], warn_no_delimiter=False)
    out = decoder(model, tok, ids, mask, params=SAMPLED, generator=_gen(4))
    assert sum(out.added_tokens) > 0, "the hook must have injected tokens"
    pad = tok.pad_token_id
    contexts = [row[ids.shape[1] :].tolist() for row in recorder.calls[-1]]
    for i, context in enumerate(contexts):
        while context and context[-1] == pad:
            context.pop()
        assert context == out.completion_ids[i, : len(context)].tolist()
    assert any(_contains(c, inject) for c in contexts), "injected tokens must be part of the processors' context"


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[j : j + len(part)] == part for j in range(len(seq) - len(part) + 1))


# -- forward hooks ----------------------------------------------------------------------------------------------------
def _forcing_hook(token: int, calls: list[int]) -> ModuleHook:
    def add_bias(module, args, output):
        calls.append(1)
        output = output.clone()
        output[..., token] += 1e4
        return output

    return ModuleHook("lm_head", add_bias)


@DECODERS
def test_hooks_are_attached_only_while_decoding(tiny, decoder_cls):
    model, tok, ids, mask = tiny
    forced = tok.convert_tokens_to_ids("q")
    calls: list[int] = []
    decoder = decoder_cls(hooks=[_forcing_hook(forced, calls)])
    out = decoder(model, tok, ids, mask, params=GREEDY)
    assert calls, "the hook must run during decoding"
    assert bool((out.completion_ids == forced).all())
    assert not model.lm_head._forward_hooks
    seen = len(calls)
    plain = SampleDecoder()(model, tok, ids, mask, params=GREEDY)
    assert len(calls) == seen
    assert not bool((plain.completion_ids == forced).all())


def test_hooks_are_removed_after_an_exception_and_the_model_mode_restored(tiny):
    model, tok, ids, mask = tiny
    events: list[str] = []

    @contextlib.contextmanager
    def tracked(name):
        events.append(f"enter {name}")
        try:
            yield
        finally:
            events.append(f"exit {name}")

    def failing(input_ids, scores):
        if input_ids.shape[1] > ids.shape[1] + 2:
            raise RuntimeError("processor failed")
        return scores

    calls: list[int] = []
    decoder = SampleDecoder(
        processors=[failing],
        hooks=[lambda m: tracked("first"), _forcing_hook(5, calls), lambda m: tracked("second")],
    )
    model.train()
    try:
        with pytest.raises(RuntimeError, match="processor failed"):
            decoder(model, tok, ids, mask, params=GREEDY)
        assert model.training
    finally:
        model.eval()
    assert calls
    assert not model.lm_head._forward_hooks
    assert events == ["enter first", "enter second", "exit second", "exit first"]


# -- run-time edits by a callback --------------------------------------------------------------------------------------
class BanDuringValidation(pl.Callback):
    """Adds a token ban to the module's decoder in ``setup`` and removes it in ``teardown``; records outputs."""

    def __init__(self, token: int) -> None:
        self.processor = SuppressTokensLogitsProcessor([token])
        self.outputs: list[torch.Tensor] = []
        self.active_during_run = False

    def setup(self, trainer, pl_module, stage):
        pl_module.decoder.processors.append(self.processor)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.active_during_run = self.processor in pl_module.decoder.processors
        self.outputs.append(outputs["completion_ids"][outputs["completion_ids"] != pl_module.tokenizer.pad_token_id])

    def teardown(self, trainer, pl_module, stage):
        pl_module.decoder.processors.remove(self.processor)


def test_a_callback_edits_the_decoder_lists_at_run_time(tmp_path):
    backbone = TinyBackbone(seed=1)
    source = TaskSource(Addition(), num_train=8, num_val=8, num_test=8, seed=0)
    dm = SFTDataModule(backbone.tokenizer, source, batch_size=8, eval_batch_size=8)
    module = CausalLMModule(backbone, generation={"max_new_tokens": 12})
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    banned = _most_common(module.generate(batch["prompt_ids"], batch["prompt_attention_mask"]))
    callback = BanDuringValidation(banned)
    trainer = pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[callback]
    )
    trainer.validate(module, datamodule=dm, verbose=False)
    assert callback.active_during_run
    assert callback.outputs and not any(bool((o == banned).any()) for o in callback.outputs)
    assert module.decoder.processors == []


# -- Hydra group -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["sft", "grpo", "cuttlefish", "valr"])
def test_every_generating_module_config_defaults_to_the_sample_decoder(train_cfg, method):
    cfg = train_cfg([f"+method={method}"])
    assert type(instantiate(cfg.module.decoder, _convert_="all")) is SampleDecoder
    assert cfg.module.verifier is not None


def test_decoder_and_verifier_are_chosen_by_config(train_cfg):
    overrides = ["module/decoder=stepwise", "module.decoder.warn_no_delimiter=false", "task=reverse"]
    cfg = train_cfg(["+method=sft", *overrides, "module.generation.max_new_tokens=8"])
    module = instantiate(cfg.module, backbone=TinyBackbone(seed=0), _convert_="all")
    assert isinstance(module.decoder, StepwiseDecoder) and isinstance(module.decoder, Decoder)
    assert module.decoder.step_delimiters == ("\n",) and not module.decoder.warn_no_delimiter
    assert isinstance(module.verifier, Reverse)
    ids, mask = encode_prompts(module.tokenizer, ["rev ab="])
    assert module.generate(ids, mask).completion_ids.shape[1] <= 8


# -- core boundary -----------------------------------------------------------------------------------------------------
def test_the_generation_core_runs_with_lightning_blocked():
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        BLOCKED = ("lightning", "pytorch_lightning", "zoo.datamodules", "zoo.callbacks", "hydra")

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED or name.startswith(BLOCKED):
                    raise ImportError(f"blocked import of {name}")
                return None

        sys.meta_path.insert(0, Block())
        import torch
        from zoo.backbones import TinyBackbone
        from zoo.generation import StepwiseDecoder, generate_text
        from zoo.protocols import SamplingParams
        import zoo.encoding, zoo.multimodal.valr  # noqa: F401

        bb = TinyBackbone(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
        model = bb.build_model()
        out = generate_text(model, bb.tokenizer, ["1+1="], SamplingParams(4))
        out = generate_text(model, bb.tokenizer, ["1+1="], SamplingParams(4), decoder=StepwiseDecoder())
        assert out.completion_ids.shape == (1, 4)
        assert not [m for m in sys.modules if m.startswith(BLOCKED)]
        print("ok")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
