"""The README's Python examples run as written (every feature stays reachable from them)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_examples_run(monkeypatch, tmp_path):
    # the examples read files relative to the repository and write files there: run them in
    # a folder that sees the repository's inputs and keeps what they write
    for name in ("analyses", "tests"):
        (tmp_path / name).symlink_to(README.parent / name)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:  # in order, sharing names, as a reader would run them
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["amap"].pattern.shape == (6, 12, 9, 9)
    assert namespace["cap"].edits["max_abs_change"].iloc[0] > 0
    summary = namespace["tally"].summary()
    assert len(summary) == 6 * 12
    result = namespace["result"]
    assert result.n_sentences == 200
    assert set(result.classify()["label"]) - {"heterogeneous"}  # some head is explained
    assert "det" in set(result.syntax()["relation"])
