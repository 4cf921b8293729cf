"""Cuttlefish wiring (arXiv 2602.02780): structure datamodule, encoder pretraining method and cache, structure-LM
module (stages, connectors, insertion, invariances, gate gradient), and ``+method=cuttlefish`` through the Hydra app."""

from __future__ import annotations

import copy
import functools
import logging

import pytest
import torch

from zoo.backbones import TinyBackbone
from zoo.data.structures import STRUCTURE_TOKEN, make_structure_samples
from zoo.datamodules.structures import StructureDataModule, StructureTaskSource, structure_batch_from_samples
from zoo.errors import ConfigError, DataError
from zoo.losses import IGNORE_INDEX
from zoo.modules.cuttlefish_encoder import (
    ENCODER_WEIGHTS,
    PretrainRecipe,
    encoder_request,
    load_encoder,
    pretrained_encoder,
)
from zoo.modules.structure_lm import StructureLMModule
from zoo.multimodal.cuttlefish import CuttlefishConnector

ENC = {"hidden": 32, "num_layers": 2, "num_rbf": 16, "rbf_cutoff": 8.0}
SMALL_DATA = [
    "datamodule.source.num_train=32",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.batch_size=4",
    "datamodule.eval_batch_size=8",
    "datamodule.source.task.max_atoms=60",
]
TINY_PRETRAIN = [
    "module.encoder_pretrain.steps=2",
    "module.encoder_pretrain.num_structures=4",
    "module.encoder_pretrain.batch_size=2",
    "module.encoder_pretrain.max_atoms=40",
]


def _module(stage: str = "alignment", seed: int = 0, **connector_kw) -> StructureLMModule:
    torch.manual_seed(seed)
    kw = {"rho": 0.2, "k_max": 16, "num_fusion_blocks": 1, "num_heads": 4, **connector_kw}
    module = StructureLMModule(
        TinyBackbone(hidden_size=64, intermediate_size=128, num_hidden_layers=2, extra_tokens=[STRUCTURE_TOKEN]),
        connector=functools.partial(CuttlefishConnector, **kw),
        encoder=ENC,
        encoder_init="random",
        stage=stage,
        generation={"max_new_tokens": 3},
    )
    module.configure_model()
    return module


@pytest.fixture(scope="module")
def samples():
    return make_structure_samples(6, seed=11)[:4]


def _batch(module, samples):
    return structure_batch_from_samples(samples, module.tokenizer)


# ------------------------------------------------------------------------------------------------------- datamodule


def test_cuttlefish_datamodule_batch_and_atom_limit_filter(caplog):
    tok = TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]).tokenizer
    source = StructureTaskSource(num_train=24, num_val=8, num_test=8, seed=3, task={"max_atoms": 120})
    dm = StructureDataModule(tok, source, batch_size=4, max_atoms=40)
    n_big = sum(r["sample"].num_atoms > 40 for r in source.rows("train"))
    assert n_big > 0
    with caplog.at_level(logging.INFO, logger="zoo"):
        dm.setup("fit")
    assert dm.num_filtered["train"] == n_big
    assert f"filtered {n_big} of 24 structures above datamodule.max_atoms=40" in caplog.text
    assert len(dm.dataset("train")) == 24 - n_big
    assert sum(dm.size_bin_counts("train").values()) == 24 - n_big
    batch = next(iter(dm.train_dataloader()))
    s = batch["structures"]
    ph = tok.convert_tokens_to_ids(STRUCTURE_TOKEN)
    assert ((batch["input_ids"] == ph).sum(1) == 1).all()
    assert ((batch["prompt_ids"] == ph).sum(1) == 1).all()
    assert s.num_graphs == 4
    assert int(s.num_atoms.max()) <= 40
    assert s.batch.tolist() == torch.repeat_interleave(torch.arange(4), s.num_atoms).tolist()
    # labels: completion (answer + EOS) only
    for b in range(4):
        sup = batch["labels"][b][batch["labels"][b] != IGNORE_INDEX].tolist()
        assert tok.decode(sup[:-1]) == batch["answers"][b]
        assert sup[-1] == tok.eos_token_id


def test_cuttlefish_datamodule_requires_placeholder_token():
    with pytest.raises(ConfigError, match="extra_tokens"):
        StructureDataModule(TinyBackbone().tokenizer, StructureTaskSource(num_train=4))


