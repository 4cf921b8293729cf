"""The auxiliary loss's normaliser is collective (DESIGN "Scale": loss normalisers are reduced across ranks).

Two gloo processes with different numbers of ThoughtFold pairs (3 and 1; then 3 and none): every rank's
``items.normalizer`` is the all-reduced count over the number of ranks, so DDP's average of the ranks' gradients is
the single-process gradient over the union of the pairs; ``ThoughtFoldLoss.loss`` divides by it. The trainer is a
double carrying ``world_size`` only (the collective itself is gloo's)."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from zoo.backbones import TinyBackbone
from zoo.modules import GRPOModule
from zoo.modules.thoughtfold import PairItems, ThoughtFoldLoss
from zoo.rl import ExactMatchReward


def _items(size: int) -> PairItems:
    ids = torch.tensor([[5, 6, 7, 8]] * size)
    labels = torch.tensor([[-100, -100, 7, 8]] * size)
    batch = {}
    for side in ("chosen", "rejected"):
        batch[f"{side}_input_ids"] = ids if side == "chosen" else ids + 1
        batch[f"{side}_attention_mask"] = torch.ones_like(ids)
        batch[f"{side}_labels"] = labels if side == "chosen" else labels + (labels >= 0)
    return PairItems(size, batch, torch.zeros(size), torch.zeros(size))


def _rank(rank: int, port: int, cases: list[list[int | None]], out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        module = GRPOModule(TinyBackbone(seed=0), rewards={"accuracy": ExactMatchReward()}, group_size=2)
        module._trainer = SimpleNamespace(world_size=2)  # a trainer double: world_size is all the method reads
        for case, sizes in enumerate(cases):
            items = None if sizes[rank] is None else _items(sizes[rank])
            module.share_aux_normalizer(items)
            out[case, rank] = None if items is None else items.normalizer
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (the pairs on rank 0 and rank 1, the normaliser each rank holds after the all-reduce); one launch runs them all
CASES = [([3, 1], {0: 2.0, 1: 2.0}), ([3, None], {0: 1.5, 1: None})]


@pytest.mark.distributed
def test_the_aux_normalizer_is_the_all_reduced_count_over_the_ranks():
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(_free_port(), [sizes for sizes, _ in CASES], out), nprocs=2, join=True)
    for case, (sizes, expected) in enumerate(CASES):
        assert {rank: out[case, rank] for rank in (0, 1)} == expected, sizes


def test_thoughtfold_divides_by_the_shared_normalizer():
    """Without a normaliser the loss of 2 pairs is divided by 2; with ``normalizer=4`` (8 pairs on 2 ranks) by 4."""
    module = GRPOModule(TinyBackbone(seed=0), rewards={"accuracy": ExactMatchReward()}, group_size=2)
    module.configure_model()
    aux = ThoughtFoldLoss(reference="rollout")
    items = _items(2)
    own = aux.loss(module, items, slice(None))
    items.normalizer = 4.0
    torch.testing.assert_close(aux.loss(module, items, slice(None)), own / 2)
