"""The inputs of a patching run: strings or ids, truncation of both sides alike, per-example
metric positions (lists or a mask) and logit_diff pairs, next-token fixed on the clean run,
callable metrics that see each repetition of the examples as its own batch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import attnprobe as ap
from tests.integration.causal_lms import causal_lm, text


@pytest.fixture(scope="module")
def lm():
    return causal_lm("gpt2")


CLEAN = [[5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
CORRUPT = [[25, 26, 7, 8, 9], [30, 31, 12, 13, 14], [35, 36, 17, 18, 19]]


def test_strings_and_ids_give_one_table(lm):
    model, tok = lm
    by_ids = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:w20", scope="layer:1")
    by_text = ap.patch.heads(model, tok, [text(*r) for r in CLEAN],
                             [text(*r) for r in CORRUPT], "logit:w20", scope="layer:1")
    pd.testing.assert_frame_equal(by_ids, by_text)


def test_per_example_positions_as_lists_or_a_mask_agree(lm):
    model, tok = lm
    lists = [[1, 3], [2], [0, 1, 2, 3]]
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for i, row in enumerate(lists):
        mask[i, row] = True
    a = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", scope="layer:0",
                       metric_positions=lists, batch_size=4)
    b = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:next", scope="layer:0",
                       metric_positions=mask, batch_size=4)
    pd.testing.assert_frame_equal(a, b)
    # example 1 reads position 2 alone: its clean metric is that position's next-token logit
    with torch.no_grad():
        logits = model(torch.tensor(CLEAN)).logits
    clean_1 = a[a["example_id"] == "1"]["clean"].iloc[0]
    assert clean_1 == pytest.approx(float(logits[1, 2, CLEAN[1][3]]), abs=1e-5)


def test_logit_diff_pairs_are_per_example(lm):
    model, tok = lm
    pairs = [("w40", "w41"), ("w42", "w43"), ("w44", "w45")]
    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit_diff", pairs=pairs,
                           scope="head:0.0", batch_size=2)
    with torch.no_grad():
        logits = model(torch.tensor(CLEAN)).logits[:, -1]
    want = [float(logits[i, 40 + 2 * i] - logits[i, 41 + 2 * i]) for i in range(3)]
    np.testing.assert_allclose(table["clean"], want, atol=1e-5)
    with pytest.raises(ap.InputError, match=r"2 .* pairs for 3 examples"):
        ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit_diff", pairs=pairs[:2])


def test_next_token_is_fixed_on_the_clean_run(lm):
    model, tok = lm
    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, "next-token", scope="head:1.0")
    with torch.no_grad():
        clean = model(torch.tensor(CLEAN)).logits[:, -1]
        corrupt = model(torch.tensor(CORRUPT)).logits[:, -1]
    top = clean.argmax(-1)
    np.testing.assert_allclose(table["clean"], clean.max(-1).values, atol=1e-5)
    np.testing.assert_allclose(table["corrupt"], corrupt[torch.arange(3), top], atol=1e-5)
    assert set(table["metric"]) == {"next-token"}


def test_a_callable_metric_sees_the_examples_of_each_patch_as_one_batch(lm):
    model, tok = lm
    seen = []

    def metric(output, batch):
        seen.append(tuple(batch["input_ids"].shape))
        assert output.logits.shape[0] == batch["input_ids"].shape[0]
        return output.logits[:, -1, 20]

    table = ap.patch.heads(model, tok, CLEAN, CORRUPT, metric, batch_size=8)
    assert set(seen) == {(3, 5)} and set(table["metric"]) == {"custom"}
    spec = ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:w20", batch_size=8)
    np.testing.assert_allclose(table["patched"], spec["patched"], atol=1e-6)
    with pytest.raises(ap.InputError, match="go with a metric spec"):
        ap.patch.heads(model, tok, CLEAN, CORRUPT, metric, metric_positions="all")


def test_skipped_pairs_keep_their_index(lm):
    model, tok = lm
    clean = [CLEAN[0], list(range(4, 14)), CLEAN[2]]
    corrupt = [CORRUPT[0], list(range(24, 34)), CORRUPT[2]]
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="head:0.1",
                           truncation="skip", max_length=6,
                           metric_positions=[[1], [1, 2, 3], [2]])
    assert list(table["example_id"]) == ["0", "2"]
    with torch.no_grad():
        logits = model(torch.tensor([clean[2]])).logits
    assert table["clean"].iloc[1] == pytest.approx(float(logits[0, 2, clean[2][3]]), abs=1e-5)
    cut = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="head:0.1",
                         truncation="cut", max_length=6, metric_positions="all")
    assert list(cut["example_id"]) == ["0", "1", "2"]
    with pytest.raises(ap.InputError, match="text 1 has 10 tokens"):
        ap.patch.heads(model, tok, clean, corrupt, "logit:next", max_length=6)


def test_a_metric_spec_with_an_unknown_token_fails_before_any_forward(lm):
    model, tok = lm
    with pytest.raises(ap.InputError, match="nonsense"):
        ap.patch.heads(model, tok, CLEAN, CORRUPT, "logit:nonsense")
