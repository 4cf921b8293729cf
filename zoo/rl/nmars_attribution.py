"""Which part of N-MARS masked SFT moves the log-probability of error tokens it never trains.

Masked SFT (ICML 2026 poster 61349) keeps the error tokens of an augmented row ``y_<t, e, <UNDO>, y_t, ...`` out of
the loss (labels -100): ``e`` is never a target. Its probability given its prefix can still move, through any
parameter the trained targets share with it. This module measures, at a starting policy and to first order, how a
step on the masked-SFT objective moves

    D = mean over held-out error tokens of log p(e | prefix)     (``val/deviation_logprob`` of UndoMetrics)

and splits that change by **which trained targets** cause it and **through which parameters**:

- target groups (:data:`GROUPS`) of the training rows: ``clean`` (rows without a deviation), ``before`` (targets of
  a deviating row before its first error), ``undo`` (the ``<UNDO>`` targets), ``after`` (corrections and everything
  after the first error) and ``error`` (the error tokens themselves: trained by plain SFT only);
- parameter paths: ``body`` (every weight but the token rows), ``out_out`` (output rows moved by the group's use of
  tokens as targets, read by D as outputs: "the error token is a target elsewhere"), ``tied`` (with tied input and
  output embeddings: rows moved through one side and read through the other; 0 for an untied model) and ``in_in``
  (input rows moved by the group's inputs, read by D's inputs).

For a group ``G`` with gradient ``g_G = ∇ sum_{t in G} log p(y_t | y_<t) / N`` (``N``: the tokens masked SFT trains)
and ``g_D = ∇ D``, the change of ``D`` after a step of size ``lr`` is ``lr * <g_D, g_G>`` to first order (an SGD
step, split exactly over groups and paths) and ``lr * <g_D, g_G / (|g| + eps)>`` for Adam's first step (``g``: the
whole masked-SFT gradient, Adam's first update being ``lr * g / |g|`` per coordinate). First order at the starting
policy: it explains the direction of the first steps, not a whole run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

GROUPS = ("clean", "before", "undo", "after", "error")
PATHS = ("body", "out_out", "tied", "in_in")
MASKED_SFT_GROUPS = ("clean", "before", "undo", "after")


@dataclass(frozen=True)
class Row:
    """One sequence: ``input_ids`` (prompt + completion) and the positions of the target tokens of each group
    (the index of the token predicted, so its log-prob is read from the logits at ``position - 1``)."""

    input_ids: list[int]
    targets: dict[str, list[int]]


def row_targets(
    prompt_ids: Sequence[int], completion_ids: Sequence[int], loss_mask: Sequence[bool], undo_id: int
) -> Row:
    """The :class:`Row` of an augmented N-MARS row (``loss_mask`` False on error tokens, see :mod:`zoo.data.undo`)."""
    if len(completion_ids) != len(loss_mask):
        raise ValueError(f"completion_ids ({len(completion_ids)}) and loss_mask ({len(loss_mask)}) differ in length")
    offset = len(prompt_ids)
    errors = [j for j, keep in enumerate(loss_mask) if not keep]
    first = errors[0] if errors else None
    targets: dict[str, list[int]] = {g: [] for g in GROUPS}
    for j, (token, keep) in enumerate(zip(completion_ids, loss_mask)):
        if first is None:
            group = "clean"
        elif not keep:
            group = "error"
        elif token == undo_id:
            group = "undo"
        else:
            group = "before" if j < first else "after"
        targets[group].append(offset + j)
    return Row([*prompt_ids, *completion_ids], targets)


def target_logprob_sum(model: nn.Module, rows: Sequence[Row], group: str, batch_size: int) -> Tensor:
    """Sum of ``log p`` of ``group``'s targets over ``rows`` (a graph to differentiate; ``batch_size`` rows a pass)."""
    total: Tensor | None = None
    chosen = [r for r in rows if r.targets.get(group)]
    for start in range(0, len(chosen), batch_size):
        batch = chosen[start : start + batch_size]
        width = max(len(r.input_ids) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, : len(r.input_ids)] = torch.tensor(r.input_ids)
            mask[i, : len(r.input_ids)] = 1
        device = next(model.parameters()).device
        logp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), -1)
        rows_idx = [i for i, r in enumerate(batch) for _ in r.targets[group]]
        pos = [p for r in batch for p in r.targets[group]]
        tok = [r.input_ids[p] for r in batch for p in r.targets[group]]
        part = logp[rows_idx, [p - 1 for p in pos], tok].sum()
        total = part if total is None else total + part
    return total if total is not None else torch.zeros(())


