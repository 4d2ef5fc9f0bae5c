"""Where the metric reads, across the causal lab (issue 24, items 10, 14 and 24): patching
(``ap.patch.heads`` / ``path`` / ``attribution``) and direct logit attribution take the same
``metric_positions`` and ``pairs``; a scalar position is that position, ``None`` the default,
anything else a one-line error naming the argument, and a mask or a position that does not
fit the inputs is an error naming the example and position, never dropped. Expected values
are read off the model's own logits here."""

from __future__ import annotations

import inspect

import pytest
import torch

import attnprobe as ap
from tests.integration.causal_lms import causal_lm, text

CLEAN = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
CORRUPT = [[25, 26, 7, 8, 9], [30, 31, 12, 13, 14]]
SHORT = [[5, 6, 7, 8, 9], [10, 11, 12]]          # example 1 has 3 tokens
SHORT_CORRUPT = [[25, 26, 7, 8, 9], [30, 31, 12]]


@pytest.fixture(scope="module")
def lm():
    return causal_lm("gpt2")


def logits_of(model, rows):
    with torch.no_grad():
        return model(torch.tensor(rows)).logits.double()


def patch_heads(model, tok, clean=CLEAN, corrupt=CORRUPT, metric="logit:w20", **kw):
    return ap.patch.heads(model, tok, clean, corrupt, metric, scope="head:1.0", **kw)


def dla(model, tok, texts=None, metric="logit:w20", **kw):
    texts = [text(*r) for r in (texts or CLEAN)]
    return ap.heads.logit_attribution(model, tok, texts, metric, **kw)


# ----------------------------------------------------------------------------- item 10
def test_a_scalar_position_is_that_one_position(lm):
    model, tok = lm
    want = logits_of(model, CLEAN)[:, 2, 20]
    table = patch_heads(model, tok, metric_positions=2)
    assert table.sort_values("example_id")["clean"].tolist() == pytest.approx(
        want.tolist(), abs=1e-5)
    estimate = ap.patch.attribution(model, tok, CLEAN, CORRUPT, "logit:w20", scope="head:1.0",
                                    metric_positions=2)
    assert estimate.sort_values("example_id")["clean"].tolist() == pytest.approx(
        want.tolist(), abs=1e-5)
    totals = dla(model, tok, metric_positions=2).totals
    assert totals["value"].tolist() == pytest.approx(want.tolist(), abs=1e-5)


def test_none_is_the_default_position(lm):
    model, tok = lm
    logits = logits_of(model, CLEAN)
    table = patch_heads(model, tok, metric_positions=None)
    assert table["clean"].tolist() == pytest.approx(logits[:, -1, 20].tolist(), abs=1e-5)
    # a metric that reads the next token: every position that has one
    ids = torch.tensor(CLEAN)
    following = logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].mean(-1)
    table = patch_heads(model, tok, metric="logit:next", metric_positions=None)
    assert table["clean"].tolist() == pytest.approx(following.tolist(), abs=1e-5)
    totals = dla(model, tok, metric="logit:next", metric_positions=None).totals
    assert totals["value"].tolist() == pytest.approx(following.tolist(), abs=1e-5)


@pytest.mark.parametrize("bad", [2.5, {"a": 1}, [1.5], [[1], "x"]], ids=repr)
def test_other_positions_are_one_line_errors_naming_the_argument(lm, bad):
    model, tok = lm
    calls = [lambda: patch_heads(model, tok, metric_positions=bad),
             lambda: ap.patch.path(model, tok, CLEAN, CORRUPT, "logit:w20", senders="layer:0",
                                   receivers="layer:1", metric_positions=bad),
             lambda: ap.patch.attribution(model, tok, CLEAN, CORRUPT, "logit:w20",
                                          metric_positions=bad),
             lambda: dla(model, tok, metric_positions=bad)]
    for call in calls:
        with pytest.raises(ap.InputError, match="metric_positions") as err:
            call()
        assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- item 14
