"""Sink-aware scores and labels on hand-built maps.

Expected values come from the construction, or from :func:`reference`, a loop-by-loop
implementation of the definitions in ``attnprobe/heads/sinks.py`` written for this test
(sink keys: first token, start tokens, column sinks; every sink-free score a mean over rows
weighted by the mass each row has left).
"""

import math

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.heads.sinks import SinkRule
from attnprobe.types import AttentionMap, ModelInfo

CAUSAL = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=True)
BIDIRECTIONAL = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=False)


def classify(pattern, tokens, info):
    """Labels and scores of one head from a stored ``[query, key]`` map."""
    amap = AttentionMap(pattern=torch.as_tensor(pattern, dtype=torch.float32)[None, None],
                        query_tokens=tokens, key_tokens=tokens, layers=(0,), info=info)
    return ap.heads.classify([amap]).iloc[0]


def reference(a, *, causal, fixed, epsilon=0.3, share=0.5, min_rows=4):
    """Sink columns and sink-free scores of ``a`` [query, key] from the definitions."""
    n = a.shape[0]
    seen = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
    columns = set()
    for k in range(n):
        seers = [i for i in range(n) if seen[i, k]]
        hits = sum(a[i, k] > epsilon for i in seers)
        if len(seers) >= min_rows and hits > share * len(seers):
            columns.add(k)
    sinks = columns | set(fixed)
    out = {"sink": 0.0, "sink_rate": 0.0, "column_sink": 0.0}
    sums = {"prev": 0.0, "self": 0.0, "next": 0.0, "max": 0.0, "rest": 0.0}
    entropy = [0.0, 0.0]  # Σ r·H/ln m, Σ r over rows with m >= 2
    chance = [0.0, 0.0]
    argmax: dict[int, float] = {}
    for i in range(n):
        keys = [k for k in range(n) if seen[i, k]]
        free = [k for k in keys if k not in sinks]
        s = sum(a[i, k] for k in keys if k in sinks)
        out["sink"] += s / n
        out["sink_rate"] += (s > epsilon) / n
        out["column_sink"] += sum(a[i, k] for k in keys if k in columns - set(fixed)) / n
        r = sum(a[i, k] for k in free)
        sums["rest"] += r
        if r <= 0:
            continue
        p = {k: a[i, k] / r for k in free}
        for name, d in (("prev", -1), ("self", 0), ("next", 1)):
            sums[name] += r * p.get(i + d, 0.0)
        sums["max"] += r * max(p.values())
        top = max(p, key=lambda k: p[k])
        argmax[top - i] = argmax.get(top - i, 0.0) + r
        m = len(free)
        chance[0] += r / m
        chance[1] += r
        if m >= 2:
            h = -sum(v * math.log(v) for v in p.values() if v > 0)
            entropy[0] += r * h / math.log(m)
            entropy[1] += r
    rest = sums["rest"]
    if rest > 0:
        for name in ("prev", "self", "next"):
            out[f"{name}_nosink"] = sums[name] / rest
        out["max_weight_nosink"] = sums["max"] / rest
        out["chance_weight_nosink"] = chance[0] / chance[1]
        out["pos_offset_nosink"] = max(argmax, key=lambda d: argmax[d])
        out["pos_score_nosink"] = argmax[out["pos_offset_nosink"]] / rest
    if entropy[1] > 0:
        out["entropy_norm_nosink"] = entropy[0] / entropy[1]
    return out, columns


def assert_scores(row, expected):
    for name, value in expected.items():
        assert row[name] == pytest.approx(value, abs=1e-6), name


# ---- the cases --------------------------------------------------------------------

def first_plus_previous(n, first=0.7):
    """Causal: rows 0 and 1 can only give their mass to the first token; every other row puts
    ``first`` on it and the rest on the previous token."""
    a = np.zeros((n, n))
    a[:2, 0] = 1.0
    for i in range(2, n):
        a[i, 0], a[i, i - 1] = first, 1 - first
    return a


