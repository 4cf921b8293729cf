"""The ``quant`` group: every option (none, bnb_nf4, bnb_int8, nanoquant, sign, onebit) builds the tiny backbone
through the Hydra config, and the SFT module validates and generates on it; bitsandbytes wiring and calibration."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from zoo.errors import ConfigError, DataError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small linear-algebra calls (ADMM's r x r solves) slow down by orders of magnitude when two OpenMP threads
    compete with other processes for two cores; the quantization tests run single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# a 2-layer, 64-wide tiny Llama, few short evaluation rows, no loggers/checkpoints
SMALL = [
    "backbone.hidden_size=64",
    "backbone.intermediate_size=128",
    "backbone.num_hidden_layers=2",
    "datamodule.source.num_train=64",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.batch_size=8",
    "datamodule.eval_batch_size=8",
    "module.generation.max_new_tokens=12",
    "logger=none",
    "callbacks=none",
    "trainer.enable_progress_bar=false",
]
# NanoQuant knobs cut down for tests (same algorithm, fewer iterations and calibration tokens)
FAST_NANOQUANT = [
    "quant.rank_multiple=8",
    "quant.admm.outer_iters=20",
    "quant.block.ep_epochs=1",
    "quant.block.fact_epochs=1",
    "quant.block.fact_batch_size=4",
    "quant.kd_epochs=1",
    "quant.kd_batch_size=4",
    "quant.calibration.num_samples=4",
    "quant.calibration.seq_len=32",
]


def _layer_types(model: nn.Module) -> set[str]:
    return {
        type(m).__name__
        for n, m in model.named_modules()
        if ".layers." in f".{n}" and n.rsplit(".", 1)[-1].endswith("_proj")
    }


EXPECTED = {
    "none": ({"Linear"}, []),
    "bnb_nf4": ({"Linear4bit"}, []),
    "bnb_int8": ({"Linear8bitLt"}, []),
    "nanoquant": ({"NanoQuantLinear"}, FAST_NANOQUANT),
    "sign": ({"SignBinaryLinear"}, []),
    "onebit": ({"OneBitLinear"}, []),
}


@pytest.mark.parametrize("quant", list(EXPECTED))
def test_sft_module_validates_and_generates_on_quant_option(train_cfg, quant):
    from zoo.cli.train import build

    types, extra = EXPECTED[quant]
    cfg = train_cfg([*SMALL, "stage=validate", f"quant={quant}", *extra])
    module, datamodule, trainer = build(cfg)
    metrics = trainer.validate(module, datamodule)[0]
    # the decoder-layer projections really are the quantized kind (no silent full precision)
    assert _layer_types(module.model) == types
    # lm_head and embeddings stay full precision in every option
    assert isinstance(module.model.lm_head, nn.Linear)
    assert type(module.model.lm_head) is nn.Linear
    assert math.isfinite(metrics["val/loss"])
    assert math.isfinite(metrics["val/perplexity"])
    assert 0.0 <= metrics["val/exact_match"] <= 1.0
    batch = next(iter(datamodule.val_dataloader()))
    out = module.generate(batch["prompt_ids"][:3], batch["prompt_attention_mask"][:3])
    assert out.completion_ids.shape[0] == 3
    assert 1 <= out.completion_ids.shape[1] <= 12
    assert len(out.texts) == 3
    if quant in ("nanoquant", "sign", "onebit"):
        from zoo.quant.nanoquant import model_bits_per_weight

        bpw = model_bits_per_weight(module.model)
        assert bpw <= (1.0 if quant == "nanoquant" else 1.0 + 16 * (64 + 128) / (64 * 64)) + 1e-9
        assert module.quantizer.name == quant


def test_bnb_config_kwargs_and_modes():
    from transformers import BitsAndBytesConfig

    from zoo.quant.bnb import BnbQuantizer

    kw = BnbQuantizer("nf4").from_pretrained_kwargs()
    qc = kw["quantization_config"]
    assert isinstance(qc, BitsAndBytesConfig)
    assert qc.load_in_4bit
    assert not qc.load_in_8bit
    assert qc.bnb_4bit_quant_type == "nf4"
    assert qc.bnb_4bit_use_double_quant
    assert qc.bnb_4bit_compute_dtype == torch.float32
    assert qc.llm_int8_skip_modules == ["lm_head"]
    assert kw["device_map"] == ("auto" if torch.cuda.is_available() else "cpu")  # device_map=None follows the machine
    assert BnbQuantizer("nf4", device_map="cpu").from_pretrained_kwargs()["device_map"] == "cpu"
    q8 = BnbQuantizer("int8", skip_modules=["lm_head", "embed_tokens"])
    qc8 = q8.from_pretrained_kwargs()["quantization_config"]
    assert qc8.load_in_8bit
    assert qc8.llm_int8_threshold == 6.0
    assert qc8.llm_int8_skip_modules[1] == "embed_tokens"
    assert q8.needs_pretrained_load
    assert q8.name == "bnb_int8"
    with pytest.raises(ConfigError, match="mode"):
        BnbQuantizer("int3")
    with pytest.raises(ConfigError, match="compute_dtype"):
        BnbQuantizer("nf4", compute_dtype="int8")
    with pytest.raises(ConfigError, match="no bitsandbytes layers"):
        BnbQuantizer("nf4").apply(nn.Sequential(nn.Linear(4, 4)))


@pytest.mark.parametrize(("mode", "double", "lo", "hi"), [("nf4", False, 4.5, 4.5), ("nf4", True, 4.12, 4.135)])
def test_bnb_measured_bits_per_weight(tmp_path, mode, double, lo, hi):
    """NF4 with blocksize 64 stores 4 + 32/64 = 4.5 bpw, ~4.127 with double quantization (notes 1(c))."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from zoo.quant.base import measured_bits_per_weight
    from zoo.quant.bnb import BnbQuantizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    q = BnbQuantizer(mode, double_quant=double)
    model = q.apply(AutoModelForCausalLM.from_pretrained(tmp_path, **q.from_pretrained_kwargs()))
    assert lo - 1e-9 <= measured_bits_per_weight(model) <= hi + 1e-9
    q8 = BnbQuantizer("int8")
    m8 = q8.apply(AutoModelForCausalLM.from_pretrained(tmp_path, **q8.from_pretrained_kwargs()))
    assert 8.0 < measured_bits_per_weight(m8) <= 8.0 + 32 / 256 + 1e-9  # int8 + one fp32 scale per row


