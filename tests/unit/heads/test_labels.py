import math
import pickle

import numpy as np
import pandas as pd
import pytest

from attnprobe.errors import InputError
from attnprobe.heads import label_rules, labels
from attnprobe.heads.labels import (
    INDEX_COLUMNS,
    PRECEDENCE,
    RULES,
    LabelRule,
    Threshold,
    Thresholds,
    classify_scores,
    layer_profile,
)

NAN = float("nan")


def head(layer=0, index=0, stack="encoder", kind="self", **scores):
    """One row of the score table: index columns plus the given scores."""
    return {"stack": stack, "kind": kind, "layer": layer, "head": index,
            "head_id": f"L{layer}H{index}", **scores}


def classify_one(thresholds=None, **scores):
    """The classified row of a one-head table."""
    return classify_scores(pd.DataFrame([head(**scores)]), thresholds).iloc[0]


def map_scores(pattern):
    """Sink-free scores of one [query, key] self-attention pattern without sink keys (so each
    ``*_nosink`` score equals its raw form), straight from the definitions."""
    a = np.asarray(pattern, dtype=float)
    n = a.shape[0]
    h = -np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1)), 0), axis=1)
    mass = {f"{name}_nosink": np.mean([a[i, i + d] if 0 <= i + d < n else 0.0
                                       for i in range(n)])
            for name, d in (("prev", -1), ("self", 0), ("next", 1))}
    return {"sink": 0.0, "entropy_norm_nosink": (h / math.log(n)).mean(),
            "max_weight_nosink": a.max(axis=1).mean(), "chance_weight_nosink": 1 / n, **mass}


# The documented core of the families (README, "Labels"): a few labels and the family each
# belongs to, written out here rather than read from the registry.
CORE_FAMILY = {"previous": "local", "offset": "local", "collapsed": "entropy_collapse",
               "block": "block", "induction": "copying", "broad": "uniform_collapse",
               "syntactic": "syntactic", "sink": "sink", "heterogeneous": "heterogeneous"}

# ---- each label fires for a row built to satisfy it ------------------------------------------

LABEL_CASES = [
    ("collapsed", {"entropy_norm_nosink": 0.01, "max_weight_nosink": 0.99},
     "entropy_norm_nosink=0.01 < 0.05, max_weight_nosink=0.99 > 0.95"),
    ("sink", {"sink": 0.7, "first": 0.1, "column_sink": 0.6}, "sink=0.7 > 0.6, column_sink=0.6"),
    ("sink", {"sink": 0.9, "first": 0.9, "bos": NAN}, "sink=0.9 > 0.6, first=0.9"),
    ("sink", {"sink": 0.65}, "sink=0.65 > 0.6"),
    ("previous", {"prev_nosink": 0.83}, "prev_nosink=0.83 > 0.5"),
    ("next", {"next_nosink": 0.7}, "next_nosink=0.7 > 0.5"),
    ("self", {"self_nosink": 0.6}, "self_nosink=0.6 > 0.5"),
    ("previous", {"pos_score_nosink": 0.95, "pos_offset_nosink": -1, "max_weight_nosink": 0.85},
     "pos_offset_nosink=-1, pos_score_nosink=0.95 >= 0.9, max_weight_nosink=0.85 > 0.8"),
    ("next", {"pos_score_nosink": 0.9, "pos_offset_nosink": 1, "max_weight_nosink": 0.85},
     "pos_offset_nosink=+1, pos_score_nosink=0.9 >= 0.9, max_weight_nosink=0.85 > 0.8"),
    ("self", {"pos_score_nosink": 0.92, "pos_offset_nosink": 0, "max_weight_nosink": 0.9},
     "pos_offset_nosink=0, pos_score_nosink=0.92 >= 0.9, max_weight_nosink=0.9 > 0.8"),
    ("offset", {"pos_score_nosink": 0.95, "pos_offset_nosink": 2, "max_weight_nosink": 0.85},
     "pos_offset_nosink=+2, pos_score_nosink=0.95 >= 0.9, max_weight_nosink=0.85 > 0.8"),
    ("offset", {"pos_score_nosink": 0.91, "pos_offset_nosink": -3, "max_weight_nosink": 0.81},
     "pos_offset_nosink=-3, pos_score_nosink=0.91 >= 0.9, max_weight_nosink=0.81 > 0.8"),
    ("vertical+diagonal",
     {"prev": 0.25, "self": 0.25, "next": 0.125, "special": 0.35, "first": 0.1},
     "prev+self+next=0.625 >= 0.3, special=0.35 >= 0.3"),
    ("vertical+diagonal", {"prev": 0.25, "self": 0.0, "next": 0.25, "first": 0.5},
     "prev+self+next=0.5 >= 0.3, first=0.5 >= 0.3"),
    ("vertical+diagonal", {"prev": 0.1, "self": 0.1, "next": 0.1, "sink": 0.4, "first": 0.2},
     "prev+self+next=0.3 >= 0.3, sink=0.4 >= 0.3"),
    ("block", {"block": 0.85}, "block=0.85 >= 0.8"),
    ("induction", {"rep_induction": 0.3, "rep_induction_ahead": 0.6},
     "rep_induction_ahead=0.6 > 0.4"),
    ("induction", {"rep_induction": 0.45}, "rep_induction=0.45 > 0.4"),
    ("retrieval", {"retrieval": 0.3}, "retrieval=0.3 > 0.1"),
    ("duplicate", {"rep_duplicate": 0.5, "rep_duplicate_ahead": 0.2}, "rep_duplicate=0.5 > 0.4"),
    ("broad", {"entropy_norm_nosink": 0.9, "max_weight_nosink": 0.05,
               "chance_weight_nosink": 0.01},
     "entropy_norm_nosink=0.9 >= 0.78, max_weight_nosink=0.05 <= 0.1"),
    ("broad", {"entropy_norm_nosink": 0.8, "max_weight_nosink": 0.08},
     "entropy_norm_nosink=0.8 >= 0.78, max_weight_nosink=0.08 <= 0.1"),
    ("syntactic", {"syntax_relation": "nsubj", "syntax_margin": 0.15, "syntax_count": 40},
     "syntax_relation=nsubj, syntax_margin=0.15 >= 0.1, syntax_count=40 >= 20"),
    ("heterogeneous", {"entropy_norm_nosink": 0.5, "max_weight_nosink": 0.4, "prev_nosink": 0.2,
                       "special": 0.1}, "no rule fired"),
]


