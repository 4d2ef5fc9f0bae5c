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
    # causal LMs: ref:induction continues the repeated segment and its copying heads are found
    gen = namespace["gen"]
    assert gen.query_tokens[gen.prompt_length:] == ("t08", "t55", "t21", "t09", "t30", "t60")
    top = namespace["retrieval"].nlargest(4, "retrieval")
    assert set(top["head_id"]) == {"L1H0", "L1H1", "L1H2", "L1H3"}
    assert set(namespace["steps"].table["step"]) == {1, 2}
    # the diff sees the change where it was made: layer 5 alone
    layers = namespace["d"].layers().set_index("layer")["js"]
    assert layers[5] > 0.01 and (layers.drop(5) < 1e-6).all()
