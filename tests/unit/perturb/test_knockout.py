"""Attention knockout (``ap.perturb.knockout`` / ``run(..., "knockout")``): values by
construction. Blocking every edge but one per row makes the row one-hot on the kept key and
gives the output of an edit that writes those one-hot rows; ``to:`` / ``from:`` / ``last-to:``
/ ``edge:`` resolve the edges by real-token position on left- and right-padded batches; each
text of a batch gets its own edges; sweeps equal one run per layer (head); and a knockout that
blocks nothing, or a bad edges spec, is a one-line error."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import attnprobe as ap
from attnprobe.capture import Keep
from attnprobe.capture.info import causal_of
from attnprobe.errors import EditNotAppliedError, InputError
from attnprobe.models import build_reference
from attnprobe.perturb import EdgeMasks, parse_edges, run
from attnprobe.perturb.table import RUN_COLUMNS
from tests.conftest import track
from tests.integration.causal_lms import causal_lm
from tests.integration.legacy_models import build_pair as legacy_pair
from tests.integration.legacy_models import padded as legacy_padded

TEXTS = ["w5 w6 w7 w8 w9", "w10 w11 w12", "w13 w14 w15 w16"]
NUMBERS = ["baseline", "perturbed", "change"]


@pytest.fixture(scope="module")
def llama():
    return causal_lm("llama")  # <s> first, causal, SDPA as loaded; 2 layers x 4 heads (GQA)


@pytest.fixture(scope="module")
def ref_lm():
    model, tok = build_reference("transformer")  # hook points, causal, [BOS] first
    return track(model), tok


def padded(tok, texts, side):
    tok.padding_side = side
    try:
        return dict(tok(texts, padding=True, return_tensors="pt"))
    finally:
        tok.padding_side = "right"


def real_block(mask: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``[query, key]`` over the real tokens of one row of a ``[seq, seq]`` mask."""
    slots = real.nonzero().flatten()
    return mask[slots][:, slots]


