"""The tidy table every perturbation experiment returns: :data:`RUN_COLUMNS`, then one column
per parameter.

=============== ===========================================================================
column          meaning
=============== ===========================================================================
``experiment``  the experiment's name (``ablate``, ``permute`` ...)
``perturbation`` the intervention applied (``zero``, ``uniform``, ``permute`` ...)
``scope``       the heads the row's perturbation acted on, in the scope language
                (``"all"``, ``"layer:3"``, ``"head:3.5"``)
``layer``       that layer (``Int64``) when every one of those heads is in one layer, else
                ``<NA>``
``head``        that head (``Int64``) when the perturbation acted on exactly one head, else
                ``<NA>`` (a sweep over heads fills both: no scope string to parse)
``example_id``  the text's index in the caller's list, as a string; ``"all"`` for rows
                about the whole corpus
``step``        keys erased (``erase``), heads pruned (``importance``); ``<NA>`` otherwise
``metric``      what is measured (``tvd``, ``cosine_distance``, ``tvd_median`` ...)
``baseline``    the metric without the perturbation (0 for distances and scores of the
                perturbation itself)
``perturbed``   the metric with it
``change``      ``perturbed − baseline``
=============== ===========================================================================

**Parameter columns** follow, one per parameter, in the order the experiment records them
(:meth:`~attnprobe.perturb.job.Job.record`): the experiment's options (the fields of
:func:`~attnprobe.perturb.params_of`), ``seed`` when the experiment draws random numbers,
then what is particular to a row (``erase``: ``ranking``, ``n_keys``; ``importance``:
``estimate``, ``normalised``, ``order``, ``pruned``; ``mean``: ``means_from``,
``n_texts``). A row without a parameter has ``<NA>`` there; whole numbers are ``Int64``,
lists are comma-separated strings. Experiments without options (``uniform``, ``ablate``)
have no parameter columns. Tables of different experiments concatenate with
``pd.concat`` (missing parameters become ``NaN``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from attnprobe.core import html_view
from attnprobe.core.scope import Scope

__all__ = ["RUN_COLUMNS", "tidy"]

RUN_COLUMNS = ("experiment", "perturbation", "scope", "layer", "head", "example_id", "step",
               "metric", "baseline", "perturbed", "change")


def _layer_and_head(scope: Scope, n_layers: int, n_heads: int) -> tuple[Any, Any]:
    """``(layer, head)`` of a scope on a model of this size; ``pd.NA`` where it spans several
    (or the model's size is unknown, 0)."""
    layers = scope.layers
    if layers is None:
        layers = scope.layers_in(n_layers) if n_layers else ()
    if len(layers) != 1:
        return pd.NA, pd.NA
    layer = layers[0]
    if n_heads:
        heads: Sequence[Any] = scope.heads_of(layer, n_heads)
    else:
        heads = sorted({h for lay, h in scope.terms if lay in (None, layer)},
                       key=lambda h: -1 if h is None else h)
        if None in heads:
            return layer, pd.NA
    return layer, heads[0] if len(heads) == 1 else pd.NA


def _cell(value: Any) -> Any:
    if value is None:
        return pd.NA
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def _typed(values: list[Any]) -> pd.Series:
    """A parameter column: ``Int64`` for whole numbers, ``float64`` for numbers, else as
    pandas infers (strings; missing where a row lacks the parameter)."""
    present = [v for v in values if v is not pd.NA]
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="Int64")
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       for v in present):
        return pd.Series([float("nan") if v is pd.NA else float(v) for v in values],
                         dtype="float64")
    return pd.Series(values)


def tidy(experiment: str, rows: Iterable[Any], n_layers: int, n_heads: int) -> pd.DataFrame:
    """The table of ``rows`` (:class:`~attnprobe.perturb.job.Row`): :data:`RUN_COLUMNS` and
    the parameter columns (module docstring). ``n_layers`` / ``n_heads``: the model's sizes,
    which say whether a row's scope is one layer or one head (0 = unknown)."""
    rows = list(rows)
    scopes: dict[Any, tuple[str, Any, Any]] = {}
    fixed = []
    for r in rows:
        if r.scope not in scopes:
            scope = Scope.parse(r.scope)
            scopes[r.scope] = (str(scope), *_layer_and_head(scope, n_layers, n_heads))
        name, layer, head = scopes[r.scope]
        fixed.append((experiment, r.perturbation, name, layer, head, r.example_id, r.step,
                      r.metric, r.baseline, r.perturbed, r.perturbed - r.baseline))
    table = pd.DataFrame(fixed, columns=list(RUN_COLUMNS))
    for column in ("layer", "head", "step"):
        table[column] = table[column].astype("Int64")
    for column in ("baseline", "perturbed", "change"):
        table[column] = table[column].astype("float64")
    names = list(dict.fromkeys(name for r in rows for name in r.params))
    clash = sorted(set(names) & set(RUN_COLUMNS))
    if clash:
        raise TypeError(f"experiment {experiment!r} records parameters named like table "
                        f"columns: {clash}")
    for name in names:
        table[name] = _typed([_cell(r.params.get(name)) for r in rows])
    return html_view.attach(table, "perturbation")  # still exactly a DataFrame
