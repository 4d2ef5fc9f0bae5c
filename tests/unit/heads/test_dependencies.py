import inspect
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnprobe import AttentionMap, InputError, ModelInfo
from attnprobe.heads.dependencies import (
    MIN_COUNT,
    PER_HEAD_COLUMNS,
    TABLE_COLUMNS,
    SyntaxCounts,
    count_syntax,
    score_batch,
    syntax,
)
from attnprobe.heads.trees import Tree, read_conllu

MINI = Path(__file__).resolve().parents[2] / "data" / "mini.conllu"
INFO = ModelInfo(name="toy", arch="toy", n_layers=3, n_heads=2, causal=False)

# The big cat saw mice: det(The->cat) amod(big->cat) nsubj(cat->saw) root(saw) obj(mice->saw)
T5 = Tree("t5", ("The", "big", "cat", "saw", "mice"), (3, 3, 4, 0, 4),
          ("det", "amod", "nsubj", "root", "obj"))
GROUP = ("", "self")


def one_hot_rows(n, targets):
    """[n, n] map where row i puts all its mass on key targets[i]."""
    m = torch.zeros(n, n)
    m[torch.arange(n), torch.tensor(targets)] = 1.0
    return m


def parent_map(tree):
    """Each dependent attends to its gold head; a root attends to itself."""
    return one_hot_rows(len(tree), [h - 1 if h else i for i, h in enumerate(tree.heads)])


def score(maps, tree, **kw):
    """Score [head, n, n] maps (one layer) for one tree."""
    maps = torch.stack(maps) if isinstance(maps, list) else maps[None]
    n_heads = maps.shape[0]
    return score_batch(maps[None, None], torch.ones(1, len(tree), dtype=torch.bool), [tree],
                       layers=(0,), heads=tuple(range(n_heads)), **kw)


def rows(frame, direction=None):
    if direction:
        frame = frame[frame.direction == direction]
    return {r.relation: r for r in frame.itertuples()}


def test_exact_parent_map_scores_one_on_every_relation():
    counts = score(parent_map(T5), T5)
    table = counts.table(1)
    assert tuple(table.columns) == TABLE_COLUMNS
    assert set(table.relation) == {"all", "det", "amod", "nsubj", "obj"}  # root is skipped
    assert (table.accuracy == 1.0).all()
    assert (table.direction == "dep->head").all()
    assert table.relation.iloc[0] == "all" and table["count"].iloc[0] == 4
    assert (table.head_id == "L0H0").all()


def test_tables_list_relations_of_min_count_words_by_default():
    """One default with the census (MIN_COUNT words, as the labels need): a relation seen on
    fewer words is left out of every table unless min_count says otherwise."""
    from attnprobe.heads.census_options import CensusOptions
    from attnprobe.heads.head_census import Census, census

    rare = Tree("rare", ("a", "b"), (2, 0), ("dep", "root"))
    counts = sum([score(parent_map(T5), T5)] * MIN_COUNT) + score(parent_map(rare), rare)
    common = {"det", "amod", "nsubj", "obj"}  # MIN_COUNT words each; "dep" has 1
    assert set(counts.table().relation) == {"all", *common}
    assert set(counts.head_table().relation) == {"all", *common}
    assert set(counts.table(1).relation) == set(counts.head_table(1).relation) == \
        {"all", "dep", *common}
    assert counts.per_head().syntax_count.tolist() == [MIN_COUNT]
    amap = AttentionMap(parent_map(rare)[None, None], ("a", "b"), ("a", "b"), (0,), INFO)
    assert syntax([amap], [rare]).relation.tolist() == ["all"]
    assert syntax([amap], [rare], min_count=1).relation.tolist() == ["all", "dep"]
    assert MIN_COUNT == 20 and Census.min_count == MIN_COUNT
    assert CensusOptions().min_count == MIN_COUNT  # census(..., min_count=) is its shim
    assert "options" in inspect.signature(census).parameters


def test_transposed_parent_map_scores_one_in_head_to_dep():
    long = score(parent_map(T5).T.contiguous(), T5).head_table(1)
    assert (long[long.direction == "head->dep"].accuracy == 1.0).all()


def test_head_attending_to_one_dependent_is_right_only_for_that_dependent():
    # cat attends to big, saw attends to mice, the rest attend to themselves (ignored).
    # head->dep: big and mice are found; The and cat are attended by nobody (argmax lands
    # on the first other word: big for The, The for cat), so they are wrong.
    m = one_hot_rows(5, [0, 1, 1, 4, 4])
    by_rel = rows(score(m, T5).head_table(1), "head->dep")
    assert {r: by_rel[r].accuracy for r in by_rel} == {
        "all": 0.5, "det": 0.0, "amod": 1.0, "nsubj": 0.0, "obj": 1.0}


