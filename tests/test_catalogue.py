"""The method catalogue (zoo/catalogue.py): every conf/method/*.yaml declares a valid methods.<name> entry, has a
docs page and a test that names it; docs/index.md and the README table are generated from the entries and current;
and every declared (method, backbone, quantizer) combination runs fast_dev_run."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, read_write

import zoo.cli.train as train_module
from zoo.catalogue import (
    KINDS,
    QLORA_QUANTS,
    README_END,
    README_START,
    by_paper,
    check_entries,
    file_problems,
    group_options,
    listing,
    load_catalogue,
    main,
    method_entries,
    method_stages,
    stale_files,
)
from zoo.cli.train import check_methods, run
from zoo.errors import ConfigError
from zoo.quant.base import layer_stored_bits

from conftest import REPO_ROOT, SMALL_BASE_POLICY, compose_train

METHODS = sorted(p.stem for p in (REPO_ROOT / "conf" / "method").glob("*.yaml"))
REFUSABLE = [*group_options("backbone"), "none", *group_options("quant")]
PAPERS, CATALOGUE = load_catalogue()
COMBINATIONS = [(m.name, b, q) for m in CATALOGUE.values() for b, q in m.combinations]
STAGES = method_stages()
# cheap settings of the post-hoc quantizers for the smoke runs (skipped where the composed quantizer lacks the key)
QUANT_SMOKE = {
    "nanoquant": [
        "quant.rank_multiple=8",
        "quant.admm.outer_iters=2",
        "quant.admm.inner_iters=1",
        "quant.block.ep_epochs=1",
        "quant.block.fact_epochs=1",
        "quant.block.fact_batch_size=2",
        "quant.kd_epochs=1",
        "quant.kd_batch_size=2",
        "quant.calibration.num_samples=2",
        "quant.calibration.seq_len=16",
    ],
    "sign": ["quant.calibration.num_samples=4", "quant.calibration.seq_len=32"],
    "onebit": ["quant.calibration.num_samples=4", "quant.calibration.seq_len=32"],
}
# the local backend's settings for a tiny backbone as an agent's or text optimiser's LLM: the tiny model's context
# (256 tokens) is shorter than the task prompts, so the most recent tokens are kept; a few tokens a reply
LLM_CELL = ["backend=hf_local", "backend.overflow=keep_recent", "backend.max_tokens=4"]
# the smallest shapes of one step for every smoke run: a cell checks that the composition runs, not what it learns.
# Few prompts a batch, two completions a group, a few new tokens (decoding is most of a cell's time); skipped where
# the composed config has no such key, and a method's own ``smoke`` settings come after these and win
SMOKE_SHAPE = [
    "module.generation.max_new_tokens=8",
    "module.group_size=2",
    "datamodule.batch_size=4",
]
# the stock tiny backbone (4 layers, hidden 128) at half its depth and width for a smoke run; applied only where the
# composed backbone has the stock shape, so a method that sets its own (layers above a probe, heads to rank) keeps it
STOCK_TINY = {"backbone.num_hidden_layers": 4, "backbone.hidden_size": 128, "backbone.intermediate_size": 384}
SMOKE_BACKBONE = ["backbone.num_hidden_layers=2", "backbone.hidden_size=64", "backbone.intermediate_size=192"]
# small data sets for every smoke run (fast_dev_run uses one batch, but data sets are built whole)
SMALL_DATA = [
    "datamodule.source.num_train=256",
    "datamodule.source.num_val=8",
    "datamodule.source.num_test=8",
    "datamodule.eval_batch_size=8",
]


def test_catalogue_is_not_empty():
    assert "sft" in METHODS
    assert set(CATALOGUE) == set(METHODS)


def test_the_nineteen_papers_are_listed_once_with_ids():
    papers = [p for p in PAPERS if not p.baseline]
    assert len(papers) == 19
    assert len({p.key for p in PAPERS}) == len(PAPERS)
    for paper in papers:
        assert paper.id is None or paper.id.startswith(("arXiv:", "icml2026:")), paper.id
        assert paper.summary.strip() and "\n" not in paper.summary.strip()
    # every method names one of them (or a baseline)
    refs = {p.ref for p in PAPERS}
    assert {m.paper for m in CATALOGUE.values()} <= refs


@pytest.mark.parametrize("method", METHODS)
def test_method_declares_itself_and_has_docs_and_a_test(method, train_cfg):
    cfg = train_cfg([f"+method={method}"])
    methods = check_methods(cfg)
    assert method in methods, f"conf/method/{method}.yaml must declare methods.{method}"
    # what the catalogue reads from the file is what +method=<name> composes
    assert methods[method] == method_entries()[method]
    entry = CATALOGUE[method]
    if entry.kind == "module":
        assert cfg.hydra.runtime.choices["module"] == entry.family, "family must be the module the method composes"
    if entry.backbones != ("none",):
        assert cfg.hydra.runtime.choices["backbone"] in entry.backbones, "the method's own backbone must be declared"
    assert cfg.hydra.runtime.choices["quant"] in entry.quantizers, "the method's own quantizer must be declared"
    assert (REPO_ROOT / "docs" / "methods" / f"{method}.md").is_file(), f"docs/methods/{method}.md is missing"
    named = [
        p for p in (REPO_ROOT / "tests").rglob("test_*.py") if p.name != Path(__file__).name and method in p.read_text()
    ]
    assert named, f"no test besides the catalogue names the method '{method}'"


def test_linked_pages_exist():
    assert file_problems(REPO_ROOT, CATALOGUE) == []


def test_a_bad_entry_gets_one_message_per_problem():
    good = method_entries()["gr3"]
    bad = {
        **good,
        "kind": "component",
        "paper": "arXiv:0000.00000",
        "backbones": ["tiny", "gpt5"],
        "quantizers": [],
        "summary": "two\nlines",
        "colour": "blue",
        "smoke": "quant.bits=1",
    }
    del bad["title"]
    with pytest.raises(ConfigError) as err:
        check_entries({"gr3": good, "broken": bad})
    lines = str(err.value).splitlines()[1:]
    expected = {
        "methods.broken.title is missing": 1,
        "methods.broken.kind='component'": 1,
        "methods.broken.paper='arXiv:0000.00000' is not a paper of zoo/papers.yaml": 1,
        "methods.broken.backbones has ['gpt5']": 1,
        "methods.broken.quantizers must be a non-empty list": 1,
        "methods.broken.summary must be one line": 1,
        "methods.broken has unknown fields ['colour']": 1,
        "methods.broken.smoke must be a list of key=value overrides": 1,
    }
    for start, count in expected.items():
        assert sum(start in line for line in lines) == count, (start, lines)
    assert len(lines) == len(expected), lines
    assert all(kind in str(err.value) for kind in KINDS)
    with pytest.raises(ConfigError, match=r"family='causal_lm_v2': a module method names a conf/module"):
        check_entries({"x": {**good, "family": "causal_lm_v2"}})


def test_refused_options_are_validated_and_listed_with_their_reason():
    good = method_entries()["doremi"]
    assert CATALOGUE["doremi"].refusal("bnb_nf4") and CATALOGUE["doremi"].refusal("none") is None
    bad = {**good, "refuses": {"bnb_nf4": "", "none": "declared too", "gpt5": "no such option", "sign": "a\nb"}}
    with pytest.raises(ConfigError) as err:
        check_entries({"doremi": good, "broken": bad})
    lines = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert sorted(lines) == sorted(
        [
            "methods.broken.refuses.bnb_nf4 must be a one-line reason",
            "methods.broken.refuses.none: none is also declared as tested; keep one of the two",
            f"methods.broken.refuses.gpt5: not a backbone or quant option of {sorted(set(REFUSABLE))}",
            "methods.broken.refuses.sign must be a one-line reason",
        ]
    ), lines
    with pytest.raises(ConfigError, match=r"methods.broken.refuses must be a mapping"):
        check_entries({"broken": {**good, "refuses": ["bnb_nf4"]}})


def test_a_refused_option_stops_the_run_naming_why_and_what_works(train_cfg, caplog):
    """A pair the method refuses is an error before anything is built; an undeclared one is a warning."""
    with pytest.raises(ConfigError) as err:
        check_methods(train_cfg(["+method=doremi", "quant=bnb_int8"]))
    message = str(err.value)
    assert message.startswith("+method=doremi refuses quant=bnb_int8: " + CATALOGUE["doremi"].refusal("bnb_int8"))
    assert message.endswith("It runs with quant=none")
    with caplog.at_level("WARNING", logger="zoo"):
        check_methods(train_cfg(["+method=doremi", "quant=sign"]))
    assert "does not declare quant=sign" in caplog.text


def test_the_smoke_runs_cover_each_declared_cell_once():
    """Each backbone with the method's own quantizer, each other quantizer on its own backbone: every ✓ of the
    matrix is one run, and none runs twice."""
    for method in CATALOGUE.values():
        cells = method.combinations
        assert len(cells) == len(set(cells)) == len(method.backbones) + len(method.quantizers) - 1, method.name
        assert {b for b, _ in cells} == set(method.backbones) and {q for _, q in cells} == set(method.quantizers)
        assert cells[0] == (method.backbones[0], method.quantizers[0])


def test_a_method_entry_drives_the_generated_pages(tmp_path):
    """Changing an entry makes both generated files stale; --write regenerates them; --check agrees."""
    shutil.copy(REPO_ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    assert main(["--check", "--root", str(tmp_path)]) == 0
    entries = method_entries()
    entries["gr3"] = {**entries["gr3"], "summary": "A changed summary.", "status": "stable"}
    edited = check_entries(entries)
    from zoo.catalogue import paper_index, readme_table

    assert "A changed summary." in paper_index(PAPERS, edited)
    assert "A changed summary." not in (tmp_path / "docs" / "index.md").read_text()
    gr3_row = next(line for line in readme_table(PAPERS, edited).splitlines() if "`+method=gr3`" in line)
    assert "| stable, [demo](docs/results/gr3.md) |" in gr3_row
    (tmp_path / "docs" / "index.md").write_text("hand-edited\n")
    readme = (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").write_text(readme.replace("`+method=gr3`", "`+method=gr4`"))
    assert {p.name for p in stale_files(tmp_path)} == {"index.md", "README.md"}
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert stale_files(tmp_path) == []
    assert (tmp_path / "README.md").read_text() == (REPO_ROOT / "README.md").read_text()


def test_generated_pages_are_current():
    stale = [str(p.relative_to(REPO_ROOT)) for p in stale_files(REPO_ROOT)]
    assert not stale, f"{stale} are stale: run `python -m zoo.catalogue --write` and commit the result"


def _hand_written_lists(text: str, names: set[str], at_least: int = 4) -> list[str]:
    """Blocks of ``text`` (a paragraph, a list item or a table row) outside the catalogue's generated block that name
    ``at_least`` methods or registry classes: a per-method list kept by hand (stale when a method comes or goes)."""
    start, end = text.find(README_START), text.find(README_END)
    if start >= 0 and end > start:
        text = text[:start] + text[end:]
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("- ", "* ", "| ")):
            blocks.append([])
        blocks[-1].append(line)
    words = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    joined = ["\n".join(block).strip() for block in blocks]
    return [block for block in joined if len(set(words.findall(block)) & names) >= at_least]


def _per_method_names() -> set[str]:
    import zoo.callbacks
    import zoo.datamodules
    import zoo.modules

    registries = [*zoo.callbacks.__all__, *zoo.modules.__all__, *zoo.datamodules.__all__]
    return set(METHODS) | {n for n in registries if n[:1].isupper() and not n.isupper()}


def test_no_per_method_list_is_kept_by_hand():
    """README.md (outside its generated table), CONTRIBUTING.md and the shared docs pages list no methods, callbacks,
    modules or datamodules by hand: the catalogue and the discovered registries are the lists."""
    names = _per_method_names()
    planted = "- Available: `EvalRecords`, `RotationInvariance`,\n  `StepStateProbe` and `SafeThinkMonitor`."
    generated = f"{README_START}\n| `gr3` | `sft` | `dpo` | `safethink` |\n{README_END}\n"
    assert _hand_written_lists(generated + "\n" + planted + "\n- next item: `gr3`\n", names) == [planted]
    pages = [REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md"]
    pages += [p for p in sorted((REPO_ROOT / "docs").glob("*.md")) if p.name != "index.md"]
    found = {p.name: _hand_written_lists(p.read_text(), names) for p in pages}
    assert not any(found.values()), f"hand-kept per-method lists (generate them or drop them): {found}"


def test_index_has_one_row_per_paper_and_the_matrix():
    index = (REPO_ROOT / "docs" / "index.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| **")]
    assert len(rows) == len(PAPERS)
    for paper in PAPERS:
        assert sum(f"| **{paper.name}**:" in row for row in rows) == 1, paper.name
    planned = [row for row in rows if "| planned |" in row]
    with_methods = {m.paper for m in CATALOGUE.values()}
    assert len(planned) == sum(1 for p in PAPERS if not p.baseline and p.ref not in with_methods)
    matrix = index[index.index("## Compatibility") :]
    notes = dict(re.findall(r"^\[\^(\d+)\]: (.+)$", matrix, re.M))
    for method in CATALOGUE.values():
        row = next(line for line in matrix.splitlines() if line.startswith(f"| `{method.name}` |"))
        assert row.count("✓") == len(method.backbones) + len(method.quantizers), row
        refused = re.findall(r"✗\[\^(\d+)\]", row)
        assert len(refused) == len(method.refuses), row
        for number, (option, reason) in zip(refused, method.refuses, strict=True):
            assert notes[number] == f"`{method.name}` refuses `{option}`: {reason}"
    assert any(m.refuses for m in CATALOGUE.values()) and len(notes) == sum(len(m.refuses) for m in CATALOGUE.values())
    assert "docs/index.md" in (REPO_ROOT / "README.md").read_text()


def test_command_line_lists_every_method_with_its_summary():
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.catalogue"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for method in CATALOGUE.values():
        line = next(x for x in proc.stdout.splitlines() if x.startswith(method.name + " "))
        assert method.summary in line and method.kind in line
    grouped = by_paper(PAPERS, CATALOGUE)
    planned = [p for p in PAPERS if not p.baseline and not grouped[p.key]]
    assert ("planned (no method yet): " in proc.stdout) == bool(planned)
    # a paper whose methods are all gone is listed as planned
    paper = next(p for p in PAPERS if not p.baseline and grouped[p.key])
    gone = {m.name for m in grouped[paper.key]}
    text = listing(PAPERS, {name: m for name, m in CATALOGUE.items() if name not in gone})
    assert paper.name in next(x for x in text.splitlines() if x.startswith("planned (no method yet): "))


# -- every declared combination runs ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def saved_backbones(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny checkpoints written with ``save_pretrained``: the ``hf`` and ``hf_vlm`` backbones load them."""
    from zoo.backbones import TinyBackbone
    from zoo.backbones.vlm import TinyVLMBackbone

    root = tmp_path_factory.mktemp("hf")
    text = TinyBackbone(seed=0)
    text.build_model().save_pretrained(root / "hf")
    text.tokenizer.save_pretrained(root / "hf")
    vlm = TinyVLMBackbone(seed=0)
    vlm.build_model().save_pretrained(root / "hf_vlm")
    vlm.save_processor(root / "hf_vlm")
    return {"hf": root / "hf", "hf_vlm": root / "hf_vlm"}