def _broken(kind: str):
    s = copy.deepcopy(make_structure_samples(1, seed=21)[0])
    if kind == "nan":
        s.pos[2, 1] = float("nan")
    elif kind == "empty":
        s.atom_types, s.pos = s.atom_types[:0], s.pos[:0]
        s.edge_index = s.bonds = torch.zeros(2, 0, dtype=torch.long)
    elif kind == "mismatch":
        s.pos = s.pos[:-1]
    elif kind == "edges":
        s.edge_index = torch.tensor([[0], [s.num_atoms + 3]])
    elif kind == "placeholder":
        s.prompt = s.prompt.replace(STRUCTURE_TOKEN, "")
    return s


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("nan", "non-finite"),
        ("empty", "empty structure"),
        ("mismatch", "coordinates"),
        ("edges", "edge_index refers"),
        ("placeholder", "placeholder"),
    ],
)
def test_cuttlefish_bad_inputs_raise_naming_the_sample(kind, match):
    tok = TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]).tokenizer
    with pytest.raises(DataError, match=match) as err:
        structure_batch_from_samples([make_structure_samples(1, seed=20)[0], _broken(kind)], tok)
    assert "'21-0'" in str(err.value)


def test_cuttlefish_module_names_sample_without_placeholder(samples):
    module = _module()
    batch = _batch(module, samples)
    ph = module.placeholder_id
    batch["input_ids"][2][batch["input_ids"][2] == ph] = module.tokenizer.convert_tokens_to_ids("x")
    with pytest.raises(DataError, match=repr(samples[2].sample_id)):
        module.loss(batch)


# ------------------------------------------------------------------------------------------------------ module core


def test_cuttlefish_sequence_is_text_plus_k_and_inserted_labels_ignored(samples):
    module = _module()
    batch = _batch(module, samples)
    logits, out, ins = module.forward_batch(batch)
    k = out.num_tokens
    assert len(set(k.tolist())) > 1  # size-adaptive
    assert ins.attention_mask.sum(1).tolist() == (batch["attention_mask"].sum(1) + k).tolist()
    assert logits.shape[1] == batch["input_ids"].shape[1] + int(k.max())
    for b in range(len(samples)):
        pos = ins.structure_positions[b, : int(k[b])]
        assert (ins.labels[b, pos] == IGNORE_INDEX).all()
        assert (ins.attention_mask[b, pos] == 1).all()
    # supervised tokens are exactly the text's completion tokens
    assert (ins.labels != IGNORE_INDEX).sum() == (batch["labels"] != IGNORE_INDEX).sum()


def test_cuttlefish_rotation_leaves_module_logits_unchanged(samples):
    module = _module().double().eval()
    batch = _batch(module, samples)
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    rot = q * torch.sign(torch.diagonal(r))
    moved = copy.deepcopy(batch)
    moved["structures"].pos = (batch["structures"].pos.double() @ rot.T + torch.tensor([3.0, -7.0, 1.5])).float()
    with torch.no_grad():
        a, out_a, ins_a = module.forward_batch(batch)
        b, out_b, _ = module.forward_batch(moved)
    assert torch.equal(out_a.num_tokens, out_b.num_tokens)
    keep = ins_a.attention_mask.bool()
    torch.testing.assert_close(b[keep], a[keep], atol=1e-5, rtol=1e-5)


def test_cuttlefish_anchor_gate_gets_gradient_through_module_loss(samples):
    module = _module()
    loss, _, _ = module.loss(_batch(module, samples))
    loss.backward()
    gate = module.connector.patching.gate
    assert sum(p.grad.abs().sum().item() for p in gate.parameters() if p.grad is not None) > 0


@pytest.mark.parametrize("stage", ["alignment", "llm_adaptation"])
def test_cuttlefish_stage_trains_only_connector_and_adapters(samples, stage):
    module = _module(stage)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert any(n.startswith("connector.") for n in trainable)
    lora = {n for n in trainable if n.startswith("model.")}
    assert all("lora_" in n for n in lora)
    assert bool(lora) == (stage == "llm_adaptation")
    assert not any(n.startswith("structure_encoder.") for n in trainable)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    opt = torch.optim.SGD(module.trainable_parameters(), lr=0.1)
    module.loss(_batch(module, samples))[0].backward()
    opt.step()
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert changed
    assert changed <= trainable
    assert any("lora_B" in n for n in changed) == (stage == "llm_adaptation")


def test_cuttlefish_generation_and_export_roundtrip(samples, tmp_path):
    from transformers import AutoModelForCausalLM

    module = _module("llm_adaptation")
    for n, p in module.model.named_parameters():  # non-zero LoRA B so the merge matters
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    batch = _batch(module, samples)
    result, out = module.generate_with_structures(
        batch["prompt_ids"], batch["prompt_attention_mask"], batch["structures"]
    )
    assert len(result.texts) == 4
    assert result.completion_ids.shape[1] <= 3
    with pytest.raises(ConfigError, match="structures"):
        module.generate(batch["prompt_ids"], batch["prompt_attention_mask"])
    path = module.export_pretrained(tmp_path / "export")
    assert (path / "connector.safetensors").is_file()
    assert (path / ENCODER_WEIGHTS).is_file()
    merged = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = batch["input_ids"][:, :5]
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=ids).logits, module.model.eval()(input_ids=ids).logits, atol=1e-4, rtol=1e-4
        )
    again = _module("alignment", seed=5)
    again.connector.load_state_dict(module.connector.state_dict())
    assert torch.equal(load_encoder(path).embed.weight, module.structure_encoder.embed.weight)


