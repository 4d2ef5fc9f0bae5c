"""Outgrowing one machine: split a corpus's work over the ranks of a ``torch.distributed``
process group and gather the results in their original order on every rank.

Every corpus analysis (census, compare, perturbation experiments, extract) cuts its work into
units (batches or texts) that do not depend on each other, runs ``units[rank::world]`` on each
rank, and gathers ``(index, result)`` pairs. Results are put back in unit order, so a run on
``n`` processes gives the same table as one process (the census even bit for bit, since its
sums are added in the same order).

A process started by ``torchrun`` finds its place in the environment (:func:`torchrun_env`:
``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), checked before
anything waits on it, and :func:`start_group` meets the other processes within
:func:`rendezvous_timeout` seconds (``ATTNPROBE_RENDEZVOUS_TIMEOUT``, default 120) instead of
torch's 30 minutes: a rank of a missing launch, or a rank no one else joins, is a one-line
error, never a silent hang.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, NamedTuple, TypeVar

import torch

from attnprobe.core.progress import progress_bar
from attnprobe.errors import InputError

__all__ = ["RENDEZVOUS_TIMEOUT_ENV", "Torchrun", "is_distributed", "rank_and_world",
           "rendezvous_timeout", "run_sharded", "start_group", "torchrun_env"]

RENDEZVOUS_TIMEOUT_ENV = "ATTNPROBE_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_S = 120.0  # processes of one launch start within seconds of each other
_POLL_S = 0.2  # between two attempts to reach rank 0

U = TypeVar("U")
R = TypeVar("R")


def is_distributed(distributed: bool | None = None) -> bool:
    """Whether to shard: ``distributed`` when given, else whether a process group is up."""
    dist = torch.distributed
    up = dist.is_available() and dist.is_initialized()
    if distributed and not up:
        raise InputError("distributed=True needs an initialised torch.distributed process "
                         "group (torch.distributed.init_process_group, or run under torchrun)")
    return up if distributed is None else bool(distributed)


def rank_and_world(distributed: bool | None = None) -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` when not sharding."""
    if not is_distributed(distributed):
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def run_sharded(fn: Callable[[U], R], units: Sequence[U], *, distributed: bool | None = None,
                progress: bool = False, desc: str = "", unit: str = "batch") -> list[R]:
    """``[fn(u) for u in units]``, with the units split over the ranks when sharding.

    ``progress`` shows a bar over this rank's share (drawn on rank 0 only). Results are
    exchanged as Python objects (``all_gather_object``), so any backend works, gloo on CPU
    and nccl with the model on each rank's GPU alike.
    """
    rank, world = rank_and_world(distributed)
    mine = list(enumerate(units))[rank::world]
    done = [(i, fn(item)) for i, item in progress_bar(mine, enabled=progress, desc=desc,
                                                      unit=unit, total=len(mine), rank=rank)]
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, done)
        done = [pair for part in gathered for pair in part]
    return [result for _, result in sorted(done, key=lambda pair: pair[0])]


# ----------------------------------------------------------------------------- torchrun
class Torchrun(NamedTuple):
    """This process's place in a ``torchrun`` launch (validated environment variables)."""

    rank: int
    world: int
    local_rank: int | None
    addr: str
    port: int


