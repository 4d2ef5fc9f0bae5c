"""The documentation machinery (docs/hooks.py, docs/griffe_docstrings.py), without a build.

``make docs`` (in CI) builds the site with warnings as errors; these tests say the same
things about the README's spans in a fraction of a second, and pin what the two helpers do.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load("hooks")
griffe_docstrings = _load("griffe_docstrings")


def _includes() -> list[tuple[str, bool]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            match = hooks.INCLUDE.match(line)
            if match:
                found.append((match.group(1), bool(match.group(2))))
    return found


def test_readme_spans_are_well_formed_and_each_is_included_once():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    spans = hooks.read_spans(text)
    assert hooks.unmarked_sections(text) == []  # every "## " section is in the site
    includes = _includes()
    required = [name for name, optional in includes if not optional]
    assert sorted(required) == sorted(set(required))  # no span on two pages
    assert set(required) <= set(spans)
    assert set(spans) <= {name for name, _ in includes}
    # a span holds its text and no marker: "## Head census" lies in the census span
    assert spans["census"].startswith("## Head census")
    assert "<!-- docs:" not in spans["census"]


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- docs:a:start -->\nx\n", "has no end marker"),
    ("x\n<!-- docs:a:end -->\n", "without its start"),
    ("<!-- docs:a:start -->\n<!-- docs:b:start -->\n", "do not nest"),
    ("<!-- docs:a:start -->\n<!-- docs:a:end -->\n<!-- docs:a:start -->\n<!-- docs:a:end -->\n",
     "marked twice"),
])
def test_a_malformed_span_layout_stops_the_build(text, message):
    with pytest.raises(PluginError, match=message):
        hooks.read_spans(text)


def test_sections_outside_spans_are_named_and_fenced_code_is_not_a_section():
    text = ("<!-- docs:a:start -->\n## In\n<!-- docs:a:end -->\n## Out\n"
            "```bash\n## a shell comment\n```\n")
    assert hooks.unmarked_sections(text) == ["Out"]
    assert hooks.read_spans(text) == {"a": "## In\n"}


def test_repository_links_show_as_their_path_outside_code():
    span = ("See [`analyses/tour.ipynb`](analyses/tour.ipynb), [site](https://x.org) and "
            "[below](#scores).\n```python\nx = a[0](b)\n[k](v)\n```\n")
    assert hooks.unlink_paths(span) == (
        "See `analyses/tour.ipynb`, [site](https://x.org) and [below](#scores).\n"
        "```python\nx = a[0](b)\n[k](v)\n```\n")


def test_an_include_of_an_unmarked_name_fails_unless_optional():
    page = SimpleNamespace(file=SimpleNamespace(src_uri="guide/x.md"))
    hooks._spans.clear()
    hooks._spans.update({"a": "## A\n"})
    assert hooks.on_page_markdown("# T\n<!-- docs:include a -->\n", page) == "# T\n## A\n\n"
    assert "has no `later` section yet" in hooks.on_page_markdown(
        "<!-- docs:include later optional -->\n", page)
    with pytest.raises(PluginError, match="does not mark"):
        hooks.on_page_markdown("<!-- docs:include later -->\n", page)


def test_only_elements_that_load_from_another_host_are_flagged():
    html = ('<script src="https://cdn.example/x.js"></script><link href="//fonts.example/f.css">'
            '<a href="https://www.mkdocs.org/">MkDocs</a><img src="img/local.png">'
            '<div itemtype="http://schema.org/Article">')
    assert [re.sub(r".*=.", "", m) for m in hooks.EXTERNAL_LOAD.findall(html)] == [
        "https://cdn.example/x.js", "//fonts.example/f.css"]


def test_docstrings_are_read_as_written():
    doc = ("Do it.\n\nArgs:\n    model_a / model_b: the two models\n        (eval mode).\n"
           "    x, y: vectors.\n    scope: which heads.\n\nReturns:\n    A :class:`~a.b.Diff`, "
           "see :func:`attnprobe.heads.census`.\n\nExample:\n    >>> 1 + 1\n")
    assert griffe_docstrings.rewrite(doc) == (
        "Do it.\n\nArgs:\n    model_a: the two models\n        (eval mode).\n"
        "    model_b: the two models\n        (eval mode).\n    x: vectors.\n    y: vectors.\n"
        "    scope: which heads.\n\nReturns:\n    A `Diff`, see `attnprobe.heads.census`.\n\n"
        "Examples:\n    >>> 1 + 1")


def test_the_top_page_lists_every_entry_point():
    import attnprobe

    page = (ROOT / "docs" / "api" / "attnprobe.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`ap\.(\w+)`", page))
    assert set(attnprobe.__all__) - listed == set()  # a new entry point gets its row