@pytest.mark.parametrize(("label", "scores", "evidence"), LABEL_CASES,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(LABEL_CASES)])
def test_each_label_fires_for_a_row_built_to_satisfy_it(label, scores, evidence):
    row = classify_one(**scores)
    assert (row["label"], row["evidence"], row["also"]) == (label, evidence, "")
    assert row["family"] == RULES.family(label)


def test_every_label_but_the_fallback_has_one_registered_rule():
    assert set(RULES.names()) == set(PRECEDENCE) - {"heterogeneous"}
    assert PRECEDENCE[-1] == "heterogeneous" and len(set(PRECEDENCE)) == len(PRECEDENCE)


def test_rules_are_plain_functions_of_row_and_thresholds():
    t = Thresholds()
    assert RULES.get("previous")({"prev_nosink": 0.6}, t) == "prev_nosink=0.6 > 0.5"
    assert RULES.get("previous")({"prev_nosink": 0.4}, t) is None
    assert RULES.get("previous")({"prev": 0.9}, t) is None  # the raw mass is not read
    assert RULES.get("sink")({}, t) is None


# ---- precedence: sink last, judged on the rest -------------------------------------------------

def test_a_head_with_a_pattern_on_the_rest_keeps_it_and_lists_sink_in_also():
    row = classify_one(sink=0.7, first=0.7, prev_nosink=0.55)
    assert row["label"] == "previous" and row["evidence"] == "prev_nosink=0.55 > 0.5"
    assert row["also"] == "sink"


def test_sink_is_the_label_only_when_nothing_else_fires():
    row = classify_one(sink=0.8, first=0.8, prev_nosink=0.3, entropy_norm_nosink=0.5,
                       max_weight_nosink=0.4)
    assert (row["label"], row["family"], row["also"]) == ("sink", "sink", "")


def test_too_little_mass_left_is_not_judged():
    """Under ``min_rest`` (5 %) of the mass outside the sinks, the sink-free rules stay quiet:
    a head that is 97 % sink is a sink, whatever its last 3 % does."""
    scores = {"sink": 0.97, "first": 0.97, "prev_nosink": 0.9, "entropy_norm_nosink": 0.01,
              "max_weight_nosink": 0.99, "pos_score_nosink": 1.0, "pos_offset_nosink": -1}
    row = classify_one(**scores)
    assert (row["label"], row["also"]) == ("sink", "")
    row = classify_one(Thresholds(min_rest=0.02), **scores)
    assert (row["label"], row["also"]) == ("previous", "collapsed, sink")


def test_also_lists_every_other_fired_label_in_precedence_order():
    # collapsed (on the rest), induction, duplicate, syntactic and sink all fire
    row = classify_one(entropy_norm_nosink=0.01, max_weight_nosink=0.99, sink=0.9, first=0.9,
                       rep_induction=0.5, syntax_margin=0.2, syntax_count=50, rep_duplicate=0.45)
    assert row["label"] == "collapsed"
    assert row["also"] == "induction, duplicate, syntactic, sink"


