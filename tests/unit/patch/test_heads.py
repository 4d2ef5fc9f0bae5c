"""Activation patching per head (``ap.patch.heads``): batched tables equal one patched forward
at a time made with the capture parts directly; by construction, patching every head of an
attention-only model at positions whose tokens agree reproduces the clean metric, and a head
whose output projection is zero has no effect; the effect formulas; refusals."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import attnprobe as ap
from tests.conftest import track
from tests.integration.causal_lms import causal_lm
from tests.unit.patch.inputs import batch_of, induction_pairs, metric_values, patched_one

SITES = ("output", "pattern", "q", "k", "v")


@pytest.fixture(scope="module")
def induction():
    model, tok = ap.load_model("ref:induction")
    clean, corrupt, positions = induction_pairs(tok, n=4)
    return model, tok, clean, corrupt, positions


def _random_pairs(n: int, length: int, low: int, high: int, seed: int = 3):
    """Clean rows and corrupt rows that differ in their first half."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(low, high, (n, length), generator=g)
    corrupt = clean.clone()
    corrupt[:, : length // 2] = torch.randint(low, high, (n, length // 2), generator=g)
    return clean.tolist(), corrupt.tolist()


def _models():
    ref, ref_tok = ap.load_model("ref:llama")  # GQA: 4 query heads on 2 key/value heads
    return {"ref:llama": (track(ref), ref_tok, 4, 60),
            "gpt2": (*causal_lm("gpt2"), 4, 99),
            "llama": (*causal_lm("llama"), 4, 99)}  # transformers LLaMA, GQA


@pytest.fixture(scope="module")
def models():
    return _models()


@pytest.mark.parametrize("name", ["ref:llama", "gpt2", "llama"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_batched_patches_equal_one_patched_forward_at_a_time(models, name, direction):
    model, tok, low, high = models[name]
    clean, corrupt = _random_pairs(3, 6, low, high)
    spec = "logit:next"
    where = "all"
    base, other = batch_of(corrupt), batch_of(clean)
    if direction == "noising":
        base, other = other, base
    for site in SITES:
        table = ap.patch.heads(model, tok, clean, corrupt, spec, site=site, scope="layer:1",
                               direction=direction, metric_positions=where, batch_size=7)
        heads = sorted(set(table["head"]))
        if site in ("k", "v") and name != "gpt2":
            assert heads == [0, 1], site  # grouped-query: the key/value heads
        for head in heads:
            out = patched_one(model, base, other, site, 1, head)
            want = metric_values(spec, tok, out, base, where, batch_of(clean)).numpy()
            got = table[table["head"] == head].sort_values("example_id")["patched"].to_numpy()
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=site)


@pytest.mark.parametrize("site", ["output", "v"])
def test_each_position_equals_one_patched_forward_at_that_position(models, site):
    model, tok, low, high = models["ref:llama"]
    clean, corrupt = _random_pairs(2, 5, low, high, seed=4)
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", site=site,
                           scope="layer:0", positions="each", metric_positions=[3],
                           batch_size=5)
    assert sorted(set(table["position"])) == [0, 1, 2, 3, 4]
    for (head, position), rows in table.groupby(["head", "position"]):
        out = patched_one(model, batch_of(corrupt), batch_of(clean), site, 0, head,
                          int(position))
        want = metric_values("logit:next", tok, out, batch_of(corrupt), [3],
                             batch_of(clean)).numpy()
        np.testing.assert_allclose(rows.sort_values("example_id")["patched"], want,
                                   atol=1e-5, rtol=1e-5)


def test_patching_every_head_where_the_tokens_agree_gives_the_clean_metric(induction):
    """ref:induction is attention-only: the residual at a position is its token's embedding
    plus every head's output there. At second-copy positions clean and corrupt tokens agree,
    so with every head's output taken from the clean run the logits there are the clean
    ones."""
    model, tok, clean, corrupt, positions = induction
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", per="scope",
                           metric_positions=positions)
    assert len(table) == 4 and table["layer"].isna().all() and table["head"].isna().all()
    np.testing.assert_allclose(table["patched"], table["clean"], atol=1e-5, rtol=1e-6)
    np.testing.assert_allclose(table["effect"], 1.0, atol=1e-5)
    noised = ap.patch.heads(model, tok, clean, corrupt, "logit:next", per="scope",
                            metric_positions=positions, direction="noising")
    np.testing.assert_allclose(noised["patched"], noised["corrupt"], atol=1e-5, rtol=1e-6)


def test_a_head_whose_output_projection_is_zero_has_no_effect(induction):
    model, tok, clean, corrupt, positions = induction
    silent = copy.deepcopy(model)
    with torch.no_grad():
        silent.blocks[1].attn.out_proj.weight[:, 16:32] = 0  # head 1 writes nothing
    for site in ("output", "pattern", "q", "k", "v"):
        table = ap.patch.heads(track(silent), tok, clean, corrupt, "logit:next", site=site,
                               scope="head:1.1", metric_positions=positions)
        np.testing.assert_allclose(table["effect"], 0.0, atol=1e-5, err_msg=site)
        np.testing.assert_allclose(table["patched"], table["corrupt"], atol=1e-5, rtol=0)


def test_effect_is_the_normalised_change_of_each_direction(induction):
    model, tok, clean, corrupt, positions = induction
    for direction in ("denoising", "noising"):
        table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="layer:1",
                               direction=direction, metric_positions=positions)
        c, x, p = (table[k].to_numpy() for k in ("clean", "corrupt", "patched"))
        want = (p - x) / (c - x) if direction == "denoising" else (c - p) / (c - x)
        np.testing.assert_allclose(table["effect"], want, rtol=1e-12)
        assert set(table["direction"]) == {direction}
        # the unpatched runs are the plain clean and corrupted ones
        with torch.no_grad():
            run = model(**batch_of(clean))
        ids = table["example_id"].astype(int).to_numpy()
        plain = metric_values("logit:next", tok, run, batch_of(clean), positions).numpy()
        np.testing.assert_allclose(c, plain[ids], atol=1e-5)


