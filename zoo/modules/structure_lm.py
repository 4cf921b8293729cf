"""Structure-grounded LM family: frozen structure encoder -> connector -> tokens inserted into the LLM input.

Paper: "Cuttlefish: Scaling-Aware Adapter for Structure-Grounded LLM Reasoning", arXiv 2602.02780 (notes 4(a)).
The connector is injected (``module/structure_lm/connector=cuttlefish|patching|query|mean_pool``); this module only
wires the cores of :mod:`zoo.multimodal.cuttlefish` into a causal LM and trains them.

Equation -> function:

- (P1) instruction vector = mean prompt input embedding -> :func:`zoo.multimodal.cuttlefish.instruction_embedding`
  (called in :meth:`StructureLMModule.embed_inputs`)
- (P2)-(P5), (G1)-(G4) connector -> ``module.connector`` (:class:`~zoo.multimodal.cuttlefish.CuttlefishConnector`
  or a baseline with the same call signature)
- (I1) insertion after ``<structure>``, mask 1, labels -100 -> :func:`zoo.multimodal.cuttlefish.insert_structure_tokens`
- training loss: masked NLL of the completion -> :func:`zoo.losses.masked_nll` (:meth:`StructureLMModule.loss`)
- stages (notes 4(a)): ``alignment`` (encoder + LLM frozen; connector trains) and ``llm_adaptation`` (LoRA on the
  LLM through ``peft`` + connector; encoder frozen) -> :meth:`StructureLMModule.apply_stage`

Validation decodes (the module's decoder, ``module/decoder``; greedy by default) from the prompt embeddings with the
structure tokens inserted (:meth:`StructureLMModule.generate_with_structures`, an ``inputs_embeds`` prefill), scores
with the structure task's verifier, and logs accuracy overall (``{split}/exact_match``, by the generating family base
:class:`~zoo.modules.generating.GeneratingModule`), per structure-size bin (``{split}/acc_size/<bin>``), per question
kind, and the mean number of structure tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torchmetrics import MeanMetric

from zoo.backbones.base import Backbone
from zoo.data.structures import SIZE_BIN_LABELS, STRUCTURE_TOKEN, STRUCTURE_VERIFIER, StructureBatch
from zoo.errors import ConfigError, DataError
from zoo.generation.decoders import Decoder
from zoo.lora import DEFAULT_LORA, inject_lora, merged_copy
from zoo.losses import IGNORE_INDEX, masked_nll
from zoo.modules.base import OptimizerFactory, SchedulerFactory
from zoo.modules.cuttlefish_encoder import PretrainRecipe, load_encoder
from zoo.modules.generating import EVAL_SPLITS, GeneratingModule
from zoo.multimodal.cuttlefish import (
    ConnectorOutput,
    InsertedInputs,
    insert_structure_tokens,
    instruction_embedding,
    patch_count_stats,
)
from zoo.multimodal.structure_encoder import FeatureStandardizer, StructureEncoder, atom_feature_stats, encode_dense
from zoo.protocols import GenerationOutput, GenerationResult, SamplingParams, Verifier
from zoo.quant.base import Quantizer

STAGES = ("alignment", "llm_adaptation", "full_finetune")
# metric-name-safe labels of the size bins
SIZE_BIN_KEYS = {"<=25": "le25", "26-50": "26_50", "51-100": "51_100", "101-200": "101_200", ">200": "gt200"}
ConnectorFactory = Callable[..., nn.Module]


class StructureLMModule(GeneratingModule):
    """Structure encoder + connector + causal LM, trained on completions (family module of Cuttlefish).

    Args:
        backbone, quantizer, optimizer, scheduler, generation: as :class:`~zoo.modules.base.ZooModule`.
        connector: partial taking ``(node_dim=, llm_dim=)`` and returning a connector with the Cuttlefish interface.
        encoder: :class:`~zoo.multimodal.structure_encoder.StructureEncoder` kwargs.
        encoder_init: a directory written by the pretraining method (the config's default is the prerequisite node
            :func:`zoo.modules.cuttlefish_encoder.pretrained_encoder`, which the CLI builds through the
            artifact cache before the job and replaces by its directory) or ``random`` (no pretraining; ablation).
        encoder_pretrain: :class:`~zoo.modules.cuttlefish_encoder.PretrainRecipe` fields (recorded with the
            hyperparameters: the recipe of the pretrained encoder).
        stage: ``alignment`` (LLM frozen), ``llm_adaptation`` (LoRA on the LLM) or ``full_finetune`` (every LLM
            weight trains with the connector; not a stage of the paper: for a small random-init LLM, which LoRA on a
            frozen random network cannot adapt).
        lora: LoRA settings for ``llm_adaptation`` (``r``, ``alpha``, ``dropout``, ``target_modules``; paper r=16,
            alpha=32).
        connector_init: a ``connector.safetensors`` (or a directory holding one, e.g. an alignment run's
            ``export``) to start the connector from.
        placeholder: the placeholder token (must be in the tokenizer: ``backbone.extra_tokens``).
        generate_on_eval: generation + verifier during validation/test.
        verifier: ``(completion, answer) -> bool``; default the structure task's
            (:data:`~zoo.data.structures.STRUCTURE_VERIFIER`).
        decoder: the decoder (``module/decoder``; default plain sampling, greedy with the default ``generation``).
        gate_entropy_weight: weight of a gate-entropy term ``w * (1 - mean_g H(p_g) / log n_g)`` added to the loss
            (connectors with a gate only; 0 = the paper's loss). Keeps the anchor distribution spread so that
            ``k_g`` keeps growing with size (a control against gate collapse; not in the paper).

    Training logs ``train/patches/{k_mean,k_per_atom,k_slope,k_vs_uniform}`` (``k_g`` against structure size,
    :func:`~zoo.multimodal.cuttlefish.patch_count_stats`) and ``train/patches/gate_entropy`` for gated connectors.
    """

    def __init__(
        self,
        backbone: Backbone,
        quantizer: Quantizer | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        generation: dict[str, Any] | None = None,
        connector: ConnectorFactory | None = None,
        encoder: dict[str, Any] | None = None,
        encoder_init: str = "random",
        encoder_pretrain: dict[str, Any] | None = None,
        stage: str = "alignment",
        lora: dict[str, Any] | None = None,
        connector_init: str | None = None,
        placeholder: str = STRUCTURE_TOKEN,
        generate_on_eval: bool = True,
        verifier: Verifier | None = None,
        standardize_features: bool = True,
        standardize_samples: int = 256,
        decoder: Decoder | None = None,
        gate_entropy_weight: float = 0.0,
    ) -> None:
        super().__init__(
            backbone,
            quantizer,
            optimizer,
            scheduler,
            generation,
            decoder=decoder,
            verifier=verifier if verifier is not None else STRUCTURE_VERIFIER,
            generate_on_eval=generate_on_eval,
        )
        if stage not in STAGES:
            raise ConfigError(f"module.stage must be one of {STAGES}, got {stage!r}")
        if connector is None:
            raise ConfigError(
                "module.connector is required (module/structure_lm/connector=cuttlefish|patching|query|mean_pool)"
            )
        vocab = self.tokenizer.get_vocab()
        if placeholder not in vocab:
            raise ConfigError(
                f"the tokenizer has no {placeholder!r} token; set backbone.extra_tokens=['{placeholder}']"
            )
        self.placeholder_id = int(vocab[placeholder])
        if gate_entropy_weight < 0:
            raise ConfigError(f"module.gate_entropy_weight must be >= 0, got {gate_entropy_weight}")
        self.gate_entropy_weight = float(gate_entropy_weight)
        self.connector_factory = connector
        self.encoder_kwargs = dict(encoder or {})
        self.encoder_init = str(encoder_init)
        if self.encoder_init == "pretrained":
            raise ConfigError(
                "module.encoder_init=pretrained: the module loads an encoder directory; the config's default "
                "(module.encoder_init: the zoo.modules.cuttlefish_encoder.pretrained_encoder node) builds "
                "it through the artifact cache. Drop the override, or give module.encoder_init=<dir> or random"
            )
        self.recipe = PretrainRecipe(**dict(encoder_pretrain or {}))
        self.stage = stage
        self.lora = {**DEFAULT_LORA, **dict(lora or {})}
        self.connector_init = connector_init
        self.standardize_features = standardize_features
        self.standardize_samples = standardize_samples
        self.structure_encoder: StructureEncoder | None = None
        self.feature_norm: FeatureStandardizer | None = None
        self.connector: nn.Module | None = None
        self._encoder_dir: Path | None = None
        ignore = ["backbone", "quantizer", "optimizer", "scheduler", "connector", "verifier", "decoder"]
        self.save_hyperparameters(ignore=ignore)
        self.eval_loss = nn.ModuleDict({s: MeanMetric() for s in EVAL_SPLITS})
        self._records: dict[str, list[dict[str, Any]]] = defaultdict(list)

    # -- building ---------------------------------------------------------------------------------------------------
    def resolve_encoder(self) -> Path | None:
        """Directory of the encoder weights (``None`` for ``encoder_init=random``)."""
        if self._encoder_dir is None and self.encoder_init != "random":
            self._encoder_dir = Path(self.encoder_init).expanduser()
        return self._encoder_dir

    def setup(self, stage: str) -> None:
        self.resolve_encoder()
        if stage == "fit" and self.standardize_features and self._trainer is not None:
            datamodule = self.trainer.datamodule
            if datamodule is not None and hasattr(datamodule, "dataset"):
                self.configure_model()
                self.fit_feature_stats(
                    [r["sample"] for r in datamodule.dataset("train").items[: self.standardize_samples]]
                )

    def fit_feature_stats(self, samples: list[Any]) -> None:
        """Measure the frozen encoder's per-dimension atom-feature mean/std on ``samples`` (training structures);
        stored as buffers (saved in checkpoints and exported with the connector)."""
        from zoo.data.structures import collate_structures

        self.configure_model()
        dtype = next(self.structure_encoder.parameters()).dtype
        batches = []
        for i in range(0, len(samples), 32):
            b = collate_structures(samples[i : i + 32])
            batches.append((b.atom_types, b.pos.to(dtype), b.edge_index, b.batch, b.num_graphs))
        mean, std = atom_feature_stats(self.structure_encoder, batches)
        self.feature_norm.set_stats(mean, std)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        super().configure_model()
        enc_dir = self.resolve_encoder()
        if enc_dir is None:
            with torch.random.fork_rng():
                torch.manual_seed(self.recipe.seed)
                self.structure_encoder = StructureEncoder(**self.encoder_kwargs)
        else:
            self.structure_encoder = load_encoder(enc_dir, expected=self.encoder_kwargs)
        llm_dim = self.model.get_input_embeddings().embedding_dim
        self.feature_norm = FeatureStandardizer(self.structure_encoder.hidden)
        self.connector = self.connector_factory(node_dim=self.structure_encoder.hidden, llm_dim=llm_dim)
        if self.connector_init:
            path = Path(self.connector_init).expanduser()
            path = path / "connector.safetensors" if path.is_dir() else path
            state = load_file(str(path))
            norm = {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith("feature_norm.")}
            if norm:
                self.feature_norm.load_state_dict(norm)
            self.connector.load_state_dict({k: v for k, v in state.items() if not k.startswith("feature_norm.")})
        dtype = self.model.get_input_embeddings().weight.dtype
        self.structure_encoder.to(dtype)
        self.connector.to(dtype)
        self.apply_stage()

    def apply_stage(self) -> None:
        """Freeze encoder and LLM; ``llm_adaptation`` injects LoRA adapters (the only trainable LLM weights),
        ``full_finetune`` trains the whole LLM."""
        self.structure_encoder.requires_grad_(False).eval()
        self.model.requires_grad_(self.stage == "full_finetune")
        if self.stage == "llm_adaptation":
            self.model = inject_lora(self.model, self.lora, seed=self.recipe.seed)
        self.connector.requires_grad_(True)

    def train(self, mode: bool = True) -> StructureLMModule:
        super().train(mode)
        if self.structure_encoder is not None:
            self.structure_encoder.eval()  # frozen: no dropout / norm updates
        return self

    # -- forward ----------------------------------------------------------------------------------------------------
    def encode_structures(self, structures: StructureBatch) -> tuple[Tensor, Tensor, Tensor]:
        """Frozen encoder -> padded ``(node_emb [B, N, D], pos [B, N, 3], atom_mask [B, N])``."""
        s = structures
        dtype = next(self.structure_encoder.parameters()).dtype
        with torch.no_grad():
            node_emb, pos, atom_mask = encode_dense(
                self.structure_encoder, s.atom_types, s.pos.to(dtype), s.edge_index, s.batch, s.num_graphs
            )
        return self.feature_norm(node_emb, atom_mask), pos, atom_mask

    def embed_inputs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        structures: StructureBatch,
        labels: Tensor | None = None,
        padding_side: str = "right",
    ) -> tuple[ConnectorOutput, InsertedInputs]:
        """Text embeddings with the connector's tokens inserted after each placeholder (eqs. P1, I1)."""
        self.configure_model()
        found = ((input_ids == self.placeholder_id) & attention_mask.bool()).sum(1)
        for b in torch.nonzero(found != 1).flatten().tolist():
            raise DataError(
                f"structure sample {structures.sample_ids[b]!r}: expected exactly one {STRUCTURE_TOKEN} placeholder in "
                f"the prompt, found {int(found[b])}"
            )
        node_emb, pos, atom_mask = self.encode_structures(structures)
        emb = self.model.get_input_embeddings()(input_ids)
        instruction = instruction_embedding(emb, attention_mask, labels)
        out = self.connector(node_emb, pos, atom_mask, instruction)
        ins = insert_structure_tokens(
            emb, input_ids, out.tokens, out.token_mask, self.placeholder_id, attention_mask, labels,
            padding_side=padding_side,  # type: ignore[arg-type]
        )  # fmt: skip
        return out, ins

    def forward_batch(self, batch: dict[str, Any]) -> tuple[Tensor, ConnectorOutput, InsertedInputs]:
        """``(logits [B, T + max k, V], connector output, inserted inputs)`` of a training batch."""
        out, ins = self.embed_inputs(batch["input_ids"], batch["attention_mask"], batch["structures"], batch["labels"])
        logits = self.model(
            inputs_embeds=ins.inputs_embeds, attention_mask=ins.attention_mask, position_ids=ins.position_ids
        ).logits
        return logits, out, ins

    def loss(self, batch: dict[str, Any]) -> tuple[Tensor, ConnectorOutput, InsertedInputs]:
        """Masked NLL of the completion tokens (inserted positions and the prompt carry label -100)."""
        logits, out, ins = self.forward_batch(batch)
        loss, _ = masked_nll(logits, ins.labels)
        return loss, out, ins

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        loss, out, _ = self.loss(batch)
        size = batch["input_ids"].shape[0]
        patches = out.patches
        if patches is not None and self.gate_entropy_weight > 0:
            regularizer = 1.0 - patches.entropy.mean()
            self.log("train/gate_regularizer", regularizer, batch_size=size)
            loss = loss + self.gate_entropy_weight * regularizer
        self.check_finite(loss)
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        self.log("train/tokens_per_structure", out.num_tokens.float().mean(), batch_size=size)
        atoms = batch["structures"].num_atoms
        self.log("train/tokens_per_atom", (out.num_tokens.float() / atoms.float()).mean(), batch_size=size)
        if patches is not None:
            rho = float(getattr(getattr(self.connector, "patching", None), "rho", 1.0))
            for key, value in patch_count_stats(patches.num_patches, atoms, rho).items():
                self.log(f"train/patches/{key}", value, batch_size=size)
            self.log("train/patches/gate_entropy", patches.entropy.detach().mean(), batch_size=size)
        return loss

    # -- generation -------------------------------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_attention_mask: Tensor,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        structures: StructureBatch | None = None,
    ) -> GenerationResult:
        """Generation protocol; a structure LM needs ``structures`` (see :meth:`generate_with_structures`)."""
        if structures is None:
            raise ConfigError("StructureLMModule.generate needs structures= (a StructureBatch for the prompts)")
        return self.generate_with_structures(prompt_ids, prompt_attention_mask, structures, params, generator)[0]

    @torch.no_grad()
    def generate_with_structures(
        self,
        prompt_ids: Tensor,
        prompt_attention_mask: Tensor,
        structures: StructureBatch,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[GenerationResult, ConnectorOutput]:
        """Decode left-padded prompts with the structure tokens inserted: the decoder prefills the inserted
        ``inputs_embeds`` (``prompt_ids`` are the result's prompt and the logits processors' context)."""
        out, ins = self.embed_inputs(prompt_ids, prompt_attention_mask, structures, padding_side="left")
        result = self.decoder(
            self.model,
            self.tokenizer,
            prompt_ids,
            ins.attention_mask,
            inputs_embeds=ins.inputs_embeds,
            params=params or self.sampling,
            generator=generator,
        )
        return result, out

    # -- evaluation -------------------------------------------------------------------------------------------------
    def generate_batch(self, batch: dict[str, Any]) -> tuple[GenerationResult, dict[str, list[Any]]]:
        s: StructureBatch = batch["structures"]
        result, out = self.generate_with_structures(
            batch["prompt_ids"], batch["prompt_attention_mask"], s, self.eval_sampling
        )
        meta = {
            "kinds": s.kinds,
            "size_bins": s.size_bins,
            "sample_ids": s.sample_ids,
            "num_atoms": s.num_atoms.tolist(),
            "num_tokens": out.num_tokens.tolist(),
        }
        return result, meta

    def prompts_and_answers(self, batch: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
        s: StructureBatch = batch["structures"]
        return list(s.prompts), list(s.answers)

    def eval_losses(self, batch: dict[str, Any], split: str) -> None:
        loss, out, _ = self.loss(batch)
        size = batch["input_ids"].shape[0]
        self.eval_loss[split].update(loss)
        self.log(f"{split}/loss", self.eval_loss[split], prog_bar=split == "val", batch_size=size)
        if not self.generate_on_eval:
            n = batch["structures"].num_atoms.tolist()
            self._records[split].extend({"num_tokens": int(k), "num_atoms": a} for k, a in zip(out.num_tokens, n))

    def log_generation(self, output: GenerationOutput, result: GenerationResult, split: str) -> None:
        m = output["meta"]
        for i in range(len(result.texts)):
            self._records[split].append(
                {k: m[k][i] for k in ("correct", "kinds", "size_bins", "num_atoms", "num_tokens")}
            )

    def _log_records(self, split: str) -> None:
        """Epoch-end metrics beside ``{split}/exact_match``: structure tokens, accuracy per size bin and kind."""
        records = self._records.pop(split, [])
        if not records:
            return
        self.log(f"{split}/tokens_per_structure", sum(r["num_tokens"] for r in records) / len(records))
        if "correct" not in records[0]:
            return
        groups: dict[str, list[bool]] = defaultdict(list)
        for r in records:
            groups[f"acc_size/{SIZE_BIN_KEYS.get(r['size_bins'], r['size_bins'])}"].append(r["correct"])
            groups[f"acc_kind/{r['kinds']}"].append(r["correct"])
        for key, values in sorted(groups.items()):
            self.log(f"{split}/{key}", sum(values) / len(values))

    def on_validation_epoch_end(self) -> None:
        self._log_records("val")

    def on_test_epoch_end(self) -> None:
        self._log_records("test")

    # -- export -----------------------------------------------------------------------------------------------------
    def export_pretrained(self, directory: str | Path) -> Path:
        """LLM (LoRA adapters merged) + tokenizer via ``save_pretrained``, plus ``connector.safetensors`` and
        ``encoder.safetensors`` (reload the connector with ``module.connector_init=<directory>``)."""
        from zoo.modules.cuttlefish_encoder import save_encoder

        self.configure_model()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model = merged_copy(self.model) if self.stage == "llm_adaptation" else self.model
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        state = {k: v.detach().cpu().contiguous() for k, v in self.connector.state_dict().items()}
        state.update(
            {f"feature_norm.{k}": v.detach().cpu().contiguous() for k, v in self.feature_norm.state_dict().items()}
        )
        save_file(state, str(directory / "connector.safetensors"))
        save_encoder(self.structure_encoder, directory, self.encoder_kwargs)
        return directory


__all__ = ["IGNORE_INDEX", "SIZE_BIN_KEYS", "SIZE_BIN_LABELS", "STAGES", "StructureLMModule"]