def test_seventy_percent_first_token_thirty_previous_is_previous_with_sink_in_also():
    n = 10
    tokens = ["[BOS]", *(f"w{i}" for i in range(1, n))]
    row = classify(first_plus_previous(n), tokens, CAUSAL)
    assert (row["label"], row["family"]) == ("previous", "local")
    assert "sink" in row["also"].split(", ")
    # the raw mass keeps its meaning: row 1's previous token is the first one
    assert row["prev"] == pytest.approx((0.3 * (n - 2) + 1.0) / n)
    assert row["first"] == pytest.approx(row["sink"])
    assert row["sink"] == pytest.approx((2 + 0.7 * (n - 2)) / n)
    assert row["prev_nosink"] == pytest.approx(1.0) and row["sink_rate"] == 1.0
    expected, columns = reference(first_plus_previous(n), causal=True, fixed={0})
    assert columns <= {0}  # the first token is a column too; no other key is
    assert_scores(row, expected)


def test_all_mass_on_the_first_token_is_sink_and_nothing_else():
    n = 10
    a = np.zeros((n, n))
    a[:, 0] = 1.0
    row = classify(a, ["[BOS]", *(f"w{i}" for i in range(1, n))], CAUSAL)
    assert (row["label"], row["family"], row["also"]) == ("sink", "sink", "")
    assert row["evidence"] == "sink=1 > 0.6, first=1"
    assert row["sink"] == 1.0 and row["sink_rate"] == 1.0
    # no mass is left anywhere: the sink-free scores do not exist
    assert np.isnan(row["prev_nosink"]) and np.isnan(row["entropy_norm_nosink"])
    assert np.isnan(row["pos_score_nosink"])


def test_a_column_sink_on_a_later_key():
    """Bidirectional; every row puts 0.6 on '.' (key 8) and 0.4 on the next token (the last
    row on itself): '.' is a column sink, and on the rest the head is a next-token head."""
    tokens = ["[CLS]", "a", "b", "c", "d", "e", "f", "g", ".", "[SEP]"]
    n = len(tokens)
    a = np.zeros((n, n))
    for i in range(n):
        a[i, 8] += 0.6
        a[i, min(i + 1, n - 1)] += 0.4
    row = classify(a, tokens, BIDIRECTIONAL)
    expected, columns = reference(a, causal=False, fixed={0})
    assert columns == {8}
    assert_scores(row, expected)
    # rows 0-6 and 8 keep their 0.4 at +1, row 9 at 0, row 7's next token is the sink itself
    assert row["next_nosink"] == pytest.approx(8 / 9)
    assert row["next"] == pytest.approx((0.4 * 8 + 1.0) / n)  # row 7: all of it on '.'
    assert row["column_sink"] == pytest.approx(expected["column_sink"])
    assert row["punct"] == pytest.approx(row["column_sink"])
    assert (row["label"], row["also"].split(", ")[-1]) == ("next", "sink")


# ---- which keys are column sinks ------------------------------------------------------------

def test_the_last_keys_of_a_causal_self_head_are_not_columns():
    """Key 5 of a 6-token causal identity head is seen by one row, which puts all its mass
    there: under ``min_rows`` (4), so not a column; the head is ``self``."""
    n = 6
    row = classify(np.eye(n), ["[BOS]", *(f"w{i}" for i in range(1, n))], CAUSAL)
    assert row["column_sink"] == 0.0 and row["sink"] == pytest.approx(1 / n)
    assert row["self_nosink"] == pytest.approx(1.0)
    assert row["label"] == "self"


def test_a_column_needs_more_than_half_of_its_rows():
    n = 8
    tokens = ["x0", *(f"w{i}" for i in range(1, n))]
    half = np.full((n, n), 1 / n)
    half[:4] = 0.5 / (n - 1)
    half[:4, 5] = 0.5  # four of the eight rows: not "most"
    row = classify(half, tokens, BIDIRECTIONAL)
    assert row["column_sink"] == 0.0
    most = half.copy()
    most[4] = most[0]  # five of eight
    row = classify(most, tokens, BIDIRECTIONAL)
    expected, columns = reference(most, causal=False, fixed={0})
    assert columns == {5}
    del expected["pos_offset_nosink"], expected["pos_score_nosink"]  # uniform rows: ties
    assert_scores(row, expected)


