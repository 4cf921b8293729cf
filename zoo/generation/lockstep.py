"""Decoding on a sharded model: every rank runs the same number of forwards (DESIGN "Scale": early stops of a
decoding loop are agreed across ranks).

Under FSDP ``FULL_SHARD`` (and DeepSpeed ZeRO-3) every forward all-gathers the parameters of each wrapped decoder
layer, a collective that all ranks must enter. A decoding loop stops when *its* rows are done, which differs from
rank to rank: the rank that stops first leaves, and the next all-gather of the others waits until the strategy's
timeout (the hang of FSDP generation).

:func:`forwards_in_step` is the agreement, entered by :meth:`zoo.generation.decoders.Decoder.__call__` around every
decode, so that every decoding loop (the sampler, step-wise/SafeThink, DTS, undo, the watermark decoder and any new
one) stops in step without code of its own:

* while a rank decodes, a forward pre-hook on the model all-reduces "not done" (``MIN`` of a 0/1 flag) before each
  of its forwards;
* once its loop has returned, the rank all-reduces "done" and, while some rank still decodes (the ``MIN`` is 0),
  runs one dummy forward (one pad token, no cache) so that its all-gathers meet the other ranks' and all-reduces
  again; when every rank has returned (the ``MIN`` is 1), all leave together.

So each forward of a running rank is matched by one forward of every finished rank, in the same order of
collectives (one all-reduce, then the forward's all-gathers). The rule is on only when ``torch.distributed`` is
initialised with a world size above 1 and the model is sharded (:func:`is_sharded`); an unsharded model (one process,
DDP, an FSDP root unit whose parameters the strategy has already gathered) decodes as before, with no collective.
Gathering the full parameters once per rollout (``summon_full_params``) was the other choice; FSDP refuses a forward
inside it and it holds a full copy of the model on every rank, so the agreement is on the forwards instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from zoo.encoding import pad_token_id

# ids of the models a decode on this process is synchronising (a decoder called inside another decoder's loop adds no
# second all-reduce per forward)
_ACTIVE: set[int] = set()


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s forward gathers parameters from other ranks: it holds an FSDP unit
    (``FullyShardedDataParallel`` or an FSDP2 ``fully_shard`` module) or DeepSpeed ZeRO-3 partitioned parameters
    (``ds_id``)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if any(isinstance(m, (FullyShardedDataParallel, FSDPModule)) for m in model.modules()):
        return True
    return any(hasattr(p, "ds_id") for p in model.parameters())


def needs_lockstep(model: nn.Module) -> bool:
    """The condition of the agreement: ``torch.distributed`` initialised, world size > 1, ``model`` sharded."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and is_sharded(model)


def _flag_device(model: nn.Module) -> torch.device:
    if dist.get_backend() == "gloo":
        return torch.device("cpu")
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


@contextlib.contextmanager
def forwards_in_step(model: nn.Module, tokenizer: object | None = None) -> Iterator[None]:
    """Run the block (a decode on ``model``) so that it ends on all ranks together with as many forwards of ``model``
    on each (see the module docstring); a no-op unless :func:`needs_lockstep`. ``tokenizer``: the dummy forwards'
    pad id (0 without one). An exception inside the block propagates without the final agreement (the other ranks'
    next collective then fails at the strategy's timeout)."""
    if id(model) in _ACTIVE or not needs_lockstep(model):
        yield
        return
    device = _flag_device(model)

    def running(module: nn.Module, args: object) -> None:
        dist.all_reduce(torch.zeros(1, dtype=torch.int32, device=device), op=dist.ReduceOp.MIN)

    handle = model.register_forward_pre_hook(running)
    _ACTIVE.add(id(model))
    try:
        yield
    finally:
        handle.remove()
        _ACTIVE.discard(id(model))
    pad = pad_token_id(tokenizer) if tokenizer is not None else 0
    dummy = torch.full((1, 1), int(pad or 0), dtype=torch.long, device=next(iter(model.parameters())).device)
    with torch.no_grad():
        while True:
            flag = torch.ones(1, dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if int(flag.item()) == 1:
                return
            model(input_ids=dummy, use_cache=False)