def test_positional_labels_win_over_the_kovaleva_and_token_match_labels():
    row = classify_one(prev=0.6, self=0.1, next=0.0, special=0.3, prev_nosink=0.6,
                       rep_induction=0.9, entropy_norm_nosink=0.7, max_weight_nosink=0.3)
    assert row["label"] == "previous"
    assert row["also"] == "vertical+diagonal, induction"
    # a broad head is not vertical+diagonal, whatever chance mass it leaves on both
    row = classify_one(prev=0.3, self=0.2, next=0.0, special=0.3, entropy_norm_nosink=0.8,
                       max_weight_nosink=0.09)
    assert row["label"] == "broad" and row["also"] == ""


def test_retrieval_ranks_right_after_induction():
    row = classify_one(rep_induction=0.5, retrieval=0.6, rep_duplicate=0.9)
    assert (row["label"], row["also"]) == ("induction", "retrieval, duplicate")


def test_block_does_not_fire_on_a_positional_head():
    row = classify_one(block=0.9, pos_score_nosink=0.95, pos_offset_nosink=2,
                       max_weight_nosink=0.9)
    assert row["label"] == "offset" and row["also"] == ""
    row = classify_one(block=0.9, prev_nosink=0.7)
    assert row["label"] == "previous" and row["also"] == ""


def test_fixed_offset_at_minus_one_is_previous_not_offset():
    row = classify_one(pos_score_nosink=0.95, pos_offset_nosink=-1, max_weight_nosink=0.9,
                       prev_nosink=0.9)
    assert row["label"] == "previous" and row["evidence"] == "prev_nosink=0.9 > 0.5"
    assert "offset" not in row["also"].split(", ")


# ---- thresholds are parameters ---------------------------------------------------------------

@pytest.mark.parametrize(("scores", "change", "before", "after"), [
    ({"prev_nosink": 0.45}, {"positional_mass": 0.4}, "heterogeneous", "previous"),
    ({"sink": 0.7}, {"sink": 0.75}, "sink", "heterogeneous"),
    ({"sink": 0.96, "prev_nosink": 0.9}, {"min_rest": 0.03}, "sink", "previous"),
    ({"rep_induction": 0.35}, {"induction": 0.3}, "heterogeneous", "induction"),
    ({"retrieval": 0.08}, {"retrieval": 0.05}, "heterogeneous", "retrieval"),
    ({"block": 0.75}, {"block": 0.7}, "heterogeneous", "block"),
    ({"entropy_norm_nosink": 0.03, "max_weight_nosink": 0.97}, {"collapsed_max_weight": 0.98},
     "collapsed", "heterogeneous"),
    ({"entropy_norm_nosink": 0.9, "max_weight_nosink": 0.2, "chance_weight_nosink": 0.05},
     {"broad_max_ratio": 4.0}, "heterogeneous", "broad"),
    ({"syntax_margin": 0.15, "syntax_count": 15}, {"syntax_count": 10},
     "heterogeneous", "syntactic"),
])
def test_changing_one_threshold_flips_the_label(scores, change, before, after):
    assert classify_one(**scores)["label"] == before
    assert classify_one(Thresholds(**change), **scores)["label"] == after


def test_evidence_reports_the_threshold_in_use():
    row = classify_one(Thresholds(positional_mass=0.4), prev_nosink=0.45)
    assert row["evidence"] == "prev_nosink=0.45 > 0.4"


def test_evidence_never_prints_a_value_equal_to_a_strict_threshold():
    row = classify_one(prev_nosink=0.5001)
    assert row["evidence"] == "prev_nosink=0.5001 > 0.5"


# ---- missing and NaN scores do not fire ------------------------------------------------------

def test_nan_scores_do_not_fire_their_rule():
    assert classify_one(prev_nosink=NAN, entropy_norm_nosink=0.5)["label"] == "heterogeneous"
    # one half of a conjunction missing: collapsed does not fire
    assert classify_one(entropy_norm_nosink=0.01, max_weight_nosink=NAN)["label"] \
        == "heterogeneous"
    assert classify_one(entropy_norm_nosink=0.01)["label"] == "heterogeneous"
    # a fixed offset needs its offset
    assert classify_one(pos_score_nosink=0.95, pos_offset_nosink=NAN,
                        max_weight_nosink=0.9)["label"] == "heterogeneous"
    # vertical+diagonal needs all of prev, self, next
    assert classify_one(prev=0.3, self=NAN, next=0.1, special=0.4)["label"] == "heterogeneous"
    # a head with no mass left after its sinks has NaN sink-free scores: sink, nothing else
    row = classify_one(sink=1.0, first=1.0, prev_nosink=NAN, entropy_norm_nosink=NAN)
    assert (row["label"], row["also"]) == ("sink", "")


def test_a_nan_alternative_does_not_stop_an_any_of_rule():
    row = classify_one(rep_induction=NAN, rep_induction_ahead=0.6)
    assert row["label"] == "induction" and row["evidence"] == "rep_induction_ahead=0.6 > 0.4"


def test_block_is_nan_on_single_segment_inputs_and_does_not_fire():
    assert classify_one(block=NAN, entropy_norm_nosink=0.5)["label"] == "heterogeneous"


