"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures(...)``): tiny
    models run fastest so, and do not fight other processes for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