def test_weighted_sink_free_scores_match_the_definitions_on_a_random_causal_map():
    """Random first-token mass per row, the rest random: every sink-free score is the
    rest-weighted mean of the reference."""
    rng = np.random.default_rng(0)
    n = 24
    a = np.zeros((n, n))
    for i in range(n):
        first = rng.uniform(0.2, 0.95) if i else 1.0
        rest = rng.dirichlet(np.full(i, 0.3)) if i else np.zeros(0)
        a[i, 0] = first
        a[i, 1:i + 1] = (1 - first) * rest
    a = a / a.sum(1, keepdims=True)
    row = classify(a, ["<s>", *(f"w{i}" for i in range(1, n))], CAUSAL)
    expected, _ = reference(a.astype(np.float32).astype(float), causal=True, fixed={0})
    assert_scores(row, expected)


def test_start_tokens_are_sinks_wherever_they_stand():
    """A second ``[CLS]`` in the middle of the input is a start token: its mass is sink mass."""
    tokens = ["[CLS]", "a", "b", "[CLS]", "c", "d", "e", "f"]
    n = len(tokens)
    a = np.zeros((n, n))
    for i in range(n):
        a[i, 3] = 0.25
        a[i, (i + 1) % n] += 0.75
    row = classify(a, tokens, BIDIRECTIONAL)
    assert row["column_sink"] == 0.0  # 0.25 < epsilon: only the token makes it a sink
    expected, _ = reference(a, causal=False, fixed={0, 3})
    assert_scores(row, expected)


@pytest.mark.parametrize(("fields", "message"), [
    ({"epsilon": 1.5}, "epsilon must be in"),
    ({"share": -0.1}, "share must be in"),
    ({"min_rows": 0}, "min_rows must be a positive integer"),
    ({"min_rows": True}, "min_rows must be a positive integer"),
])
def test_a_malformed_sink_rule_is_refused(fields, message):
    with pytest.raises(ap.InputError, match=message):
        SinkRule(**fields)


def test_sink_free_argmax_offsets_beyond_max_offset_are_pooled():
    """Rows 3.. of a causal map look 3 back (after a 0.5 first-token sink); with
    ``max_offset=2`` their sink-free argmax counts in ``argmax_nosink@far``."""
    from attnprobe.capture.calls import positions
    from attnprobe.heads import CensusStats, RowBlock

    n = 8
    a = torch.zeros(1, 1, n, n)
    a[0, 0, :3, 0] = 1.0
    for i in range(3, n):
        a[0, 0, i, 0], a[0, 0, i, i - 3] = 0.5, 0.5
    a[0, 0, 3] = 0  # row 3 looks 3 back at the first token itself: all sink
    a[0, 0, 3, 0] = 1.0
    valid = torch.ones(1, n, dtype=torch.bool)
    block = RowBlock(pattern=a, query_valid=valid, query_pos=positions(valid),
                     key_pos=positions(valid), key_len=valid.sum(-1),
                     visible=torch.arange(1, n + 1)[None])
    sums = CensusStats(groups=frozenset({"sinks"}), max_offset=2)(block)
    argmax = {k: v.item() for k, v in sums.items() if k.startswith("argmax_nosink@")}
    assert argmax == {"argmax_nosink@far": pytest.approx(0.5 * (n - 4))}
    assert sums["rest"].item() == pytest.approx(0.5 * (n - 4))


def test_a_learned_sink_counts_as_sink_mass_and_leaves_the_rest_to_be_judged():
    """Rows give half their mass to a learned sink (no key) and half to the previous token;
    row 0 to the first token. The sink mass is what the learned sink and the first token took:
    rows 0 and 1 (whose previous token is the first) 1.0, the others 0.5, mean 4/6; the rest
    is all on the previous token."""
    n = 6
    pattern = torch.zeros(n, n)
    pattern[0, 0] = 0.5
    for i in range(1, n):
        pattern[i, i - 1] = 0.5
    tokens = tuple(f"t{i}" for i in range(n))
    amap = AttentionMap(pattern=pattern[None, None], query_tokens=tokens, key_tokens=tokens,
                        layers=(0,), info=CAUSAL, learned_sink=True)
    row = ap.heads.classify([amap]).iloc[0]
    assert row["sink"] == pytest.approx(4 / 6)
    assert row["prev_nosink"] == pytest.approx(1.0)
    assert row["label"] == "previous"
    assert "sink" in row["also"]
    with pytest.raises(ap.InputError, match="rows must sum to 1"):
        AttentionMap(pattern=pattern[None, None], query_tokens=tokens, key_tokens=tokens,
                     layers=(0,), info=CAUSAL)
