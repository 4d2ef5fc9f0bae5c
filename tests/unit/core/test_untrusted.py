"""Reading files that may be hostile (attnprobe.core.untrusted). The crafted-file cases of
``load_maps`` are in tests/unit/test_types.py; here the building blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnprobe.core.untrusted import (
    check_fields,
    matches,
    read_json,
    read_npz,
    sha256_of,
    size_text,
)
from attnprobe.errors import FileFormatError


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_read_npz_gives_back_what_numpy_saved(tmp_path, save):
    rng = np.random.default_rng(0)
    arrays = {"a": rng.random((2, 3, 4), dtype=np.float32),
              "b": np.asfortranarray(rng.random((5, 7))),  # float64, Fortran order
              "empty": np.zeros((0, 3), np.float16)}
    save(tmp_path / "x.npz", **arrays)
    shapes = {name: value.shape for name, value in arrays.items()} | {"optional": (1,)}
    got = read_npz(tmp_path / "x.npz", shapes, required=["a", "b"])
    assert set(got) == set(arrays)
    for name, value in arrays.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value)


def test_read_npz_limit_counts_declared_bytes(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros(1000, np.float32))  # 4000 bytes + 128 header
    assert read_npz(tmp_path / "x.npz", {"a": (1000,)}, max_bytes=4128)["a"].shape == (1000,)
    with pytest.raises(FileFormatError, match=r"declare uncompressed 4128 bytes, over the "
                                              r"limit of 4127 bytes"):
        read_npz(tmp_path / "x.npz", {"a": (1000,)}, max_bytes=4127)


def test_read_npz_refuses_a_stored_duplicate(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "x.npz", "w") as zf, pytest.warns(UserWarning):
        for _ in range(2):
            zf.writestr("a.npy", b"")
    with pytest.raises(FileFormatError, match="'a' is stored twice"):
        read_npz(tmp_path / "x.npz", {"a": (1,)})


@pytest.mark.parametrize(("value", "hint", "expected"), [
    ([1, 2], list[int], True), ([1, True], list[int], False), (["a"], list[int], False),
    (1.5, float, True), (2, float, True), (True, float, False), (None, bool | None, True),
    ({"a": "b"}, dict[str, str], True), ({"a": 1}, dict[str, str], False),
    ("x", int, False), ({"x": [1]}, dict, True), (object(), object, True),
])
def test_matches_json_values_against_type_hints(value, hint, expected):
    assert matches(value, hint) is expected


def test_check_fields_names_the_field(tmp_path):
    fields = {"name": str, "sizes": list[int], "note": str}
    ok = {"name": "x", "sizes": [1]}
    assert check_fields(ok, fields, "f.json", required=["name", "sizes"]) is ok
    for entry, message in [({"name": "x"}, "f.json: missing 'sizes'"),
                           ({**ok, "sizes": "1"}, r"'sizes' must be list\[int\]; got str"),
                           ({**ok, "extra": 1}, "unexpected field 'extra'"),
                           ([ok], "expected an object; got list")]:
        with pytest.raises(FileFormatError, match=message):
            check_fields(entry, fields, "f.json", required=["name", "sizes"])


def test_read_json_limits_and_one_line_errors(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": [1, 2]}))
    assert read_json(path) == {"a": [1, 2]}
    with pytest.raises(FileFormatError, match="over the limit of 4 bytes"):
        read_json(path, max_bytes=4)
    path.write_text("[" * 100_000)  # nesting deep enough to exhaust the parser's recursion
    with pytest.raises(FileFormatError, match="not valid JSON") as caught:
        read_json(path)
    assert "\n" not in str(caught.value)
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(FileFormatError, match="not valid JSON"):
        read_json(path)


def test_sha256_and_size_text(tmp_path):
    import hashlib

    path = tmp_path / "x"
    path.write_bytes(b"abc" * (1 << 19))  # spans several read blocks
    assert sha256_of(path) == hashlib.sha256(b"abc" * (1 << 19)).hexdigest()
    assert [size_text(n) for n in (5, 1536, 3 * 2**30, 2**50)] == [
        "5 bytes", "1.5 KiB", "3.0 GiB", "1024.0 TiB"]