def test_nan_in_one_head_leaves_the_others_alone():
    table = pd.DataFrame([head(0, 0, prev_nosink=0.9, sink=NAN),
                          head(0, 1, prev_nosink=NAN, sink=0.9)])
    assert list(classify_scores(table)["label"]) == ["previous", "sink"]


# ---- broad on short inputs -------------------------------------------------------------------

def test_uniform_rows_on_a_short_input_are_broad():
    n = 8
    scores = map_scores(np.full((n, n), 1 / n))
    assert scores["entropy_norm_nosink"] == pytest.approx(1.0)
    assert scores["max_weight_nosink"] == pytest.approx(1 / n) == scores["chance_weight_nosink"]
    row = classify_one(**scores)
    assert row["label"] == "broad"
    # the 0.1 of Clark alone would reject it: 1/8 > 0.1
    assert classify_one(Thresholds(broad_max_ratio=0.0), **scores)["label"] != "broad"
    assert row["evidence"] == ("entropy_norm_nosink=1 >= 0.78, max_weight_nosink=0.125 <= "
                               "0.375 (3 x chance_weight_nosink=0.125)")


def test_a_peaked_head_on_a_short_input_is_not_broad():
    n, peak = 8, 0.45
    pattern = np.full((n, n), (1 - peak) / (n - 1))
    np.fill_diagonal(pattern, peak)
    scores = map_scores(pattern)
    # high entropy, so only the max-weight bound rejects it: 0.45 > 3 / 8
    assert scores["entropy_norm_nosink"] >= 0.78 and scores["max_weight_nosink"] > 3 / n
    assert RULES.get("broad")(scores, Thresholds()) is None
    assert classify_one(**scores)["label"] == "heterogeneous"


def test_long_inputs_keep_clarks_ten_percent():
    n = 128  # 3 / 128 < 0.1: the bound is 0.1
    assert classify_one(entropy_norm_nosink=0.9, max_weight_nosink=0.11,
                        chance_weight_nosink=1 / n)["label"] == "heterogeneous"
    assert classify_one(entropy_norm_nosink=0.9, max_weight_nosink=0.09,
                        chance_weight_nosink=1 / n)["label"] == "broad"


def test_analytic_identity_and_sub_diagonal_maps():
    n = 8
    # one-hot rows with a consistent target: the target wins, "collapsed" is listed in also
    assert classify_one(**map_scores(np.eye(n)))["label"] == "self"
    assert "collapsed" in classify_one(**map_scores(np.eye(n)))["also"].split(", ")
    sub = np.eye(n, k=-1)
    sub[0, 0] = 1.0
    scores = map_scores(sub)
    assert scores["prev_nosink"] == pytest.approx((n - 1) / n)
    assert classify_scores(pd.DataFrame([head(**scores)]))["label"].item() == "previous"
    # one-hot rows that go nowhere in particular are collapsed
    scattered = np.eye(n)[[3, 0, 6, 1, 7, 2, 5, 4]]
    assert classify_one(**map_scores(scattered))["label"] == "collapsed"


# ---- output table ----------------------------------------------------------------------------

def test_output_columns_and_scores_are_unchanged():
    table = pd.DataFrame([head(1, 0, prev_nosink=0.9, syntax_relation="amod", pos_offset=-1),
                          head(0, 1, entropy=2.0, prev_nosink=NAN, syntax_relation=None,
                               pos_offset=2)],
                         index=[10, 20])
    out = classify_scores(table)
    score_cols = ["prev_nosink", "syntax_relation", "pos_offset", "entropy"]
    assert list(out.columns) == [*INDEX_COLUMNS, "label", "family", "evidence", "also",
                                 *score_cols]
    assert list(out["family"]) == ["local", "heterogeneous"]
    assert list(out["head_id"]) == ["L1H0", "L0H1"]  # input order kept
    pd.testing.assert_frame_equal(out[score_cols], table[score_cols].reset_index(drop=True))
    pd.testing.assert_frame_equal(out[list(INDEX_COLUMNS)],
                                  table[list(INDEX_COLUMNS)].reset_index(drop=True))


def test_reclassifying_an_output_replaces_its_labels():
    first = classify_scores(pd.DataFrame([head(prev_nosink=0.6)]))
    again = classify_scores(first, Thresholds(positional_mass=0.7))
    assert list(again.columns) == list(first.columns)
    assert (again["label"].item(), again["family"].item()) == ("heterogeneous", "heterogeneous")


# ---- bad input -------------------------------------------------------------------------------

