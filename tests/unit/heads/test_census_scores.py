"""Census scores on maps built to be exactly one pattern: values follow from the construction."""

import math

import numpy as np
import pytest
import torch

import attnprobe as ap
from attnprobe.capture.calls import BatchPatterns, positions
from attnprobe.core.tokens import TokenVocabulary
from attnprobe.heads import CensusStats, HeadDistances, RowBlock, Tally
from attnprobe.heads.scores import offset_table, wide_scores
from attnprobe.heads.similarity import pairwise_js
from attnprobe.types import AttentionMap, ModelInfo

INFO = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=False)
WORDS = ["[CLS]", "the", "cat", "sat", "on", "a", "mat", ".", "[SEP]"]


def shifted(n, offset):
    """Row i puts all mass on key i+offset, clamped into the sentence."""
    a = torch.zeros(n, n)
    for i in range(n):
        a[i, min(max(i + offset, 0), n - 1)] = 1.0
    return a


def column(n, k):
    a = torch.zeros(n, n)
    a[:, k] = 1.0
    return a


def amap(pattern, tokens=WORDS, info=INFO):
    return AttentionMap(pattern=pattern[None, None], query_tokens=tokens, key_tokens=tokens,
                        layers=(0,), info=info)


def label_of(pattern, tokens=WORDS, info=INFO):
    row = ap.heads.classify([amap(pattern, tokens, info)]).iloc[0]
    return row["label"], row


def block_of(pattern, ids=None, visible=None):
    b, _, q, _ = pattern.shape
    valid = torch.ones(b, q, dtype=torch.bool)
    return RowBlock(pattern=pattern, query_valid=valid, query_pos=positions(valid),
                    key_pos=positions(valid), key_len=valid.sum(-1), visible=visible,
                    query_ids=ids, key_ids=ids)


# ------------------------------------------------------------------- labels on pure maps
def test_uniform_map_is_broad_with_entropy_ln_n():
    n = len(WORDS)
    label, row = label_of(torch.full((n, n), 1 / n))
    assert label == "broad"
    assert row["entropy"] == pytest.approx(math.log(n), abs=1e-6)
    assert row["entropy_norm"] == pytest.approx(1.0, abs=1e-6)
    assert row["max_weight"] == pytest.approx(1 / n)
    assert row["chance_weight"] == pytest.approx(1 / n)


def test_previous_token_map_scores_n_minus_1_over_n():
    n = len(WORDS)
    label, row = label_of(shifted(n, -1))  # row 0 can only look at itself
    assert label == "previous"
    assert row["prev"] == pytest.approx((n - 1) / n)
    assert row["self"] == pytest.approx(1 / n)
    assert row["pos_score"] == pytest.approx((n - 1) / n) and row["pos_offset"] == -1
    assert row["distance"] == pytest.approx((n - 1) / n)
    assert row["entropy"] == pytest.approx(0.0, abs=1e-6)


def test_identity_map_is_self():
    label, row = label_of(torch.eye(len(WORDS)))
    assert label == "self" and row["self"] == pytest.approx(1.0)
    assert row["distance"] == 0.0


def test_next_and_fixed_offset_maps():
    n = len(WORDS)
    label, row = label_of(shifted(n, 1))
    assert label == "next" and row["next"] == pytest.approx((n - 1) / n)
    # two to the left; the first two rows are clamped to key 0 (one of them at offset 0)
    label, row = label_of(shifted(n, -2))
    assert row["offset-2"] == pytest.approx((n - 2) / n)
    assert row["pos_offset"] == -2 and row["pos_score"] == pytest.approx((n - 2) / n)
    # 7/9 of rows at -2 is under Voita's 0.9, but the two clamped rows (and row 2, whose -2
    # is key 0) put all their mass on the first token, a sink: on the mass left every row is
    # at -2
    assert row["sink"] == pytest.approx(3 / n)
    assert row["pos_score_nosink"] == pytest.approx(1.0) and row["pos_offset_nosink"] == -2
    assert label == "offset" and "collapsed" in row["also"].split(", ")
    long = ["[CLS]", *(f"w{i}" for i in range(28)), "[SEP]"]
    label, row = label_of(shifted(len(long), -2), long)
    assert row["pos_score"] == pytest.approx(28 / 30)
    assert label == "offset" and "pos_offset_nosink=-2" in row["evidence"]


def test_one_column_on_sep_is_a_sink():
    n = len(WORDS)
    label, row = label_of(column(n, n - 1))
    assert label == "sink" and row["evidence"] == "sink=1 > 0.6, column_sink=1"
    assert row["sep"] == pytest.approx(1.0) and row["special"] == pytest.approx(1.0)
    assert row["first"] == 0.0 and row["punct"] == 0.0
    label, row = label_of(column(n, 0))
    assert label == "sink" and row["first"] == pytest.approx(1.0) and row["cls"] == 1.0