# ----------------------------------------------------------------------------- construction
def keep_one(n: int) -> torch.Tensor:
    """``[n, n]`` bool: every edge blocked but query q's edge to key q // 2 (causal: k <= q)."""
    kept = torch.zeros(n, n, dtype=torch.bool)
    kept[torch.arange(n), torch.arange(n) // 2] = True
    return ~kept


@pytest.mark.parametrize("name", ["llama", "ref_lm"])
def test_blocking_all_edges_but_one_makes_rows_one_hot_and_equals_the_one_hot_edit(name,
                                                                                   request):
    model, tok = request.getfixturevalue(name)
    texts = ["w5 w6 w7 w8 w9", "w10 w11"] if name == "llama" else ["the cat sat on the mat",
                                                                   "a dog"]
    inputs = padded(tok, texts, "right")
    real = inputs["attention_mask"].bool()
    lengths = real.sum(-1).tolist()
    masks = EdgeMasks(parse_edges(lambda example, layer, head: keep_one(lengths[example])),
                      inputs, causal=True)
    with torch.no_grad(), ap.capture(model, parts=[Keep(), masks.part]) as cap:
        knocked = model(**inputs)
    for b, amap in enumerate(cap.maps):  # padding stripped: [layer, head, n, n]
        n = lengths[b]
        want = (~keep_one(n)).to(amap.pattern.dtype).expand_as(amap.pattern)
        torch.testing.assert_close(amap.pattern, want, atol=1e-6, rtol=0)

    def one_hot(layer, pattern):  # the same rows written after the softmax
        for b, n in enumerate(lengths):
            slots = real[b].nonzero().flatten()
            rows = torch.zeros(n, pattern.shape[-1], dtype=pattern.dtype)
            rows[torch.arange(n), slots[torch.arange(n) // 2]] = 1.0
            pattern[b, :, slots] = rows
        return pattern

    with torch.no_grad(), ap.capture(model, edit=one_hot, keep=False):
        edited = model(**inputs)
    logits = (getattr(knocked, "logits", knocked), getattr(edited, "logits", edited))
    torch.testing.assert_close(logits[0][real], logits[1][real], atol=1e-5, rtol=0)
    assert ap.count_hooks(model) == 0


EXPECTED = {  # spec -> n real tokens -> the (query, key) pairs blocked
    "to:1": lambda n: [(q, 1) for q in range(n) if q != 1],
    "from:-1": lambda n: [(n - 1, k) for k in range(n - 1)],
    "from:last": lambda n: [(n - 1, k) for k in range(n - 1)],
    "from:0-1": lambda n: [(q, k) for q in (0, 1) for k in range(n) if k != q],
    # the last token still reads itself: for n = 4, key 3 is the last token
    "last-to:0,2-3": lambda n: [(n - 1, k) for k in (0, 2, 3) if k != n - 1],
    "edge:3>1,-1>0": lambda n: [(3, 1), (n - 1, 0)],
    "edge:2>2": lambda n: [(2, 2)],
}


@pytest.mark.parametrize("spec", EXPECTED)
def test_named_edges_count_real_tokens_on_left_and_right_padding(llama, spec):
    _, tok = llama
    texts = ["w5 w6 w7 w8", "w9 w10 w11"]  # 5 and 4 real tokens with <s>
    blocks = {}
    for side in ("left", "right"):
        inputs = padded(tok, texts, side)
        real = inputs["attention_mask"].bool()
        masks = EdgeMasks(parse_edges(spec), inputs, examples=[0, 1])
        seq = real.shape[1]
        shape = torch.Size((2, 4, seq, seq))
        full = torch.broadcast_to(masks(0, shape), shape)  # as the Knockout part reads it
        pad = ~real[:, None, :, None] | ~real[:, None, None, :]
        assert not (full & pad).any()  # no edge from or to padding
        blocks[side] = [real_block(full[b, h], real[b]) for b in range(2) for h in range(4)]
    for left, right in zip(blocks["left"], blocks["right"], strict=True):
        assert torch.equal(left, right)
    for b, n in enumerate((5, 4)):
        want = torch.zeros(n, n, dtype=torch.bool)
        for q, k in EXPECTED[spec](n):
            want[q, k] = True
        assert torch.equal(blocks["right"][4 * b], want), (b, blocks["right"][4 * b])


def test_left_and_right_padded_knockouts_give_the_same_weights(llama):
    model, tok = llama
    texts = ["w5 w6 w7 w8", "w9 w10"]
    maps = {}
    for side in ("left", "right"):
        inputs = padded(tok, texts, side)
        masks = EdgeMasks(parse_edges("to:1"), inputs, causal=True)
        with torch.no_grad(), ap.capture(model, parts=[Keep(), masks.part]) as cap:
            model(**inputs)
        maps[side] = cap.maps
    plain = ap.extract(model, tok, texts)
    for left, right, before in zip(maps["left"], maps["right"], plain, strict=True):
        torch.testing.assert_close(left.pattern, right.pattern, atol=1e-5, rtol=0)
        assert (left.pattern[:, :, 2:, 1] == 0).all()  # no later token reads key 1
        # rows 0 and 1 lose nothing (row 1 keeps its own edge; causal: they see no later
        # token); in layer 0 the others are the plain rows without key 1, renormalised
        torch.testing.assert_close(left.pattern[:, :, :2], before.pattern[:, :, :2], atol=1e-5,
                                   rtol=0)
        row = before.pattern[0, :, 2:].clone()
        row[..., 1] = 0
        torch.testing.assert_close(left.pattern[0, :, 2:], row / row.sum(-1, keepdim=True),
                                   atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- the experiment
def test_the_table_has_run_columns_and_the_edges(llama):
    model, tok = llama
    table = ap.perturb.knockout(model, tok, TEXTS, "to:0")
    assert tuple(table.columns) == (*RUN_COLUMNS, "edges")
    assert set(table["experiment"]) == {"knockout"} == set(table["perturbation"])
    assert set(table["edges"]) == {"to:0"} and set(table["scope"]) == {"all"}
    assert set(table["metric"]) == {"tvd", "jsd", "flip", "top_prob"}
    assert (table[table["metric"] == "tvd"]["perturbed"] > 0).all()
    via_run = run(model, tok, TEXTS, "knockout", edges="to:0")
    pd.testing.assert_frame_equal(table, via_run)


def test_each_text_of_a_batch_gets_its_own_edges(llama):
    """A callable that depends on the example: batched rows equal one text per forward, and
    differ from the same knockout given to every text."""
    model, tok = llama
    lengths = [len(tok(text)["input_ids"]) for text in TEXTS]  # 6, 4, 5 with <s>

    def edges(example, layer, head):
        n = lengths[example]
        blocked = torch.zeros(n, n, dtype=torch.bool)
        blocked[:, example + 1] = True  # key example + 1, except its own row
        blocked[example + 1, example + 1] = False
        return blocked

    batched = ap.perturb.knockout(model, tok, TEXTS, edges, metric="loss", batch_size=3)
    single = ap.perturb.knockout(model, tok, TEXTS, edges, metric="loss", batch_size=1)
    pd.testing.assert_frame_equal(batched, single, rtol=1e-5, atol=1e-6)
    assert set(batched["edges"]) == {"custom"} and set(batched["positions"]) == {"all"}
    named = ap.perturb.knockout(model, tok, TEXTS, "to:1", metric="loss")
    assert batched["perturbed"].iloc[0] == pytest.approx(named["perturbed"].iloc[0], abs=1e-6)
    assert (batched["perturbed"].iloc[1:] - named["perturbed"].iloc[1:]).abs().min() > 1e-4


def test_a_layer_sweep_equals_one_run_per_layer(llama):
    model, tok = llama
    swept = ap.perturb.knockout(model, tok, TEXTS, "last-to:0", metric="logit:w5",
                                sweep="layer", batch_size=4)
    assert swept["layer"].tolist() == [0, 0, 0, 1, 1, 1] and swept["head"].isna().all()
    each = pd.concat([ap.perturb.knockout(model, tok, TEXTS, "last-to:0", metric="logit:w5",
                                          scope=f"layer:{layer}") for layer in (0, 1)],
                     ignore_index=True)
    pd.testing.assert_frame_equal(swept[NUMBERS], each[NUMBERS], rtol=1e-5, atol=1e-5)
    heads = ap.perturb.knockout(model, tok, TEXTS[:1], "to:0", sweep="head", metric="loss")
    assert heads[["layer", "head"]].values.tolist() == [[lay, h] for lay in (0, 1)
                                                        for h in range(4)]
    one = ap.perturb.knockout(model, tok, TEXTS[:1], "to:0", scope="head:1.2", metric="loss")
    assert heads.iloc[6]["perturbed"] == pytest.approx(one.iloc[0]["perturbed"], abs=1e-5)


def test_the_reference_lm_takes_a_knockout_through_its_hook_points(ref_lm):
    model, tok = ref_lm
    assert causal_of(model)
    table = ap.perturb.knockout(model, tok, ["the cat sat on the mat"], "from:-1",
                                metric="logit:cat")
    assert table["change"].abs().iloc[0] > 0
    # its causal mask comes after hook_scores, where the capture cannot see it: a row left
    # without a key is refused here rather than turned into NaN
    with pytest.raises(InputError, match=r"'edge:0>0' blocks every key query 0 of example 0"):
        ap.perturb.knockout(model, tok, ["the cat sat"], "edge:0>0")


def test_a_module_seam_model_takes_the_same_edges_on_left_padding():
    """GPT-Neo computes its weights in its own module (the module seam); left-padded."""
    model, _ = legacy_pair("gpt_neo")
    inputs = legacy_padded("gpt_neo", lengths=(6, 4))
    assert inputs["attention_mask"][1, 0] == 0  # left padding
    plain = ap.capture(model, parts=[Keep()])
    with torch.no_grad(), plain as cap:
        model(**inputs)
    masks = EdgeMasks(parse_edges("to:1"), inputs, causal=True)
    with torch.no_grad(), ap.capture(model, parts=[Keep(), masks.part]) as knocked:
        model(**inputs)
    for before, after in zip(cap.maps, knocked.maps, strict=True):
        row = before.pattern[0, :, 2:].clone()  # layer 0, queries after key 1
        row[..., 1] = 0
        torch.testing.assert_close(after.pattern[0, :, 2:], row / row.sum(-1, keepdim=True),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(after.pattern[:, :, :2], before.pattern[:, :, :2],
                                   atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------- errors
def test_a_knockout_that_blocks_nothing_names_the_text(llama):
    model, tok = llama
    # text 1 has two real tokens: to:-1 would block only edges into the last token, which
    # no earlier query of a causal model can see, and its own edge is kept
    with pytest.raises(EditNotAppliedError, match=r"knockout 'to:-1' blocks no edge .* texts "
                                                  r"0, 1 could see"):
        ap.perturb.knockout(model, tok, ["w5 w6 w7", "w8"], "to:-1")
    with pytest.raises(EditNotAppliedError, match=r"blocks no edge of scope all that text 1 "):
        ap.perturb.knockout(model, tok, ["w5 w6 w7", "w8"], "to:1")
    with pytest.raises(EditNotAppliedError, match=r"blocks no edge of layer:0 that text 1 "):
        ap.perturb.knockout(model, tok, ["w5 w6 w7", "w8"], "to:1", sweep="layer")
    assert ap.count_hooks(model) == 0


@pytest.mark.parametrize(("edges", "match"), [
    ("towards:0", r"unknown edges kind 'towards'; choose one of 'edge', 'from', 'last-to', "
                  r"'to'"),
    ("to", r"unknown edges kind 'to'"),
    ("to:", r"edges 'to:' needs positions"),
    ("to:a", r"'a' is not a position"),
    ("to:3-1", r"range 3-1 is empty"),
    ("edge:3", r"needs query>key pairs"),
    ("to:9", r"example 0: edges 'to:9': position 9 is out of range for a text of 6 tokens"),
    ("edge:0>0", r"blocks every key query 0 of example 0 may read"),
    (None, r"knockout needs edges= \(CLI --edges\)"),
    (3, r"edges must be a non-empty spec string or a callable; got 3"),
    (lambda e, lay, h: torch.ones(2, 2), r"must return a bool tensor"),
    (lambda e, lay, h: torch.ones(2, 2, dtype=torch.bool), r"returned shape \(2, 2\) for "
                                                           r"example 0"),
])
def test_bad_edges_are_one_line_input_errors(llama, edges, match):
    model, tok = llama
    options = {} if edges is None else {"edges": edges}
    with pytest.raises(InputError, match=match):
        run(model, tok, TEXTS[:1], "knockout", **options)
    assert ap.count_hooks(model) == 0
