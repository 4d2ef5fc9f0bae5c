import hashlib
import json
import math
import os
import tracemalloc

import numpy as np
import pytest
import torch

from attnprobe import AttentionMap, InputError, ModelInfo, load_maps, save_maps
from attnprobe.errors import FileFormatError, OutputError
from attnprobe.types import MAP_COLUMNS, is_maps_sidecar
from tests.unit.crafted_files import CASES, entry, sidecar, zeros_bomb

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


# ----------------------------------------------------------------- saving is atomic
def _killed(stream, **arrays):
    """np.savez_compressed that dies half way, as a killed process would."""
    stream.write(b"PK\x03\x04 half an archive")
    raise KeyboardInterrupt


def test_a_save_that_dies_leaves_the_old_pair_and_no_temporary(tmp_path, monkeypatch):
    old = [make_map(example_id="old")]
    save_maps(old, tmp_path / "maps.npz")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(np, "savez_compressed", _killed)
    with pytest.raises(KeyboardInterrupt):
        save_maps([make_map(n=6, example_id="new")], tmp_path / "maps.npz")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (loaded,) = load_maps(tmp_path / "maps.npz")
    assert loaded.example_id == "old" and torch.equal(loaded.pattern, old[0].pattern)


def test_saved_files_get_ordinary_permissions(tmp_path):
    # mkstemp makes 0600 files; an output replaces that with what open() would give
    path = save_maps([make_map()], tmp_path / "maps.npz")
    umask = os.umask(0)
    os.umask(umask)
    for written in (path, path.with_suffix(".json")):
        assert written.stat().st_mode & 0o777 == 0o666 & ~umask


def test_save_refuses_to_overwrite_an_unrelated_json(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "bert"}')
    with pytest.raises(OutputError, match="not the sidecar of saved maps"):
        save_maps([make_map()], tmp_path / "config.npz")
    assert config.read_text() == '{"model_type": "bert"}'
    assert not (tmp_path / "config.npz").exists()


def test_save_replaces_its_own_earlier_pair(tmp_path):
    save_maps([make_map(example_id="first")], tmp_path / "maps.npz")
    save_maps([make_map(example_id="second")], tmp_path / "maps.npz")
    assert [m.example_id for m in load_maps(tmp_path / "maps.npz")] == ["second"]


def test_save_to_a_directory_is_an_output_error(tmp_path):
    (tmp_path / "maps.npz").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        save_maps([make_map()], tmp_path / "maps.npz")


def test_sidecar_records_the_digest_of_its_npz(tmp_path):
    path = save_maps([make_map()], tmp_path / "maps.npz")
    digest = json.loads(path.with_suffix(".json").read_text())["npz_sha256"]
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_is_maps_sidecar(tmp_path):
    save_maps([make_map()], tmp_path / "maps.npz")
    (tmp_path / "other.json").write_text('{"maps": 3}')
    (tmp_path / "bad.json").write_text("{")
    assert is_maps_sidecar(tmp_path / "maps.json")
    assert not any(is_maps_sidecar(tmp_path / name)
                   for name in ("other.json", "bad.json", "missing.json"))


# ----------------------------------------------------------------- loading crafted files
@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_files_are_one_line_file_format_errors(case, tmp_path):
    build, message = CASES[case]
    build(tmp_path)
    with pytest.raises(FileFormatError, match=message) as caught:
        load_maps(tmp_path / "maps.npz")
    assert "\n" not in str(caught.value)


def test_arrays_over_the_limit_are_refused_before_they_are_inflated(tmp_path):
    # a real deflate bomb: 64 MiB of zeros in about 64 KiB, described honestly
    shape = (1, 1, 4096, 4096)
    sidecar(tmp_path, entry(*shape))
    zeros_bomb(tmp_path, shape)
    assert (tmp_path / "maps.npz").stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError, match=r"declare uncompressed 64\.0 MiB, over the "
                                                  r"limit of 16\.0 MiB \(max_bytes\)"):
            load_maps(tmp_path / "maps.npz", max_bytes=16 * 2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20  # nothing was inflated
    # within the limit it loads; all zeros is then refused as a map, not as a file
    with pytest.raises(FileFormatError, match="rows must sum to 1"):
        load_maps(tmp_path / "maps.npz", max_bytes=2**27)


def test_a_bomb_described_as_a_small_map_is_refused_from_its_header(tmp_path):
    sidecar(tmp_path, entry())  # (1, 1, 2, 2)
    zeros_bomb(tmp_path, (1, 1, 4096, 4096))
    tracemalloc.start()
    try:
        with pytest.raises(FileFormatError, match=r"shape \(1, 1, 4096, 4096\) \(64\.0 MiB\)"):
            load_maps(tmp_path / "maps.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


@pytest.mark.slow
def test_the_1_7_gb_zip_bomb_of_the_issue_is_refused(tmp_path):
    shape = (1, 1, 20000, 21250)  # 1.7 GB of float32 zeros in 1.6 MB
    sidecar(tmp_path, entry(*shape))
    zeros_bomb(tmp_path, shape)
    assert (tmp_path / "maps.npz").stat().st_size < 2 * 10**6
    with pytest.raises(FileFormatError, match=r"declare uncompressed 1\.6 GiB, over the limit "
                                              r"of 1\.0 GiB"):
        load_maps(tmp_path / "maps.npz")


def test_missing_files_are_an_input_error(tmp_path):
    save_maps([make_map()], tmp_path / "maps.npz")
    (tmp_path / "maps.json").unlink()
    with pytest.raises(InputError, match=r"expected .*maps\.npz and its sidecar .*maps\.json"):
        load_maps(tmp_path / "maps.npz")


def test_old_sidecars_without_a_digest_still_load(tmp_path):
    amap = make_map(example_id="old")
    path = save_maps([amap], tmp_path / "maps.npz")
    meta = json.loads(path.with_suffix(".json").read_text())
    del meta["npz_sha256"]
    path.with_suffix(".json").write_text(json.dumps(meta))
    (loaded,) = load_maps(path)
    assert torch.equal(loaded.pattern, amap.pattern) and loaded.example_id == "old"


def test_scores_round_trip(tmp_path):
    amap = make_map(scores=torch.randn(3, 2, 4, 4))
    (loaded,) = load_maps(save_maps([amap], tmp_path / "s.npz"))
    assert torch.equal(loaded.scores, amap.scores)


@pytest.mark.parametrize(("spec", "message"), [
    ({"maps": [{**entry(), "format_version": 2}]}, r"map 0: unsupported format_version 2"),
    ({"maps": [entry(), "x"]}, r"map 1: expected an object; got str"),
    ({"maps": []}, r"'maps' is empty"),
    ({"mapz": [entry()]}, r"missing 'maps'"),
    ([entry()], r"expected an object; got list"),
    ({"maps": [{**entry(), "colour": "red"}]}, r"map 0: unexpected field 'colour'"),
])
def test_sidecar_structure_errors_name_the_place(spec, message, tmp_path):
    (tmp_path / "maps.json").write_text(json.dumps(spec))
    np.savez_compressed(tmp_path / "maps.npz", pattern_0=np.full((1, 1, 2, 2), 0.5, np.float32))
    with pytest.raises(FileFormatError, match=message):
        load_maps(tmp_path / "maps.npz")