@pytest.mark.parametrize("quant", ["bnb_nf4", "bnb_int8"])
def test_bnb_configs_place_the_model_where_the_machine_runs(train_cfg, quant):
    """The configs leave the device map to the quantizer (its docstring: "auto" with CUDA, "cpu" without)."""
    from hydra.utils import instantiate

    cfg = train_cfg([f"quant={quant}"])
    assert cfg.quant.device_map is None
    expected = "auto" if torch.cuda.is_available() else "cpu"
    assert instantiate(cfg.quant).from_pretrained_kwargs()["device_map"] == expected


def test_calibration_from_task_train_split_only():
    from zoo.backbones import TinyBackbone
    from zoo.data.calibration import calibration_set, task_texts
    from zoo.data.sources import TaskSource
    from zoo.data.tasks import Addition

    tok = TinyBackbone().tokenizer
    task = Addition()
    cal = calibration_set(tok, task=task, layout="windows", num_samples=6, seq_len=40, seed=0)
    ids = cal.input_ids
    assert ids.shape == (6, 40)
    assert ids.dtype == torch.long
    assert cal.token_mask is None
    assert ids[0, 0].item() == tok.bos_token_id
    assert (ids == tok.eos_token_id).any()
    again = calibration_set(tok, task=task, layout="windows", num_samples=6, seq_len=40, seed=0).input_ids
    torch.testing.assert_close(ids, again)
    other = calibration_set(tok, task=task, layout="windows", num_samples=6, seq_len=40, seed=1).input_ids
    assert not torch.equal(ids, other)
    held_out = {r["prompt"] for s in ("val", "test") for r in TaskSource(task, seed=0, num_train=1).rows(s)}
    prompts = {p for p, _ in task_texts(task, 200, 0)}
    assert not prompts & held_out
    with pytest.raises(ConfigError, match="needs quant.calibration.task"):
        calibration_set(tok, source="task", task=None)
    with pytest.raises(ConfigError, match="source"):
        calibration_set(tok, source="wikitext", task=task)
    with pytest.raises(ConfigError, match="layout"):
        calibration_set(tok, task=task, layout="packed")