def test_bad_tables_raise_input_errors():
    with pytest.raises(InputError, match="lacks column"):
        classify_scores(pd.DataFrame([head(prev=0.9)]).drop(columns="head_id"))
    with pytest.raises(InputError, match="empty"):
        classify_scores(pd.DataFrame(columns=[*INDEX_COLUMNS, "prev"]))
    with pytest.raises(InputError, match="no score columns"):
        classify_scores(pd.DataFrame([head()]))
    with pytest.raises(InputError, match="more than once"):
        classify_scores(pd.DataFrame([head(0, 1, prev=0.1), head(0, 1, prev=0.2)]))
    with pytest.raises(InputError, match="'prev' is not numeric"):
        classify_scores(pd.DataFrame([head(prev="high")]))
    with pytest.raises(InputError, match="'sink' is not numeric"):
        classify_scores(pd.DataFrame([head(sink="most")]))
    with pytest.raises(InputError, match="DataFrame"):
        classify_scores([head(prev=0.9)])


def test_a_head_with_every_score_nan_is_an_error_naming_it():
    table = pd.DataFrame([head(2, 0, prev=0.9, sep=0.1), head(2, 3, prev=NAN, sep=NAN)])
    with pytest.raises(InputError, match=r"encoder/self L2H3 has no scores") as err:
        classify_scores(table)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [NAN, float("inf"), "0.6", None, True])
def test_thresholds_must_be_finite_numbers(value):
    with pytest.raises(InputError, match="threshold sink"):
        Thresholds(sink=value)


def test_thresholds_accept_numpy_numbers():
    t = Thresholds(syntax_count=np.int64(10), sink=np.float64(0.5))
    assert classify_one(t, sink=0.55)["label"] == "sink"


def test_thresholds_argument_must_be_a_thresholds():
    with pytest.raises(InputError, match="Thresholds"):
        classify_scores(pd.DataFrame([head(prev=0.9)]), {"positional_mass": 0.4})


# ---- layer profile ---------------------------------------------------------------------------

def profile_input():
    rows = [
        # layer 0: two previous-token heads and one broad head
        head(0, 0, prev=0.8, self=0.1, next=0.0, entropy=1.0, entropy_norm=0.3,
             max_weight=0.8, distance=1.0, first=0.1, special=0.1, syntax_accuracy=0.2,
             prev_nosink=0.85, sink=0.1),
        head(0, 1, prev=0.6, self=0.2, next=0.1, entropy=1.5, entropy_norm=0.4,
             max_weight=0.6, distance=1.5, first=0.0, special=0.05, syntax_accuracy=NAN,
             prev_nosink=0.6, sink=0.0),
        head(0, 2, prev=0.05, self=0.05, next=0.05, entropy=4.0, entropy_norm=0.9,
             max_weight=0.05, distance=20.0, first=0.05, special=0.1, syntax_accuracy=0.4,
             entropy_norm_nosink=0.9, max_weight_nosink=0.05, sink=0.05),
        # layer 1: one sink head
        head(1, 0, prev=0.0, self=0.0, next=0.0, entropy=0.5, entropy_norm=0.1,
             max_weight=0.9, distance=5.0, first=0.9, special=0.9, syntax_accuracy=0.1,
             sink=0.9),
    ]
    return classify_scores(pd.DataFrame(rows))


def test_layer_profile_shares_sum_to_one_and_means_are_per_layer():
    classified = profile_input()
    assert list(classified["label"]) == ["previous", "previous", "broad", "sink"]
    profile = layer_profile(classified)
    assert list(profile["layer"]) == [0, 1] and list(profile["n_heads"]) == [3, 1]
    shares = profile[[f"share_{label}" for label in PRECEDENCE]]
    assert shares.sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    layer0, layer1 = profile.iloc[0], profile.iloc[1]
    assert layer0["share_previous"] == pytest.approx(2 / 3)
    assert layer0["share_broad"] == pytest.approx(1 / 3)
    assert layer0["share_sink"] == 0.0 and layer1["share_sink"] == 1.0
    families = profile[[f"family_{name}" for name in RULES.families()]]
    assert families.sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    assert layer0["family_local"] == pytest.approx(2 / 3)
    assert layer0["family_uniform_collapse"] == pytest.approx(1 / 3)
    assert layer1["family_sink"] == 1.0 and layer1["family_local"] == 0.0
    assert layer0["sink"] == pytest.approx((0.1 + 0.0 + 0.05) / 3)
    assert layer0["entropy"] == pytest.approx((1.0 + 1.5 + 4.0) / 3)
    assert layer0["entropy_norm"] == pytest.approx((0.3 + 0.4 + 0.9) / 3)
    assert layer0["max_weight"] == pytest.approx((0.8 + 0.6 + 0.05) / 3)
    assert layer0["distance"] == pytest.approx((1.0 + 1.5 + 20.0) / 3)
    assert layer0["first"] == pytest.approx((0.1 + 0.0 + 0.05) / 3)
    assert layer0["special"] == pytest.approx((0.1 + 0.05 + 0.1) / 3)
    assert layer0["local"] == pytest.approx((0.9 + 0.9 + 0.15) / 3)
    assert layer0["syntax_accuracy"] == pytest.approx((0.2 + 0.4) / 2)  # NaN head skipped
    assert layer1["local"] == 0.0 and layer1["distance"] == 5.0
    assert "dep_alignment" not in profile.columns