def test_baseline_counted_by_hand():
    counts = score(parent_map(T5), T5)
    # gold head minus position: The +2, big +1, cat +1, mice -1; offsets (-3,-2,-1,1,2,3)
    expected = {"all": [0, 0, 1, 2, 1, 0], "det": [0, 0, 0, 0, 1, 0],
                "amod": [0, 0, 0, 1, 0, 0], "nsubj": [0, 0, 0, 1, 0, 0],
                "obj": [0, 0, 1, 0, 0, 0]}
    for relation, hits in expected.items():
        assert counts.baseline[(GROUP, relation)].tolist() == hits, relation
    table = rows(counts.table(1))
    assert (table["all"].baseline, table["all"].baseline_offset) == (0.5, 1)
    assert (table["det"].baseline, table["det"].baseline_offset) == (1.0, 2)
    assert (table["obj"].baseline, table["obj"].baseline_offset) == (1.0, -1)
    assert table["all"].margin == 0.5


def test_next_word_map_equals_the_plus_one_baseline():
    m = one_hot_rows(5, [1, 2, 3, 4, 4])  # the last word attends to itself
    counts = score(m, T5)
    by_rel = rows(counts.head_table(1), "dep->head")
    plus_one = counts.offsets.index(1)
    for relation, row in by_rel.items():
        hits = int(counts.baseline[(GROUP, relation)][plus_one])
        assert row.accuracy == hits / row.count, relation
    assert by_rel["all"].accuracy == 0.5
    best = rows(counts.table(1))["all"]
    assert best.margin == 0.0 and best.baseline_offset == 1


def test_offsets_out_of_range_are_wrong_and_custom_offsets_work():
    tree = Tree("last", ("a", "b"), (2, 0), ("dep", "root"))
    counts = score(parent_map(tree), tree, offsets=(-1, 1, 5))
    assert counts.baseline[(GROUP, "dep")].tolist() == [0, 1, 0]
    with pytest.raises(InputError, match="distinct integers"):
        score(parent_map(tree), tree, offsets=(1, 1))


def test_dependency_alignment_by_hand():
    # exact parents: all off-diagonal mass (4 rows) is on related pairs -> 1
    # uniform 1/5: related ordered pairs 2 * 4 = 8 of 5 * 4 off-diagonal pairs -> 8/20
    counts = score([parent_map(T5), torch.full((5, 5), 0.2)], T5)
    per_head = counts.per_head(min_count=1)
    assert per_head.dep_alignment.tolist() == pytest.approx([1.0, 8 / 20])


def test_per_head_picks_the_relation_with_the_largest_margin():
    s1 = read_conllu(MINI)[0]  # The cat chased a small mouse .
    counts = score([parent_map(s1), torch.full((7, 7), 1 / 7)], s1)
    # baselines: det 1/2 (+1), amod 1, nsubj 1, obj 1 (-3), punct 0 (its head is 4 back)
    per_head = counts.per_head(min_count=1, exclude=())
    assert tuple(per_head.columns) == PER_HEAD_COLUMNS
    best = per_head.iloc[0]
    assert (best.syntax_relation, best.syntax_direction) == ("punct", "dep->head")
    assert (best.syntax_accuracy, best.syntax_baseline, best.syntax_margin) == (1.0, 0.0, 1.0)
    assert best.syntax_count == 1
    # punctuation is left out by default: the next best margin is det's (1 - 1/2)
    default = counts.per_head(min_count=1).iloc[0]
    assert (default.syntax_relation, default.syntax_margin) == ("det", 0.5)
    only_det = counts.per_head(min_count=2).iloc[0]
    assert (only_det.syntax_relation, only_det.syntax_margin, only_det.syntax_count) == \
        ("det", 0.5, 2)
    none = counts.per_head(min_count=3)
    assert none.syntax_relation.isna().all() and none.syntax_margin.isna().all()
    assert none.syntax_count.isna().all()
    assert none.dep_alignment.notna().all()


def random_batch(trees, n_layers=2, n_heads=3):
    n = max(len(t) for t in trees)
    pattern = torch.softmax(torch.randn(len(trees), n_layers, n_heads, n, n), dim=-1)
    mask = torch.zeros(len(trees), n, dtype=torch.bool)
    for b, tree in enumerate(trees):
        mask[b, :len(tree)] = True
    return pattern, mask