def _whole(raw: str, name: str, context: str, *, low: int = 0,
           below: tuple[str, int] | None = None) -> int:
    """``int(raw)`` of variable ``name``, checked to be ``>= low`` (and ``< below``)."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise InputError(f"{context}: {name} must be a whole number; got {raw[:40]!r}") from None
    if value < low:
        raise InputError(f"{context}: {name}={value} must be at least {low}")
    if below is not None and value >= below[1]:
        raise InputError(f"{context}: {name}={value} must be below {below[0]}={below[1]} "
                         f"(0..{below[1] - 1})")
    return value


def torchrun_env(env: Mapping[str, str] | None = None, *, context: str = "torch.distributed"
                 ) -> Torchrun | None:
    """The launch ``torchrun`` describes in the environment, every variable checked (a
    one-line InputError naming the variable), or ``None`` when there is none (``WORLD_SIZE``
    unset or 1). ``context`` starts each message (the CLI's ``--distributed``)."""
    env = os.environ if env is None else env
    if env.get("WORLD_SIZE") is None:
        return None
    world = _whole(env["WORLD_SIZE"], "WORLD_SIZE", context, low=1)
    if world == 1:
        return None
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")
               if not env.get(name, "").strip()]
    if missing:
        raise InputError(f"{context}: WORLD_SIZE={world} but {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not set; start the processes "
                         "with torchrun (it sets RANK, MASTER_ADDR and MASTER_PORT)")
    rank = _whole(env["RANK"], "RANK", context, below=("WORLD_SIZE", world))
    per_node = ("WORLD_SIZE", world)
    if env.get("LOCAL_WORLD_SIZE") is not None:
        local_world = _whole(env["LOCAL_WORLD_SIZE"], "LOCAL_WORLD_SIZE", context, low=1)
        if local_world > world:
            raise InputError(f"{context}: LOCAL_WORLD_SIZE={local_world} is more than "
                             f"WORLD_SIZE={world}")
        per_node = ("LOCAL_WORLD_SIZE", local_world)
    local_rank = (_whole(env["LOCAL_RANK"], "LOCAL_RANK", context, below=per_node)
                  if env.get("LOCAL_RANK") is not None else None)
    port = _whole(env["MASTER_PORT"], "MASTER_PORT", context, low=1)
    if port > 65535:
        raise InputError(f"{context}: MASTER_PORT={port} is not a TCP port (1..65535)")
    return Torchrun(rank, world, local_rank, env["MASTER_ADDR"].strip(), port)


def rendezvous_timeout(env: Mapping[str, str] | None = None) -> float:
    """Seconds the processes of a launch wait for each other: ``ATTNPROBE_RENDEZVOUS_TIMEOUT``
    (a positive number) or 120."""
    env = os.environ if env is None else env
    raw = env.get(RENDEZVOUS_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_RENDEZVOUS_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{RENDEZVOUS_TIMEOUT_ENV} must be a number of seconds > 0; got "
                         f"{raw[:40]!r}")
    return value


def _reach(addr: str, port: int, deadline: float) -> bool:
    """Whether rank 0's store accepts a connection before ``deadline`` (polled, so a client
    whose rank 0 never comes fails here, quietly, rather than in torch's retry logs)."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=_POLL_S):
                return True
        except OSError:
            if time.monotonic() + _POLL_S >= deadline:
                return False
            time.sleep(_POLL_S)


def start_group(launch: Torchrun, *, backend: str = "gloo", context: str = "torch.distributed",
                timeout_s: float | None = None) -> None:
    """Initialise the default process group of ``launch``: meet the other processes at
    ``MASTER_ADDR:MASTER_PORT`` within ``timeout_s`` (default :func:`rendezvous_timeout`), or
    raise a one-line InputError saying who was missing. The group's collectives keep torch's
    own timeout (ranks may finish their shares far apart)."""
    import torch.distributed as dist

    timeout_s = rendezvous_timeout() if timeout_s is None else timeout_s
    where = f"{launch.addr}:{launch.port}"
    # under torchrun's agent store every rank is a client of the agent; else rank 0 hosts it
    host = launch.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    waited = (f"{context}: rank {launch.rank} of WORLD_SIZE={launch.world} met no "
              f"{'other process' if host else 'rank 0'} at {where} within {timeout_s:g} s")
    hint = (f"start all {launch.world} processes of the launch (torchrun --nproc-per-node "
            f"...), or wait longer with {RENDEZVOUS_TIMEOUT_ENV}=SECONDS")
    if not host and not _reach(launch.addr, launch.port, time.monotonic() + timeout_s):
        raise InputError(f"{waited}; {hint}")
    try:
        store = dist.TCPStore(launch.addr, launch.port, launch.world, is_master=host,
                              timeout=timedelta(seconds=timeout_s), multi_tenant=True)
    except (RuntimeError, ValueError, OSError) as exc:  # torch's DistError is a RuntimeError
        found = " ".join(str(exc).split("\n", 1)[0].split())[:160]
        raise InputError(f"{waited} ({found}); {hint}") from None
    try:
        dist.init_process_group(backend, store=store, rank=launch.rank,
                                world_size=launch.world)
    except (RuntimeError, ValueError) as exc:
        found = " ".join(str(exc).split("\n", 1)[0].split())[:160]
        raise InputError(f"{context}: cannot start the {backend} process group at {where} "
                         f"(rank {launch.rank} of {launch.world}): {found}") from None
