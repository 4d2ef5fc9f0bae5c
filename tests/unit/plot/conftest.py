"""Figures are rendered with the Agg backend (no display), and no test may leave a pyplot
figure open or change matplotlib's global settings."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")
pytest.importorskip("seaborn")
matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _no_global_state():
    import matplotlib.pyplot as plt

    before = dict(matplotlib.rcParams)
    open_before = plt.get_fignums()
    yield
    assert plt.get_fignums() == open_before, "a plot opened a pyplot figure"
    changed = [k for k, v in matplotlib.rcParams.items() if before.get(k) != v
               and not (v != v and before.get(k) != before.get(k))]
    assert not changed, f"a plot changed rcParams {changed}"