def test_row_calibration_is_shaped_like_the_training_batches():
    """layout=rows: every sample is one training row from position 0 (``<bos> prompt completion <eos>``, as the SFT
    datamodule renders it), right-padded; the mask covers exactly the row's tokens."""
    from zoo.backbones import TinyBackbone
    from zoo.data.calibration import calibration_set, task_texts
    from zoo.data.tasks import Addition

    tok = TinyBackbone().tokenizer
    task = Addition()
    cal = calibration_set(tok, task=task, layout="rows", num_samples=8, seq_len=64, seed=0)
    rows = task_texts(task, 8, 0)
    assert cal.input_ids.shape[0] == 8 and cal.token_mask is not None
    lengths = cal.token_mask.sum(1).tolist()
    assert len(set(lengths)) > 1  # rows of different lengths, not windows
    assert cal.input_ids.shape[1] == max(lengths)
    assert cal.num_tokens == sum(lengths)
    for i, (prompt, completion) in enumerate(rows):
        n = lengths[i]
        row = cal.input_ids[i, :n].tolist()
        assert row[0] == tok.bos_token_id and row[-1] == tok.eos_token_id
        assert tok.decode(row[1:-1]) == prompt + completion
        assert (cal.input_ids[i, n:] == tok.pad_token_id).all()
        assert cal.token_mask[i, :n].all() and not cal.token_mask[i, n:].any()
    short = calibration_set(tok, task=task, layout="rows", num_samples=8, seq_len=10, seed=0)
    assert short.input_ids.shape == (8, 10) and short.token_mask.all()
    with pytest.raises(ConfigError, match="layout=windows"):
        calibration_set(tok, source="text", path="x.txt", layout="rows")


def test_padding_does_not_change_row_statistics():
    """Right padding under causal attention leaves the real tokens untouched, and the mask keeps the padding out of
    the statistics: padded rows give the same moments as the rows run one by one without padding."""
    from zoo.backbones import TinyBackbone
    from zoo.data.calibration import calibration_set
    from zoo.data.tasks import Addition
    from zoo.quant.nanoquant import collect_linear_stats

    backbone = TinyBackbone(seed=0)
    model = backbone.build_model().eval()
    cal = calibration_set(backbone.tokenizer, task=Addition(), layout="rows", num_samples=4, seq_len=64, seed=0)
    name = "model.layers.0.mlp.down_proj"

    def only(n, m):
        return n == name

    padded = collect_linear_stats(model, cal.input_ids, token_mask=cal.token_mask, layer_filter=only, clip=False)
    ones = [
        collect_linear_stats(model, cal.input_ids[i : i + 1, : int(n)], layer_filter=only, clip=False)[name]
        for i, n in enumerate(cal.token_mask.sum(1))
    ]
    # batch_size=1: the moments are the mean over batches (rows) of each row's token mean
    i_norm = sum(s.i_norm.double() for s in ones) / len(ones)
    torch.testing.assert_close(padded[name].i_norm.double(), i_norm, rtol=1e-4, atol=1e-7)
    unmasked = collect_linear_stats(model, cal.input_ids, layer_filter=only, clip=False)[name]
    assert not torch.allclose(unmasked.i_norm.double(), i_norm, rtol=1e-3)