def test_punctuation_column():
    n = len(WORDS)
    _, row = label_of(column(n, WORDS.index(".")))
    assert row["punct"] == pytest.approx(1.0) and row["special"] == 0.0


def test_block_map_on_a_sentence_pair():
    tokens = ["[CLS]", "a", "b", "c", "d", "[SEP]", "e", "f", "g", "h", "[SEP]"]
    segments = [range(1, 5), range(6, 10)]
    n = len(tokens)
    a = torch.full((n, n), 1 / n)  # special rows: uniform
    for seg in segments:
        for i in seg:
            a[i] = 0
            a[i, list(seg)] = 1 / len(seg)
    label, row = label_of(a, tokens)
    assert row["block"] == pytest.approx(1.0)
    assert label == "block"
    # a head spread evenly over both segments keeps half its (far) mass at home
    b = torch.full((n, n), 1 / n)
    _, row = label_of(b, tokens)
    assert row["block"] < 0.6


def copying_map(first, second):
    """``[CLS] first second`` (words distinct within each part): a row whose token occurs
    earlier at ``j``, with the token after that copy at least two keys back (``j + 1 <= q -
    2``; offset -1 is the previous token, not induction), puts all its mass on ``j + 1``;
    every other row is uniform. Returns the map and how many rows copy."""
    tokens = ["[CLS]", *first, *second]
    n = len(tokens)
    a = torch.full((n, n), 1 / n)
    rows = 0
    for q in range(1, n):
        earlier = [j for j in range(1, q - 2) if tokens[j] == tokens[q]]
        if earlier:
            a[q] = 0.0
            a[q, earlier[0] + 1] = 1.0
            rows += 1
    return amap(a, tokens), rows


def shuffled(words, seed=0):
    order = torch.randperm(len(words), generator=torch.Generator().manual_seed(seed))
    return [words[i] for i in order.tolist()]


def test_stored_maps_whose_rows_copy_are_induction_on_the_corpus_evidence():
    """No probe: the label reads the map's own induction mass (all of it, by construction)
    over the rows that hold an earlier copy."""
    words = [f"w{i}" for i in range(24)]
    amap_, rows = copying_map(words, shuffled(words))
    assert rows >= 20  # min_copy_rows
    row = ap.heads.classify([amap_]).iloc[0]
    assert row["induction"] == pytest.approx(1.0) and row["induction_rows"] == rows
    assert row["duplicate"] == 0.0 and row["duplicate_rows"] == 24
    assert row["label"] == "induction", row["evidence"]
    assert row["evidence"] == f"induction=1 > 0.4 over {rows} rows"


def test_too_few_rows_with_a_copy_are_no_induction_and_the_evidence_says_why():
    words = [f"w{i}" for i in range(24)]
    amap_, rows = copying_map(words, shuffled(words[:4], seed=1))
    assert 0 < rows < 20
    row = ap.heads.classify([amap_]).iloc[0]
    assert row["induction"] == pytest.approx(1.0) and row["induction_rows"] == rows
    assert row["label"] != "induction" and "induction" not in row["also"].split(", ")
    assert row["evidence"].endswith(f"; not induction: induction=1 > 0.4 over {rows} rows, "
                                    "fewer than min_copy_rows=20")
    loose = ap.heads.classify([amap_], thresholds=ap.heads.Thresholds(min_copy_rows=rows))
    assert loose.iloc[0]["label"] == "induction"


def test_causal_uniform_rows_are_normalised_by_visible_keys():
    # long enough that chance mass on the first token and the diagonal stays under 0.3
    n = 40
    causal = torch.tril(torch.ones(n, n))
    causal = causal / causal.sum(-1, keepdim=True)
    info = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=True)
    tokens = ["<s>", *(f"w{i}" for i in range(1, n))]
    label, row = label_of(causal, tokens, info)
    expected = sum(math.log(i + 1) for i in range(n)) / n
    assert row["entropy"] == pytest.approx(expected, abs=1e-6)
    assert row["entropy_norm"] == pytest.approx(1.0, abs=1e-6)  # row 0 (one key) not counted
    assert row["chance_weight"] == pytest.approx(sum(1 / (i + 1) for i in range(n)) / n)
    assert row["first"] == pytest.approx(row["chance_weight"])
    assert label == "broad"


# ------------------------------------------------------------------------ reducers
def stats(*groups, **kwargs):
    return CensusStats(groups=frozenset(groups), **kwargs)


