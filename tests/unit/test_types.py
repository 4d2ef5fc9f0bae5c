import json
import math

import numpy as np
import pytest
import torch

from attnprobe import AttentionMap, InputError, ModelInfo, load_maps, save_maps
from attnprobe.types import MAP_COLUMNS

INFO = ModelInfo(name="toy", arch="toy", n_layers=3, n_heads=2, causal=False)


def make_map(n_layers=3, n_heads=2, n=4, **kw):
    pattern = torch.softmax(torch.randn(n_layers, n_heads, n, n), dim=-1)
    tokens = tuple(f"t{i}" for i in range(n))
    return AttentionMap(pattern=pattern, query_tokens=tokens, key_tokens=tokens,
                        layers=tuple(range(n_layers)), info=INFO, **kw)


def test_shape_must_match_tokens():
    with pytest.raises(InputError, match="does not match"):
        AttentionMap(pattern=torch.full((1, 1, 3, 3), 1 / 3), query_tokens=("a", "b"),
                     key_tokens=("a", "b", "c"), layers=(0,), info=INFO)


def test_rejects_non_4d_nan_and_rows_not_summing_to_one():
    with pytest.raises(InputError, match="4-D"):
        AttentionMap(pattern=torch.ones(3, 3), query_tokens="abc", key_tokens="abc",
                     layers=(0,), info=INFO)
    nan = torch.full((1, 1, 2, 2), 0.5)
    nan[0, 0, 1, 1] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        AttentionMap(pattern=nan, query_tokens="ab", key_tokens="ab", layers=(0,), info=INFO)
    with pytest.raises(InputError, match="sum to 1"):
        AttentionMap(pattern=torch.ones(1, 1, 2, 2), query_tokens="ab", key_tokens="ab",
                     layers=(0,), info=INFO)
    # an edited map may opt out of the row check
    AttentionMap(pattern=torch.zeros(1, 1, 2, 2), query_tokens="ab", key_tokens="ab",
                 layers=(0,), info=INFO, check_rows=False)


def test_select_keeps_model_indices():
    amap = make_map()
    sub = amap.select(layers=[2], heads=[1])
    assert sub.layers == (2,) and sub.heads == (1,)
    assert torch.equal(sub.pattern[0, 0], amap.pattern[2, 1])
    assert torch.equal(sub.head(2, 1), amap.head(2, 1))
    with pytest.raises(InputError, match="not available"):
        sub.select(layers=[0])


def test_to_frame_is_tidy_and_exact():
    amap = make_map(n_layers=2, n_heads=2, n=3).select(layers=[1])
    frame = amap.to_frame()
    assert tuple(frame.columns) == MAP_COLUMNS
    assert len(frame) == 1 * 2 * 3 * 3
    row = frame[(frame["head"] == 1) & (frame.query_pos == 2) & (frame.key_pos == 0)].iloc[0]
    assert row.layer == 1 and row.head_id == "L1H1" and row.query_token == "t2"
    assert row.weight == pytest.approx(amap.pattern[0, 1, 2, 0].item())
    sums = frame.groupby(["layer", "head", "query_pos"]).weight.sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-6)


def test_save_load_round_trip_without_pickle(tmp_path):
    maps = [make_map(example_id="a"), make_map(n=5, example_id="b", kind="self", stack="enc")]
    path = save_maps(maps, tmp_path / "maps.npz")
    meta = json.loads((tmp_path / "maps.json").read_text())
    assert meta["maps"][1]["stack"] == "enc"
    with np.load(path, allow_pickle=False) as arrays:  # would raise on object arrays
        assert set(arrays) == {"pattern_0", "pattern_1"}
    loaded = load_maps(tmp_path / "maps.npz")
    for before, after in zip(maps, loaded, strict=True):
        assert torch.equal(before.pattern, after.pattern)
        assert before.query_tokens == after.query_tokens
        assert before.info == after.info and before.example_id == after.example_id
    single = maps[0].save(tmp_path / "one.npz")
    assert torch.equal(AttentionMap.load(single).pattern, maps[0].pattern)


def test_uniform_map_entropy_is_log_n():
    from attnprobe.heads import summarize

    n = 8
    amap = AttentionMap(pattern=torch.full((1, 1, n, n), 1 / n), query_tokens=tuple("abcdefgh"),
                        key_tokens=tuple("abcdefgh"), layers=(0,), info=INFO)
    row = summarize([amap]).iloc[0]
    assert row.entropy == pytest.approx(math.log(8))
    assert row.max_weight == pytest.approx(1 / 8)


def test_rejects_negative_weights_duplicate_indices_and_bad_info():
    ok = torch.full((1, 1, 2, 2), 0.5)
    with pytest.raises(InputError, match="negative"):
        AttentionMap(pattern=torch.tensor([[[[1.5, -0.5], [0.5, 0.5]]]]), query_tokens="ab",
                     key_tokens="ab", layers=(0,), info=INFO)
    with pytest.raises(InputError, match="distinct"):
        AttentionMap(pattern=torch.full((2, 1, 2, 2), 0.5), query_tokens="ab", key_tokens="ab",
                     layers=(1, 1), info=INFO)
    with pytest.raises(InputError, match="ModelInfo"):
        AttentionMap(pattern=ok, query_tokens="ab", key_tokens="ab", layers=(0,), info={})


@pytest.mark.parametrize("kwargs", [{"heads": []}, {"layers": [0, 0]}, {"layers": True}])
def test_select_rejects_empty_duplicate_and_bool(kwargs):
    with pytest.raises(InputError, match="distinct integers"):
        make_map().select(**kwargs)


def test_save_keeps_dotted_names(tmp_path):
    path = make_map().save(tmp_path / "run.v2")
    assert path.name == "run.v2.npz" and (tmp_path / "run.v2.json").exists()
    assert AttentionMap.load(tmp_path / "run.v2").shape == (3, 2, 4, 4)