def test_layer_profile_columns():
    profile = layer_profile(profile_input())
    assert list(profile.columns) == [
        "stack", "kind", "layer", "n_heads", *(f"share_{label}" for label in PRECEDENCE),
        *(f"family_{name}" for name in RULES.families()),
        "entropy", "entropy_norm", "max_weight", "distance", "first", "special", "local",
        "sink", "syntax_accuracy"]


def test_layer_profile_keeps_stacks_apart_and_reports_absent_means_as_nan():
    table = pd.DataFrame([head(0, 0, stack="encoder", prev_nosink=0.9),
                          head(0, 0, stack="decoder", sink=0.9)])
    profile = layer_profile(classify_scores(table))
    assert list(profile["stack"]) == ["decoder", "encoder"]
    assert list(profile["share_sink"]) == [1.0, 0.0]
    assert list(profile["family_local"]) == [0.0, 1.0]
    assert profile["entropy"].isna().all() and profile["local"].isna().all()


def test_layer_profile_bad_input():
    classified = profile_input()
    with pytest.raises(InputError, match="lacks column"):
        layer_profile(classified.drop(columns="label"))
    with pytest.raises(InputError, match="empty"):
        layer_profile(classified.iloc[:0])
    with pytest.raises(InputError, match="unknown label"):
        layer_profile(classified.assign(label="weird"))


# ---- a rule is one registry entry: label, test, rank, family, colour -------------------------

def tilted(row, t):
    """A made-up label for the tests: fires on a 'tilt' score over 0.5."""
    value = row.get("tilt")
    return f"tilt={value} > 0.5" if value is not None and value > 0.5 else None


@pytest.fixture
def tilted_rule():
    """'tilted' registered between previous (rank 20) and next (rank 30), in a family of its
    own, removed after."""
    entry = RULES.add(LabelRule("tilted", tilted, rank=25, colour="#123456", family="tilts"))
    try:
        yield entry
    finally:
        RULES.remove("tilted")


def test_the_precedence_is_every_rule_in_rank_order_with_the_fallback_last():
    assert len(set(PRECEDENCE)) == len(PRECEDENCE) and PRECEDENCE[-1] == "heterogeneous"
    ranks = [RULES.get(label).rank for label in PRECEDENCE[:-1]]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert set(CORE_FAMILY) <= set(PRECEDENCE)  # the documented core is there
    # the literature's order for the core: positional before collapsed before copying before
    # broad before syntactic before sink (Clark's order with sink moved last)
    core = [label for label in PRECEDENCE if label in
            ("previous", "collapsed", "induction", "broad", "syntactic", "sink")]
    assert core == ["previous", "collapsed", "induction", "broad", "syntactic", "sink"]


def test_every_rule_has_a_colour_a_family_help_and_thresholds_with_defaults():
    colours = [RULES.colour(label) for label in PRECEDENCE]
    assert None not in colours and len(set(colours)) == len(colours)
    for entry in RULES.rules():
        assert entry.family in label_rules.FAMILIES, entry.label
        assert entry.help and entry.summary() != "", entry.label
        assert entry.thresholds, entry.label
        for threshold in entry.thresholds:
            assert threshold.help and math.isfinite(threshold.default)
            assert getattr(Thresholds(), threshold.name) == threshold.default
            assert f"{{{threshold.name}}}" not in entry.summary()  # filled in


def test_every_label_has_its_documented_family():
    assert {label: RULES.family(label) for label in CORE_FAMILY} == CORE_FAMILY
    families = RULES.families()
    assert len(set(families)) == len(families) and families[-1] == "heterogeneous"
    assert set(families) == set(label_rules.FAMILIES)
    firsts = [PRECEDENCE.index(RULES.labels_of(family)[0]) for family in families]
    assert firsts == sorted(firsts)  # ordered by their first label
    assert {label for family in families for label in RULES.labels_of(family)} \
        == set(PRECEDENCE)
    assert RULES.family("no such label") is None


def test_a_registered_rule_takes_its_place_in_precedence_and_labels(tilted_rule):
    assert labels.PRECEDENCE[:3] == ("previous", "tilted", "next")
    assert RULES.colour("tilted") == "#123456"
    assert RULES.families()[:2] == ("local", "tilts")
    table = pd.DataFrame([head(0, 0, tilt=0.9), head(0, 1, tilt=0.9, prev_nosink=0.8),
                          head(0, 2, tilt=0.9, next_nosink=0.8),
                          head(0, 3, tilt=0.1, next_nosink=0.8)])
    out = classify_scores(table)
    assert list(out["label"]) == ["tilted", "previous", "tilted", "next"]
    assert list(out["family"]) == ["tilts", "local", "tilts", "local"]
    assert list(out["also"]) == ["", "tilted", "next", ""]
    assert out["evidence"][0] == "tilt=0.9 > 0.5"
    profile = layer_profile(out)
    assert profile["share_tilted"].item() == pytest.approx(2 / 4)
    assert profile["family_tilts"].item() == pytest.approx(2 / 4)
    shares = profile[[f"share_{label}" for label in labels.PRECEDENCE]]
    assert shares.sum(axis=1).item() == pytest.approx(1.0)