def test_calibration_from_jsonl_and_text(tmp_path):
    from zoo.backbones import TinyBackbone
    from zoo.data.calibration import Calibration, calibration_set
    from zoo.quant.nanoquant_quantizer import NanoQuantQuantizer

    tok = TinyBackbone().tokenizer
    path = tmp_path / "calib.jsonl"
    path.write_text("\n".join(json.dumps({"text": "12+34=46 and 5+5=10"}) for _ in range(20)) + "\n")
    ids = calibration_set(tok, source="jsonl", layout="windows", path=path, num_samples=4, seq_len=16).input_ids
    assert ids.shape == (4, 16)
    assert tok.decode(ids[0, 1:9]) == "12+34=46"
    txt = tmp_path / "calib.txt"
    txt.write_text("1+1=2\n" * 50)
    text = calibration_set(tok, source="text", layout="windows", path=txt, num_samples=2, seq_len=32)
    assert text.input_ids.shape == (2, 32)
    with pytest.raises(DataError, match="needed"):
        calibration_set(tok, source="text", layout="windows", path=txt, num_samples=100, seq_len=64)
    with pytest.raises(DataError, match="not found"):
        calibration_set(tok, source="jsonl", path=tmp_path / "missing.jsonl")
    rows = calibration_set(tok, source="jsonl", path=path, num_samples=3, seq_len=64)
    assert rows.input_ids.shape == (3, 21) and rows.token_mask.all()  # <bos> + 19 characters + <eos>
    with pytest.raises(DataError, match="rows"):
        calibration_set(tok, source="jsonl", path=path, num_samples=30, seq_len=64)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1"):
        calibration_set(tok, source="jsonl", path=bad)
    with pytest.raises(ConfigError, match="tokenizer"):
        NanoQuantQuantizer(calibration=Calibration(task=None)).calibration_set(None)
    with pytest.raises(ConfigError, match="needs calibration batches"):
        NanoQuantQuantizer().calibration_set(None)
    with pytest.raises(ConfigError, match="callable model -> CalibrationSet"):
        NanoQuantQuantizer(calibration={"num_samples": 3})


def test_baseline_quantizers_measured_bpw_and_stats():
    from transformers import LlamaConfig, LlamaForCausalLM

    from zoo.quant.baselines import OneBitLinear, SignBinaryLinear
    from zoo.quant.nanoquant import quantized_layers
    from zoo.quant.nanoquant_quantizer import CalibrationSet, OneBitQuantizer, SignQuantizer

    cfg = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(0))
    m = SignQuantizer().apply(_copy(base))
    layers = [mod for mod in m.modules() if isinstance(mod, SignBinaryLinear)]
    assert len(layers) == 7
    # 1 bit per weight + one fp16 row scale: sum 16 d_out / sum d_out d_in over q,k,v,o (64x64), gate/up (128x64),
    # down (64x128)
    sizes = [(64, 64)] * 4 + [(128, 64)] * 2 + [(64, 128)]
    expected = 1 + 16 * sum(o for o, _ in sizes) / sum(o * i for o, i in sizes)
    q = SignQuantizer()
    q.apply(_copy(base))
    assert q.bits_per_weight == pytest.approx(expected)
    ob = OneBitQuantizer()
    mo = ob.apply(_copy(base))
    assert all(isinstance(mo.get_submodule(n), OneBitLinear) for n, mod in base.named_modules() if n.endswith("proj"))
    assert ob.bits_per_weight == pytest.approx(1 + 16 * sum(o + i for o, i in sizes) / sum(o * i for o, i in sizes))
    # with calibration statistics the row scales change (weighted L2-optimal scale)
    qs = SignQuantizer(use_stats=True, calib_input_ids=ids).apply(_copy(base))
    # the quantizer receives its calibration batches: a callable gives the same scales as the same ids passed in
    seen = []
    fed = SignQuantizer(use_stats=True, calibration=lambda model: seen.append(model) or CalibrationSet(ids))
    qc = fed.apply(_copy(base))
    assert len(seen) == 1
    torch.testing.assert_close(qc.model.layers[0].self_attn.q_proj.alpha, qs.model.layers[0].self_attn.q_proj.alpha)
    a0 = m.model.layers[0].self_attn.q_proj.alpha.float()
    a1 = qs.model.layers[0].self_attn.q_proj.alpha.float()
    assert not torch.allclose(a0, a1)
    # the quantized layers are frozen; the rest of the model (embeddings, norms) trains, as under bitsandbytes
    frozen = [p for layer in quantized_layers(qs).values() for p in layer.parameters()]
    assert frozen and not any(p.requires_grad for p in frozen)
    assert qs.model.embed_tokens.weight.requires_grad and qs.model.norm.weight.requires_grad


def _copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).eval()
