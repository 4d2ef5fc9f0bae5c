"""A :class:`Faithfulness` built by hand from a small table of known values, for the tests of
its surfaces (figure, report section, notebook view): every mean below is written out, so a
test compares what is drawn with numbers it did not get from the code under test."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnprobe.faithfulness.result import CURVE_COLUMNS, TABLE_COLUMNS, Faithfulness

EXAMPLES = ("0", "1", "2")
KINDS = {"saliency": "attribution", "raw@L1": "attention", "random": "random"}
# per source, the per-example values of each summary metric (NaN: a recorded failure)
PER_EXAMPLE = {
    "saliency": {"aopc_comprehensiveness": (0.5, 0.7, 0.6), "aopc_sufficiency": (0.1, 0.2, 0.0),
                 "abpc": (0.4, 0.5, 0.3), "tau_loo": (0.6, 0.8, 0.7)},
    "raw@L1": {"aopc_comprehensiveness": (0.2, 0.3, 0.1), "aopc_sufficiency": (0.3, 0.4, 0.5),
               "abpc": (0.1, 0.0, 0.2), "tau_loo": (0.1, np.nan, 0.3)},
    "random": {"aopc_comprehensiveness": (0.1, 0.15, 0.2), "aopc_sufficiency": (0.4, 0.4, 0.4),
               "abpc": (0.0, 0.05, -0.05), "tau_loo": (0.0, 0.1, -0.1)},
}
FRACTIONS = (0.0, 0.5, 1.0)
FULL = (1.0, 2.0, 1.5)  # the full-text output of each example
# per source and curve, the output drop full − value of each example at each fraction
DROPS = {
    ("saliency", "deletion_morf"): ((0.0, 0.6, 0.9), (0.0, 0.8, 1.0), (0.0, 0.7, 0.8)),
    ("saliency", "deletion_lerf"): ((0.0, 0.1, 0.9), (0.0, 0.2, 1.0), (0.0, 0.0, 0.8)),
    ("saliency", "insertion_morf"): ((0.9, 0.2, 0.0), (1.0, 0.1, 0.0), (0.8, 0.3, 0.0)),
    ("raw@L1", "deletion_morf"): ((0.0, 0.3, 0.9), (0.0, 0.4, 1.0), (0.0, 0.2, 0.8)),
    ("raw@L1", "deletion_lerf"): ((0.0, 0.2, 0.9), (0.0, 0.3, 1.0), (0.0, 0.1, 0.8)),
    ("raw@L1", "insertion_morf"): ((0.9, 0.6, 0.0), (1.0, 0.5, 0.0), (0.8, 0.4, 0.0)),
    ("random", "deletion_morf"): ((0.0, 0.25, 0.9), (0.0, 0.25, 1.0), (0.0, 0.25, 0.8)),
    ("random", "deletion_lerf"): ((0.0, 0.25, 0.9), (0.0, 0.25, 1.0), (0.0, 0.25, 0.8)),
    ("random", "insertion_morf"): ((0.9, 0.5, 0.0), (1.0, 0.5, 0.0), (0.8, 0.5, 0.0)),
}
REMOVAL = "delete"
TARGET = "class:1"
NOTE = "constant importance"


def result(sanity: bool = False) -> Faithfulness:
    """The hand-built result: 3 examples, 2 sources and the random baseline; per level
    comprehensiveness rows at 0.1 and 0.5 besides the summary metrics; one NaN row."""
    rows = []
    for source, metrics in PER_EXAMPLE.items():
        for metric, values in metrics.items():
            for example, value in zip(EXAMPLES, values, strict=True):
                rows.append((example, source, KINDS[source], metric, np.nan, np.nan, value,
                             REMOVAL, TARGET, NOTE if np.isnan(value) else ""))
        for example in EXAMPLES:
            for level, k in ((0.1, 1), (0.5, 3)):
                rows.append((example, source, KINDS[source], "comprehensiveness", level, k,
                             0.25 * k, REMOVAL, TARGET, ""))
    curves = []
    for (source, curve), per_example in DROPS.items():
        for example, full, drops in zip(EXAMPLES, FULL, per_example, strict=True):
            for fraction, drop in zip(FRACTIONS, drops, strict=True):
                curves.append((example, source, KINDS[source], curve, fraction,
                               round(fraction * 6), full - drop, full, REMOVAL))
    found = Faithfulness(table=pd.DataFrame(rows, columns=list(TABLE_COLUMNS)),
                         curves_table=pd.DataFrame(curves, columns=list(CURVE_COLUMNS)))
    if sanity:
        checks = [(e, s, KINDS[s], 0.9 if s == "raw@L1" else 0.1) for s in ("saliency", "raw@L1")
                  for e in EXAMPLES]
        found.sanity = pd.DataFrame(checks, columns=["example_id", "source", "source_kind",
                                                     "spearman"])
    return found


def mean_of(source: str, metric: str) -> float:
    """The hand mean of ``metric`` for ``source`` over the examples with a value."""
    return float(np.nanmean(PER_EXAMPLE[source][metric]))


def mean_drop(source: str, curve: str) -> list[float]:
    """The hand mean drop of ``curve`` of ``source`` at each of ``FRACTIONS``."""
    return [float(v) for v in np.mean(DROPS[(source, curve)], axis=0)]
