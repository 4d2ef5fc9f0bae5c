"""The tour notebook (analyses/tour.ipynb) runs top to bottom on MiniLM without an error, and
shows what it says it shows. Needs nbclient and ipykernel (the dev extra)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the tour test needs nbformat (dev extra)")
nbclient = pytest.importorskip("nbclient", reason="the tour test needs nbclient (dev extra)")
pytest.importorskip("ipykernel", reason="the tour test needs ipykernel (dev extra)")

ROOT = Path(__file__).resolve().parents[2]
TOUR = ROOT / "analyses" / "tour.ipynb"
KERNEL = "attnprobe-tour-test"


def kernel_name(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """A kernel spec that runs this interpreter (the venv's), in a private directory, so the
    test never depends on (or changes) the user's installed kernels."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "attnprobe tour", "language": "python"}))
    return KERNEL, {"JUPYTER_PATH": str(root)}


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory):
    if not TOUR.is_file():
        pytest.fail(f"{TOUR} is missing")
    name, env = kernel_name(tmp_path_factory)
    notebook = nbformat.read(TOUR, as_version=4)
    # the committed notebook carries no outputs
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in notebook.cells if c.cell_type == "code")
    mp = pytest.MonkeyPatch()
    for key, value in env.items():
        mp.setenv(key, value)
    mp.setenv("TOKENIZERS_PARALLELISM", "false")
    try:
        client = nbclient.NotebookClient(notebook, kernel_name=name, timeout=300,
                                         resources={"metadata": {"path": str(TOUR.parent)}})
        client.execute()
    finally:
        mp.undo()
    return notebook


def outputs(notebook, kind: str | None = None):
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if kind is None or out.output_type == kind:
                yield cell, out


def text_of(out) -> str:
    if out.output_type == "stream":
        return out.text
    return out.get("data", {}).get("text/plain", "")


def test_tour_runs_without_errors(executed):
    notebook = executed
    errors = [f"{o.ename}: {o.evalue}" for _, o in outputs(notebook, "error")]
    assert errors == []
    stderr = "".join(o.text for _, o in outputs(notebook, "stream") if o.name == "stderr")
    assert "Traceback" not in stderr and "Error" not in stderr, stderr[-2000:]


def test_tour_shows_the_results(executed):
    notebook = executed
    table = next(c for c in notebook.cells if "census-table" in c.metadata.get("tags", []))
    shown = text_of(next(o for o in table.outputs if o.output_type == "execute_result"))
    assert re.search(r"\[72 rows x 4 columns\]", shown), shown[-300:]
    printed = "".join(text_of(o) for _, o in outputs(notebook, "stream"))
    assert "AttentionMap(minilm, encoder self, 6 layers × 12 heads, 9 × 9 tokens" in printed
    assert "Census(minilm: 72 heads in 6 layers, 40 sentences" in printed
    assert re.search(r"Report\('attnprobe report', [\d.]+ [kM]B, \d+ sections\)", printed)
    # the compare bar counted 2 texts × (2 methods + the views)
    assert "6/6" in printed
    figures = [o for _, o in outputs(notebook) if "image/png" in o.get("data", {})]
    assert len(figures) == 2  # head grid and head effects
    views = [o for _, o in outputs(notebook) if "text/html" in o.get("data", {})]
    assert len(views) >= 4  # the map, the census, the comparison, the report (and tables)
