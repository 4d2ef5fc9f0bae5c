"""The README's Python example runs as written (every feature stays reachable from it)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    assert namespace["amap"].pattern.shape == (6, 12, 9, 9)
    assert namespace["cap"].edits["max_abs_change"].iloc[0] > 0
    summary = namespace["tally"].summary()
    assert len(summary) == 6 * 12