def test_the_induction_heads_restore_far_more_than_the_others(induction):
    model, tok, clean, corrupt, positions = induction
    means = ap.patch.summary(ap.patch.heads(model, tok, clean, corrupt, "logit:next",
                                            metric_positions=positions))
    layer0 = means[means["layer"] == 0]["effect"].abs().max()
    layer1 = means[means["layer"] == 1]["effect"].max()
    assert layer1 > 3 * layer0, means


def test_the_table_has_the_documented_columns_and_types(induction):
    model, tok, clean, corrupt, positions = induction
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="layer:0",
                           metric_positions=positions)
    assert list(table.columns) == list(ap.patch.COLUMNS)
    assert str(table["layer"].dtype) == "int64" and str(table["head"].dtype) == "int64"
    assert str(table["position"].dtype) == "Int64" and table["position"].isna().all()
    assert set(table["experiment"]) == {"heads"} and set(table["metric"]) == {"logit:next(clean)"}
    assert list(table["example_id"][:4]) == ["0", "1", "2", "3"]
    assert callable(table._repr_html_)


def test_pairs_whose_metric_is_equal_get_nan_and_a_note(induction):
    model, tok, clean, corrupt, positions = induction
    pairs_clean, pairs_corrupt = clean[:2], [clean[0], corrupt[1]]  # pair 0: no corruption
    with pytest.warns(UserWarning, match=r"examples 0: .*equal"):
        table = ap.patch.heads(model, tok, pairs_clean, pairs_corrupt, "logit:next",
                               scope="layer:1", metric_positions=positions[:2])
    assert table[table["example_id"] == "0"]["effect"].isna().all()
    assert table[table["example_id"] == "1"]["effect"].notna().all()
    assert np.isfinite(table["effect"].dropna()).all()
    assert "equal" in table.attrs["notes"][0]
    with pytest.raises(ap.InputError, match="same on the clean and the corrupted run"):
        ap.patch.heads(model, tok, clean[:2], clean[:2], "logit:next",
                       metric_positions=positions[:2])


def test_pairs_of_different_lengths_are_refused_naming_the_first(induction):
    model, tok, clean, corrupt, _positions = induction
    with pytest.raises(ap.InputError, match=r"input 1 tokenize to 24 and 23 tokens"):
        ap.patch.heads(model, tok, clean[:2], [corrupt[0], corrupt[1][:-1]], "logit:next")
    with pytest.raises(ap.InputError, match="2 clean and 1 corrupted"):
        ap.patch.heads(model, tok, clean[:2], corrupt[:1], "logit:next")


def test_each_position_leaves_out_the_padding_of_shorter_pairs(models):
    model, tok, _low, _high = models["ref:llama"]
    clean = [[10, 11, 12, 13, 14], [20, 21, 22]]
    corrupt = [[30, 31, 12, 13, 14], [40, 21, 22]]
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="head:0.0",
                           positions="each", metric_positions=[1])
    assert table.groupby("example_id")["position"].apply(list).to_dict() == {
        "0": [0, 1, 2, 3, 4], "1": [0, 1, 2]}


def test_per_layer_patches_each_layers_heads_together(models):
    model, tok, low, high = models["ref:llama"]
    clean, corrupt = _random_pairs(2, 6, low, high)
    table = ap.patch.heads(model, tok, clean, corrupt, "logit:next", per="layer",
                           metric_positions="all")
    assert table["head"].isna().all() and list(table["layer"].unique()) == [0, 1]
    assert str(table["head"].dtype) == "Int64"


def test_a_model_whose_modules_compute_the_weights_patches_only_the_pattern():
    from tests.integration.legacy_models import build_pair

    model, _ = build_pair("gpt_neo")
    ids = [[5, 6, 7, 8], [9, 10, 11, 12]]
    other = [[15, 16, 17, 18], [19, 20, 21, 22]]

    def last_state(output, batch):
        return output.last_hidden_state[:, -1, 0]

    with pytest.raises(ap.InputError, match=r"site 'output'.*serve pattern only"):
        ap.patch.heads(model, None, ids, other, last_state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = ap.patch.heads(model, None, ids, other, last_state, site="pattern")
    assert len(table) == 2 * 2 * 4 and set(table["metric"]) == {"custom"}


def test_bad_options_are_one_line_errors(induction):
    model, tok, clean, corrupt, _positions = induction
    for options, message in (({"site": "values"}, "unknown site 'values'"),
                             ({"positions": "some"}, "unknown positions"),
                             ({"direction": "up"}, "unknown direction"),
                             ({"per": "token"}, "unknown per"),
                             ({"scope": "layer:7"}, "out of range")):
        with pytest.raises(ap.InputError, match=message):
            ap.patch.heads(model, tok, clean, corrupt, "logit:next", **options)
    with pytest.raises(ap.InputError, match="takes the options"):
        ap.patch.run(model, tok, clean, corrupt, "logit:next", "heads", into="q")
    with pytest.raises(ap.InputError, match="unknown patching experiment"):
        ap.patch.run(model, tok, clean, corrupt, "logit:next", "knockout")
    with pytest.raises(ap.InputError, match="no next token"):
        ap.patch.heads(model, tok, clean, corrupt, "logit:next")  # the last position