def test_a_mask_narrower_or_wider_than_the_inputs_is_refused(lm):
    model, tok = lm
    for width in (4, 6):
        mask = torch.zeros(2, width, dtype=torch.bool)
        mask[:, 1] = True
        with pytest.raises(ap.InputError, match=r"\[2, 5\]"):
            patch_heads(model, tok, metric_positions=mask)
        with pytest.raises(ap.InputError, match=r"\[2, 5\]"):
            dla(model, tok, metric_positions=mask)


def test_a_mask_marking_past_an_inputs_end_is_refused_not_dropped(lm):
    model, tok = lm
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, 1] = True
    mask[1, 4] = True  # example 1 has 3 tokens
    with pytest.raises(ap.InputError, match=r"position 4 of example 1"):
        patch_heads(model, tok, SHORT, SHORT_CORRUPT, metric_positions=mask)
    with pytest.raises(ap.InputError, match=r"position 4 of example 1"):
        dla(model, tok, SHORT, metric_positions=mask)


def test_positions_past_either_end_name_the_example_and_position(lm):
    model, tok = lm
    for bad in ([3], [-4], [[0], [5]]):
        p = bad[0] if isinstance(bad[0], int) else bad[1][0]
        with pytest.raises(ap.InputError, match=rf"position {p} .*example 1"):
            patch_heads(model, tok, SHORT, SHORT_CORRUPT, metric_positions=bad)
        with pytest.raises(ap.InputError, match=rf"position {p} .*example 1"):
            dla(model, tok, SHORT, metric_positions=bad)


def test_negative_positions_count_from_each_inputs_end(lm):
    model, tok = lm
    totals = dla(model, tok, SHORT, metric_positions=[-3]).totals
    first = [logits_of(model, [row])[0, len(row) - 3, 20] for row in SHORT]
    assert totals["value"].tolist() == pytest.approx([float(v) for v in first], abs=1e-5)


# ----------------------------------------------------------------------------- item 24
def test_one_name_for_one_idea_across_the_causal_lab():
    # patch.heads / path / attribution hand these keywords on to patch.run (issue 25: at
    # most 10 parameters each), so run() is where the shared names are declared.
    wrappers = [ap.patch.heads, ap.patch.path, ap.patch.attribution]
    assert all(any(p.kind is inspect.Parameter.VAR_KEYWORD
                   for p in inspect.signature(fn).parameters.values()) for fn in wrappers)
    entries = [ap.patch.run, ap.heads.logit_attribution]
    for name in ("metric", "metric_positions", "pairs"):
        found = [inspect.signature(fn).parameters.get(name) for fn in entries]
        assert all(p is not None for p in found), name
        assert len({p.default for p in found}) == 1, name
        assert {p.kind for p in found} <= {inspect.Parameter.KEYWORD_ONLY,
                                           inspect.Parameter.POSITIONAL_OR_KEYWORD}, name


def test_logit_attribution_takes_per_example_pairs_as_patching_does(lm):
    model, tok = lm
    pairs = [("w40", "w41"), ("w42", "w43")]
    logits = logits_of(model, CLEAN)[:, -1]
    want = [float(logits[i, 40 + 2 * i] - logits[i, 41 + 2 * i]) for i in range(2)]
    result = dla(model, tok, metric="logit_diff", pairs=pairs, batch_size=1)
    assert result.totals["value"].tolist() == pytest.approx(want, abs=1e-5)
    sums = result.table.groupby("example_id")["value"].sum()
    assert [sums["0"], sums["1"]] == pytest.approx(want, abs=1e-4)
    patched = patch_heads(model, tok, metric="logit_diff", pairs=pairs)
    assert patched["clean"].tolist() == pytest.approx(want, abs=1e-5)
    with pytest.raises(ap.InputError, match=r"1 .* pairs for 2 examples"):
        dla(model, tok, metric="logit_diff", pairs=pairs[:1])


def test_positions_still_works_with_a_deprecation_warning(lm):
    model, tok = lm
    with pytest.warns(DeprecationWarning, match="metric_positions"):
        old = dla(model, tok, positions=[1])
    new = dla(model, tok, metric_positions=[1])
    assert old.table["value"].tolist() == new.table["value"].tolist()
    with pytest.raises(ap.InputError, match="not both"):
        dla(model, tok, positions=[1], metric_positions=[1])
