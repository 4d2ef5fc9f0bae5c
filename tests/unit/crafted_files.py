"""Crafted saved-maps pairs (``.npz`` + ``.json``), built in the test, as an attacker or a
killed writer would leave them. Each case writes ``<folder>/maps.npz`` and ``maps.json``.

The sidecars written here carry no ``npz_sha256`` (as files from before it existed, or an
attacker's), so the archive checks themselves are reached.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import torch

from attnprobe import AttentionMap, ModelInfo, save_maps

INFO = ModelInfo(name="toy", arch="toy", n_layers=1, n_heads=1, causal=False)
GIB_447 = (1000, 1000, 346, 346)  # float32: 479 GB = 446 GiB


def entry(n_layers=1, n_heads=1, n_q=2, n_k=2, **changes) -> dict:
    """A sidecar entry as save_maps writes it, for a map of the given shape."""
    base = {"format_version": 1, "query_tokens": [f"q{i}" for i in range(n_q)],
            "key_tokens": [f"k{i}" for i in range(n_k)], "layers": list(range(n_layers)),
            "heads": list(range(n_heads)), "kind": "self", "stack": "", "example_id": "0",
            "check_rows": True, "info": INFO.to_dict()}
    return {**base, **changes}


def sidecar(folder: Path, *entries: dict) -> Path:
    path = folder / "maps.json"
    path.write_text(json.dumps({"maps": list(entries)}))
    return path


def npy_bytes(shape: tuple[int, ...], descr: str = "<f4", data: bytes = b"") -> bytes:
    """An ``.npy`` header declaring ``shape`` and ``descr``, followed by ``data``."""
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": descr, "fortran_order": False,
                                                  "shape": shape})
    return stream.getvalue() + data


def archive(folder: Path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> Path:
    path = folder / "maps.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def uniform(n: int = 2) -> np.ndarray:
    return np.full((1, 1, n, n), 1 / n, dtype=np.float32)


def real_pair(folder: Path, n: int = 2, seed: int = 0) -> Path:
    """A pair written by save_maps (with its digest)."""
    generator = torch.Generator().manual_seed(seed)
    pattern = torch.softmax(torch.randn(1, 1, n, n, generator=generator), -1)
    amap = AttentionMap(pattern=pattern, query_tokens=[f"q{i}" for i in range(n)],
                        key_tokens=[f"k{i}" for i in range(n)], layers=(0,), info=INFO)
    return save_maps([amap], folder / "maps.npz")


def zeros_bomb(folder: Path, shape: tuple[int, ...]) -> Path:
    """A member whose header and zip entry honestly declare ``shape`` of float32 zeros,
    deflated to about a thousandth of that."""
    path = folder / "maps.npz"
    size = int(np.prod(shape)) * 4
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
            zf.open("pattern_0.npy", "w", force_zip64=True) as member:
        member.write(npy_bytes(shape))
        while size:
            member.write(chunk[:min(size, len(chunk))])
            size -= min(size, len(chunk))
    return path


# case -> (build(folder), what the one-line error says)
def _object_array(folder: Path) -> None:
    sidecar(folder, entry())
    values = np.empty((1, 1, 2, 2), dtype=object)
    values[...] = {"payload": 1}
    stream = io.BytesIO()
    np.save(stream, values, allow_pickle=True)
    archive(folder, {"pattern_0.npy": stream.getvalue()})


def _missing_key(folder: Path) -> None:
    broken = entry()
    del broken["layers"]
    sidecar(folder, broken)
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes())})


def _bad_json(folder: Path) -> None:
    (folder / "maps.json").write_text('{"maps": [{"format_version": 1,')
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes())})


def _bad_zip(folder: Path) -> None:
    sidecar(folder, entry())
    (folder / "maps.npz").write_bytes(b"this is not a zip file" * 10)


def _truncated_zip(folder: Path) -> None:  # what a killed non-atomic write left
    npz = real_pair(folder, n=32)
    npz.write_bytes(npz.read_bytes()[: npz.stat().st_size // 2])
    meta = json.loads((folder / "maps.json").read_text())
    del meta["npz_sha256"]
    (folder / "maps.json").write_text(json.dumps(meta))


def _header_447_gib(folder: Path) -> None:
    sidecar(folder, entry())
    archive(folder, {"pattern_0.npy": npy_bytes(GIB_447, data=bytes(16))})


def _header_447_gib_described(folder: Path) -> None:
    """The sidecar agrees with the huge header; the zip entry holds 16 bytes."""
    sidecar(folder, entry(*GIB_447))
    archive(folder, {"pattern_0.npy": npy_bytes(GIB_447, data=bytes(16))})


def _unexpected_member(folder: Path) -> None:
    sidecar(folder, entry())
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes()),
                     "payload.pkl": b"\x80\x04N."})


def _missing_array(folder: Path) -> None:
    sidecar(folder, entry(), entry())
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes())})


def _integer_dtype(folder: Path) -> None:
    sidecar(folder, entry())
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), "<i8", bytes(32))})


def _wrong_field_type(folder: Path) -> None:
    sidecar(folder, entry(layers="0"))
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes())})


def _info_missing_field(folder: Path) -> None:
    info = INFO.to_dict()
    del info["n_heads"]
    sidecar(folder, entry(info=info))
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=uniform().tobytes())})


def _rows_not_summing_to_one(folder: Path) -> None:
    sidecar(folder, entry())
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2),
                                                data=np.ones(4, np.float32).tobytes())})


def _size_mismatch(folder: Path) -> None:  # the header says 16 bytes of data, 8 follow
    sidecar(folder, entry())
    archive(folder, {"pattern_0.npy": npy_bytes((1, 1, 2, 2), data=bytes(8))})


def _torn_pair(folder: Path) -> None:
    """The .npz of another save (same shapes) next to this sidecar: what a save killed
    between its two renames leaves."""
    other = folder / "other"
    other.mkdir()
    real_pair(folder, seed=0)
    (folder / "maps.npz").write_bytes(real_pair(other, seed=1).read_bytes())


def _damaged_data(folder: Path) -> None:
    npz = real_pair(folder, n=64)
    data = bytearray(npz.read_bytes())
    with zipfile.ZipFile(npz) as zf:
        info = zf.getinfo("pattern_0.npy")
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size * 3 // 4
    data[middle:middle + 64] = bytes(64)  # zero 64 bytes late in the deflate stream
    npz.write_bytes(bytes(data))
    meta = json.loads((folder / "maps.json").read_text())
    del meta["npz_sha256"]
    (folder / "maps.json").write_text(json.dumps(meta))


CASES = {
    "object array": (_object_array, r"dtype object.*object arrays are never loaded"),
    "missing key": (_missing_key, r"map 0: missing 'layers'"),
    "bad json": (_bad_json, r"not valid JSON"),
    "bad zip": (_bad_zip, r"not a readable \.npz"),
    "truncated zip": (_truncated_zip, r"not a readable \.npz"),
    "447 GiB header": (_header_447_gib,
                       r"shape \(1000, 1000, 346, 346\) \(446\.\d GiB\); its description says "
                       r"\(1, 1, 2, 2\)"),
    "447 GiB header described": (_header_447_gib_described,
                                 r"declares 446\.\d GiB of data but its zip entry holds 16 "
                                 r"bytes"),
    "unexpected member": (_unexpected_member, r"unexpected member 'payload\.pkl'"),
    "missing array": (_missing_array, r"missing array 'pattern_1'"),
    "integer dtype": (_integer_dtype, r"dtype int64; expected floating-point"),
    "wrong field type": (_wrong_field_type, r"map 0: 'layers' must be list\[int\]; got str"),
    "info missing field": (_info_missing_field, r"map 0: info: missing 'n_heads'"),
    "rows not summing to 1": (_rows_not_summing_to_one, r"map 0: pattern rows must sum to 1"),
    "size mismatch": (_size_mismatch, r"declares 16 bytes of data but its zip entry holds 8"),
    "torn pair": (_torn_pair, r"is not the file its sidecar maps\.json was written with"),
    "damaged data": (_damaged_data, r"array 'pattern_0' is damaged"),
}