def combination_overrides(backbone: str, quant: str, saved: dict[str, Path]) -> list[str]:
    overrides = [f"quant={quant}"]
    if backbone != "none":
        overrides.append(f"backbone={backbone}")
    if backbone in saved:
        overrides.append(f"backbone.name_or_path={saved[backbone]}")
    return overrides


def qlora_cell(method: str, quant: str) -> bool:
    """Whether the cell trains LoRA adapters on a frozen quantized base: a method that trains a language model (kind
    module, stage fit) under a bitsandbytes quantizer (QLoRA)."""
    return quant in QLORA_QUANTS and CATALOGUE[method].kind == "module" and STAGES.get(method) in (None, "fit")


def cell_overrides(method: str, backbone: str, quant: str, composed: DictConfig) -> list[str]:
    """What a cell adds to the method's own config: QLoRA's adapters (``+preset=qlora``, with the cell's quantizer)
    unless the method sets ``backbone.lora`` itself, the quantizer's cheap settings (:data:`QUANT_SMOKE`), and, for a
    method without a language model of its own (its first backbone ``none``), the backbone as its LLM in process
    (:data:`LLM_CELL`; ``agent=llm`` where the method runs an agent)."""
    extra = list(QUANT_SMOKE.get(quant, ()))
    if backbone != "none" and CATALOGUE[method].backbones[0] == "none":
        extra += (["agent=llm"] if OmegaConf.select(composed, "agent") is not None else []) + LLM_CELL
    if qlora_cell(method, quant) and OmegaConf.select(composed, "backbone.lora") is None:
        extra.insert(0, "+preset=qlora")
    return extra


