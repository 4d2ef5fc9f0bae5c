"""Shared fixtures: seeded RNG, and a guard that no test leaves a hook on a tracked model."""

from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from attnprobe.capture import count_hooks

# The analysis scripts import their shared harness as `harness` (analyses/ on the path).
ANALYSES = Path(__file__).resolve().parents[1] / "analyses"
if str(ANALYSES) not in sys.path:
    sys.path.insert(0, str(ANALYSES))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_TRACKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker gets its share of the cores: torch's default (every
    core per process) would run workers x cores threads, each waiting for the others."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // workers))


CUDA_SKIP = "needs a CUDA device: torch.cuda.is_available() is False"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` are skipped, each with the reason, on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.skip(reason=CUDA_SKIP))


def track(model: nn.Module) -> nn.Module:
    """Register a model so the autouse guard asserts it carries no hook after every test."""
    _TRACKED.add(model)
    return model


@pytest.fixture(autouse=True)
def _seed_and_no_hooks():
    torch.manual_seed(0)
    yield
    leaked = [type(m).__name__ for m in list(_TRACKED) if count_hooks(m) > 0]
    assert not leaked, f"hooks left behind on {leaked}"