def test_removing_a_rule_restores_the_precedence(tilted_rule):
    RULES.remove("tilted")
    try:
        assert labels.PRECEDENCE == PRECEDENCE and "tilted" not in RULES
        assert classify_one(tilt=0.9, entropy_norm=0.5)["label"] == "heterogeneous"
    finally:
        RULES.add(tilted_rule)  # the fixture removes it again


@pytest.mark.parametrize(("entry", "message"), [
    (LabelRule("previous", tilted, rank=25, family="local"), "already registered"),
    (LabelRule("heterogeneous", tilted, rank=25, family="local"), "the fallback"),
    (LabelRule("tilted", tilted, rank=20, family="local"), "rank 20 is taken by 'previous'"),
])
def test_a_rule_that_would_be_ambiguous_is_refused(entry, message):
    with pytest.raises(InputError, match=message):
        RULES.add(entry)
    assert labels.PRECEDENCE == PRECEDENCE


@pytest.mark.parametrize(("fields", "message"), [
    ({"label": ""}, "non-empty label"),
    ({"test": "prev > 0.5"}, "callable"),
    ({"rank": float("nan")}, "rank must be a finite number"),
    ({"rank": True}, "rank must be a finite number"),
    ({"colour": "red"}, "colour must be '#rrggbb'"),
    ({"colour": '#12345"'}, "colour must be '#rrggbb'"),
    ({"family": ""}, "family must be a lower-case name"),
    ({"family": "Local Heads"}, "family must be a lower-case name"),
    ({"family": None}, "family must be a lower-case name"),
    ({"held_back": "too few rows"}, "held_back must be callable"),
])
def test_a_malformed_rule_is_refused(fields, message):
    with pytest.raises(InputError, match=message):
        LabelRule(**{"label": "tilted", "test": tilted, "rank": 25, "family": "local",
                     **fields})


def test_a_rule_must_name_its_family():
    with pytest.raises(TypeError, match="family"):
        LabelRule("tilted", tilted, rank=25)


def test_register_needs_a_label_rule_of_that_name():
    with pytest.raises(InputError, match="LabelRule labelled 'tilted'"):
        RULES.register("tilted")(tilted)
    with pytest.raises(InputError, match="LabelRule labelled 'tilted'"):
        RULES.register("tilted")(LabelRule("other", tilted, rank=25, family="local"))
    assert "tilted" not in RULES and "other" not in RULES


# ---- copying rules: the probe, else the corpus' own evidence over enough rows ---------------

@pytest.mark.parametrize(("label", "scores", "evidence"), [
    ("induction", {"induction": 0.62, "induction_rows": 412},
     "induction=0.62 > 0.4 over 412 rows"),
    ("induction", {"induction": 0.3, "induction_rows": 412, "induction_ahead": 0.5,
                   "induction_ahead_rows": 20}, "induction_ahead=0.5 > 0.4 over 20 rows"),
    ("duplicate", {"duplicate": 0.7, "duplicate_rows": 25}, "duplicate=0.7 > 0.4 over 25 rows"),
    ("duplicate", {"duplicate": 0.7, "duplicate_rows": 25, "duplicate_ahead": 0.9,
                   "duplicate_ahead_rows": 3},
     "duplicate=0.7 > 0.4 over 25 rows"),  # the larger ahead score has too few rows
])
def test_without_the_probe_the_corpus_evidence_decides(label, scores, evidence):
    row = classify_one(**scores)
    assert (row["label"], row["family"]) == (label, "copying")
    assert row["evidence"].split("; ")[0] == evidence


def test_the_probe_decides_when_the_table_has_it():
    """The probe is the controlled experiment: when present it overrides the corpus, both
    ways, and the evidence names it."""
    corpus = {"induction": 0.9, "induction_rows": 500}
    assert classify_one(rep_induction=0.1, **corpus)["label"] == "heterogeneous"
    assert classify_one(rep_induction=0.1, **corpus)["evidence"] == "no rule fired"
    row = classify_one(rep_induction=0.7, induction=0.1, induction_rows=500)
    assert (row["label"], row["evidence"]) == ("induction", "rep_induction=0.7 > 0.4")
    # a NaN probe is no probe: the corpus decides
    row = classify_one(rep_induction=NAN, rep_induction_ahead=NAN, **corpus)
    assert row["evidence"] == "induction=0.9 > 0.4 over 500 rows"