# ------------------------------------------------------------------------------------------------ Hydra app + cache


@pytest.mark.parametrize("connector", ["cuttlefish", "patching", "query", "mean_pool"])
def test_cuttlefish_connector_options_compose_and_train(train_cfg, connector):
    from zoo.cli.train import build

    cfg = train_cfg(
        ["+method=cuttlefish", f"module/structure_lm/connector={connector}", "module.encoder_init=random", *SMALL_DATA]
    )
    module, dm, _ = build(cfg)
    dm.setup("fit")
    module.configure_model()
    loss, out, _ = module.loss(next(iter(dm.train_dataloader())))
    loss.backward()
    expected = {"query": 8, "mean_pool": 1}
    if connector in expected:
        assert out.num_tokens.tolist() == [expected[connector]] * 4
    no_grad = {n for n, p in module.connector.named_parameters() if p.grad is None}
    assert no_grad <= ({"adapter.kv_proj.weight", "adapter.kv_proj.bias"} if connector == "patching" else set())
    assert cfg.module.stage == "llm_adaptation"


def test_cuttlefish_method_fast_dev_run_bootstraps_encoder(train_cfg, tmp_path, caplog):
    from zoo.cli.train import run

    cfg = train_cfg(["+method=cuttlefish", "debug=fdr", *SMALL_DATA, *TINY_PRETRAIN])
    with caplog.at_level(logging.INFO, logger="zoo"):
        metrics = run(cfg)
    assert "building the structure_encoder artifact" in caplog.text
    from zoo.cli.artifacts import plan_request
    from zoo.cli.prerequisites import fulfil

    build = plan_request(
        encoder_request(cfg.paths.cache_dir, dict(cfg.module.encoder), dict(cfg.module.encoder_pretrain))
    )
    assert (build.export_dir / ENCODER_WEIGHTS).is_file()
    assert build.config.trainer.max_steps == 2  # the recipe reached the +method=cuttlefish_encoder run
    for key in ("val/exact_match", "val/loss", "val/tokens_per_structure"):
        assert key in metrics
    assert any(k.startswith("val/acc_size/") for k in metrics)
    # the same encoder + recipe asked for again is the cached encoder (no pretraining), and a module loads it
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        again = fulfil(
            pretrained_encoder(dict(cfg.module.encoder), dict(cfg.module.encoder_pretrain), cfg.paths.cache_dir)
        )
    assert "using the cached structure_encoder artifact" in caplog.text
    assert "building" not in caplog.text
    assert again == str(build.export_dir)
    module = StructureLMModule(
        TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]),
        connector=functools.partial(CuttlefishConnector, num_fusion_blocks=0, k_max=8),
        encoder=dict(cfg.module.encoder),
        encoder_pretrain=dict(cfg.module.encoder_pretrain),
        encoder_init=again,
    )
    module.configure_model()
    cached = load_encoder(build.export_dir)
    assert all(
        torch.equal(a, b) for a, b in zip(cached.state_dict().values(), module.structure_encoder.state_dict().values())
    )


def test_cuttlefish_encoder_method_exports_an_encoder_cuttlefish_loads(train_cfg, tmp_path):
    from zoo.cli.train import run

    cfg = train_cfg(
        [
            "+method=cuttlefish_encoder",
            *SMALL_DATA,
            "trainer.max_steps=2",
            "trainer.val_check_interval=2",
            "trainer.limit_val_batches=1",
            "export=true",
        ]
    )
    metrics = run(cfg)
    assert {"val/type_loss", "val/dist_loss", "val/coord_loss"} <= set(metrics)
    export = tmp_path / "run" / "export"
    assert (export / ENCODER_WEIGHTS).is_file()
    module = StructureLMModule(
        TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]),
        connector=functools.partial(CuttlefishConnector, num_fusion_blocks=0, k_max=8),
        encoder=dict(cfg.module.encoder),
        encoder_init=str(export),
    )
    module.configure_model()
    saved = load_encoder(export)
    assert all(
        torch.equal(a, b) for a, b in zip(saved.state_dict().values(), module.structure_encoder.state_dict().values())
    )
    fresh = StructureLMModule(
        TinyBackbone(extra_tokens=[STRUCTURE_TOKEN]),
        connector=functools.partial(CuttlefishConnector, num_fusion_blocks=0, k_max=8),
        encoder=dict(cfg.module.encoder),
        encoder_init="random",
    )
    fresh.configure_model()
    assert not all(
        torch.equal(a, b) for a, b in zip(saved.state_dict().values(), fresh.structure_encoder.state_dict().values())
    )


