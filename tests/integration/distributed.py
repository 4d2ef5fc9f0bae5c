"""Run a function, or the ``attnprobe`` command line, in several torch.distributed (gloo)
processes, the way the ``*_distributed`` integration tests compare one process with two."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.multiprocessing as mp


def run_ranks(fn: Callable[..., Any], args: Sequence[Any] = (), *, world: int,
              folder: Path) -> list[Any]:
    """``fn(rank, *args)`` in ``world`` spawned processes, each with one thread; what every
    rank returned (pickled), in rank order.

    With ``world > 1`` the processes form a gloo group (a file:// rendezvous in a fresh folder
    under ``folder``) around the call; ``world == 1`` is the plain single-process reference:
    no group at all. ``fn`` must be a module-level function (spawn pickles it by name)."""
    run = Path(tempfile.mkdtemp(prefix=f"world{world}-", dir=folder))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_rank, args=(fn, tuple(args), world, str(run)), nprocs=world, join=True,
                       start_method="spawn")
    return [pickle.loads((run / f"rank{rank}.pkl").read_bytes()) for rank in range(world)]


def _rank(rank: int, fn: Callable[..., Any], args: tuple, world: int, run: str) -> None:
    torch.set_num_threads(1)  # the same arithmetic in every process
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{run}/rendezvous",
                                             rank=rank, world_size=world)
    try:
        result = fn(rank, *args)
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()
    (Path(run) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def run_cli_ranks(argv: list[str], *, world: int) -> None:
    """``attnprobe argv`` in ``world`` spawned processes started as torchrun would start them
    (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment); a rank
    that exits non-zero fails the call."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_cli_rank, args=(argv, world, _free_port()), nprocs=world, join=True,
                       start_method="spawn")


def cli_tables(argv: list[str], *, folder: Path,
               worlds: Sequence[int] = (1, 2)) -> list[pd.DataFrame]:
    """``run_cli_ranks(argv + ["--out", CSV])`` once for each world size; the CSV tables each
    wrote, read back with ``example_id`` as text."""
    tables = []
    for world in worlds:
        out = folder / f"world{world}.csv"
        run_cli_ranks([*argv, "--out", str(out)], world=world)
        tables.append(pd.read_csv(out, dtype={"example_id": str}))
    return tables


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli_rank(rank: int, argv: list[str], world: int, port: int) -> None:
    """One process as torchrun starts it: the rendezvous in the environment."""
    torch.set_num_threads(1)
    os.environ.update({"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    from attnprobe.cli import main

    code = main(argv)
    if code != 0:
        raise SystemExit(code)


@contextmanager
def counting_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """A list that grows by one for every forward ``model`` runs inside the block."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda *_: seen.append(1))
    try:
        yield seen
    finally:
        handle.remove()
