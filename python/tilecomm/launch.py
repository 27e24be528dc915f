"""Runs a function on N local ranks, or on this rank when started by torchrun."""

from __future__ import annotations

import os
import socket
import tempfile

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _entry(rank, fn, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    # As torchrun does (OMP_NUM_THREADS=1): ranks sharing cores must not also spin
    # up intra-op thread pools that compete with each other.
    torch.set_num_threads(1)
    fn(rank, world, *args)


def run(fn, world: int, *args):
    """Calls fn(rank, world, *args) on every rank: in this process under torchrun, else in `world` children."""
    if under_torchrun():
        fn(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), *args)
        return
    mp.spawn(_entry, args=(fn, world, free_port(), args), nprocs=world, join=True)


def run_read(fn, world: int, *args) -> str:
    """run(fn, world, *args, path), path a fresh temporary file that fn writes (on one rank) what it
    reports; returns that text and removes the file."""
    fd, path = tempfile.mkstemp(prefix="tilecomm-")
    os.close(fd)
    try:
        run(fn, world, *args, path)
        with open(path) as f:
            return f.read()
    finally:
        os.unlink(path)
