"""DoReMi's online domain reweighting as a callback over the weighted-sampler seam (arXiv 2305.10429).

Each micro-batch of the proxy model: per-token losses of the proxy and of the frozen reference model -> per-domain
sums of the clipped excess loss and token counts, accumulated over the optimizer step; the batch's per-row
``loss_weight`` is set from the weights in force so that the module's token-mean loss is DoReMi's
``sum_k a_k * (mean domain-k token loss)`` (:func:`zoo.mixing.domain_loss_weights`). Once per optimizer step (before
it), the accumulated sums and counts are all-reduced across ranks and the weights take one exponentiated-gradient
step (:func:`zoo.mixing.doremi_update`) from the step's per-domain excess losses; a domain without tokens in the step
keeps its last score (official rule; ``absent_domains``). So gradient accumulation and the number of processes do not
change the weights (accumulating 2 micro-batches = one batch twice as large), and every rank holds the same weights.
The running average of the weights is the output, written at the end of training as a JSON object
``{domain: weight}`` that ``datamodule.sampler.weights_file`` reads.

[assumed] Order within a step: the official trainer (``doremi/trainer.py``, ``training_step``) gathers the excess
losses of a step's micro-batches and updates the weights at the last one, whose loss already uses the new weights
while the earlier micro-batches used the old ones. Here every micro-batch of step ``t`` is weighted with the weights in
force when the step starts (updated at the end of step ``t - 1``), so the gradient of a step does not depend on how it
is split; without accumulation this differs from the official order by one step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from zoo.backbones.placement import model_device, place_auxiliary, resolve_dtype_option
from zoo.errors import ConfigError
from zoo.losses import masked_token_logprobs
from zoo.mixing.doremi import ABSENT_RULES, DoReMiWeights, domain_excess_sums, domain_loss_weights, excess_from_sums


class DoReMiReweighting(Callback):
    """Group-DRO domain reweighting of the proxy model against a reference model; writes the average weights.

    Args:
        reference: directory of the reference model (``save_pretrained`` export, e.g. from the artifact cache).
        weights_file: where the average weights go (JSON ``{domain: weight}``), written at the end of training.
        eta: step size of the weight update (paper: 1).
        smoothing: ``c`` of ``(1 - c) a + c / K`` (paper: 1e-3; reference code default 1e-4).
        apply: ``loss`` (paper: the proxy's loss is reweighted; batches keep the sampler's weights) or ``sampler``
            (the batches are drawn with the current weights instead, through ``sampler.set_weights``; the loss is
            the plain token mean) [assumed variant].
        absent_domains: the score of a domain without tokens in a step: ``keep_last`` (official code: its last
            score) or ``zero`` (it scores 0 and loses weight against the domains with a positive excess loss).
        initial_score: a domain's score before its first tokens (``keep_last``); ``None`` = ``log`` of the proxy's
            vocabulary size, as the official code (``doremi/train.py``: ``perdomain_scores`` start at
            ``log(len(tokenizer))``).
        reference_device: where the reference model runs: ``None`` (default) = the proxy's device, ``"keep"`` =
            where it was loaded, or a device (``"cuda:1"``); placed when training starts
            (:func:`zoo.backbones.placement.place_auxiliary`).
        reference_dtype: its dtype: ``None`` (default) = the proxy's compute dtype (a bf16 proxy gets a bf16
            reference, not the float32 of its export), ``"keep"``, or a dtype name.

    Needs ``datamodule/sampler=weighted`` (the domains and the domain column come from it) and a module with a
    ``model`` (a causal LM) whose training loss honours the batch's ``loss_weight`` (``CausalLMModule``).
    """

    def __init__(
        self,
        reference: str | Path,
        weights_file: str | Path,
        eta: float = 1.0,
        smoothing: float = 1e-3,
        apply: str = "loss",
        absent_domains: str = "keep_last",
        initial_score: float | None = None,
        reference_device: str | None = None,
        reference_dtype: str | None = None,
    ) -> None:
        if absent_domains not in ABSENT_RULES:
            raise ConfigError(f"DoReMiReweighting.absent_domains must be one of {ABSENT_RULES}, got {absent_domains!r}")
        if initial_score is not None and not 0 <= initial_score < float("inf"):
            raise ConfigError(f"DoReMiReweighting.initial_score must be finite and >= 0 or null, got {initial_score}")
        if apply not in ("loss", "sampler"):
            raise ConfigError(f"DoReMiReweighting.apply must be 'loss' or 'sampler', got {apply!r}")
        if not 0.0 <= smoothing <= 1.0 or eta <= 0:
            raise ConfigError(f"DoReMiReweighting: need eta > 0 and 0 <= smoothing <= 1, got {eta}, {smoothing}")
        self.reference_path = Path(reference)
        self.weights_file = Path(weights_file)
        self.eta, self.smoothing, self.apply = float(eta), float(smoothing), apply
        self.absent_domains = absent_domains
        self.initial_score = initial_score
        self.reference_device = reference_device
        self.reference_dtype = resolve_dtype_option(reference_dtype, "DoReMiReweighting.reference_dtype")
        self._sums: torch.Tensor | None = None  # the step's per-domain excess sums and token counts so far
        self._counts: torch.Tensor | None = None
        self.reference: torch.nn.Module | None = None
        self.state: DoReMiWeights | None = None
        self.domains: tuple[str, ...] = ()
        self._pending_state: dict[str, Any] | None = None

    @property
    def state_key(self) -> str:
        return "DoReMiReweighting"

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        sampler = getattr(trainer.datamodule, "sampler", None)
        if not hasattr(sampler, "set_weights"):
            raise ConfigError("DoReMiReweighting needs datamodule/sampler=weighted (the per-domain sampler)")
        if not (self.reference_path / "config.json").is_file():
            raise ConfigError(
                f"DoReMi reference model {self.reference_path} has no config.json (a save_pretrained dir)"
            )
        from transformers import AutoModelForCausalLM

        self.reference = AutoModelForCausalLM.from_pretrained(self.reference_path).eval().requires_grad_(False)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not isinstance(getattr(pl_module, "model", None), torch.nn.Module):
            raise ConfigError(f"DoReMiReweighting needs a causal-LM module with .model, got {type(pl_module).__name__}")
        sampler = trainer.datamodule.sampler
        self.domains = sampler.domains
        initial_score = self.initial_score
        if initial_score is None:
            initial_score = math.log(int(pl_module.model.get_output_embeddings().weight.shape[0]))
        self.state = DoReMiWeights(
            len(self.domains), self.eta, self.smoothing, absent_domains=self.absent_domains, initial_score=initial_score
        )
        self._sums = torch.zeros(len(self.domains), dtype=torch.float64)
        self._counts = torch.zeros(len(self.domains), dtype=torch.float64)
        if self._pending_state is not None:
            if tuple(self._pending_state["domains"]) != self.domains:
                raise ConfigError(
                    f"the checkpoint's DoReMi weights are for domains {self._pending_state['domains']}, the data has "
                    f"{list(self.domains)}"
                )
            self.state.load_state_dict(self._pending_state)
            self._pending_state = None
        place_auxiliary(
            self.reference, pl_module.model, self.reference_device, self.reference_dtype, "DoReMiReweighting.reference"
        )

    @torch.no_grad()
    def _token_losses(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token losses and mask of ``model`` on ``batch``, on the batch's device (a reference placed elsewhere,
        ``reference_device``, reads a copy of the batch on its own device)."""
        device = model_device(model)
        inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "labels")}
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        logp, mask = masked_token_logprobs(logits, inputs["labels"])
        return -logp.to(batch["input_ids"].device), mask.to(batch["input_ids"].device)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int):
        sampler = trainer.datamodule.sampler
        names = batch["columns"].get(sampler.domain_column)
        if names is None:
            raise ConfigError(f"DoReMiReweighting: the batch has no '{sampler.domain_column}' column")
        index_of = {d: i for i, d in enumerate(self.domains)}
        domain_index = torch.tensor([index_of[str(name)] for name in names])
        proxy_loss, mask = self._token_losses(pl_module.model, batch)
        reference_loss, _ = self._token_losses(self.reference, batch)
        sums, counts = domain_excess_sums(proxy_loss, reference_loss, mask, domain_index, len(self.domains))
        self._sums += sums.cpu()
        self._counts += counts.cpu()
        if self.apply == "loss":  # the weights in force since the last optimizer step
            batch["loss_weight"] = domain_loss_weights(self.state.current, mask.sum(dim=1).cpu(), domain_index).to(
                pl_module.device
            )

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """One weight update per optimizer step, from the step's excess losses summed over its micro-batches and
        all-reduced over the ranks (every rank computes the same weights)."""
        if self.state is None or self._sums is None:
            return
        totals = torch.stack([self._sums, self._counts])
        if trainer.world_size > 1:
            totals = trainer.strategy.reduce(totals.to(pl_module.device), reduce_op="sum").cpu()
        self._sums = torch.zeros_like(self._sums)
        self._counts = torch.zeros_like(self._counts)
        excess = excess_from_sums(totals[0], totals[1])
        weights = self.state.step(excess)
        if self.apply == "sampler":
            trainer.datamodule.sampler.set_weights(weights.tolist())
        for name, value in zip(self.domains, weights.tolist()):
            pl_module.log(f"doremi/weight/{name}", value, batch_size=1)
        for name, value in zip(self.domains, self.state.scores.tolist()):
            pl_module.log(f"doremi/excess/{name}", value, batch_size=1)

    def average_weights(self) -> dict[str, float]:
        """The output: ``{domain: mean_t a_t}``."""
        if self.state is None:
            raise ConfigError("DoReMiReweighting: no training step has run")
        return dict(zip(self.domains, self.state.average.tolist()))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or self.state is None:
            return
        self.weights_file.parent.mkdir(parents=True, exist_ok=True)
        self.weights_file.write_text(json.dumps(self.average_weights(), indent=2, sort_keys=True))

    def state_dict(self) -> dict[str, Any]:
        if self.state is None:
            return {}
        return {"domains": list(self.domains), **self.state.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self._pending_state = dict(state_dict)