def test_merging_two_halves_equals_scoring_the_whole():
    trees = read_conllu(MINI)
    pattern, mask = random_batch(trees)
    kw = {"layers": (4, 5), "heads": (0, 1, 2), "stack": "encoder"}
    whole = score_batch(pattern, mask, trees, **kw)
    a = score_batch(pattern[:2], mask[:2], trees[:2], **kw)
    b = score_batch(pattern[2:], mask[2:], trees[2:], **kw)
    for merged in (a + b, sum([a, b])):
        assert merged.words == whole.words
        assert all(torch.equal(merged.correct[k], v) for k, v in whole.correct.items())
        assert all(torch.equal(merged.baseline[k], v) for k, v in whole.baseline.items())
        pd.testing.assert_frame_equal(merged.table(1), whole.table(1))
        pd.testing.assert_frame_equal(merged.per_head(1), whole.per_head(1))
    assert whole.table(1).head_id.str.fullmatch(r"L[45]H[012]").all()


def test_padding_in_a_batch_changes_nothing():
    trees = read_conllu(MINI)
    pattern, mask = random_batch(trees)
    kw = {"layers": (0, 1), "heads": (0, 1, 2)}
    batched = score_batch(pattern, mask, trees, **kw)
    single = sum(score_batch(pattern[b:b + 1, ..., :len(t), :len(t)], mask[b:b + 1, :len(t)],
                             [t], **kw) for b, t in enumerate(trees))
    pd.testing.assert_frame_equal(batched.head_table(1), single.head_table(1))


def test_merging_rejects_different_grids_and_offsets():
    a = score(parent_map(T5), T5)
    b = score([parent_map(T5), parent_map(T5)], T5)
    with pytest.raises(InputError, match="different layers/heads"):
        a + b
    with pytest.raises(InputError, match="offsets"):
        a + score(parent_map(T5), T5, offsets=(1,))
    assert isinstance(a + SyntaxCounts(), SyntaxCounts)


def test_score_batch_checks_shapes_and_word_counts():
    with pytest.raises(InputError, match="sentence t5: 4 words in the mask but 5"):
        score_batch(parent_map(T5)[None, None, None], torch.tensor([[1, 1, 1, 1, 0]]).bool(),
                    [T5], layers=(0,), heads=(0,))
    with pytest.raises(InputError, match="1 layers and 2 heads"):
        score_batch(parent_map(T5)[None, None, None], torch.ones(1, 5, dtype=torch.bool),
                    [T5], layers=(0,), heads=(0, 1))


# ------------------------------------------------------------------- syntax() on stored maps
TOKENS = ("[CLS]", "the", "big", "cat", "sa", "##w", "mice", "[SEP]")
FIRST_TOKEN = [1, 2, 3, 4, 6]  # first token of each word of T5


def token_map(**kw):
    """Head 0 points every piece of a dependent at its head's first piece (roots and specials
    at [SEP]); head 1 is uniform over the 8 tokens."""
    word_of = [-1, 0, 1, 2, 3, 3, 4, -1]
    targets = [FIRST_TOKEN[T5.heads[w] - 1] if w >= 0 and T5.heads[w] else 7 for w in word_of]
    pattern = torch.stack([one_hot_rows(8, targets), torch.full((8, 8), 1 / 8)])[None]
    tokens = kw.pop("tokens", TOKENS)
    return AttentionMap(pattern=pattern, query_tokens=tokens, key_tokens=tokens, layers=(2,),
                        info=INFO, **kw)


def test_syntax_end_to_end_on_stored_maps():
    table = syntax([token_map()], [T5])
    assert tuple(table.columns) == TABLE_COLUMNS
    assert (table.accuracy == 1.0).all() and (table.head_id == "L2H0").all()
    assert table.relation.iloc[0] == "all"
    # head 1 (uniform tokens): word columns weigh pieces (saw has 2 of 8), rows are equal.
    # related ordered pairs: (0,2) (2,0) (1,2) (2,1) (4,3) (2,3) (3,2) (3,4) = 10/8;
    # off-diagonal mass: 5 rows * 6/8, minus the diagonal 4 * 1/8 + 2/8 = 24/8
    per_head = count_syntax([token_map()], [T5]).per_head(min_count=1)
    assert per_head.dep_alignment.tolist() == pytest.approx([1.0, 10 / 24])
    assert math.isclose(syntax([token_map()], [T5], from_agg="first").accuracy.min(), 1.0)


def test_syntax_errors():
    with pytest.raises(InputError, match="1 maps but 2 trees"):
        syntax([token_map()], [T5, T5])
    with pytest.raises(InputError, match="self-attention maps only"):
        syntax([token_map(kind="cross")], [T5])
    other = ("[CLS]", "the", "big", "dog", "sa", "##w", "mice", "[SEP]")
    with pytest.raises(InputError, match=r"sentence t5: tokens .* do not match word 2 'cat'"):
        syntax([token_map(tokens=other)], [T5])
    with pytest.raises(InputError, match="unknown from_agg"):
        syntax([token_map()], [T5], from_agg="last")
    with pytest.raises(InputError, match="no attention maps"):
        syntax([], [])
