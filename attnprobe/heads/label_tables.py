"""The tables built from the label rules: :func:`classify_scores` (one label, family,
evidence and ``also`` per head) and :func:`layer_profile` (label and family shares per layer).

The rules live in :data:`~attnprobe.heads.label_rules.RULES` (the built-in ones are registered
by :mod:`attnprobe.heads.labels` and the modules of :mod:`attnprobe.heads.rules` it discovers,
which the ``attnprobe.heads`` package imports first); these functions read whatever is
registered when they run.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from attnprobe.errors import InputError
from attnprobe.heads.label_rules import FALLBACK, RULES, Row, Thresholds, check_judgeable
from attnprobe.heads.stats import score_columns

__all__ = ["INDEX_COLUMNS", "LABEL_COUNT_COLUMNS", "RESULT_COLUMNS",
           "classify_row", "classify_scores", "label_counts", "layer_profile"]

INDEX_COLUMNS = ("stack", "kind", "layer", "head", "head_id")
RESULT_COLUMNS = ("label", "family", "evidence", "also")
LABEL_COUNT_COLUMNS = ("family", "family_heads", "label", "heads", "share", "layers", "head_ids")
# layer_profile: means always reported (NaN when the column is absent) and when present.
PROFILE_MEANS = ("entropy", "entropy_norm", "max_weight", "distance", "first", "special")
OPTIONAL_MEANS = ("sink", "sink_rate", "syntax_accuracy", "dep_alignment")


def _check_table(frame: pd.DataFrame, needed: Sequence[str], what: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{what} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise InputError(f"{what} lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise InputError(f"{what} is empty: it needs one row per head")


def _numeric(frame: pd.DataFrame, columns: Sequence[str], what: str) -> pd.DataFrame:
    """``columns`` of ``frame`` as numbers; a column that is not numeric raises InputError."""
    out = {}
    for name in columns:
        try:
            out[name] = pd.to_numeric(frame[name], errors="raise")
        except (TypeError, ValueError):
            raise InputError(f"{what} column {name!r} is not numeric") from None
    return pd.DataFrame(out, index=frame.index)


def _head_name(row: Row) -> str:
    return f"{row['stack']}/{row['kind']} {row['head_id']}"


def classify_row(row: Row, thresholds: Thresholds | None = None) -> tuple[str, str, str]:
    """``(label, evidence, also)`` of one head's scores (a mapping of score name to value).

    The evidence is the winning rule's, followed by the notes of the rules ranked before it
    that were held back (:attr:`~attnprobe.heads.label_rules.LabelRule.held_back`): why the
    head did not get a label it came close to.
    """
    t = Thresholds() if thresholds is None else thresholds
    rules = RULES.rules()
    fired = [(entry, evidence) for entry in rules if (evidence := entry(row, t)) is not None]
    winner = fired[0][0].rank if fired else float("inf")
    notes = [f"not {entry.label}: {note}" for entry in rules
             if entry.rank < winner and entry.held_back is not None
             and (note := entry.held_back(row, t)) is not None]
    if not fired:
        return FALLBACK, "; ".join(["no rule fired", *notes]), ""
    return (fired[0][0].label, "; ".join([fired[0][1], *notes]),
            ", ".join(entry.label for entry, _ in fired[1:]))


def classify_scores(scores: pd.DataFrame, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """Label every head of a wide score table.

    Args:
        scores: one row per head: ``INDEX_COLUMNS`` plus any score columns
            (:mod:`attnprobe.heads.scores`). Columns named ``label``, ``family``, ``evidence``
            or ``also`` are replaced.
        thresholds: rule thresholds (defaults: :class:`Thresholds`).

    Returns:
        ``INDEX_COLUMNS``, then ``label``, ``family`` (the label's family, from its rule),
        ``evidence`` (the winning rule's scores against its thresholds), ``also`` (other
        labels that fired, in precedence order, ``""`` if none), then every score column
        unchanged; rows in input order.

    Raises:
        InputError: missing index columns, an empty table, a duplicated head, a non-numeric
            score the rules read, a head whose every score is NaN, or a corpus in which no
            row saw more than one key (:func:`~attnprobe.heads.label_rules.check_judgeable`).

    Example:
        >>> scores = pd.DataFrame({"stack": "enc", "kind": "self", "layer": [0, 0, 1],
        ...                        "head": [0, 1, 0], "head_id": ["L0H0", "L0H1", "L1H0"],
        ...                        "prev_nosink": [0.9, 0.05, 0.1],
        ...                        "self_nosink": [0.05, 0.9, 0.1]})
        >>> classify_scores(scores)[["head_id", "label", "family", "evidence"]]
          head_id          label         family               evidence
        0    L0H0       previous          local  prev_nosink=0.9 > 0.5
        1    L0H1           self          local  self_nosink=0.9 > 0.5
        2    L1H0  heterogeneous  heterogeneous          no rule fired
    """
    thresholds = Thresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, Thresholds):
        raise InputError(f"thresholds must be a Thresholds, got {type(thresholds).__name__}")
    _check_table(scores, INDEX_COLUMNS, "score table")
    keys = list(INDEX_COLUMNS[:4])
    duplicated = scores.duplicated(keys)
    if duplicated.any():
        first = scores[duplicated].iloc[0]
        raise InputError(f"head {_head_name(first)} appears more than once in the score table")
    score_cols = [c for c in scores.columns if c not in INDEX_COLUMNS and c not in RESULT_COLUMNS]
    if not score_cols:
        raise InputError("score table has no score columns besides " + ", ".join(INDEX_COLUMNS))
    empty = scores[score_cols].isna().all(axis=1)
    if empty.any():
        head = _head_name(scores[empty].iloc[0])
        raise InputError(f"head {head} has no scores (all NaN); drop it or compute its scores")

    known = set(score_columns())  # the registered score columns are numbers
    numeric = [c for c in score_cols if c in known]
    rows = pd.concat([scores[[c for c in score_cols if c not in numeric]],
                      _numeric(scores, numeric, "score table")], axis=1)
    records = rows.to_dict("records")
    check_judgeable(records)
    results = [(label, RULES.family(label), evidence, also) for label, evidence, also in
               (classify_row(row, thresholds) for row in records)]
    labels = pd.DataFrame(results, columns=list(RESULT_COLUMNS), index=scores.index)
    out = pd.concat([scores[list(INDEX_COLUMNS)], labels, scores[score_cols]], axis=1)
    return out.reset_index(drop=True)


def layer_profile(classified: pd.DataFrame) -> pd.DataFrame:
    """Share of each label and family and mean scores per layer, from
    :func:`classify_scores`' output.

    Reading the rows from shallow to deep checks the usual story: shallow heads local
    (high ``local`` and ``family_local``), middle heads syntactic, deep heads global
    (``family_uniform_collapse``, high ``entropy_norm``, long ``distance``) or sinks.

    Returns:
        One row per ``(stack, kind, layer)`` (sorted): ``n_heads``, ``share_<label>`` for every
        label in ``PRECEDENCE`` and ``family_<family>`` for every family of
        ``RULES.families()`` (fractions of the layer's heads, each set summing to 1; the
        family is read from the label's rule), the mean ``entropy``, ``entropy_norm``,
        ``max_weight``, ``distance``, ``first``, ``special`` (NaN when the column is absent),
        ``local`` = mean of ``prev + self + next``, and the mean ``sink``, ``sink_rate``,
        ``syntax_accuracy``, ``dep_alignment`` when present. Means skip heads without the
        score.

    Raises:
        InputError: missing index or ``label`` columns, an empty table, or an unknown label.

    Example:
        >>> scores = pd.DataFrame({"stack": "enc", "kind": "self", "layer": [0, 0, 1],
        ...                        "head": [0, 1, 0], "head_id": ["L0H0", "L0H1", "L1H0"],
        ...                        "prev_nosink": [0.9, 0.05, 0.1],
        ...                        "self_nosink": [0.05, 0.9, 0.1]})
        >>> profile = layer_profile(classify_scores(scores))   # previous, self; heterogeneous
        >>> profile[["layer", "n_heads", "share_previous", "share_self", "family_local"]]
           layer  n_heads  share_previous  share_self  family_local
        0      0        2             0.5         0.5           1.0
        1      1        1             0.0         0.0           0.0
    """
    _check_table(classified, (*INDEX_COLUMNS, "label"), "classified table")
    precedence = RULES.precedence()
    unknown = sorted(set(classified["label"]) - set(precedence), key=str)
    if unknown:
        raise InputError(f"unknown label(s) {', '.join(map(repr, unknown))}; "
                         f"expected labels from PRECEDENCE")
    means = [*PROFILE_MEANS, *(c for c in OPTIONAL_MEANS if c in classified.columns)]
    present = [c for c in (*means, "prev", "self", "next") if c in classified.columns]
    values = _numeric(classified, present, "classified table").reindex(
        columns=[*means, "prev", "self", "next"])
    table = pd.DataFrame({c: classified[c] for c in INDEX_COLUMNS[:3]})
    for label in precedence:
        table[f"share_{label}"] = (classified["label"] == label).astype(float)
    families = RULES.families()
    family = classified["label"].map(RULES.family)
    for name in families:
        table[f"family_{name}"] = (family == name).astype(float)
    for name in means:
        table[name] = values[name]
    table["local"] = values["prev"] + values["self"] + values["next"]
    grouped = table.groupby(list(INDEX_COLUMNS[:3]), sort=True)
    profile = grouped.mean()
    profile.insert(0, "n_heads", grouped.size())
    order = ["n_heads", *(f"share_{label}" for label in precedence),
             *(f"family_{name}" for name in families), *PROFILE_MEANS, "local",
             *means[len(PROFILE_MEANS):]]
    return profile[order].reset_index()


def label_counts(classified: pd.DataFrame) -> pd.DataFrame:
    """How many heads got each label, grouped by family, from :func:`classify_scores`' output.

    Returns:
        One row per label present (columns ``LABEL_COUNT_COLUMNS``), families in the order of
        ``RULES.families()`` and labels in precedence order within each: ``family``,
        ``family_heads`` (heads of the family), ``label``, ``heads``, ``share`` (of all heads),
        ``layers`` (the layers holding them, ``"0,2"``) and ``head_ids`` (``"L0H2, L1H9"``;
        prefixed with the stack and kind when the table has several).

    Raises:
        InputError: missing index or ``label`` columns, an empty table, or an unknown label.

    Example:
        >>> scores = pd.DataFrame({"stack": "enc", "kind": "self", "layer": [0, 0, 1],
        ...                        "head": [0, 1, 0], "head_id": ["L0H0", "L0H1", "L1H0"],
        ...                        "prev_nosink": [0.9, 0.05, 0.1],
        ...                        "self_nosink": [0.05, 0.9, 0.1]})
        >>> label_counts(classify_scores(scores))[["family", "family_heads", "label", "heads",
        ...                                        "head_ids"]]
                  family  family_heads          label  heads head_ids
        0          local             2       previous      1     L0H0
        1          local             2           self      1     L0H1
        2  heterogeneous             1  heterogeneous      1     L1H0
    """
    _check_table(classified, (*INDEX_COLUMNS, "label"), "classified table")
    unknown = sorted(set(classified["label"]) - set(RULES.precedence()), key=str)
    if unknown:
        raise InputError(f"unknown label(s) {', '.join(map(repr, unknown))}; "
                         f"expected labels from PRECEDENCE")
    several = classified[["stack", "kind"]].drop_duplicates().shape[0] > 1
    names = [f"{s}/{k} {h}" if several else str(h) for s, k, h in
             zip(classified["stack"], classified["kind"], classified["head_id"], strict=True)]
    frame = classified.assign(name=names)
    rows = []
    for family in RULES.families():
        members = frame[frame["label"].isin(RULES.labels_of(family))]
        for label in RULES.labels_of(family):
            heads = members[members["label"] == label]
            if heads.empty:
                continue
            layers = sorted({int(x) for x in heads["layer"]})
            rows.append((family, len(members), label, len(heads), len(heads) / len(frame),
                         ",".join(map(str, layers)), ", ".join(heads["name"])))
    return pd.DataFrame(rows, columns=list(LABEL_COUNT_COLUMNS))
