"""The tidy table every patching experiment returns, the normalised effect, and its summary.

==============  ============================================================================
column          meaning
==============  ============================================================================
``experiment``  ``heads`` (activation patching), ``path``, ``attribution``, ``residual``
                or ``mlp``
``example_id``  the input pair's index in the caller's lists, as a string
``layer``       the patched head's layer (``int64``; ``Int64`` with ``<NA>`` for patches over
                several layers: ``per="scope"``); for ``path`` the sender's
``head``        the patched head (``int64``; ``<NA>`` for patches of several heads); for
                ``k``/``v`` of grouped-query models the key/value head
``position``    the patched position (``Int64``; ``<NA>``: every position)
``site``        what was patched: ``output``, ``pattern``, ``q``, ``k``, ``v``, or a
                stream point (``resid_pre`` ... ``mlp_out``)
``direction``   ``denoising`` (the corrupted run with clean activations: *sufficiency*) or
                ``noising`` (the clean run with corrupted activations: *necessity*)
``metric``      the metric's spec (``logit_diff:Paris,Rome``, ``next-token:464`` ...)
``clean``       the metric of the clean run, ``m(x)``
``corrupt``     the metric of the corrupted run, ``m(x̃)``
``patched``     the metric of the patched run (``attribution``: its first-order estimate)
``effect``      denoising ``(patched − corrupt) / (clean − corrupt)``, noising
                ``(clean − patched) / (clean − corrupt)`` (Heimersheim & Nanda 2024): 1
                when the patch restores (denoising) or destroys (noising) the whole
                clean−corrupt difference, 0 when it changes nothing
==============  ============================================================================

The definitions: [causal methods](../guide/causal-methods.md#activation-patching).

``path`` adds ``sender_layer``, ``sender_head`` (the sender, as ``layer``/``head``),
``receivers`` (their scope) and ``into`` (the receivers' inputs, ``q,k``). ``residual`` and
``mlp`` leave ``head`` ``<NA>`` (a patch moves the whole residual vector or MLP output) and
name the stream point in ``site`` (``resid_pre``, ``resid_mid``, ``resid_post``,
``mlp_out``). :func:`summary` with ``ci=`` adds ``ci_low`` / ``ci_high``
(:mod:`attnprobe.patch.bootstrap`).

**An example whose clean and corrupted metric are equal** (within :data:`EQUAL_TOLERANCE`)
has nothing to normalise by: its ``effect`` is NaN, a warning names it and ``table.attrs
["notes"]`` keeps the note; when every example is so, the experiment refuses to run.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core import html_view
from attnprobe.errors import InputError
from attnprobe.patch.bootstrap import bootstrap_means, check_ci

__all__ = ["COLUMNS", "EQUAL_TOLERANCE", "PATH_COLUMNS", "Row", "check_differs", "effect",
           "summary", "tidy"]

COLUMNS = ("experiment", "example_id", "layer", "head", "position", "site", "direction",
           "metric", "clean", "corrupt", "patched", "effect")
PATH_COLUMNS = ("sender_layer", "sender_head", "receivers", "into")
EQUAL_TOLERANCE = 1e-6  # relative: |clean - corrupt| <= tol * max(1, |clean|, |corrupt|)
KEYS = ("experiment", "layer", "head", "position", "site", "direction", "metric",
        *PATH_COLUMNS)


@dataclass(frozen=True)
class Row:
    """One patched (example, unit): its layer/head/position and the patched metric."""

    example: int  # index into the run's pairs
    layer: int | None
    head: int | None
    position: int | None
    patched: float
    extra: tuple[tuple[str, Any], ...] = ()


def _equal(clean: np.ndarray, corrupt: np.ndarray) -> np.ndarray:
    scale = np.maximum(1.0, np.maximum(np.abs(clean), np.abs(corrupt)))
    return np.abs(clean - corrupt) <= EQUAL_TOLERANCE * scale


def effect(clean: np.ndarray, corrupt: np.ndarray, patched: np.ndarray,
           direction: str) -> np.ndarray:
    """The normalised effect (module docstring); NaN where clean and corrupt are equal."""
    clean, corrupt, patched = (np.asarray(a, dtype=float) for a in (clean, corrupt, patched))
    gap = clean - corrupt
    moved = patched - corrupt if direction == "denoising" else clean - patched
    with np.errstate(divide="ignore", invalid="ignore"):
        out = moved / gap
    return np.where(_equal(clean, corrupt), np.nan, out)


def check_differs(clean: np.ndarray, corrupt: np.ndarray, ids: Sequence[str],
                  metric: str) -> str | None:
    """The note for examples whose clean and corrupted metric are equal (None: none is);
    an InputError when every example is (there is no effect to measure)."""
    same = _equal(np.asarray(clean, float), np.asarray(corrupt, float))
    if same.all():
        raise InputError(f"metric {metric!r} is the same on the clean and the corrupted run of "
                         f"every example (e.g. {float(clean[0]):.6g}); the corruption changes "
                         "nothing it measures: choose another metric or corruption")
    if not same.any():
        return None
    named = [ids[i] for i in np.flatnonzero(same)]
    shown = ", ".join(named[:10]) + (f" ... ({len(named)} in all)" if len(named) > 10 else "")
    return (f"examples {shown}: metric {metric!r} is equal on the clean and corrupted run, so "
            "their effect is NaN (nothing to normalise by)")


def _ints(values: list[Any]) -> pd.Series:
    series = pd.Series([pd.NA if v is None else v for v in values], dtype="Int64")
    return series.astype("int64") if len(series) and series.notna().all() else series


def tidy(experiment: str, rows: Sequence[Row], *, ids: Sequence[str], clean: np.ndarray,
         corrupt: np.ndarray, site: str, direction: str, metric: str,
         note: str | None = None, columns: Sequence[str] = ()) -> pd.DataFrame:
    """The table of ``rows`` (module docstring); ``clean``/``corrupt`` ``[example]`` are the
    runs' metrics, ``columns`` the names of each row's ``extra`` values."""
    example = np.array([r.example for r in rows], dtype=int)
    c, x = np.asarray(clean, float)[example], np.asarray(corrupt, float)[example]
    patched = np.array([r.patched for r in rows], dtype=float)
    table = pd.DataFrame({
        "experiment": experiment,
        "example_id": pd.Series([ids[i] for i in example], dtype=object),
        "layer": _ints([r.layer for r in rows]),
        "head": _ints([r.head for r in rows]),
        "position": pd.Series([pd.NA if r.position is None else r.position for r in rows],
                              dtype="Int64"),
        "site": site, "direction": direction, "metric": metric,
        "clean": c, "corrupt": x, "patched": patched,
        "effect": effect(c, x, patched, direction)}, columns=list(COLUMNS))
    for name in columns:
        values = [dict(r.extra).get(name) for r in rows]
        table[name] = _ints(values) if name.endswith(("_layer", "_head")) else values
    notes = [note] if note else []
    if notes:
        warnings.warn(note, stacklevel=3)
    table.attrs["notes"] = notes
    return html_view.attach(table, "patching")  # still exactly a DataFrame


def summary(table: pd.DataFrame, *, ci: float | None = None, n_boot: int = 1000,
            seed: int = 0) -> pd.DataFrame:
    """Per patch (experiment, layer, head, position, site, direction, metric, and the path
    columns) the mean over examples of ``clean``, ``corrupt``, ``patched`` and ``effect``
    (NaN effects left out) and ``n_examples`` (those with an effect): what
    :func:`attnprobe.plot.patching_effect` draws.

    Args:
        table: a patching table (:func:`attnprobe.patch.heads`, ``path``, ``residual`` ...).
        ci: a confidence level (e.g. 0.95): adds ``ci_low`` / ``ci_high``, the percentile
            bootstrap interval of the mean effect, resampling examples with replacement
            (:mod:`attnprobe.patch.bootstrap` gives the exact protocol). NaN effects are left
            out (a note says how many); a patch with fewer than two examples with an effect
            gets a NaN interval (a note says so), never a made-up one.
        n_boot / seed: the number of bootstrap draws and the seed of their generator.

    Raises:
        InputError: ``table`` is not a patching table; ``ci`` outside (0, 1), ``n_boot`` < 1.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> table = ap.patch.heads(model, tok, clean, corrupt, "logit:next",
        ...                        metric_positions=copies)
        >>> ap.patch.summary(table).sort_values("effect", ascending=False).head(3)
        >>> ap.patch.summary(table, ci=0.95, seed=0)  # + ci_low, ci_high (NaN here: 1 pair)
    """
    if ci is not None:
        check_ci(ci, n_boot, seed)
    if not isinstance(table, pd.DataFrame) or not {"effect", "layer", "head"} <= set(
            table.columns):
        raise InputError("summary needs a patching table (from ap.patch.heads, path or "
                         "attribution)")
    keys = [k for k in KEYS if k in table.columns]
    grouped = table.groupby(keys, sort=False, dropna=False)
    out = grouped[["clean", "corrupt", "patched", "effect"]].mean().reset_index()
    out["n_examples"] = grouped["effect"].count().to_numpy()
    for column in ("layer", "head", "sender_layer", "sender_head"):
        if column in out.columns:
            out[column] = _ints([None if pd.isna(v) else int(v) for v in out[column]])
    out.attrs = dict(table.attrs)
    if ci is not None:
        _add_intervals(out, table, grouped.ngroup().to_numpy(), ci, n_boot, seed)
    return out


def _add_intervals(out: pd.DataFrame, table: pd.DataFrame, group: np.ndarray, ci: float,
                   n_boot: int, seed: int) -> None:
    """``ci_low`` / ``ci_high`` after ``effect`` (:func:`summary`), and their notes.
    ``group`` ``[row]``: each table row's row of ``out``."""
    example, ids = pd.factorize(table["example_id"], use_na_sentinel=False)
    effects = table["effect"].to_numpy(dtype=float)
    # [patch, example] mean effect (an example repeated within a patch is one example)
    sums = np.zeros((len(out), len(ids)))
    counts = np.zeros((len(out), len(ids)))
    have = ~np.isnan(effects)
    np.add.at(sums, (group[have], example[have]), effects[have])
    np.add.at(counts, (group[have], example[have]), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = sums / counts  # NaN where the patch has no effect for the example
    found = bootstrap_means(values, ci=ci, n_boot=n_boot, seed=seed)
    at = out.columns.get_loc("effect") + 1
    out.insert(at, "ci_low", found.low)
    out.insert(at + 1, "ci_high", found.high)
    notes = list(out.attrs.get("notes", []))
    if (~have).any():
        notes.append(f"{int((~have).sum())} NaN effect(s) (examples whose clean and corrupted "
                     "metric are equal) are left out of the means and the intervals")
    if found.few:
        notes.append(f"{found.few} patch(es) have fewer than two examples with an effect: "
                     "their interval is NaN (one value gives no interval)")
    for note in notes[len(out.attrs.get("notes", [])):]:
        warnings.warn(note, stacklevel=3)
    out.attrs["notes"] = notes
    out.attrs["ci"] = {"level": ci, "n_boot": n_boot, "seed": seed}