def test_cuttlefish_default_recipe_is_the_default_cuttlefish_encoder_run(train_cfg, tmp_path):
    """The encoder +method=cuttlefish asks for is built by +method=cuttlefish_encoder with its own defaults."""
    from zoo.cli.artifacts import plan_artifact

    for method in ("cuttlefish", "cuttlefish_encoder"):
        info = train_cfg([f"+method={method}"]).methods[method]
        assert info.paper == "arXiv:2602.02780"
        assert info.kind == "module"
    cfg = train_cfg(["+method=cuttlefish"])
    from zoo.cli.artifacts import plan_request

    wanted = plan_request(encoder_request(tmp_path, dict(cfg.module.encoder), dict(cfg.module.encoder_pretrain)))
    default = plan_artifact("structure_encoder", ["+method=cuttlefish_encoder"], cache_dir=tmp_path)
    assert wanted.spec == default.spec
    # each recipe field lands on the option of the pretraining run that it names
    changed = plan_request(
        encoder_request(tmp_path, {"hidden": 32}, PretrainRecipe(steps=7, batch_size=3, coord_noise=0.1, seed=5))
    )
    assert changed.config.trainer.max_steps == 7
    assert changed.config.datamodule.batch_size == 3
    assert changed.config.module.objective.coord_noise == 0.1
    assert changed.config.module.encoder.hidden == 32
    assert changed.spec["seed"] == changed.spec["datamodule"]["seed"] == 5
    assert changed.path != wanted.path


# ------------------------------------------------------------------------------------------------ standardization


def test_feature_standardization_is_measured_on_training_structures_and_exported(samples, tmp_path):
    """The frozen encoder's atom features reach the connector standardized per dimension (stats measured once on
    training structures); the statistics travel with the exported connector."""
    module = _module()
    raw, _, mask = module.encode_structures(_batch(module, samples)["structures"])
    assert torch.equal(module.feature_norm(raw, mask), raw)  # identity until statistics are measured
    many = make_structure_samples(40, seed=5)
    module.fit_feature_stats(many)
    std = module.feature_norm.std
    assert not torch.allclose(std, torch.ones_like(std))
    from zoo.data.structures import collate_structures

    feats, _, m = module.encode_structures(collate_structures(many))
    atoms = feats[m]
    torch.testing.assert_close(atoms.mean(0), torch.zeros(atoms.shape[1]), atol=1e-3, rtol=0)
    torch.testing.assert_close(atoms.std(0), torch.ones(atoms.shape[1]), atol=2e-2, rtol=0)
    assert torch.all(feats[~m] == 0)
    module.export_pretrained(tmp_path)
    again = _module(seed=1)
    again.connector_init = str(tmp_path)
    again.model = None
    again.configure_model()
    torch.testing.assert_close(again.feature_norm.std, module.feature_norm.std)


def test_cuttlefish_gate_entropy_term_adds_to_the_loss_and_reaches_the_gate(samples):
    """``gate_entropy_weight``: the logged training loss is the LM loss + w (1 - mean normalized gate entropy), and
    the term alone gives the gate a gradient; k_g against n is logged."""
    plain = _module(prob_straight_through=False)
    batch = _batch(plain, samples)
    lm, out, _ = plain.loss(batch)
    logged: dict[str, float] = {}
    reg = _module(prob_straight_through=False)
    reg.load_state_dict(plain.state_dict())
    reg.gate_entropy_weight = 0.5
    reg.log = lambda name, value, **kw: logged.__setitem__(name, float(value))  # no Trainer here
    total = reg.training_step(batch, 0)
    expected = lm + 0.5 * (1.0 - out.patches.entropy.mean())
    torch.testing.assert_close(total, expected)
    assert {"train/patches/k_mean", "train/patches/k_slope", "train/patches/k_vs_uniform"} <= set(logged)
    assert logged["train/patches/k_mean"] == pytest.approx(out.num_tokens.float().mean().item())
    regularizer = reg.connector.patching(*_encoded(reg, batch)).entropy.mean()
    (1 - regularizer).backward()
    gate = reg.connector.patching.gate
    assert sum(p.grad.abs().sum().item() for p in gate.parameters() if p.grad is not None) > 0
    with pytest.raises(ConfigError, match="gate_entropy_weight"):
        StructureLMModule(
            TinyBackbone(hidden_size=64, intermediate_size=128, num_hidden_layers=2, extra_tokens=[STRUCTURE_TOKEN]),
            connector=functools.partial(CuttlefishConnector),
            encoder=ENC,
            encoder_init="random",
            gate_entropy_weight=-1.0,
        )


def _encoded(module, batch):
    node_emb, pos, atom_mask = module.encode_structures(batch["structures"])
    return node_emb, pos, atom_mask