def test_too_few_rows_with_a_copy_is_not_induction_and_the_evidence_says_why():
    row = classify_one(induction=0.93, induction_rows=5)
    assert row["label"] == "heterogeneous"
    assert row["evidence"] == ("no rule fired; not induction: induction=0.93 > 0.4 over 5 rows, "
                               "fewer than min_copy_rows=20")
    # the note follows another label the head gets instead ...
    row = classify_one(induction=0.93, induction_rows=5, duplicate=0.6, duplicate_rows=30)
    assert row["label"] == "duplicate"
    assert row["evidence"] == ("duplicate=0.6 > 0.4 over 30 rows; not induction: "
                               "induction=0.93 > 0.4 over 5 rows, fewer than min_copy_rows=20")
    # ... but not a label that outranks induction anyway
    row = classify_one(induction=0.93, induction_rows=5, prev_nosink=0.8)
    assert (row["label"], row["evidence"]) == ("previous", "prev_nosink=0.8 > 0.5")
    # a table without the row counts cannot trust the score
    row = classify_one(duplicate=0.8)
    assert row["label"] == "heterogeneous"
    assert row["evidence"].endswith("not duplicate: duplicate=0.8 > 0.4 on an unknown number "
                                    "of rows (no duplicate_rows column)")


def test_min_copy_rows_is_a_threshold():
    scores = {"induction": 0.6, "induction_rows": 12}
    assert classify_one(**scores)["label"] == "heterogeneous"
    assert classify_one(Thresholds(min_copy_rows=10), **scores)["label"] == "induction"
    assert classify_one(Thresholds(min_copy_rows=12), **scores)["label"] == "induction"
    assert classify_one(Thresholds(min_copy_rows=13), **scores)["label"] == "heterogeneous"


def test_a_head_that_is_all_sink_gets_no_copying_label_from_the_corpus():
    """The corpus scores are renormalised over content keys: the last 2 % of a sink head is
    not what it does (``min_rest``)."""
    row = classify_one(sink=0.98, first=0.98, induction=0.9, induction_rows=100)
    assert (row["label"], row["also"], row["evidence"]) == ("sink", "", "sink=0.98 > 0.6, "
                                                            "first=0.98")
    row = classify_one(sink=0.9, first=0.9, induction=0.9, induction_rows=100)
    assert (row["label"], row["also"]) == ("induction", "sink")


# ---- thresholds: declared by the rules, overridden by name ------------------------------------

def test_an_unknown_threshold_is_a_one_line_error_naming_the_known_ones():
    with pytest.raises(InputError, match="unknown threshold 'positional_mas'") as err:
        Thresholds(positional_mas=0.4)
    assert "'positional_mass'" in str(err.value) and "\n" not in str(err.value)


def test_thresholds_lay_the_given_values_over_the_rules_defaults():
    declared = RULES.thresholds()
    t = Thresholds(sink=0.5)
    assert t.sink == 0.5 and t.given == {"sink": 0.5}
    assert {name: value for name, value in t.values().items() if name != "sink"} \
        == {name: entry.default for name, entry in declared.items() if name != "sink"}
    assert t.replace(block=0.9) == Thresholds(sink=0.5, block=0.9)
    assert pickle.loads(pickle.dumps(t)) == t and hash(t) == hash(Thresholds(sink=0.5))
    with pytest.raises(AttributeError):
        t.sink = 0.7  # frozen


def test_a_later_rule_brings_its_threshold_to_thresholds_made_before(tilted_rule):
    before = Thresholds(sink=0.5)
    extra = LabelRule("leaning", tilted, rank=26, family="tilts",
                      thresholds=(Threshold("lean", 0.25, "leaning: lean above this"),),
                      help="lean > {lean}")
    RULES.add(extra)
    try:
        assert before.lean == 0.25 and Thresholds(lean=0.3).lean == 0.3
        assert extra.summary() == "lean > 0.25"
    finally:
        RULES.remove("leaning")
    with pytest.raises(AttributeError, match="lean"):
        before.lean  # noqa: B018


@pytest.mark.parametrize(("entry", "message"), [
    (LabelRule("leaning", tilted, rank=26, family="tilts",
               thresholds=(Threshold("sink", 0.9, "another sink bound"),)),
     "threshold sink has the default 0.6 in another rule, not 0.9"),
])
def test_a_threshold_declared_twice_must_keep_one_default(entry, message):
    with pytest.raises(InputError, match=message):
        RULES.add(entry)
    assert "leaning" not in RULES


@pytest.mark.parametrize(("make", "message"), [
    (lambda: LabelRule("leaning", tilted, rank=26, family="tilts", help="lean > {lean}"),
     "its help names 'lean'"),
    (lambda: Threshold("lean", float("nan"), "x"), "threshold lean must be a finite number"),
    (lambda: Threshold("values", 0.1, "x"), "not an attribute of Thresholds"),
    (lambda: Threshold("lean", 0.1, " "), "needs a help text"),
])
def test_a_malformed_threshold_or_help_is_refused(make, message):
    with pytest.raises(InputError, match=message):
        make()
