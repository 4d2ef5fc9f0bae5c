"""The torchrun environment is checked before anything waits on it, and the rendezvous has a
finite timeout: a bad launch is one line, never minutes of silence (issue 17)."""

from __future__ import annotations

import socket

import pytest
import torch

from attnprobe.core.distributed import (
    Torchrun,
    rendezvous_timeout,
    start_group,
    torchrun_env,
)
from attnprobe.errors import InputError

GOOD = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500"}


def test_a_launch_is_read_from_the_environment():
    assert torchrun_env(GOOD) == Torchrun(1, 2, 1, "127.0.0.1", 29500)
    assert torchrun_env({}) is None  # not under torchrun
    assert torchrun_env({"WORLD_SIZE": "1"}) is None  # torchrun with one process: no group
    without_local = {k: v for k, v in GOOD.items() if k != "LOCAL_RANK"}
    assert torchrun_env(without_local).local_rank is None


@pytest.mark.parametrize(("change", "message"), [
    ({"RANK": "5"}, "RANK=5 must be below WORLD_SIZE=2 (0..1)"),
    ({"RANK": "-1"}, "RANK=-1 must be at least 0"),
    ({"RANK": "one"}, "RANK must be a whole number; got 'one'"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be a whole number; got 'two'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"RANK": None}, "WORLD_SIZE=2 but RANK is not set"),
    ({"MASTER_ADDR": None, "MASTER_PORT": ""}, "MASTER_ADDR, MASTER_PORT are not set"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT must be a whole number; got 'http'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port (1..65535)"),
    ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 must be below WORLD_SIZE=2 (0..1)"),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"}, "LOCAL_RANK=1 must be below "
                                                   "LOCAL_WORLD_SIZE=1 (0..0)"),
    ({"LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE=3 is more than WORLD_SIZE=2"),
])
def test_each_bad_variable_is_one_line_naming_it(change, message):
    env = {**GOOD, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(InputError) as info:
        torchrun_env(env, context="--distributed")
    text = str(info.value)
    assert text.startswith("--distributed: ") and message in text and "\n" not in text


def test_the_rendezvous_timeout_is_finite_and_settable():
    assert rendezvous_timeout({}) == 120
    assert rendezvous_timeout({"ATTNPROBE_RENDEZVOUS_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        with pytest.raises(InputError, match="ATTNPROBE_RENDEZVOUS_TIMEOUT must be a number"):
            rendezvous_timeout({"ATTNPROBE_RENDEZVOUS_TIMEOUT": bad})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_no_one_joins_fails_after_the_timeout_in_one_line(rank):
    # rank 0 of 2 alone waited for torch's 30 minutes; rank 1 without a rank 0 too
    launch = Torchrun(rank, 2, rank, "127.0.0.1", _free_port())
    with pytest.raises(InputError) as info:
        start_group(launch, context="--distributed", timeout_s=1)
    text = str(info.value)
    assert f"--distributed: rank {rank} of WORLD_SIZE=2 met no" in text and "within 1 s" in text
    assert "start all 2 processes" in text and "\n" not in text
    assert not torch.distributed.is_initialized()
