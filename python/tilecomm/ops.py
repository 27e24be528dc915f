"""Collectives as torch operators: the least host time per call.

``torch.ops.tilecomm.all_reduce_(tensor, "sum", group.group_name)`` and
``torch.ops.tilecomm.all_gather_into_tensor_out(input, group.group_name, out=output)``
do what a synchronous ``dist.all_reduce`` / ``dist.all_gather_into_tensor`` on that group
does (same checks, algorithms and stream semantics; complex tensors as real views), without
torch.distributed's Python wrapper and without a Work object. That takes 3-10 us of host time
off a small CUDA collective (docs/benchmarks.md). They write their tensor argument and return
nothing, so that torch.compile can trace them; CUDA graphs capture them. A tensor that requires
grad is refused. The group's backend for the tensor's device must be tilecomm. The two
functions below name the group for you, at the price of a Python call.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

import tilecomm._C  # noqa: F401  (defines the operators)


def _group_name(group) -> str | None:
    """The group's name; None where this rank is not in it (the call then does nothing, as dist's do)."""
    g = group if group is not None else dist.group.WORLD
    if g is None:
        raise ValueError("tilecomm.ops: the default process group is not initialised")
    if g is dist.GroupMember.NON_GROUP_MEMBER:
        warnings.warn("tilecomm.ops: this rank is not in the group; the call does nothing", stacklevel=3)
        return None
    return g.group_name


def _op_name(op) -> str:
    name = getattr(op, "name", op)  # dist.ReduceOp.SUM (an enum) or "sum"
    if not isinstance(name, str):
        raise ValueError(f"tilecomm.ops.all_reduce_: op must be a name or a dist.ReduceOp member, got {op!r}")
    return name.lower()


def all_reduce_(tensor: torch.Tensor, op="sum", group=None) -> torch.Tensor:
    """Reduces ``tensor`` in place over ``group`` (default: the world) and returns it."""
    op, name = _op_name(op), _group_name(group)
    if name is not None:
        torch.ops.tilecomm.all_reduce_(tensor, op, name)
    return tensor


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group=None) -> torch.Tensor:
    """Gathers every rank's ``input`` into ``output`` (rank order along dim 0) and returns it."""
    name = _group_name(group)
    if name is not None:
        torch.ops.tilecomm.all_gather_into_tensor_out(input, name, out=output)
    return output
