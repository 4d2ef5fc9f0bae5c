"""Bootstrap confidence intervals of ``ap.patch.summary(table, ci=...)`` against a hand-written
numpy bootstrap of the documented protocol (one ``default_rng(seed)``, one set of example
draws for every patch, percentile interval), and by construction: equal effects give a
zero-width interval, one example gives none (NaN with a note)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import attnprobe as ap
from attnprobe.patch import COLUMNS


def table_of(effects: np.ndarray, positions=None) -> pd.DataFrame:
    """A heads table of ``effects`` ``[patch, example]`` (NaN: the example has no effect);
    patch ``k`` is head ``k`` of layer 0; clean 1 and corrupt 0, so effect = patched."""
    rows = []
    n_patches, n = effects.shape
    for k in range(n_patches):
        for i in range(n):
            same = np.isnan(effects[k, i])
            rows.append({"experiment": "heads", "example_id": str(i), "layer": 0, "head": k,
                         "position": pd.NA if positions is None else positions[k],
                         "site": "output", "direction": "denoising", "metric": "logit:w20",
                         "clean": 0.0 if same else 1.0, "corrupt": 0.0,
                         "patched": 0.0 if same else effects[k, i], "effect": effects[k, i]})
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table["position"] = table["position"].astype("Int64")
    return table


def hand_bootstrap(table: pd.DataFrame, head: int, ci: float, n_boot: int, seed: int):
    examples = list(dict.fromkeys(table["example_id"]))  # order of first appearance
    rows = table[table["head"] == head].set_index("example_id")["effect"]
    v = np.array([rows.get(e, np.nan) for e in examples], dtype=float)
    draws = np.random.default_rng(seed).integers(0, len(examples), size=(n_boot, len(examples)))
    means = []
    for b in range(n_boot):
        picked = v[draws[b]]
        picked = picked[~np.isnan(picked)]
        means.append(picked.mean() if len(picked) else np.nan)
    return np.nanquantile(np.array(means), [(1 - ci) / 2, (1 + ci) / 2])


def test_intervals_equal_a_hand_computed_bootstrap():
    rng = np.random.default_rng(11)
    effects = rng.normal(0.3, 0.5, size=(4, 9))
    effects[2, 5] = np.nan  # an example without an effect for one patch
    table = table_of(effects)
    with pytest.warns(UserWarning, match="1 NaN effect"):
        found = ap.patch.summary(table, ci=0.9, n_boot=400, seed=5)
    assert list(found.columns[found.columns.get_loc("effect"):][:3]) == [
        "effect", "ci_low", "ci_high"]
    for head in range(4):
        row = found[found["head"] == head].iloc[0]
        low, high = hand_bootstrap(table, head, 0.9, 400, 5)
        # float64 sums of <= 9 terms in another order: rounding in the 15th digit
        np.testing.assert_allclose([row["ci_low"], row["ci_high"]], [low, high], rtol=1e-12,
                                   atol=1e-12)
        assert row["ci_low"] < row["effect"] < row["ci_high"]
    assert found.attrs["ci"] == {"level": 0.9, "n_boot": 400, "seed": 5}
    assert any("left out of the means and the intervals" in n for n in found.attrs["notes"])


def test_examples_missing_from_some_patches_are_resampled_alike():
    """Positions each: a short example has no row at the late positions; the hand bootstrap
    reads it as missing there, as the summary does."""
    effects = np.random.default_rng(2).normal(size=(3, 6))
    table = table_of(effects, positions=[0, 1, 2])
    table = table[~((table["position"] == 2) & table["example_id"].isin(["1", "4"]))]
    found = ap.patch.summary(table, ci=0.95, n_boot=300, seed=0)
    for head in range(3):
        row = found[found["head"] == head].iloc[0]
        np.testing.assert_allclose([row["ci_low"], row["ci_high"]],
                                   hand_bootstrap(table, head, 0.95, 300, 0), rtol=1e-12,
                                   atol=1e-12)
    assert list(found["n_examples"]) == [6, 6, 4]


def test_equal_effects_give_a_zero_width_interval():
    effects = np.full((2, 7), 0.3)
    effects[1] = -1.7
    found = ap.patch.summary(table_of(effects), ci=0.95, n_boot=200, seed=1)
    assert list(found["ci_low"]) == [0.3, -1.7] and list(found["ci_high"]) == [0.3, -1.7]


def test_one_example_gives_no_interval_and_says_so():
    table = table_of(np.array([[0.4], [0.9]]))
    with pytest.warns(UserWarning, match="fewer than two examples"):
        found = ap.patch.summary(table, ci=0.95)
    assert found["ci_low"].isna().all() and found["ci_high"].isna().all()
    assert list(found["effect"]) == [0.4, 0.9]


def test_without_ci_the_summary_is_unchanged_and_bad_levels_are_refused():
    table = table_of(np.random.default_rng(0).normal(size=(2, 3)))
    assert "ci_low" not in ap.patch.summary(table).columns
    for bad in (0, 1, 1.5, -0.1, float("nan")):
        with pytest.raises(ap.InputError, match="ci"):
            ap.patch.summary(table, ci=bad)
    with pytest.raises(ap.InputError, match="n_boot"):
        ap.patch.summary(table, ci=0.9, n_boot=0)


def test_a_real_residual_table_gets_intervals_per_layer_and_position():
    from tests.integration.causal_lms import causal_lm

    model, tok = causal_lm("gpt2")
    clean = [[5, 6, 7, 8], [11, 12, 13, 14], [40, 41, 42, 43]]
    corrupt = [[25, 6, 27, 8], [31, 12, 13, 34], [40, 51, 42, 53]]
    table = ap.patch.residual(model, tok, clean, corrupt, "logit:w20")
    found = ap.patch.summary(table, ci=0.8, n_boot=100, seed=3)
    assert len(found) == 2 * 4 and (found["n_examples"] == 3).all()
    assert (found["ci_low"] <= found["effect"] + 1e-12).all()
    assert (found["effect"] <= found["ci_high"] + 1e-12).all()
