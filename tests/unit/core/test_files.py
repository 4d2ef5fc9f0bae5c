"""Atomic writes and the output checks made before a run (attnprobe.core.files)."""

from __future__ import annotations

import os

import pytest

from attnprobe.core.files import atomic_path, atomic_write, check_outputs
from attnprobe.errors import OutputError


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_replaces_the_file_only_when_the_writer_finished(tmp_path):
    target = tmp_path / "table.csv"
    target.write_text("old,complete\n")

    def dies_half_way(part):
        part.write_text("new,par")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, dies_half_way)
    assert target.read_text() == "old,complete\n"
    assert _listing(tmp_path) == ["table.csv"]  # the temporary file is gone too
    assert atomic_write(target, lambda part: part.write_text("new,complete\n")) == target
    assert target.read_text() == "new,complete\n" and _listing(tmp_path) == ["table.csv"]


def test_the_temporary_file_is_in_the_same_folder_and_keeps_the_suffix(tmp_path):
    # same folder: the rename cannot cross file systems; same suffix: np.savez and friends
    # append or pick formats by suffix
    with atomic_path(tmp_path / "sub" / "maps.npz") as part:
        assert part.parent == tmp_path / "sub" and part.name.endswith(".npz")
        assert part.name.startswith(".maps.npz.")
        part.write_bytes(b"x")
    assert (tmp_path / "sub" / "maps.npz").read_bytes() == b"x"


def test_new_files_get_the_default_permissions_and_replaced_files_keep_theirs(tmp_path):
    umask = os.umask(0o027)
    try:
        fresh = atomic_write(tmp_path / "fresh.txt", lambda part: part.write_text("a"))
        assert fresh.stat().st_mode & 0o777 == 0o640  # 0666 & ~umask, not mkstemp's 0600
    finally:
        os.umask(umask)
    kept = tmp_path / "kept.txt"
    kept.write_text("a")
    kept.chmod(0o604)
    atomic_write(kept, lambda part: part.write_text("b"))
    assert kept.stat().st_mode & 0o777 == 0o604 and kept.read_text() == "b"


def test_atomic_write_refuses_a_directory_and_an_unwritable_folder(tmp_path):
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        atomic_write(tmp_path / "out.csv", lambda part: part.write_text("x"))
    with pytest.raises(OutputError, match=r"cannot write /proc/no/such/out\.csv"):
        atomic_write("/proc/no/such/out.csv", lambda part: part.write_text("x"))


@pytest.mark.parametrize(("outputs", "message"), [
    ([("--out", "a.csv"), ("--profile", "a.csv")], "--profile and --out both write a.csv"),
    ([("--out", "a.csv"), ("--profile", "sub/../a.csv")], "--profile and --out both write"),
    ([("--out", "link.csv"), ("--distances", "a.csv")], "--distances and --out both write"),
    ([("--out", "folder")], "--out folder is a directory"),
])
def test_colliding_and_directory_outputs_are_refused(tmp_path, monkeypatch, outputs, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "folder").mkdir()
    (tmp_path / "a.csv").write_text("x")
    (tmp_path / "link.csv").symlink_to(tmp_path / "a.csv")
    with pytest.raises(OutputError, match=message):
        check_outputs(outputs)


def test_an_output_that_is_an_input_is_refused(tmp_path):
    texts = tmp_path / "texts.json"
    with pytest.raises(OutputError, match=r"texts\.json is also the --text-file input"):
        check_outputs([("--out", texts)], inputs=[("--text-file", str(texts)),
                                                  ("--conllu", None)])


def test_sidecars_collide_or_replace_only_their_own_kind(tmp_path):
    out, side = tmp_path / "m.npz", tmp_path / "m.json"
    ours = lambda path: path.read_text() == "ours"  # noqa: E731
    with pytest.raises(OutputError, match=r"--bertviz .*m\.json is also the \.json sidecar"):
        check_outputs([("--out", out), ("--bertviz", side)], sidecars=[(side, ours)])
    side.write_text("theirs")
    with pytest.raises(OutputError, match=r"would overwrite .*m\.json, which is not a sidecar"):
        check_outputs([("--out", out)], sidecars=[(side, ours)])
    side.write_text("ours")
    assert check_outputs([("--out", out)], sidecars=[(side, ours)]) == [out]
    side.unlink()
    side.mkdir()
    with pytest.raises(OutputError, match=r"sidecar .*m\.json of an output is a directory"):
        check_outputs([("--out", out)], sidecars=[(side, ours)])


def test_unwritable_outputs_are_refused_and_refusals_create_no_folder(tmp_path):
    with pytest.raises(OutputError, match=r"--out: cannot write /proc/no/such/t\.csv"):
        check_outputs([("--out", "/proc/no/such/t.csv")])
    with pytest.raises(OutputError, match="both write"):
        check_outputs([("--out", tmp_path / "new" / "t.csv"),
                       ("--profile", tmp_path / "new" / "t.csv")])
    assert not (tmp_path / "new").exists()
    # accepted: the folder is made now, so the run's result can be written
    assert check_outputs([("--out", tmp_path / "new" / "t.csv"), ("--profile", None)]) == [
        tmp_path / "new" / "t.csv"]
    assert (tmp_path / "new").is_dir() and _listing(tmp_path / "new") == []