def untied_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose output head has its own copy of the (possibly tied) token rows, so that gradients
    reach the input rows (``get_input_embeddings().weight``) and the output rows (``get_output_embeddings().weight``)
    separately. Same function as ``model`` at these weights."""
    clone = copy.deepcopy(model)
    head, embedding = clone.get_output_embeddings(), clone.get_input_embeddings()
    if head.weight is embedding.weight:
        head.weight = nn.Parameter(embedding.weight.detach().clone())
        if hasattr(clone, "config"):
            clone.config.tie_word_embeddings = False
    return clone


def _gradients(model: nn.Module, loss: Tensor) -> dict[str, Tensor]:
    params = dict(model.named_parameters())
    if not loss.requires_grad:  # a group without targets in these rows
        return {n: torch.zeros_like(p) for n, p in params.items()}
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g.detach()) for (n, p), g in zip(params.items(), grads)}


def deviation_attribution(
    model: nn.Module,
    train_rows: Sequence[Row],
    heldout_rows: Sequence[Row],
    tied: bool,
    batch_size: int = 64,
    eps: float = 1e-8,
) -> dict[str, dict[str, float]]:
    """First-order change of the held-out error tokens' mean log-prob per unit step, by target group and path.

    Args:
        model: the starting policy (any causal LM with ``get_input_embeddings``/``get_output_embeddings``; it is
            copied, not changed).
        train_rows: the training rows (:func:`row_targets`); heldout_rows: the held-out rows whose ``error``
            targets define ``D``.
        tied: whether the model ties its input and output token rows (``config.tie_word_embeddings``): then an
            update of the rows through one side moves the other (the ``tied`` path); untied, that path is 0.

    Returns:
        ``{group: {"share": share of the masked-SFT targets (error: relative to them), "body", "out_out", "tied",
        "in_in", "sgd": their sum, "adam": the Adam-first-step change}}`` plus ``"masked_sft"`` (the sum over
        :data:`MASKED_SFT_GROUPS`).
    """
    work = untied_copy(model).float()
    work.eval()
    in_name = next(n for n, p in work.named_parameters() if p is work.get_input_embeddings().weight)
    out_name = next(n for n, p in work.named_parameters() if p is work.get_output_embeddings().weight)
    count = sum(len(r.targets[g]) for r in train_rows for g in MASKED_SFT_GROUPS)
    held = sum(len(r.targets["error"]) for r in heldout_rows)
    if count == 0 or held == 0:
        raise ValueError("deviation_attribution needs trained targets and held-out error tokens")
    g_d = _gradients(work, target_logprob_sum(work, heldout_rows, "error", batch_size) / held)
    g_groups = {g: _gradients(work, target_logprob_sum(work, train_rows, g, batch_size) / count) for g in GROUPS}

    def rows_of(grads: dict[str, Tensor]) -> Tensor:
        """The tied parameterisation's row gradient (both sides add up when the rows are one tensor)."""
        return grads[in_name] + grads[out_name] if tied else grads[out_name]

    body = [n for n in g_d if n not in (in_name, out_name)]
    total = {n: sum(g_groups[g][n] for g in MASKED_SFT_GROUPS) for n in g_d}
    total_rows = rows_of(total) if tied else None
    result: dict[str, dict[str, float]] = {}
    for group in GROUPS:
        g = g_groups[group]
        parts = {
            "body": float(sum((g_d[n] * g[n]).sum() for n in body)),
            "out_out": float((g_d[out_name] * g[out_name]).sum()),
            "tied": float((g_d[out_name] * g[in_name]).sum() + (g_d[in_name] * g[out_name]).sum()) if tied else 0.0,
            "in_in": float((g_d[in_name] * g[in_name]).sum()),
        }
        adam = sum(float((g_d[n] * g[n] / (total[n].abs() + eps)).sum()) for n in body)
        if tied:
            adam += float((rows_of(g_d) * rows_of(g) / (total_rows.abs() + eps)).sum())
        else:
            adam += sum(float((g_d[n] * g[n] / (total[n].abs() + eps)).sum()) for n in (in_name, out_name))
        n_group = sum(len(r.targets[group]) for r in train_rows)
        result[group] = {"share": n_group / count, **parts, "sgd": sum(parts.values()), "adam": adam}
    result["masked_sft"] = {
        key: sum(result[g][key] for g in MASKED_SFT_GROUPS) for key in ("share", *PATHS, "sgd", "adam")
    }
    return result


__all__ = [
    "GROUPS",
    "MASKED_SFT_GROUPS",
    "PATHS",
    "Row",
    "deviation_attribution",
    "row_targets",
    "target_logprob_sum",
    "untied_copy",
]