@functools.cache
def method_composition(method: str) -> DictConfig:
    """``+method=<method>`` composed alone, once per method: what :func:`cell_overrides` reads (whether the method
    runs an agent, whether it sets ``backbone.lora``) does not depend on the cell's backbone or quantizer."""
    return compose_train([f"+method={method}"], Path(tempfile.gettempdir()) / "catalogue_probe")


def set_values(cfg: DictConfig, settings: list[str]) -> None:
    """Set ``key=value`` overrides on a composed config as Hydra sets value overrides once the defaults are merged
    (the override grammar's value, merged into the existing node, in order) and record them after the others in
    ``hydra.overrides.task``: the config and the run's recorded command are those of composing with them, without a
    second composition (a cell composes once)."""
    for override in OverridesParser.create().parse_overrides(settings):
        assert not override.is_add() and not override.is_delete() and override.package is None, override.input_line
        OmegaConf.update(cfg, override.key_or_group, override.value(), merge=True)
    with read_write(cfg.hydra.overrides.task):
        cfg.hydra.overrides.task.extend(settings)
    HydraConfig.instance().set_config(cfg)


def smoke_settings(method: str, composed: DictConfig) -> list[str]:
    """The settings of a smoke run of ``method`` (its config ``composed`` without them): :data:`SMALL_DATA`,
    :data:`SMOKE_SHAPE`, :data:`SMOKE_BACKBONE` where the backbone has the stock tiny shape, then the method's own
    ``smoke`` list (which wins), each kept only where ``composed`` has the key. Every smoke run of a method composes
    the same settings, so their prerequisites (base policy, rollouts, ...) are built once in the shared cache."""
    absent = object()
    stock = all(OmegaConf.select(composed, k, default=None) == v for k, v in STOCK_TINY.items())
    return [
        s
        for s in [*SMALL_DATA, *SMOKE_SHAPE, *(SMOKE_BACKBONE if stock else []), *CATALOGUE[method].smoke]
        if OmegaConf.select(composed, s.split("=", 1)[0], default=absent, throw_on_resolution_failure=False)
        is not absent
    ]


