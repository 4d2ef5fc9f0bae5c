"""The causal methods' definitions live in the project's own docs (issue 24, item 23): the
README, the docstrings and the docs point to ``docs/guide/causal-methods.md`` (in the site's
navigation), never to a developers' guide outside the repository, and every anchor they link
to is a heading of that page."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guide" / "causal-methods.md"
SOURCES = [ROOT / "README.md", *sorted((ROOT / "attnprobe").rglob("*.py")),
           *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"causal-methods\.md(?:#([\w-]+))?")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _anchors() -> set[str]:
    """The ids Markdown's toc extension gives the page's headings (lower case, words joined
    by hyphens, punctuation dropped)."""
    found = set()
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return found


def test_nothing_points_to_the_developers_methods_guide():
    stale = re.compile(r"methods guide|methods\.md\s*§\s*16|§16")
    hits = [f"{path.relative_to(ROOT)}:{n}" for path in SOURCES
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if stale.search(line)]
    assert hits == []


def test_the_page_is_in_the_site_and_every_anchor_linked_to_exists():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"),
                       Loader=yaml.BaseLoader)
    guide = next(item["Guide"] for item in config["nav"] if "Guide" in item)
    assert "guide/causal-methods.md" in [path for entry in guide for path in entry.values()]
    anchors = _anchors()
    assert {"activation-patching", "path-patching", "attribution-patching", "attention-knockout",
            "direct-logit-attribution", "qk-and-ov-circuits", "composition-scores"} <= anchors
    linked = {(path.name, anchor) for path in SOURCES
              for anchor in LINK.findall(path.read_text(encoding="utf-8")) if anchor}
    assert linked  # the docstrings do link to sections
    assert {(name, a) for name, a in linked if a not in anchors} == set()


def test_readme_links_into_docs_stay_links_relative_to_the_including_page():
    hooks = _hooks()
    span = ("See [methods](docs/guide/causal-methods.md#path-patching) and "
            "[the tour](analyses/tour.ipynb).\n")
    assert hooks.unlink_paths(span, "guide/causal-experiments.md") == (
        "See [methods](causal-methods.md#path-patching) and the tour.\n")
    assert hooks.unlink_paths(span, "index.md") == (
        "See [methods](guide/causal-methods.md#path-patching) and the tour.\n")