def test_normalized_entropy_uses_visible_keys_and_skips_single_key_rows():
    a = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.25, 0.25, 0.5]]]])
    sums = stats("rows")(block_of(a, visible=torch.tensor([[1, 2, 3]])))
    total, count = sums["entropy_norm"]
    h3 = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))
    assert count.item() == 2
    assert total.item() == pytest.approx(1.0 + h3 / math.log(3))
    assert sums["chance_weight"].item() == pytest.approx(1 + 1 / 2 + 1 / 3)
    assert sums["entropy"].item() == pytest.approx(math.log(2) + h3)


def test_offset_profile_counts_every_offset_and_pools_far_ones():
    n = 8
    p = torch.stack([shifted(n, -1), shifted(n, 3)])[None]  # [1, 2 heads, n, n]
    sums = stats("offsets")(block_of(p))
    assert sums["offset@-1"].tolist() == [n - 1, 0]
    assert sums["offset@+3"].tolist() == [0, n - 3]
    assert sums["argmax@+0"].tolist() == [1, 1]  # row 0 of one, the clamped last row of other
    assert sums["distance"].tolist() == [n - 1, 3 * (n - 3) + 2 + 1]
    far = stats("offsets", max_offset=2)(block_of(p))
    assert far["offset@far"].tolist() == [0, n - 3]
    assert "offset@+3" not in far
    table = offset_table(_tally(p, [stats("offsets")]))
    head1 = table[(table["head"] == 1) & (table["offset"] == 3)].iloc[0]
    assert head1["mass"] == pytest.approx((n - 3) / n)
    assert head1["argmax_share"] == pytest.approx((n - 3) / n)


def _tally(pattern, reducers, ids=None):
    tally = Tally()
    tally.add(("s", "self", 0), tuple(range(pattern.shape[1])), block_of(pattern, ids), reducers)
    return tally


def test_token_classes_need_ids():
    p = torch.full((1, 1, 3, 3), 1 / 3)
    classes = {"special": torch.tensor([9]), "x": torch.tensor([7])}
    with pytest.raises(ap.InputError, match="token ids"):
        stats("classes", classes=classes)(block_of(p))
    out = stats("classes", classes=classes)(block_of(p, torch.tensor([[7, 1, 7]])))
    assert out["x"].item() == pytest.approx(3 * 2 / 3)
    assert out["first"].item() == pytest.approx(3 * 1 / 3)


def test_token_match_on_repeated_tokens_reads_the_published_diagonals():
    m = 4
    ids = torch.tensor([[0, 11, 12, 13, 14, 11, 12, 13, 14, 1]])  # [CLS] x x [SEP]
    n = ids.shape[1]
    classes = {"special": torch.tensor([0, 1])}
    induction = torch.eye(n)
    for i in range(1 + m, 1 + 2 * m):  # second copy: look at the token after the earlier copy
        induction[i] = 0
        induction[i, i - m + 1] = 1.0
    out = stats("match", classes=classes)(block_of(induction[None, None], ids))
    total, count = out["induction"]
    # every second-copy row has exactly one induction target and puts all its mass there
    assert count.item() == m and total.item() == pytest.approx(m)
    dup_total, dup_count = out["duplicate"]
    assert dup_count.item() == m and dup_total.item() == 0.0
    ahead_total, ahead_count = out["duplicate_ahead"]
    assert ahead_count.item() == m and ahead_total.item() == 0.0
    rep = stats("match", classes=classes, prefix="rep_")(block_of(induction[None, None], ids))
    assert set(rep) == {f"rep_{k}" for k in out}


def test_token_match_renormalises_over_content_keys():
    ids = torch.tensor([[0, 5, 6, 5]])
    p = torch.zeros(1, 1, 4, 4)
    p[0, 0, :, 0] = 0.5  # half on [CLS]
    p[0, 0, 3, 1] = 0.5  # last token: other half on its earlier duplicate
    p[0, 0, :3, 2] = 0.5
    out = stats("match", classes={"special": torch.tensor([0])})(block_of(p, ids))
    total, count = out["duplicate"]
    assert count.item() == 1 and total.item() == pytest.approx(1.0)


def test_segment_mass_ignores_single_segment_inputs():
    ids = torch.tensor([[0, 5, 6, 7, 8, 1]])
    p = torch.full((1, 1, 6, 6), 1 / 6)
    classes = {"sep": torch.tensor([1]), "special": torch.tensor([0, 1])}
    out = stats("segments", classes=classes)(block_of(p, ids))
    assert "block" not in out  # no input is a pair: the score does not exist