@pytest.mark.parametrize(("method", "backbone", "quant"), COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_declared_combination_runs_fast_dev_run(
    method, backbone, quant, train_cfg, base_policy_cache, saved_backbones, monkeypatch
):
    """One cell of the compatibility matrix: one composition and one ``fast_dev_run`` (one training step and one
    validation batch, or one evaluation batch), in process. ``methods.<name>.smoke`` may list cheap settings for
    this run (fewer ADMM steps, ...); these, :data:`SMALL_DATA` and :data:`SMOKE_SHAPE` are skipped where the
    method's composed config has no such key (e.g. NanoQuant's under ``quant=sign``). The quantizer must have acted
    on the built model, and a QLoRA cell (:func:`qlora_cell`) must train LoRA adapters only, on bitsandbytes
    layers."""
    overrides = [
        f"+method={method}",
        "debug=fdr",
        "trainer.accelerator=cpu",
        *SMALL_BASE_POLICY,
        *combination_overrides(backbone, quant, saved_backbones),
    ]
    overrides += cell_overrides(method, backbone, quant, method_composition(method))
    cfg = train_cfg(overrides, cache_dir=base_policy_cache)
    set_values(cfg, smoke_settings(method, cfg))
    assert cfg.hydra.runtime.choices["quant"] == quant
    if backbone != "none":
        assert cfg.hydra.runtime.choices["backbone"] == backbone
    built = []  # the objects of the cell's own job (the last build; prerequisites build theirs first)
    real_build = train_module.build_objects
    monkeypatch.setattr(train_module, "build_objects", lambda c: built.append(real_build(c)) or built[-1])
    metrics = run(cfg)
    assert metrics, f"{method} on backbone={backbone} quant={quant} logged no metric"
    module = built[-1][0]
    if quant != "none":
        quantized = [m for m in module.modules() if layer_stored_bits(m) is not None]
        assert quantized, f"quant={quant} left no quantized layer in {method}'s model"
    if qlora_cell(method, quant):
        # the language model's trainable weights: LoRA adapters, plus the rows a vocabulary extension adds (its
        # method trains them on the frozen base); a module's own parts beside it (Cuttlefish's connector) may train
        language_model = module.model if getattr(module, "model", None) is not None else module
        trainable = [n for n, p in language_model.named_parameters() if p.requires_grad]
        assert trainable and all(re.search(r"\blora_|\.new_rows\.", n) for n in trainable), trainable[:5]