# -------------------------------------------------------------------------- distances
def test_js_is_zero_for_equal_heads_and_ln2_for_disjoint_one_hots():
    n = 5
    rows = torch.stack([torch.eye(n), torch.eye(n), shifted(n, 1)[[1, 2, 3, 4, 0]]])
    rows[2] = torch.roll(torch.eye(n), 1, dims=1)  # disjoint from the identity everywhere
    js = pairwise_js(rows)
    assert js[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert js[0, 2].item() == pytest.approx(n * math.log(2), abs=1e-5)
    assert torch.equal(js, js.T)


def test_head_distances_merge_exactly_and_skip_padding():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(2, 1, 3, 4, 4), -1)  # [batch, layer, head, q, k]
    valid = torch.ones(2, 4, dtype=torch.bool)

    def batch(sl):
        return BatchPatterns(p[sl], valid[sl], valid[sl], None, None, (0,), (0, 1, 2), "", "self")

    whole = HeadDistances.from_batch(batch(slice(0, 2)))
    merged = HeadDistances.from_batch(batch(slice(0, 1))) + HeadDistances.from_batch(
        batch(slice(1, 2)))
    assert whole.rows == merged.rows == 8
    assert torch.allclose(whole.sums, merged.sums, atol=1e-9)
    padded = torch.zeros(1, 1, 3, 6, 6)
    padded[..., :4, :4] = p[:1]
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    with_padding = HeadDistances.from_batch(
        BatchPatterns(padded, mask, mask, None, None, (0,), (0, 1, 2), "", "self"))
    first = HeadDistances.from_batch(batch(slice(0, 1)))
    assert torch.allclose(with_padding.sums, first.sums, atol=1e-6)


def test_map_vocabulary_recognises_special_tokens():
    m = amap(torch.eye(len(WORDS)))
    vocab = TokenVocabulary([*m.query_tokens, *m.key_tokens])
    assert vocab.cls_token_id == vocab.get_vocab()["[CLS]"]
    assert vocab.sep_token_id == vocab.get_vocab()["[SEP]"]
    assert vocab.bos_token_id is None


def test_wide_scores_of_an_empty_tally_is_empty():
    assert wide_scores(Tally()).empty


def test_classical_mds_recovers_points_on_a_line_and_clusters_split_them():
    from attnprobe.heads.similarity import classical_mds, cluster_heads

    points = np.array([0.0, 1.0, 2.0, 10.0, 11.0])
    distances = np.abs(points[:, None] - points[None, :])
    xy = classical_mds(distances)
    recovered = np.abs(xy[:, None, :] - xy[None, :, :]).sum(-1)
    assert recovered == pytest.approx(distances, abs=1e-6)  # a line embeds exactly
    heads = tuple(("", "self", 0, h) for h in range(5))
    # JS divergences are squared distances here (the clustering takes their square root)
    dist = HeadDistances(heads, torch.tensor(distances ** 2, dtype=torch.float64), 1.0)
    clusters = cluster_heads(dist, n_clusters=2)
    assert clusters["cluster"].tolist()[:3] == [clusters["cluster"][0]] * 3
    assert clusters["cluster"][3] == clusters["cluster"][4] != clusters["cluster"][0]


def test_census_stats_are_the_same_for_right_and_left_padding():
    """Right padding takes the diagonal fast path, left padding the general scatter path."""
    torch.manual_seed(3)
    n, pad = 6, 2
    core = torch.softmax(torch.randn(1, 3, n, n), -1)
    ids_core = torch.tensor([[0, 5, 6, 5, 7, 1]])
    right = torch.zeros(1, 3, n + pad, n + pad)
    right[..., :n, :n] = core
    left = torch.zeros(1, 3, n + pad, n + pad)
    left[..., pad:, pad:] = core
    r_valid = torch.tensor([[True] * n + [False] * pad])
    l_valid = torch.tensor([[False] * pad + [True] * n])
    r_ids = torch.cat([ids_core, torch.zeros(1, pad, dtype=torch.long)], 1)
    l_ids = torch.cat([torch.zeros(1, pad, dtype=torch.long), ids_core], 1)
    classes = {"sep": torch.tensor([1]), "special": torch.tensor([0, 1])}

    def run(pattern, valid, ids):
        block = RowBlock(pattern=pattern, query_valid=valid, query_pos=positions(valid),
                         key_pos=positions(valid), key_len=valid.sum(-1), query_ids=ids,
                         key_ids=ids)
        return CensusStats(classes=classes, max_offset=3)(block)

    a, b = run(right, r_valid, r_ids), run(left, l_valid, l_ids)
    assert a.keys() == b.keys()
    for key in a:
        left_value = b[key] if not isinstance(b[key], tuple) else torch.stack(b[key])
        right_value = a[key] if not isinstance(a[key], tuple) else torch.stack(a[key])
        assert torch.allclose(right_value, left_value, atol=1e-6), key
